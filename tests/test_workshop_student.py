"""``make student`` (utils/workshop/student.py): the course as learners get it holds no reference solution, keeps
every lab with its stubs, and its own tests answer a lab's stubs with "not written yet".

Built into a temporary folder with the module's own clearing (``engine="builtin"``): nbgrader is the ``[teacher]``
extra, which ``make setup`` does not install; where it is installed, a slow test checks that it makes the same
release. Running every lesson inside the release is the release's own ``make test``, not this suite's.
"""

import json
import re
import subprocess
import sys

import pytest
from utils.course.notebook_runner import ROOT, kernel_env
from utils.workshop import student
from utils.workshop.student_files import FLAG, SOLUTIONS, targets

LABS = sorted(p.name for p in (ROOT / "labs").glob("*.ipynb"))  # found, as the builder finds them
DIAGNOSES_LINE = re.compile(r"\s*diagnosis_\w+(, diagnosis_\w+)* = \(DIAGNOSES")  # labs 11: set from the reference


def code_lines(path):
    return [line for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"
            for line in "".join(c["source"]).split("\n")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return student.build_release(tmp_path_factory.mktemp("student"), engine="builtin")


def test_nbgraders_layout(built):
    course = built["release"].parent
    assert sorted(p.name for p in course.iterdir()) == ["autograded", "feedback", "release", "source", "submitted"]
    assert student.assignments(course / "source") == ["labs", "notebooks"]
    assert (course / "source" / "labs" / SOLUTIONS).is_dir(), "the teacher's source keeps the solutions"
    assert built["labs"] == len(LABS) and built["regions"] >= 2 * len(LABS)  # each lab: its flag and its import


def test_no_reference_solution_anywhere(built):
    release = built["release"]
    assert not [p for p in release.rglob("*") if p.name == SOLUTIONS], "a solutions folder in the release"
    assert student.leaks(release) == []
    text = "\n".join(p.read_text(errors="replace") for p in release.rglob("*") if p.is_file())
    assert FLAG not in text
    assert not re.search(rf"\b(from|import)\s+{SOLUTIONS}\b", text), "an import of a reference solution"
    keys = sorted((ROOT / "labs" / SOLUTIONS / "keys").glob("*.md"))
    assert keys, "no instructor key to look for"
    for key in keys:  # no line of an instructor key long enough to be an answer is in the release
        for line in key.read_text().splitlines():
            assert len(line) <= 60 or line not in text, f"{key.name}'s answer is in the release: {line[:80]}"
    notes = [p.name for p in release.rglob("*.ipynb") if "teaching" in json.loads(p.read_text())["metadata"].get(
        "course", {})]
    assert notes == [], "the teacher's notes (metadata.course.teaching) stay out of the release"
    assert not (release / "utils" / "workshop").exists(), "the teachers' tools stay with the teachers"
    kept = sorted(p.name for p in (release / "utils" / "course").iterdir() if p.is_file())
    assert kept == ["__init__.py", "lab_overrides.json", "notebook_runner.py", "run_minutes.json"], \
        "of the maintainers' tools, the runner, and the JupyterLab settings that `make setup` installs"


def test_every_lab_is_there_with_its_stubs_and_only_the_reference_lines_are_gone(built):
    release = built["release"]
    assert sorted(p.name for p in (release / "labs").glob("*.ipynb")) == LABS
    for name in LABS:
        before, after = code_lines(ROOT / "labs" / name), code_lines(release / "labs" / name)
        gone = [line for line in before if line not in after]
        assert gone and all(FLAG in line or SOLUTIONS in line or DIAGNOSES_LINE.match(line) for line in gone), (name, gone)
        for marker in ("## YOUR CODE", "raise NotImplementedError("):
            assert sum(marker in line for line in after) == sum(marker in line for line in before) > 0, (name, marker)


def test_the_cheatsheet_is_there_as_it_is(built):
    """notebooks/cheatsheet.md, the learners' page of formulas, travels with the lessons, unchanged."""
    cheatsheet = "notebooks/cheatsheet.md"
    assert (built["release"] / cheatsheet).read_text() == (ROOT / cheatsheet).read_text()
    assert f"]({cheatsheet})" in (built["release"] / "README.md").read_text(), "the README's course map links it"


def test_a_planted_leak_stops_the_build(tmp_path):
    (tmp_path / "labs").mkdir()
    (tmp_path / "labs" / "helper.py").write_text(f"from {SOLUTIONS}.zero import make_buckets\n")
    (tmp_path / SOLUTIONS).mkdir()
    found = student.leaks(tmp_path)
    assert len(found) == 2 and any("helper.py:1" in f for f in found), found


def test_the_readme_commands_work_there(built):
    release = built["release"]
    makefile, readme = (release / "Makefile").read_text(), (release / "README.md").read_text()
    have = targets(makefile)
    assert {"setup", "lab", "test"} <= have and "student" not in have
    quick = readme.split("## Quick start")[1].split("\n## ")[0]
    assert "make lab " in quick and "make test " in quick and "make test` runs every lesson" in quick
    named = {w for cmd in re.findall(r"`make ([^`]*)`", readme) for w in cmd.split() if "=" not in w}
    assert named <= have, f"the release's README names make targets its Makefile lacks: {sorted(named - have)}"
    assert "Teaching a workshop" not in readme and "## Teaching a workshop" in (ROOT / "README.md").read_text()
    assert "TEACHING.md" not in readme and "make student" not in readme
    dry = subprocess.run(["make", "-n", "lab", "test"], cwd=release, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and "pytest" in dry.stdout and "jupyter lab" in dry.stdout, dry.stderr


@pytest.mark.notebook
def test_the_releases_own_test_answers_a_labs_stubs(built):
    """The release's tests/test_course.py on lab 06 (the quickest lab): its checker answers the unwritten stub."""
    release = built["release"]
    lab = next(p.stem for p in (release / "labs").glob("06_*.ipynb"))
    env = dict(kernel_env(), PYTHONPATH=str(release))  # the release's own utils, before the installed course's
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_course.py",
                           "-k", lab], cwd=release, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_nbgrader_makes_the_same_release(built, tmp_path):
    pytest.importorskip("nbgrader", reason="nbgrader is the [teacher] extra: `make student` installs it")
    other = student.build_release(tmp_path, engine="nbgrader")["release"]
    for path in sorted(p for p in built["release"].rglob("*") if p.is_file()):
        twin = other / path.relative_to(built["release"])
        if path.suffix == ".ipynb":
            a, b = (json.loads(p.read_text()) for p in (path, twin))
            assert [("".join(c["source"]), c["cell_type"]) for c in a["cells"]] == \
                   [("".join(c["source"]), c["cell_type"]) for c in b["cells"]], path.name
        else:
            assert path.read_bytes() == twin.read_bytes(), path


# ------------------------------------------------------------------ an answer's logic, renamed (issue 37, part 1)
# What the release still carries of the answers' logic, as utils/workshop/logic_leaks.py finds it: each is known and
# named, so that a new one fails this test, and so does one that is gone (take it off the list). Only idioms are
# left: a line any such code has, not the answer. A checker or utils module that carried an answer's own steps is a
# failure (issue 37, part 1: that logic lives on the teacher's side, make grade, and the release judges by results).
IDIOM = "a common idiom, not the answer"
KNOWN_LOGIC = {
    ("ddp.py", "BucketedDDP", "notebooks/08a_lightning_strategies.ipynb"): IDIOM,  # [*params, *buffers]
    ("zero.py", "BucketedZeRO2", "utils/checkers/zero_reference.py"): IDIOM,  # torch.cat([p.detach().reshape(-1) ...
    ("plan_3d.py", "divisors", "utils/pipeline/schedules.py"): IDIOM,  # a batch's divisors, named in an error
    ("plan_3d.py", "choose_plan", "utils/planner/estimate.py"): IDIOM,  # the planner's own search space (lesson 09b)
    ("ring_attention.py", "block_backward", "utils/context_parallel/ring.py"): IDIOM,  # the scores q k^T / sqrt(d)
}


def _logic_key(leak):
    answer_file, rest = leak.answer.split(":", 1)
    return answer_file.split("/")[-1], rest.split("(")[-1].rstrip(")"), re.split(r"[:,]", leak.found_in)[0]


def test_the_release_carries_no_answer_logic_but_the_known(built):
    from utils.checkers.labs import LABS
    from utils.workshop import logic_leaks

    found = {}
    for leak in logic_leaks.find(built["release"], ROOT / "labs" / SOLUTIONS, LABS):
        found.setdefault(_logic_key(leak), []).append(str(leak))
    new = {k: v for k, v in found.items() if k not in KNOWN_LOGIC}
    assert not new, "an answer's logic in the release:\n" + "\n".join(line for v in new.values() for line in v)
    gone = sorted(set(KNOWN_LOGIC) - set(found))
    assert not gone, f"no longer found (take them off KNOWN_LOGIC): {gone}"


def test_a_renamed_copy_of_an_answer_is_found(tmp_path):
    """The search is by shape: a copy with every name changed, in a module of its own, is found; so is a formula."""
    import ast

    from utils.checkers.labs import LABS
    from utils.workshop import logic_leaks

    source = (ROOT / "labs" / SOLUTIONS / "halving_doubling.py").read_text()
    tree = ast.parse(source)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {a.arg for a in ast.walk(tree)
                                                                          if isinstance(a, ast.arg)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in names:
            node.id = f"renamed_{node.id}"
        elif isinstance(node, ast.arg):
            node.arg = f"renamed_{node.arg}"
        elif isinstance(node, ast.FunctionDef):
            node.name = f"my_{node.name}"
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "helpers.py").write_text(ast.unparse(tree))
    found = logic_leaks.find(tmp_path, ROOT / "labs" / SOLUTIONS, {k: v for k, v in LABS.items() if k.startswith("01")})
    assert {leak.answer.split("(")[-1] for leak in found} >= {"halving_reduce_scatter)", "doubling_all_gather)",
                                                             "halving_doubling_all_reduce)"}
    (tmp_path / "utils" / "helpers.py").write_text("def f(x, y):\n    return x + y\n")
    assert logic_leaks.find(tmp_path, ROOT / "labs" / SOLUTIONS, LABS) == []
