"""Claims tied to their source (issue 34): every pointer holds, the checker refuses bad ones, no claim goes uncovered.

The pointers and their rules are described in utils/course/claims.py (the tool: ``python -m utils.course.claims``)."""

import functools
import json
import re

import pytest

from utils.course import claims

ROOT = claims.ROOT
NOTEBOOKS = claims.notebooks()


def _id(path):
    return claims.key(path)


# ---------------------------------------------------------------------------------------------------------------
# 1. Every pointer holds against the installed libraries.

@pytest.mark.parametrize("path", NOTEBOOKS, ids=_id)
def test_pointers_hold(path):
    result = claims.run([path])
    if result["broken"]:
        lines = [f"\"{b['says']}\" -> {b['file']}: {b['why']}" for b in result["broken"]]
        pytest.fail(f"{len(lines)} broken claim pointer(s) in {claims.key(path)}:\n  " + "\n  ".join(lines)
                    + f"\nre-read: {claims.key(path)} (the sentence may no longer be true of the library)")


def test_pointers_are_well_formed():
    """Each pointer is a dict of exactly the four fields, its file a relative path, and no pointer is repeated."""
    for path in NOTEBOOKS:
        seen = set()
        for claim in claims.claims_of(claims.load(path)):
            allowed = set(claims.FIELDS + claims.OPTIONAL_FIELDS)
            assert set(claims.FIELDS) <= set(claim) <= allowed, (claims.key(path), claim)
            assert not claim["file"].startswith("/") and ".." not in claim["file"], (claims.key(path), claim)
            ident = (claim["cell"], claim["says"], claim["file"], claim["code"])
            assert ident not in seen, f"{claims.key(path)}: the same pointer twice: {claim}"
            seen.add(ident)


def test_versions_cover_a_release_the_suite_runs_on():
    """A torch pointer's ``versions`` must include a release that ``make test`` or ``make test-torch`` runs, or no run
    would ever check it (``"<2.13"`` would sit there unread)."""
    from packaging.specifiers import SpecifierSet
    from utils.torch_versions import SUITE_RELEASES
    unread = [(claims.key(path), claim["says"], claim["versions"]) for path in NOTEBOOKS
              for claim in claims.claims_of(claims.load(path))
              if claims.library(claim) == "torch" and "versions" in claim
              and not any(SpecifierSet(claim["versions"]).contains(r) for r in SUITE_RELEASES)]
    assert not unread, f"pointers for no release in {SUITE_RELEASES}: {unread}"


def test_command_line(tmp_path):
    out = tmp_path / "claims.json"
    assert claims.main(["--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["broken"] == [] and result["reread"] == []
    assert result["pointers"] >= 60 and result["per_library"]["torch"] > 0, result["per_library"]


# ---------------------------------------------------------------------------------------------------------------
# 2. The checker's rules, on planted pointers into a package of our own making.

FAKE_MODULE = '''"""A module docstring: sorted(state.participants) is only said here."""

TIMEOUT = 30  # a comment: start_new_session=True


def launch(cmd):
    """Launch it with start_new_session=True (a docstring says so)."""
    message = "if k > 2: a string literal"
    return spawn(cmd, start_new_session=False, env={"A": "1"})
'''
FAKE_HEADER = """// constexpr int kCap = 25 * 1024 * 1024;
/* int kOld = 1; */
 * int kStar = 2;
constexpr int kFirst = 1024 * 1024;
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A package ``claimsfakepkg`` on sys.path, and a one-cell notebook that quotes a sentence."""
    pkg = tmp_path / "claimsfakepkg"
    (pkg / "include").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(FAKE_MODULE)
    (pkg / "include" / "cap.h").write_text(FAKE_HEADER)
    monkeypatch.syspath_prepend(str(tmp_path))
    claims.package_root.cache_clear()
    yield {"cells": [{"id": "c1", "cell_type": "markdown",
                      "source": ["The launcher starts each rank in a\n", "new session, so a signal reaches all."]}],
           "metadata": {}}
    claims.package_root.cache_clear()


def pointer(**kw):
    base = {"cell": "c1", "says": "starts each rank in a new session", "file": "claimsfakepkg/mod.py",
            "code": "start_new_session=False"}
    return {**base, **kw}


def test_a_good_pointer_holds(fake):
    assert claims.check(fake, pointer()) is None
    assert claims.check(fake, pointer(code="spawn(cmd,\n    start_new_session=False")) is None  # whitespace collapsed
    assert claims.check(fake, pointer(code='env={"A": "1"}')) is None  # a string inside code is code
    assert claims.check(fake, pointer(file="claimsfakepkg/include/cap.h", code="kFirst = 1024 * 1024;")) is None


@pytest.mark.parametrize("bad, why", [
    (dict(code="start_new_session=True"), "only in a comment or a string"),  # in a comment and in a docstring
    (dict(code="sorted(state.participants)"), "only in a comment or a string"),  # in the module docstring
    (dict(code="if k > 2: a string literal"), "only in a comment or a string"),  # in a string literal
    (dict(code="spawn"), "bare name"),
    (dict(code="TIMEOUT"), "bare name"),
    (dict(code='"if k > 2: a string literal"'), "bare name"),  # one token: a string is not code
    (dict(code="start_new_session=None"), "is gone from"),
    (dict(file="claimsfakepkg/gone.py"), "is gone from"),
    (dict(file="claimsfakepkg/include/cap.h", code="kCap = 25 * 1024 * 1024;"), "only in a comment"),  # //
    (dict(file="claimsfakepkg/include/cap.h", code="int kOld = 1;"), "only in a comment"),  # /*
    (dict(file="claimsfakepkg/include/cap.h", code="int kStar = 2;"), "only in a comment"),  # *
    (dict(says="starts each rank in a new process group"), "quote is not in the cell"),
    (dict(cell="c2"), "no cell with id"),
    (dict(file="claimsnosuchpkg/run.py"), "is not installed"),
    (dict(code=""), "pointer lacks code"),
])
def test_bad_pointers_are_rejected(fake, bad, why):
    verdict = claims.check(fake, pointer(**bad))
    assert verdict is not None and verdict[0] == "broken", (bad, verdict)
    assert why in verdict[1], (bad, verdict)


@pytest.mark.parametrize("versions, why", [
    ("2.15", "not a version specifier"),
    ("<2.x5", "not a version specifier"),
    (2.15, "not a string"),
    ("", "versions is empty"),
])
def test_bad_versions_are_rejected(fake, monkeypatch, versions, why):
    monkeypatch.setattr(claims, "release", lambda top: "2.14.1")
    verdict = claims.check(fake, pointer(versions=versions))
    assert verdict is not None and verdict[0] == "broken" and why in verdict[1], (versions, verdict)


def test_unknown_field_is_rejected(fake):
    verdict = claims.check(fake, pointer(version="<2.15"))  # a misspelt "versions" would silently apply everywhere
    assert verdict is not None and verdict[0] == "broken" and "unknown field" in verdict[1], verdict


def test_versions_select_the_pointer(fake, monkeypatch, tmp_path):
    """A pointer for other releases is not checked (even a broken one); a claim needs one that applies here."""
    monkeypatch.setattr(claims, "release", lambda top: "2.15.0")
    assert claims.check(fake, pointer(versions=">=2.15")) is None
    assert claims.check(fake, pointer(versions=">=2.15,<2.16")) is None
    kind, why = claims.check(fake, pointer(versions="<2.15", code="start_new_session=None"))  # gone, but not ours
    assert kind == "other" and "<2.15" in why and "2.15.0" in why
    kind, why = claims.check(fake, pointer(versions=">=2.15", code="start_new_session=None"))  # ours, and gone
    assert kind == "broken" and "is gone from" in why
    monkeypatch.setattr(claims, "release", lambda top: None)
    kind, why = claims.check(fake, pointer(versions=">=2.15"))
    assert kind == "broken" and "cannot be read" in why

    monkeypatch.setattr(claims, "release", lambda top: "2.15.0")
    nb = tmp_path / "notebooks" / "98_fake.ipynb"
    nb.parent.mkdir()
    covered = [pointer(versions="<2.15", code="start_new_session=None"), pointer(versions=">=2.15")]
    fake["metadata"] = {"course": {"claims": covered}}
    nb.write_text(json.dumps(fake))
    result = claims.run([nb])
    assert result["broken"] == [] and len(result["other_versions"]) == 1, result
    fake["metadata"] = {"course": {"claims": covered[:1]}}  # only the pointer for older releases is left
    nb.write_text(json.dumps(fake))
    result = claims.run([nb])
    assert len(result["broken"]) == 1 and "no pointer applies" in result["broken"][0]["why"], result
    assert result["reread"] == ["notebooks/98_fake.ipynb"], result


def test_absent_teacher_package_is_skipped(fake, monkeypatch):
    monkeypatch.setitem(claims.OPTIONAL, "claimsnosuchpkg", "teacher")
    kind, why = claims.check(fake, pointer(file="claimsnosuchpkg/app.py"))
    assert kind == "skip" and "not installed" in why and "teacher" in why


def test_report_names_the_lessons_to_reread(fake, tmp_path, capsys):
    nb = tmp_path / "notebooks" / "99_fake.ipynb"
    nb.parent.mkdir()
    fake["metadata"] = {"course": {"claims": [pointer(), pointer(code="start_new_session=True")]}}
    nb.write_text(json.dumps(fake))
    result = claims.run([nb])
    claims.report(result)
    out = capsys.readouterr().out
    assert result["pointers"] == 2 and len(result["broken"]) == 1
    assert "BROKEN notebooks/99_fake.ipynb" in out and "start_new_session=True" in out
    assert "lessons to re-read: notebooks/99_fake.ipynb" in out
    assert "claimsfakepkg 2" in out  # the count per library


# ---------------------------------------------------------------------------------------------------------------
# 3. Coverage: a cell that talks about a library's source carries a pointer.

SOURCE_FILE = re.compile(r"[\w./*-]*\w\.(?:py|pyi|h|hpp|cpp|cu)\b")
LIBRARIES = ("torch", "deepspeed", "lightning", "lightning_fabric", "pytorch_lightning", "transformers", "nbgrader",
             "jupyterhub", "papermill")
PRIVATE = re.compile(r"(?<![\w./])(?:[A-Za-z]\w*\.)*_[a-z0-9]\w*")  # `_lazy_init`, `FSDPState._pre_forward`, `torch._x`


@functools.cache
def course_names():
    """Names the course defines itself (utils, tests, scripts, and every notebook's code cells): ``def``, ``class``
    and assignments. A private name among them is ours, and says nothing about a library."""
    texts = [p.read_text(encoding="utf-8") for folder in ("utils", "tests", "notebooks/scripts")
             for p in (ROOT / folder).rglob("*.py")]
    texts += [claims.source(c) for path in NOTEBOOKS for c in claims.load(path)["cells"] if c["cell_type"] == "code"]
    names = set()
    for text in texts:
        names.update(re.findall(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", text, re.M))
        for targets in re.findall(r"^\s*([\w.]+(?:\s*,\s*[\w.]+)*)\s*(?::[^=\n]+)?=[^=]", text, re.M):
            names.update(target.split(".")[-1].strip() for target in targets.split(","))  # a, obj.b = ...
    return names


def course_file(word):
    """Whether a file named in a cell is one of the course's own (a lesson script, a utils module, a test)."""
    word = word.lstrip("./")
    if word.startswith(("utils/", "tests/", "notebooks/", "labs/", "scripts/", "website/")):
        return True
    return any((ROOT / folder / word).exists() for folder in ("", "notebooks", "notebooks/scripts", "labs"))


def library_mentions(markdown):
    """What in a markdown cell's backticks points into a library's source:

    - a source file (``run.py``, ``_fsdp_init.py``, ``torch/distributed/run.py``, ``deepspeed/moe/ep_*.py``) that is
      not one of the course's own files. A backticked span with a space in it is a command line (``python
      train.py``), whose files count only when they are paths into a library (``torch/...``);
    - a library path without an extension (``torch/distributed/elastic/...``);
    - a private name (one leading underscore: ``_lazy_init``, ``FSDPState._pre_forward``, ``torch.ops._c10d_x``)
      that the course does not define itself. An elision (``..._into_tensor``) and dunders are not private names.

    Such a mention says how a library works inside, where its code is, so the cell must carry a pointer. A cell that
    only names public API (``fully_shard``, ``dist.all_reduce``) is not flagged: that is the heuristic's blind spot,
    covered by reading the lessons (utils/course/claims.py lists what was checked)."""
    found = []
    for span in re.findall(r"`([^`\n]+)`", markdown):
        spaced = bool(re.search(r"\s", span.strip()))
        for word in SOURCE_FILE.findall(span):
            if spaced and not word.startswith(tuple(lib + "/" for lib in LIBRARIES)):
                continue
            if not course_file(word):
                found.append(word)
        if not spaced and re.fullmatch(r"(?:%s)/[\w/.*-]+" % "|".join(LIBRARIES), span) and span not in found:
            found.append(span)
        if "/" in span:  # a path: its folders and files are above, not private names
            continue
        for match in PRIVATE.finditer(SOURCE_FILE.sub(" ", span)):
            private = [part for part in match.group().split(".") if re.fullmatch(r"_[a-z0-9]\w*", part)]
            if private and not any(part in course_names() for part in private):
                found.append(match.group())
    return found


def uncovered(path):
    nb = claims.load(path)
    covered = {c.get("cell") for c in claims.claims_of(nb)}
    return [(c.get("id"), mentions) for c in nb["cells"] if c["cell_type"] == "markdown" and c.get("id") not in covered
            for mentions in [library_mentions(claims.source(c))] if mentions]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_id)
def test_library_source_claims_carry_pointers(path):
    missing = uncovered(path)
    assert not missing, (
        f"{claims.key(path)}: cells that name a library's source file or private function, with no claim pointer "
        f"(add one to metadata.course.claims, see utils/course/claims.py): {missing}")


def test_the_detector_flags_what_it_should():
    flagged = library_mentions(
        "The int is read in `torch/distributed/fsdp/_fully_shard/_fsdp_init.py` (`_get_post_forward_mesh_info`); "
        "see `sharded_moe.py`, `FSDPState._pre_backward`, `torch.ops._c10d_functional` and `torch/distributed/...`.")
    assert flagged == ["torch/distributed/fsdp/_fully_shard/_fsdp_init.py", "_get_post_forward_mesh_info",
                       "sharded_moe.py", "FSDPState._pre_backward", "torch.ops._c10d_functional",
                       "torch/distributed/..."], flagged
    quiet = library_mentions(
        "Our `utils/launch/report.py`, `notebooks/scripts/02_ddp_train.py`, `02_ddp_train.py`, `python train.py`, "
        "`dist.all_reduce`, `fully_shard(model)`, `..._into_tensor`, `__init__`, `_settle_ddp_buckets`.")
    assert quiet == [], quiet
