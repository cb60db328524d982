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
