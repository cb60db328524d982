"""Execute notebooks headless with papermill, each in its own process group, and time them.

Used by the test suite (small parameters, see tests/test_notebooks.py) and by ``make course``
(each notebook's own parameters). Executed copies go to ``build/``, which git ignores.

    python tests/notebook_runner.py [NOTEBOOK ...]
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
DEFAULT_TIMEOUT = 600  # seconds per notebook; a notebook may set metadata.course.test_timeout


def course_notebooks():
    """The lessons in order, then the labs."""
    return sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))


def parameters_for(path, **parameters):
    """A lab runs its checker on the reference solution (labs/solutions/) when it is executed
    headless: stubs that raise NotImplementedError are what a learner starts from, not a failure."""
    if Path(path).parent.name == "labs":
        parameters["USE_REFERENCE"] = True
    return parameters


def course_metadata(path):
    """The notebook's ``metadata.course``: test_timeout (seconds), world_sizes (the WORLD_SIZEs it supports)."""
    return json.loads(Path(path).read_text())["metadata"].get("course", {})


def notebook_timeout(path):
    return course_metadata(path).get("test_timeout", DEFAULT_TIMEOUT)


def supported_world_sizes(path):
    """The WORLD_SIZEs a notebook's lesson can use, from metadata.course.world_sizes; None = any.

    A lesson that cannot use a size (tensor parallelism over 5 ranks with 12 heads, a collective
    on 1 rank) says so in its parameters cell and raises at once; this list lets the suite skip it."""
    sizes = course_metadata(path).get("world_sizes")
    return None if sizes is None else [int(n) for n in sizes]


def suite_world_sizes(path):
    """The WORLD_SIZEs the default ``make test`` runs a notebook at: metadata.course.suite_world_sizes,
    else [2]. One size per lesson keeps the suite under 20 minutes; ``make test-matrix`` runs them all."""
    return [int(n) for n in course_metadata(path).get("suite_world_sizes", [2])]


def missing_requirements(path):
    """The modules of ``metadata.course.requires`` that the course's kernel cannot import: an optional lesson
    (notebook 13 needs TensorFlow, from ``make frameworks``) is skipped, with the reason, where they are absent.
    The kernel is this interpreter (``.venv``, see kernel_env), so ``find_spec`` here answers for it."""
    import importlib.util

    return [name for name in course_metadata(path).get("requires", []) if importlib.util.find_spec(name) is None]


def kernel_env():
    """Environment in which papermill finds the course's own kernel first (see the Makefile)."""
    env = dict(os.environ)
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(Path(sys.prefix) / "share" / "jupyter"),
                                                        env.get("JUPYTER_PATH")]))
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # silences a debugger warning in every kernel
    return env


def execute(path, out_dir, parameters=None, timeout=None):
    """Run one notebook; return (ok, seconds, log). A notebook past its timeout is killed, kernel and ranks too."""
    path = Path(path)
    out = Path(out_dir) / path.parent.name / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    timeout = timeout or notebook_timeout(path)
    cmd = [sys.executable, "-m", "papermill", str(path), str(out), "--cwd", str(path.parent),
           "--kernel", "python3", "--no-progress-bar", "--log-level", "WARNING"]
    for name, value in (parameters or {}).items():
        cmd += ["-p", name, str(value)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=kernel_env(), start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
        ok = proc.returncode == 0
    except subprocess.TimeoutExpired:
        for child in psutil.Process(proc.pid).children(recursive=True):  # the kernel has its own session
            child.kill()
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        ok, log = False, f"{log}\nKILLED: {path.name} did not finish within its {timeout} s timeout."
    return ok, time.perf_counter() - start, log


def print_table(rows, title):
    """rows: (name, ok, seconds)."""
    print(f"\n{title}")
    width = max([len(r[0]) for r in rows] + [8])
    print(f"  {'notebook':<{width}}  status  seconds")
    for name, ok, seconds in rows:
        print(f"  {name:<{width}}  {'ok' if ok else 'FAILED':<6}  {seconds:7.1f}")
    print(f"  {'total':<{width}}  {sum(r[1] for r in rows)}/{len(rows)} ok {sum(r[2] for r in rows):7.1f}")


def main(argv):
    paths = [Path(p) for p in argv] or course_notebooks()
    rows = []
    for path in paths:
        if missing := missing_requirements(path):
            print(f"skipped {path.name}: needs {', '.join(missing)} (metadata.course.requires; `make frameworks`)")
            continue
        ok, seconds, log = execute(path, BUILD / "course", parameters_for(path))
        if not ok:
            print(log[-4000:])
        rows.append((f"{path.parent.name}/{path.name}", ok, seconds))
    print_table(rows, "make course: every notebook with its own parameters (executed copies in build/course/)")
    return 0 if all(r[1] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
