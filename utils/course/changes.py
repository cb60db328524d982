"""Which notebooks a change touches, for ``make test-quick`` (``pytest --changed-since=REV``).

A notebook is touched when the change edits it, its lab's reference solution (``labs/solutions/``), a script of
``notebooks/scripts/`` it names, or a ``utils`` module it imports, directly or through other ``utils`` modules (read
statically with ``ast``: ``from utils.x import y``, ``import utils.x``, ``utils.x.y`` in code). The change is what
``git diff --name-only REV`` lists, plus the files git does not track yet (none for a range ``A..B``). A change to
the test machinery itself (``utils/course/notebook_runner.py``, ``tests/conftest.py``, ``pyproject.toml``) touches
every notebook. ``python -m utils.course.shown_source --changed`` reads the same change for the utils source that
lessons print.
"""

import ast
import functools
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVERYTHING = {"utils/course/notebook_runner.py", "tests/conftest.py", "pyproject.toml", "utils/__init__.py",
              "utils/launch/server.py"}  # the rank server: started by name (python -m), so no import shows it


def changed_files(rev):
    """Paths (relative, posix) changed since ``rev`` in the working tree, untracked ones included."""
    def git(*args):
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise ValueError(f"git {' '.join(args)} failed: {done.stderr.strip()} (is {rev!r} a commit?)")
        return done.stdout.split("\n")
    untracked = [] if ".." in rev else git("ls-files", "--others", "--exclude-standard")  # A..B: two commits
    return {f for f in git("diff", "--name-only", rev) + untracked if f}


def text_at(rev, path):
    """The text of ``path`` (relative, posix) in commit ``rev``, or None where that commit has no such file."""
    done = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode == 0:
        return done.stdout
    if subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=ROOT,
                      capture_output=True).returncode != 0:
        raise ValueError(f"{rev!r} is not a commit")
    return None


def _module_file(name):
    """utils.comm.ledger -> utils/comm/ledger.py (or its package's __init__.py); None if it is not a file here."""
    path = ROOT / Path(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate.relative_to(ROOT).as_posix()
    return None


def _imported_utils(code, package="utils", dotted=False):
    """The utils modules a piece of source imports (absolute or relative to ``package``), as dotted names; with
    ``dotted``, also those it names as ``utils.x.y`` (a notebook's ``utils.comm.compat.all_to_all(...)``)."""
    names = set()
    try:
        tree = ast.parse(code)
    except SyntaxError:  # a notebook cell with IPython syntax (%%ranks, !pip): read the dotted names only
        tree = None
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.split(".")[0] == "utils"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] == "utils":
                names.add(base)
                names |= {f"{base}.{a.name}" for a in node.names}  # `from utils.comm import ledger`: a module
    if dotted or tree is None:
        names |= set(re.findall(r"(?<![\w.])(utils(?:\.\w+)+)", code))
    found = set()
    for name in names:  # utils.comm.ledger.CommLedger -> the longest prefix that is a module file
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            if _module_file(".".join(parts[:end])):
                found.add(".".join(parts[:end]))
                break
    return found


@functools.cache
def utils_closure(module):
    """``module`` and every utils module it imports, transitively, as file paths."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None or path in seen:
            continue
        seen.add(path)
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        todo += sorted(_imported_utils((ROOT / path).read_text(), package))
        parent = name.rpartition(".")[0]  # importing utils.comm.ledger runs utils/comm/__init__.py first
        if parent:
            todo.append(parent)
    return frozenset(seen)


def notebook_dependencies(path):
    """The files a notebook's run depends on: itself, its utils modules (transitively), its scripts, its solution."""
    path = Path(path)
    nb = json.loads(path.read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    deps = {path.relative_to(ROOT).as_posix()}
    for module in _imported_utils(code, dotted=True):
        deps |= utils_closure(module)
    for script in set(re.findall(r"(\d\d\w*\.py)", code)):
        if (ROOT / "notebooks" / "scripts" / script).is_file():
            deps.add(f"notebooks/scripts/{script}")
            deps |= {d for m in _imported_utils((ROOT / "notebooks" / "scripts" / script).read_text())
                     for d in utils_closure(m)}
    for solution in set(re.findall(r"from solutions\.(\w+) import", code)):
        deps.add(f"labs/solutions/{solution}.py")
    return deps


def touched(paths, rev):
    """The notebooks of ``paths`` that the change since ``rev`` touches."""
    changed = changed_files(rev)
    if changed & EVERYTHING:
        return list(paths)
    return [p for p in paths if notebook_dependencies(p) & changed]
