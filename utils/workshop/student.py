"""The student release: the course as learners get it, with no reference solution anywhere (``make student``).

A teacher's checkout holds the labs' reference solutions (``labs/solutions/``) and a ``USE_REFERENCE`` parameter in
every lab that makes the lab grade them. This module writes an nbgrader course directory (its layout, so that a
teacher who knows nbgrader finds what they expect) into ``build/student/``:

- ``source/``: the teacher's version of the course: each lab's reference lines marked with nbgrader's
  ``### BEGIN SOLUTION`` / ``### END SOLUTION``, ``labs/solutions/`` present;
- ``release/``: the course as learners get it, made from ``source/`` by nbgrader's ``generate_assignment`` (or,
  without nbgrader, by ``clear_solutions`` here, the same rule): every marked region gone, ``labs/solutions/`` left
  out. Copy this folder to a hub or a repository; ``make lab`` and ``make test`` work inside it;
- ``submitted/``, ``autograded/``, ``feedback/``: empty, for nbgrader's collect, autograde and feedback steps.

nbgrader processes the notebooks of ``source/<assignment>/`` only, no deeper, so each folder of the course that
holds notebooks is an assignment of its own (``labs``, ``notebooks``), and the rest of the course (``utils/``,
``tests/``, the Makefile) sits beside them in ``source/`` and ``release/``. What is a solution is found, not
listed: every ``labs/*.ipynb``, each line that sets ``USE_REFERENCE`` and each ``if USE_REFERENCE:`` block, and the
``labs/solutions/`` folder. ``leaks`` then searches the whole release for what must not be there, and the build
fails naming it. The release's ``tests/`` runs every lesson and checks that each lab's checker answers the
unmodified stubs with "not written yet" (``utils/workshop/student_suite.py``).

    python -m utils.workshop.student [--out build/student] [--engine auto|nbgrader|builtin]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import student_files
from .student_files import FLAG, SOLUTIONS

__all__ = ["assignments", "build_release", "clear_solutions", "leaks", "mark_solutions"]

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"  # nbgrader's markers (ClearSolutions)
REMOVED = "### SOLUTION REMOVED"  # what nbgrader puts in a region's place (its code_stub); _tidy deletes the line
# What the release needs: lessons, labs, the package (less the teachers' own tools), set-up files, its tests.
FOLDERS = ("notebooks", "labs", "utils")
FILES = ("README.md", "Makefile", "pyproject.toml", "environment.yml", ".gitignore", ".gitattributes",
         "data/README.md", "tests/conftest.py", "utils/course/__init__.py", "utils/course/notebook_runner.py",
         "utils/course/run_minutes.json", "utils/course/lab_overrides.json")
SKIP = {"__pycache__", ".ipynb_checkpoints", "workshop"}  # utils/workshop: this module and the other teachers' tools
TOOLS = "utils/course"  # the maintainers' tools: the release keeps only those its tests run and `make setup` installs (FILES)
SUITE = "utils/workshop/student_suite.py"  # the release's own tests, written as tests/test_course.py
NOT_THERE = re.compile(rf"{FLAG}|\b(from|import)\s+{SOLUTIONS}\b|labs/{SOLUTIONS}/\w+\.py")


# ------------------------------------------------------------------ notebooks: mark, then clear

def _source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _solution_lines(lines):
    """Indices of the lines that belong to the reference: ``USE_REFERENCE = ...`` and ``if USE_REFERENCE:`` blocks."""
    marked, i = set(), 0
    while i < len(lines):
        line = lines[i]
        if re.match(rf"\s*{FLAG}\s*=", line):
            marked.add(i)
        elif re.match(rf"(\s*)if {FLAG}\b.*:", line):
            indent = len(line) - len(line.lstrip())
            marked.add(i)
            while i + 1 < len(lines) and (not lines[i + 1].strip() or
                                          len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent):
                i += 1
                marked.add(i)
            while max(marked) > 0 and not lines[max(marked)].strip():  # blank lines after the block stay
                marked.discard(max(marked))
        i += 1
    return marked


def mark_solutions(nb):
    """A lab as nbgrader's source: the reference lines wrapped in BEGIN/END SOLUTION markers. Returns regions marked."""
    regions = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "code" or FLAG not in _source(cell):
            continue
        lines, out = _source(cell).split("\n"), []
        marked = _solution_lines(lines)
        for i, line in enumerate(lines):
            if i in marked and i - 1 not in marked:
                out.append(line[:len(line) - len(line.lstrip())] + BEGIN)
                regions += 1
            out.append(line)
            if i in marked and i + 1 not in marked:
                out.append(line[:len(line) - len(line.lstrip())] + END)
        cell["source"] = "\n".join(out)
    return regions


def clear_solutions(nb):
    """What nbgrader's ClearSolutions does with an empty stub: each marked region removed; then every code cell
    left empty removed, and outputs cleared."""
    cells = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and BEGIN in _source(cell):
            keep, inside = [], False
            for line in _source(cell).split("\n"):
                if line.strip() in (BEGIN, END):
                    inside = line.strip() == BEGIN
                    continue
                if not inside:
                    keep.append(line)
            cell["source"] = "\n".join(keep).strip("\n")
            if not cell["source"].strip():
                continue
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
        cells.append(cell)
    nb["cells"] = cells
    return nb


def _tidy(nb):
    """After nbgrader: delete the lines it put where the regions were, the code cells left empty, and its per-cell
    ``nbgrader`` metadata."""
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and REMOVED in _source(cell):
            cell["source"] = "\n".join(l for l in _source(cell).split("\n") if l.strip() != REMOVED).strip("\n")
    nb["cells"] = [c for c in nb["cells"] if c["cell_type"] != "code" or _source(c).strip()]
    for cell in nb["cells"]:
        cell.get("metadata", {}).pop("nbgrader", None)
    return nb


# ------------------------------------------------------------------ the course directory

def _write(path, nb):
    path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")  # as nbformat writes


def _copy_course(dest):
    """source/: the course files the release needs, labs/solutions/ included (the release leaves it out)."""
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT)
            if path.is_file() and not SKIP & set(rel.parts) and path.suffix not in (".pyc",) \
                    and rel.parent.as_posix() != TOOLS:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest / rel)
    for name in FILES:
        if (ROOT / name).exists():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    makefile = student_files.release_makefile((ROOT / "Makefile").read_text())
    (dest / "Makefile").write_text(makefile)
    for readme in ("README.md", "labs/README.md"):
        text = (ROOT / readme).read_text()
        (dest / readme).write_text(student_files.release_readme(text, student_files.targets(makefile)))
    runner = dest / TOOLS / "notebook_runner.py"
    runner.write_text(student_files.release_runner(runner.read_text()))
    shutil.copy2(ROOT / SUITE, dest / "tests" / "test_course.py")
    regions = 0
    for path in sorted(dest.rglob("*.ipynb")):  # the labs hold them; a lesson that did would be marked too
        nb = json.loads(path.read_text())
        notes = nb.get("metadata", {}).get("course", {}).pop("teaching", None)  # the teacher's notes stay home
        found = mark_solutions(nb)
        regions += found
        if found or notes is not None:
            _write(path, nb)
    return regions


def assignments(source):
    """nbgrader's assignments: the folders of the course that hold notebooks (``labs``, ``notebooks``)."""
    return sorted({p.parent.name for p in source.glob("*/*.ipynb")})


def _release_builtin(source, release):
    shutil.copytree(source, release, ignore=shutil.ignore_patterns(SOLUTIONS, *SKIP), dirs_exist_ok=True)
    for path in sorted(release.rglob("*.ipynb")):
        _write(path, clear_solutions(json.loads(path.read_text())))


NBGRADER_CONFIG = f'''c = get_config()  # noqa: F821  (nbgrader's config file; written by utils/workshop/student.py)
c.CourseDirectory.course_id = "distributed-course"
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "{SOLUTIONS}", "feedback"]
c.ClearSolutions.code_stub = {{"python": "{REMOVED}"}}  # a line in the region's place, deleted afterwards
c.ClearSolutions.enforce_metadata = False  # our labs mark regions, not nbgrader solution cells
'''


def _release_nbgrader(course_dir, source, release):
    """generate_assignment for each assignment; the rest of the course copied beside them, as it is."""
    names = assignments(source)
    for path in source.iterdir():
        if path.name not in names:
            (shutil.copytree(path, release / path.name, ignore=shutil.ignore_patterns(SOLUTIONS, *SKIP))
             if path.is_dir() else shutil.copy2(path, release / path.name))
    (course_dir / "nbgrader_config.py").write_text(NBGRADER_CONFIG)
    # nbgrader migrates its gradebook with the `alembic` command: it must be on PATH, beside this Python
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    for name in names:
        done = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", name, "--force",
                               "--log-level=WARN"], cwd=course_dir, env=env, capture_output=True, text=True,
                              timeout=600)
        if done.returncode:
            raise RuntimeError(f"nbgrader generate_assignment {name} failed ({done.returncode}):\n"
                               f"{done.stderr[-3000:]}")
    for path in sorted(release.rglob("*.ipynb")):
        _write(path, _tidy(json.loads(path.read_text())))


def leaks(release):
    """What must not be in a student release: a solutions folder, the reference flag or an import of a solution."""
    found = [f"{p.relative_to(release)}: a reference-solution folder" for p in release.rglob(SOLUTIONS) if p.is_dir()]
    for path in sorted(p for p in release.rglob("*") if p.is_file() and p.suffix in (".py", ".ipynb", ".md", ".toml",
                                                                                         ".yml", ".json", "")):
        for n, line in enumerate(path.read_text(errors="replace").split("\n"), 1):
            if NOT_THERE.search(line):
                found.append(f"{path.relative_to(release)}:{n}: {line.strip()[:120]}")
    return found


def _has_nbgrader():
    import importlib.util

    return importlib.util.find_spec("nbgrader") is not None


def build_release(out=ROOT / "build" / "student", engine="auto"):
    """Write the course directory into ``out``; return a summary dict. Raises if anything leaks into the release."""
    start, out = time.perf_counter(), Path(out)
    engine = ("nbgrader" if _has_nbgrader() else "builtin") if engine == "auto" else engine
    if out.exists():
        shutil.rmtree(out)
    source, release = out / "source", out / "release"
    for folder in ("source", "release", "submitted", "autograded", "feedback"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    regions = _copy_course(source)
    (_release_nbgrader(out, source, release) if engine == "nbgrader" else _release_builtin(source, release))
    if found := leaks(release):
        raise RuntimeError(f"the student release in {release} still holds {len(found)} piece(s) of the reference "
                           "solutions; mark them for removal in utils/workshop/student.py:\n  " + "\n  ".join(found))
    files = [p for p in release.rglob("*") if p.is_file()]
    return dict(release=release, engine=engine, regions=regions, files=len(files),
                notebooks=sum(p.suffix == ".ipynb" for p in files), labs=len(list((release / "labs").glob("*.ipynb"))),
                bytes=sum(p.stat().st_size for p in files), seconds=time.perf_counter() - start)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Write the student release (no reference solutions).")
    parser.add_argument("--out", default=str(ROOT / "build" / "student"), help="the nbgrader course directory")
    parser.add_argument("--engine", choices=("auto", "nbgrader", "builtin"), default="auto",
                        help="nbgrader's generate_assignment (auto: when installed) or this module's clear_solutions")
    args = parser.parse_args(argv)
    s = build_release(args.out, args.engine)
    print(f"student release ({s['engine']}): {s['release']}\n  {s['files']} files, {s['bytes'] / 1e6:.1f} MB, "
          f"{s['notebooks']} notebooks of which {s['labs']} labs; {s['regions']} solution regions removed; "
          f"no reference solution left; {s['seconds']:.1f} s\n  copy that folder to a hub or a repository: "
          "`make lab` opens it, `make test` runs every lesson and checks every lab's stubs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
