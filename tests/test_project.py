"""House rules that keep the course working: one dependency list, clean notebooks, the layout."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from utils.course.notebook_runner import ROOT, course_notebooks


def _normalise(requirement):
    """'Foo_Bar == 1.0' -> 'foo-bar==1.0' (PEP 503 names, no spaces)."""
    name, spec = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(.*)", requirement).groups()
    return re.sub(r"[-_.]+", "-", name).lower() + spec.replace(" ", "")


def test_environment_yml_matches_pyproject():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = lines.index("  - pip:")
    conda_pip = [line.strip()[2:] for line in lines[start + 1:] if line.strip().startswith("- ")]
    conda_pip = [r for r in conda_pip if not r.startswith("-")]  # "--editable ." installs the course itself
    assert sorted(map(_normalise, conda_pip)) == sorted(map(_normalise, pyproject)), (
        "environment.yml and pyproject.toml list different dependencies: change both together")


def test_torch_is_pinned_exactly():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch==2.13.0" in deps, "a loose torch pin pulls a newer CUDA build (gigabytes)"


def _make(*args, **env):
    """``make ARGS`` in the repository, as from a shell: no MAKEFLAGS from a ``make test SYSTEM_TORCH=1`` around us."""
    clean = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", *args], cwd=ROOT, capture_output=True, text=True, env={**clean, **env})


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_system_torch_option(tmp_path):
    """README: `make ... SYSTEM_TORCH=1` keeps the system's torch, and refuses one outside 2.11-2.15
    (utils/torch_versions.py): 2.10 and 2.16 refused, before anything is made; 2.11.0 and 2.15.0 kept."""
    venv = tmp_path / "venv"
    plain = _make("-n", "setup", f"VENV={venv}").stdout
    keep = _make("-n", "setup", "SYSTEM_TORCH=1", f"VENV={venv}").stdout
    for flag in ("--system-site-packages", "--constraint", "--no-deps"):
        assert flag in keep and flag not in plain, flag
    for version in ("2.10.0", "2.16.0", "2.11.0", "2.15.0+cu130"):
        site = tmp_path / version
        fake = site / f"torch-{version}.dist-info"  # a torch that only importlib.metadata can see
        fake.mkdir(parents=True)
        (fake / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        if version in ("2.10.0", "2.16.0"):
            run = _make("-s", "setup", "SYSTEM_TORCH=1", f"VENV={venv}", f"PYTHON={sys.executable}",
                        PYTHONPATH=str(site))
            assert run.returncode != 0, run.stdout
            assert "runs on torch 2.11 to 2.15" in run.stderr and f"has torch {version}" in run.stderr, run.stderr
            assert not venv.exists(), "refused before creating anything"
        else:  # the Makefile's own check, run as set-up runs it (make setup would go on to install)
            pin = _make("-s", "--eval", "print-pin: ; @$(PYTHON) -c \"$$SYSTEM_TORCH_PIN\"", "print-pin",
                        f"PYTHON={sys.executable}", PYTHONPATH=str(site))
            assert pin.returncode == 0 and pin.stdout.strip() == f"torch=={version}", pin.stderr


def _tracked_notebooks():
    out = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True, text=True)
    tracked = [ROOT / p for p in out.stdout.split()] if out.returncode == 0 else []
    tracked = [p for p in tracked if p.exists()]  # a notebook deleted or renamed but not yet committed is not one
    return sorted(set(tracked) | set(course_notebooks()))  # about to be committed counts too


def test_setup_removes_the_slow_iri_checker():
    """`make setup` uninstalls rfc3987-syntax (the Makefile says why): in the .venv it made, it cannot be imported,
    so jsonschema (under nbformat) builds no grammar. Elsewhere (another environment, or one that sees the system's
    packages, where pip leaves the system's copy alone) this says so and skips."""
    import importlib.util

    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip(f"{sys.prefix} is not the .venv that `make setup` makes")
    spec = importlib.util.find_spec("rfc3987_syntax")
    if spec is not None and not Path(spec.origin).resolve().is_relative_to(Path(sys.prefix).resolve()):
        pytest.skip(f"rfc3987_syntax comes from outside .venv ({spec.origin}): pip does not remove it from there")
    assert spec is None, f"rfc3987-syntax is installed in {sys.prefix} ({spec.origin}): `make setup` removes it"


@pytest.mark.parametrize("path", _tracked_notebooks(), ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path):
    cells = json.loads(path.read_text())["cells"]
    dirty = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and (c["outputs"] or c["execution_count"])]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; run `make strip` before committing"


@pytest.mark.parametrize("path", course_notebooks(), ids=lambda p: p.name)
def test_notebook_has_parameters_cell(path):
    cells = json.loads(path.read_text())["cells"]
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: needs exactly one cell tagged 'parameters' (papermill injects there)"
    source = "".join(tagged[0]["source"])
    for knob in ("SMOKE", "WORLD_SIZE"):
        assert re.search(rf"^{knob}\s*=", source, re.M), f"{path.name}: parameters cell lacks {knob}"


OUTPUT_WIDGETS = re.compile(r"\binteract(ive|ive_output)?\(|widgets\.Output\(")


@pytest.mark.parametrize("path", course_notebooks(), ids=lambda p: p.name)
def test_notebook_has_no_output_widget(path):
    """papermill's client plays front end for Output widgets (interact, interactive_output) and can deadlock
    on them: the kernel idles and the run hangs until its timeout (nbclient#312; seen here on notebook 03).
    Update an HTML, Label or Image widget from an ``observe`` callback instead."""
    code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
    found = OUTPUT_WIDGETS.search(code)
    assert not found, f"{path.name} uses {found.group(0)!r}: an Output widget can hang papermill (see the docstring)"


# The cells that may read a clock themselves, and why: stopwatch / measure time an interval on one process, these
# need a timestamp every process reads alike, or an interval that spans cells.
CLOCK_CELLS = {
    ("01a_point_to_point_and_collectives.ipynb", "3fa1a396"): "time.time(): ranks' arrivals on one shared clock",
    ("05a_tensor_parallelism.ipynb", "b0ca445b"): "time.time(): timeline stamps, one clock for all ranks",
    ("05a_tensor_parallelism.ipynb", "ff2a94e2"): "time.time(): busy intervals of every rank, one timeline",
    ("05a_tensor_parallelism.ipynb", "5fc9f78c"): "time.time(): a run's start and end on the timeline",
    ("07a_deepspeed_config.ipynb", "16f1c97a"): "time.monotonic(): the first DeepSpeed cells' time, across cells",
    ("07a_deepspeed_config.ipynb", "7fb5115e"): "time.monotonic(): ... read in the launch cell, four cells below",
    ("11a_failures_and_resume.ipynb", "fa0fd0a2"): "time.monotonic(): how long a restart has stalled, polled",
}
OWN_TIMER = re.compile(r"\bperf_counter(_ns)?\b|\bdefault_timer\b|%%?timeit?\b")
OWN_CLOCK = re.compile(r"\btime\.time(_ns)?\(|\bmonotonic\b|\bfrom time import\b")


@pytest.mark.parametrize("path", course_notebooks(), ids=lambda p: p.name)
def test_notebook_times_with_the_perf_home(path):
    """One timing home (issue 35): an interval is ``utils.perf.stopwatch``, steps are ``measure`` or
    ``best_seconds``; a wall clock read by hand only in the cells of ``CLOCK_CELLS``, which say why."""
    for c in json.loads(path.read_text())["cells"]:
        source = "".join(c["source"]) if c["cell_type"] == "code" else ""
        assert not OWN_TIMER.search(source), (
            f"{path.name}, cell {c.get('id')}: time.perf_counter in a cell; use utils.perf.stopwatch (one interval), "
            "measure (steps) or best_seconds (variants in turns)")
        if OWN_CLOCK.search(source):
            assert (path.name, c.get("id")) in CLOCK_CELLS, (
                f"{path.name}, cell {c.get('id')} reads time.time / time.monotonic: use utils.perf.stopwatch, or "
                "name the cell and the reason in CLOCK_CELLS (tests/test_project.py)")


def test_clock_cells_still_read_a_clock():
    """An allowed cell that no longer reads a clock (edited, or its id gone) leaves CLOCK_CELLS: no stale permit."""
    cells = {(path.name, c.get("id")): "".join(c["source"]) for path in course_notebooks()
             for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"}
    stale = [key for key in CLOCK_CELLS if not OWN_CLOCK.search(cells.get(key, ""))]
    assert not stale, f"CLOCK_CELLS names cells that read no clock (any more): {stale}; remove them"


@pytest.mark.parametrize("planted", ["t = time.perf_counter_ns()", "from timeit import default_timer",
                                     "%timeit f()", "t = time.time_ns()", "from time import time"])
def test_the_clock_guard_sees_other_spellings(planted):
    assert OWN_TIMER.search(planted) or OWN_CLOCK.search(planted), planted


def test_layout():
    for name in ("notebooks", "labs", "utils", "data", "tests", "environment.yml", "README.md",
                 "pyproject.toml", "Makefile", ".ci/run", ".gitignore"):
        assert (ROOT / name).exists(), f"{name} is missing from the layout the design fixes"
    assert course_notebooks(), "no notebook found: the suite would test nothing"


def _left_off_the_map(docstring, utils_dir):
    """The subpackages and top-level modules of ``utils_dir`` that the map (``utils/__init__.py``'s docstring) does
    not name as ``utils.NAME``."""
    parts = sorted({p.parent.name for p in utils_dir.glob("*/__init__.py")}
                   | {p.stem for p in utils_dir.glob("*.py") if p.stem != "__init__"})
    return [name for name in parts if not re.search(rf"``utils\.{name}``", docstring)]


def test_the_package_map_names_every_part_of_utils(tmp_path):
    """utils/__init__.py's docstring is the map a learner reads first: every subpackage and top-level module is on
    it (each package's own ``__init__`` lists its modules). Checked on a planted package missing from a copy too."""
    docstring = ast.get_docstring(ast.parse((ROOT / "utils" / "__init__.py").read_text()))
    missing = _left_off_the_map(docstring, ROOT / "utils")
    assert not missing, f"utils/__init__.py's map leaves out {missing}: add a line ``utils.NAME``: what it holds"
    (tmp_path / "newidea").mkdir()  # planted: a package and a module the map does not know
    (tmp_path / "newidea" / "__init__.py").write_text("")
    (tmp_path / "loose.py").write_text("")
    assert _left_off_the_map(docstring, tmp_path) == ["loose", "newidea"]
    assert _left_off_the_map(docstring.replace("``utils.models``", "models"), ROOT / "utils") == ["models"]


def _modules_left_off(package):
    """The modules of ``package`` (a folder with an ``__init__.py``) that its ``__init__``'s docstring does not name
    as ``name``."""
    import ast

    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    return [p.stem for p in sorted(package.glob("*.py"))
            if p.stem != "__init__" and not re.search(rf"``{p.stem}(\.py)?``", docstring)]


def test_every_package_lists_its_modules(tmp_path):
    """The map says each folder's ``__init__`` lists its modules: a module added to a package is named there, so
    a learner who opens the package finds it. Checked on a planted module missing from a copy too."""
    missing = {p.parent.name: _modules_left_off(p.parent) for p in sorted((ROOT / "utils").glob("*/__init__.py"))}
    missing = {name: mods for name, mods in missing.items() if mods}
    assert not missing, f"these packages' __init__ docstrings leave out modules: {missing}"
    (tmp_path / "__init__.py").write_text('"""``known``: named."""')
    (tmp_path / "known.py").write_text("")
    (tmp_path / "unknown.py").write_text("")
    assert _modules_left_off(tmp_path) == ["unknown"]


def _utils_imports(utils_dir):
    """{module: the modules of ``utils_dir`` it imports}, read with ``ast`` from every file, imports inside functions
    too (they run, later); ``from .x import name`` is the submodule ``x.name`` where there is one, else ``x``."""
    files = {}
    for path in utils_dir.rglob("*.py"):
        parts = path.relative_to(utils_dir.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def ours(name):  # the longest prefix of ``name`` that is one of our modules ('' for torch and the like)
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in files.items():
        package = (name if path.stem == "__init__" else name.rpartition(".")[0]).split(".")
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {ours(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: up from this module's package
                    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else ours(base) for a in node.names}
        graph[name] = found - {"", name}
    return graph


def _a_cycle(graph):
    """One cycle of ``graph`` as [a, b, ..., a], or None."""
    done, path = set(), []

    def visit(node):
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done and (cycle := visit(nxt)):
                return cycle
        done.add(path.pop())
        return None

    return next((cycle for start in sorted(graph) if start not in done and (cycle := visit(start))), None)


def _upward(graph):
    """{module: the packages above it that it imports}: ``from .. import x`` in utils/mesh/ reads utils/__init__."""
    found = {name: sorted(t for t in targets if name.startswith(t + ".")) for name, targets in graph.items()}
    return {name: above for name, above in found.items() if above}


def test_utils_is_layered_without_import_cycles(tmp_path):
    """STYLE.md's layers: no utils module imports (even inside a function) one that imports it back, and none imports
    from a package above it (a package's ``__init__`` imports its modules: a cycle in waiting). Checked on a planted
    package too: a cycle through a function's import, and an upward ``from .. import``."""
    graph = _utils_imports(ROOT / "utils")
    assert {"utils.mesh.context4d", "utils.planner.shapes"} <= graph["utils.mesh.parallelize3d"]  # it reads imports
    cycle = _a_cycle(graph)
    assert cycle is None, f"an import cycle in utils: {' -> '.join(cycle)}; move the shared piece below both"
    assert not _upward(graph), f"imports from a package above the module: {_upward(graph)}"
    planted = tmp_path / "utils"
    (planted / "a").mkdir(parents=True)
    for name, text in (("__init__.py", "from .a import x\n"), ("a/__init__.py", ""),
                       ("a/x.py", "import torch\n\ndef f():\n    from .y import g\n"),
                       ("a/y.py", "from . import x\nfrom .. import a\n")):
        (planted / name).write_text(text)
    graph = _utils_imports(planted)
    assert graph == {"utils": {"utils.a.x"}, "utils.a": set(), "utils.a.x": {"utils.a.y"},
                     "utils.a.y": {"utils.a.x", "utils.a"}}
    assert _a_cycle(graph) == ["utils.a.x", "utils.a.y", "utils.a.x"] and _upward(graph) == {"utils.a.y": ["utils.a"]}


@pytest.mark.slow
def test_wheel_ships_every_utils_module(tmp_path):
    """`pip install .` (not editable) gives the whole course package: every module of utils/ is in the wheel,
    no reference solution is, and the installed copy imports its subpackages (from the wheel, not this folder)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split("\n")
    tracked = [f for f in tracked if f and (ROOT / f).is_file()] or [  # not a git checkout: the files on disk
        str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    source = tmp_path / "source"  # a copy: setuptools reuses an in-tree build/lib, which could hide a missing module
    for f in tracked:
        (source / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, source / f)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(source)],
                           capture_output=True, text=True)
    if built.returncode != 0 and "No matching distribution found for setuptools" in built.stderr:
        pytest.skip("building a wheel needs setuptools from the package index, which this machine cannot reach")
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("distributed_course-*.whl")
    import zipfile
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    modules = {f for f in tracked if f.startswith("utils/") and f.endswith(".py")}
    assert modules and modules <= shipped, f"the wheel lacks {sorted(modules - shipped)}"
    assert not any(n.startswith("labs/") for n in shipped), "a reference solution went into the wheel"
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    probe = ("import importlib, pkgutil, utils; "  # every subpackage (comm, sharding, pipeline, ...) imports
             "[importlib.import_module(m.name) for m in pkgutil.walk_packages(utils.__path__, 'utils.') if m.ispkg]; "
             "import utils.checkers.common; print(utils.__file__)")
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(site)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().startswith(str(site)), f"imported {run.stdout.strip()}, not the installed wheel"


def test_xdist_keeps_a_group_on_one_worker(tmp_path):
    """`make test` relies on pytest-xdist's --dist loadgroup: a test file whole on one worker, so its module fixtures
    (a site build, a kernel) are made once. pytest 9.2 silently breaks it (pytest-xdist issue #1386): pinned 9.1.1."""
    (tmp_path / "test_group.py").write_text(
        "import os, pytest\npytestmark = pytest.mark.xdist_group('one')\n"
        + "".join(f"def test_{i}():\n    open('pids', 'a').write(f'{{os.getpid()}}\\n')\n" for i in range(6)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-p", "no:cacheprovider",
                           "test_group.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    pids = (tmp_path / "pids").read_text().split()
    assert len(pids) == 6 and len(set(pids)) == 1, f"the group ran on {len(set(pids))} workers"
