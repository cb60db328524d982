"""Execute notebooks headless with papermill, each in its own process group (``utils.launch.children``), and time them.

Used by the test suite (small parameters, see tests/test_notebooks.py) and by ``make course``
(each notebook's own parameters). Executed copies go to ``build/``, which git ignores.

    python -m utils.course.notebook_runner [NOTEBOOK ...]
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from ..launch import kill_tree, start_child  # papermill's tree killed on a timeout, the kernel (its own session) too
from ..launch.warm import ForkedProcess

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
PEAKS = BUILD / "course" / "peak_memory.json"  # notebook -> peak resident bytes of its process tree, by make course
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
    else [2]. One size per notebook keeps the suite near 15 minutes (README); ``make test-matrix`` runs them all."""
    return [int(n) for n in course_metadata(path).get("suite_world_sizes", [2])]


def missing_requirements(path):
    """The modules of ``metadata.course.requires`` that the course's kernel cannot import: an optional lesson
    (notebook 13 needs TensorFlow, from ``make frameworks``) is skipped, with the reason, where they are absent.
    The kernel is this interpreter (``.venv``, see kernel_env), so ``find_spec`` here answers for it."""
    import importlib.util

    return [name for name in course_metadata(path).get("requires", []) if importlib.util.find_spec(name) is None]


COURSE_KERNEL_ENV = ("JUPYTER_PATH", "PYDEVD_DISABLE_FILE_VALIDATION")  # what kernel_env adds


def kernel_env():
    """Environment in which papermill finds the course's own kernel first (see the Makefile)."""
    env = dict(os.environ)
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(Path(sys.prefix) / "share" / "jupyter"),
                                                        env.get("JUPYTER_PATH")]))
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # silences a debugger warning in every kernel
    return env


class PeakMemory:
    """Samples the resident memory of a process and all its descendants (papermill, the kernel, its ranks) every
    ``interval`` seconds in a thread; ``.peak`` is the largest sum seen, in bytes. Memory shared between the
    ranks (torch's libraries, forked pages) counts once per process, so this is an upper bound, which is what a
    teacher sizing a workshop box needs."""

    def __init__(self, pid, interval=0.5):
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                total = 0
                for proc in [root, *root.children(recursive=True)]:
                    try:
                        total += proc.memory_info().rss
                    except psutil.Error:  # a rank that just ended
                        pass
                self.peak = max(self.peak, total)
            except psutil.Error:  # papermill itself has ended
                return
            self._stop.wait(self.interval)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.peak


def execute(path, out_dir, parameters=None, timeout=None, peaks=None, cwd=None, warm=None):
    """Run one notebook; return (ok, seconds, log). A notebook past its timeout is killed, kernel and ranks too.

    ``peaks``: a dict that receives the notebook's peak resident memory (bytes, ``PeakMemory``) under its
    ``<folder>/<name>`` key. ``cwd``: the working folder of papermill and of the notebook's kernel (None: the
    notebook's own folder, as Jupyter's). ``warm``: a ``utils.launch.warm.WarmStarts`` (the test suite's): papermill
    runs in this process (it changes this process's folder to ``cwd`` while it runs) and the kernel, and its rank
    server, are forked from the zygote, which has imported torch already (lesson 05a: 8.9 s instead of 18.4 s);
    None, or a zygote that has died: ``python -m papermill``, a kernel started cold, as a learner's, for
    ``make course``'s minutes and memory."""
    path = Path(path).absolute()
    out = (Path(out_dir) / path.parent.name / path.name).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    cwd = Path(cwd or path.parent).absolute()
    timeout = timeout or notebook_timeout(path)
    cmd = [sys.executable, "-m", "papermill", str(path), str(out), "--cwd", str(cwd),
           "--kernel", "python3", "--no-progress-bar", "--log-level", "WARNING"]
    for name, value in (parameters or {}).items():
        cmd += ["-p", name, str(value)]

    start = time.perf_counter()
    for attempt in (1, 2):
        if warm is not None and warm.alive() and peaks is None:  # a dead zygote: a cold start, below
            ok, log = _papermill_here(path, out, parameters, timeout, cwd, warm)
            if ok or attempt == 2 or not kernel_port_clash(log):
                return ok, time.perf_counter() - start, log
            print(f"{path.name}: its kernel could not bind a port another kernel took meanwhile; running it again",
                  file=sys.stderr)
            continue
        child = start_child(cmd, env=kernel_env(), cwd=cwd)
        memory = PeakMemory(child.pid) if peaks is not None else None
        done = child.wait(timeout)
        ok, log = done.code == 0, done.output
        if done.timed_out:
            ok, log = False, f"{log}\nKILLED: {path.name} did not finish within its {timeout} s timeout."
        if memory is not None:
            peaks[f"{path.parent.name}/{path.name}"] = memory.stop()
        if ok or attempt == 2 or not kernel_port_clash(log):
            return ok, time.perf_counter() - start, log
        print(f"{path.name}: its kernel could not bind a port another kernel started at the same moment took "
              "(jupyter_client picks free ports, then binds them); running it again", file=sys.stderr)


def _papermill_here(path, out, parameters, timeout, cwd, warm):
    """papermill in this process, on a kernel forked by ``warm``; (ok, log). Past ``timeout`` seconds the kernel's
    descendants and its process group (the kernel, its rank server) are killed, the ranks with their server (their
    parent-death signal), and papermill sees a dead kernel."""
    import papermill
    from jupyter_client.manager import AsyncKernelManager

    kernel_log = out.with_name(out.name + ".kernel.log")
    kernel_log.unlink(missing_ok=True)
    kernels, killed = [], threading.Event()

    class WarmKernelManager(AsyncKernelManager):  # nbclient's own kind
        async def _async_launch_kernel(self, kernel_cmd, **kw):  # jupyter_client's place to launch differently
            if killed.is_set():
                raise TimeoutError(f"{path.name} reached its {timeout} s timeout before its kernel started")
            course = kernel_env()
            env = dict(kw.get("env", os.environ), **{name: course[name] for name in COURSE_KERNEL_ENV})
            pid = warm.fork_kernel(kernel_cmd, env, kw.get("cwd") or cwd, kernel_log)
            kernels.append(pid)
            provisioner = self.provisioner
            provisioner.process, provisioner.pid, provisioner.pgid = ForkedProcess(pid), pid, pid
            provisioner.cwd = kw.get("cwd") or cwd
            self._reconcile_connection_info(provisioner.connection_info)

    def kill():  # the kernel's descendants (torchrun's agents, in sessions of their own), then its group (its server)
        killed.set()
        for pid in kernels:
            kill_tree([ForkedProcess(pid)])

    watchdog = threading.Timer(timeout, kill)
    watchdog.daemon = True
    watchdog.start()
    try:
        papermill.execute_notebook(str(path), str(out), parameters=parameters or {}, cwd=str(cwd),
                                   kernel_name="python3", progress_bar=False, kernel_manager_class=WarmKernelManager)
        ok, error = True, ""
    except Exception as exc:  # noqa: BLE001 - the notebook's failure, reported as the cold run's log would
        ok, error = False, f"{type(exc).__name__}: {exc}"
    finally:
        watchdog.cancel()
        for pid in kernels:  # a kernel that papermill left (a failed start) takes nothing with it
            kill_tree([ForkedProcess(pid)])
    log = kernel_log.read_text(errors="replace") if kernel_log.exists() else ""
    if killed.is_set():
        ok, error = False, f"{error}\nKILLED: {path.name} did not finish within its {timeout} s timeout."
    return ok, f"{log}\n{error}"


def kernel_port_clash(log):
    """True when papermill's kernel died at start because a port it had picked was taken meanwhile: a race between
    kernels started at once (the test suite's workers), not the notebook's failure."""
    return "Address already in use" in log and "Kernel died before replying to kernel_info" in log


def alone_copy(path, folder):
    """A copy of the course's tracked files in ``folder`` (no build/, no data/ but its README, nothing an earlier
    notebook wrote), and ``path``'s place in it: a notebook run from there shows whether it runs alone, as a
    learner who jumps to it does. ``utils`` is imported from the installed package either way."""
    folder = Path(folder)
    if not (folder / "README.md").exists():
        tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        for name in filter(None, tracked.decode().split("\0")):
            if (ROOT / name).is_file():
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, folder / name)
    return folder / Path(path).resolve().relative_to(ROOT)


def print_table(rows, title):
    """rows: (name, ok, seconds[, peak bytes])."""
    print(f"\n{title}")
    width = max([len(r[0]) for r in rows] + [8])
    print(f"  {'notebook':<{width}}  status  seconds  peak MB")
    for name, ok, seconds, *peak in rows:
        print(f"  {name:<{width}}  {'ok' if ok else 'FAILED':<6}  {seconds:7.1f}  {peak[0] / 2**20 if peak else float('nan'):7.0f}")
    print(f"  {'total':<{width}}  {sum(r[1] for r in rows)}/{len(rows)} ok {sum(r[2] for r in rows):7.1f}")


def main(argv):
    paths = [Path(p) for p in argv] or course_notebooks()
    rows, peaks = [], {}
    for path in paths:
        if missing := missing_requirements(path):
            print(f"skipped {path.name}: needs {', '.join(missing)} (metadata.course.requires; `make frameworks`)")
            continue
        ok, seconds, log = execute(path, BUILD / "course", parameters_for(path), peaks=peaks)
        if not ok:
            print(log[-4000:])
        key = f"{path.parent.name}/{path.name}"
        rows.append((key, ok, seconds, peaks[key]))
        # beside the executed copies; utils.course.minutes --measured build/course copies each into run_minutes.json
        known = json.loads(PEAKS.read_text()) if PEAKS.exists() else {}
        PEAKS.write_text(json.dumps({**known, key: peaks[key]}, indent=1))
    print_table(rows, "make course: every notebook with its own parameters (executed copies in build/course/)")
    return 0 if all(r[1] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
