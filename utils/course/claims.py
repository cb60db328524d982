"""Claims tied to their source: every sentence about what a library does inside carries a pointer (a maintainer tool).

    python -m utils.course.claims                  # checks every pointer; exits 1 on any broken one
    python -m utils.course.claims --json out.json  # the same, and the result as JSON (for a run against another torch)

A pointer lives in the notebook's metadata, never in its prose::

    nb.metadata["course"]["claims"] = [
      {"cell": "<cell id>", "says": "<short exact quote from that cell>",
       "file": "torch/distributed/run.py",        # relative to the directory that holds the top-level package
       "code": "start_new_session=True"},         # a short exact piece of that file's code that makes it true
    ]

The rules (tests/test_course_claims.py holds every notebook and lab to them, and tests them on planted bad pointers):

- ``cell`` is a cell of the notebook and ``says`` occurs in its source (whitespace runs collapsed), so rewording the
  sentence forces a look at its pointer;
- ``file`` exists where the installed package lives (found with importlib, without importing it);
- ``code`` occurs in the file (whitespace runs collapsed) and at least one occurrence lies in code: not wholly inside a
  comment or a string literal / docstring (Python files: ``tokenize``; other files: not on a line that starts with
  ``//``, ``#``, ``*`` or ``/*``); and ``code`` holds more than one token (a bare name proves nothing);
- a pointer into a package that ``make setup`` does not install (the ``teacher`` extra: nbgrader, jupyterhub) is
  skipped, with the reason, while that package is absent;
- an optional fifth field, ``versions``, a version specifier (PEP 440: ``"<2.15"``, ``">=2.14"``) on the release of
  the pointer's package, says the pointer holds for those releases only: where a library moved the code, a claim
  that stays true carries one pointer per side of the move, and a pointer for other releases is not checked. Every
  claim (cell and quote) needs at least one pointer that applies to the installed release, so a library upgrade
  cannot leave a claim with none. The pointers that carry ``versions`` are the record of what changed (printed).

What changed from torch 2.13 (the pointers with ``versions``; found with ``make test-torch``): 2.14 moved the
agent-store choice of ``_create_c10d_store`` into ``_agent_store_serves`` (the same address as the agent's
``MASTER_ADDR:MASTER_PORT``), lets ``monitored_barrier`` run on any group with a CPU backend
(``"cpu:gloo,cuda:nccl"``), and can pass selective checkpointing's cached outputs through the user's saved-tensor
hooks (``respect_saved_tensors_hooks``, opt-in); 2.15 made ``all_gather_into_tensor`` / ``reduce_scatter_tensor``
aliases without a warning, gave ``FlopCounterMode`` a formula for the CPU's fused attention, moved the schedule's
final FSDP gradient reduction into ``start_gradient_reduction``, has FSDP2's no-sync ``post_backward`` mark the group
pending instead of converting to an accumulated gradient, and declares C++20 with ``target_compile_features``.

On a library upgrade the list of "lessons to re-read" this prints is the maintainer's work.
"""

import argparse
import bisect
import functools
import importlib.metadata
import importlib.util
import io
import json
import re
import sys
import tokenize
from collections import Counter
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .minutes import key, notebooks, source  # one list of the course's notebooks, one way to name and read them

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = {"nbgrader": "teacher", "jupyterhub": "teacher"}  # top-level package -> the extra that installs it
FIELDS = ("cell", "says", "file", "code")
OPTIONAL_FIELDS = ("versions",)


def squash(text):
    return re.sub(r"\s+", " ", text).strip()


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def claims_of(nb):
    return nb.get("metadata", {}).get("course", {}).get("claims", [])


@functools.cache
def package_root(top):
    """The directory that holds the installed top-level package (or module) ``top``; None when it is absent."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).parent
    return Path(spec.origin).parent if spec.origin else None


@functools.cache
def _squashed(path):
    """The file's text with whitespace runs collapsed to one space, and a map back: each piece of it starts at
    ``flat_starts[k]`` in the collapsed text and at ``orig_starts[k]`` in the file (within a piece, offsets agree)."""
    text = _read(path)
    parts, flat_starts, orig_starts, flat, pos = [], [], [], 0, 0
    for m in re.finditer(r"\s+", text):
        for piece, orig in ((text[pos:m.start()], pos), (" ", m.start())):
            flat_starts.append(flat)
            orig_starts.append(orig)
            parts.append(piece)
            flat += len(piece)
        pos = m.end()
    flat_starts.append(flat)
    orig_starts.append(pos)
    parts.append(text[pos:])
    return "".join(parts), flat_starts, orig_starts


@functools.cache
def _read(path):
    return Path(path).read_text(encoding="utf-8", errors="replace")


@functools.cache
def _not_code_mask(path):
    """A bytearray over the file's characters: 1 where a character is in a comment or a string literal (Python), or on
    a comment line (other files). Whitespace counts as neither code nor not-code: callers look at the rest."""
    text = _read(path)
    mask = bytearray(len(text))
    if str(path).endswith((".py", ".pyi")):
        starts = [0]
        for line in text.splitlines(keepends=True):
            starts.append(starts[-1] + len(line))
        try:
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                if tok.type in (tokenize.COMMENT, tokenize.STRING):
                    a = starts[tok.start[0] - 1] + tok.start[1]
                    b = starts[tok.end[0] - 1] + tok.end[1]
                    mask[a:b] = b"\x01" * (b - a)
        except (tokenize.TokenError, IndentationError, SyntaxError):
            pass  # a file tokenize cannot read to the end: what it read is marked
    else:
        offset = 0
        for line in text.splitlines(keepends=True):
            if line.lstrip().startswith(("//", "#", "*", "/*")):
                mask[offset:offset + len(line)] = b"\x01" * len(line)
            offset += len(line)
    return mask


def token_count(piece):
    """How many tokens ``piece`` holds, read as Python (a fragment: unbalanced brackets allowed)."""
    count = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(piece).readline):
            if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                continue
            count += 1
    except (tokenize.TokenError, IndentationError, SyntaxError):
        count = max(count, len(re.findall(r"\w+|[^\w\s]", piece)))
    return count


def find_in_code(path, piece):
    """(found, in code): whether ``piece`` occurs in the file, and whether one of its occurrences lies in code."""
    text = _read(path)
    flat, flat_starts, orig_starts = _squashed(path)
    mask = _not_code_mask(path)

    def orig(i):
        k = bisect.bisect_right(flat_starts, i) - 1
        return orig_starts[k] + (i - flat_starts[k])

    needle = squash(piece)
    found = False
    start = flat.find(needle)
    while start >= 0:
        found = True
        if any(not mask[i] and not text[i].isspace() for i in range(orig(start), orig(start + len(needle) - 1) + 1)):
            return True, True
        start = flat.find(needle, start + 1)
    return found, False


@functools.cache
def release(top):
    """The installed release of the distribution named ``top`` (``2.15.0`` for ``2.15.0+cu132``); None if unknown."""
    try:
        return Version(importlib.metadata.version(top)).base_version
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return None


def applies(claim):
    """(True, None) when the pointer applies to the installed release of its package (always, without ``versions``);
    (False, why) when it is for other releases; raises ValueError on a ``versions`` that is no specifier."""
    spec = claim.get("versions")
    if spec is None:
        return True, None
    if not isinstance(spec, str):
        raise ValueError(f"versions {spec!r} is not a string: write it as \"<2.15\" or \">=2.14\"")
    try:
        specifier = SpecifierSet(spec)
    except InvalidSpecifier:
        raise ValueError(f"versions {spec!r} is not a version specifier (write it as \"<2.15\" or \">=2.14\")")
    if not spec.strip():
        raise ValueError("versions is empty: leave the field out for a pointer that holds on every release")
    top = library(claim)
    got = release(top)
    if got is None:
        raise ValueError(f"versions {spec!r} given, but the release of {top!r} cannot be read (is it installed?)")
    if specifier.contains(got, prereleases=True):
        return True, None
    return False, f"for {top} {spec}; {top} {got} is installed"


def check(nb, claim):
    """None when the pointer holds; ("skip", reason) for an absent optional package; ("other", reason) for a pointer
    whose ``versions`` leave out the installed release; else ("broken", what broke)."""
    missing = [f for f in FIELDS if not isinstance(claim.get(f), str) or not claim.get(f).strip()]
    if missing:
        return "broken", f"pointer lacks {', '.join(missing)}"
    unknown = sorted(set(claim) - set(FIELDS) - set(OPTIONAL_FIELDS))
    if unknown:
        return "broken", (f"pointer has unknown field(s) {', '.join(unknown)} "
                          f"(fields: {', '.join(FIELDS + OPTIONAL_FIELDS)})")
    cells = {c.get("id"): c for c in nb["cells"]}
    if claim["cell"] not in cells:
        return "broken", f"no cell with id {claim['cell']!r}"
    if squash(claim["says"]) not in squash(source(cells[claim["cell"]])):
        return "broken", "the quote is not in the cell (the sentence changed: re-check the claim, then the quote)"
    top = library(claim)
    root = package_root(top)
    if root is None:
        if top in OPTIONAL:
            return "skip", f"{top} is not installed (the {OPTIONAL[top]!r} extra)"
        return "broken", f"package {top!r} is not installed"
    try:
        ok, why = applies(claim)
    except ValueError as e:
        return "broken", str(e)
    if not ok:
        return "other", why
    path = root / claim["file"]
    if not path.is_file():
        return "broken", f"{claim['file']} is gone from {top}"
    if token_count(claim["code"]) < 2:
        return "broken", f"code {claim['code']!r} is a bare name or one token: quote the code that makes it true"
    found, in_code = find_in_code(path, claim["code"])
    if not found:
        return "broken", f"code {claim['code']!r} is gone from {claim['file']}"
    if not in_code:
        return "broken", f"code {claim['code']!r} is only in a comment or a string/docstring of {claim['file']}"
    return None


def library(claim):
    return claim.get("file", "?").split("/")[0].removesuffix(".py")


def run(paths=None):
    """Checks every pointer of every notebook and lab: a dict with the counts, the broken and skipped pointers and the
    lessons to re-read."""
    result = {"pointers": 0, "per_library": Counter(), "broken": [], "skipped": [], "other_versions": [],
              "reread": []}
    for path in paths or notebooks():
        nb = load(path)
        applying = Counter()  # (cell, says) -> pointers that apply to the installed releases
        other = {}  # (cell, says) -> the entries of its pointers for other releases
        for claim in claims_of(nb):
            result["pointers"] += 1
            result["per_library"][library(claim)] += 1
            verdict = check(nb, claim)
            entry = {"notebook": key(path), "says": claim.get("says"), "file": claim.get("file"),
                     "code": claim.get("code"), "versions": claim.get("versions")}
            claim_key = (claim.get("cell"), claim.get("says"))
            if verdict is None:
                applying[claim_key] += 1
                continue
            kind, why = verdict
            entry["why"] = why
            if kind == "other":
                other.setdefault(claim_key, []).append(entry)
                result["other_versions"].append(entry)
                continue
            applying[claim_key] += 1  # broken or skipped: reported as such, not again as uncovered
            result["broken" if kind == "broken" else "skipped"].append(entry)
        for claim_key, entries in other.items():
            if not applying[claim_key]:
                result["broken"].append({**entries[0], "why": "no pointer applies to the installed release ("
                                         + "; ".join(e["why"] for e in entries)
                                         + "): is the claim still true? add a pointer with versions for this one"})
    result["reread"] = sorted({b["notebook"] for b in result["broken"]})
    result["per_library"] = dict(sorted(result["per_library"].items()))
    return result


def report(result, out=None):
    out = out or sys.stdout
    for b in result["broken"]:
        print(f"BROKEN {b['notebook']}: \"{b['says']}\"\n    {b['file']}: {b['why']}", file=out)
    for s in result["skipped"]:
        print(f"skipped {s['notebook']}: \"{s['says']}\" ({s['why']})", file=out)
    for o in result["other_versions"]:
        print(f"not checked {o['notebook']}: \"{o['says']}\" ({o['why']})", file=out)
    per = ", ".join(f"{lib} {n}" for lib, n in result["per_library"].items())
    print(f"{result['pointers']} pointers ({per}); {len(result['broken'])} broken, {len(result['skipped'])} skipped, "
          f"{len(result['other_versions'])} for other releases", file=out)
    if result["reread"]:
        print("lessons to re-read: " + ", ".join(result["reread"]), file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", metavar="FILE", help="write the result as JSON")
    args = parser.parse_args(argv)
    result = run()
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 1 if result["broken"] else 0


if __name__ == "__main__":
    sys.exit(main())
