"""Shared fixtures: a real Jupyter kernel for the tests that must run as a notebook does, and the
per-notebook time table printed at the end of the run."""

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/ itself: lab_grading, the labs' tests' shared helper
from utils.course.notebook_runner import ROOT, kernel_env  # noqa: E402

os.environ.update(kernel_env())  # the course's kernel first, for papermill and jupyter_client alike

NOTEBOOK_TIMES = []  # (name, ok, seconds): tests/test_notebooks.py records them, pytest_runtest_logreport collects them
MAX_WORKERS = 4  # `pytest -n auto`: one notebook a core, at most 4 at once (each runs 2-8 ranks of its own)


def child_processes(pid=None):
    """Children of a process (default: this one), less its rank server (utils/launch/server.py),
    which a kernel starts once and which lives as long as its kernel by design."""
    import psutil

    parent = psutil.Process(pid)

    def is_server(p):  # a direct child running the server (its ranks, forked from it, share its command line)
        try:
            return p.ppid() == parent.pid and "utils.launch.server" in " ".join(p.cmdline())
        except psutil.Error:  # ended while we looked
            return True

    return [p for p in parent.children(recursive=True) if not is_server(p)]


class Kernel:
    """A live kernel: ``run(code)`` executes a cell and returns (reply, stdout, stderr)."""

    def __init__(self, km, kc):
        self.km, self.kc = km, kc

    @property
    def pid(self):
        return self.km.provisioner.process.pid

    def run(self, code, timeout=60):
        out, err = [], []

        def hook(msg):
            if msg["msg_type"] == "stream":
                (out if msg["content"]["name"] == "stdout" else err).append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                err.append("\n".join(msg["content"]["traceback"]))

        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        return reply["content"], "".join(out), "".join(err)


@pytest.fixture(scope="module")
def kernel():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        yield Kernel(km, kc)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def pytest_addoption(parser):
    # "suite": each notebook at the size its metadata.course.suite_world_sizes names (2, 3 where uneven shards
    # are the lesson, 4 or 8 where the lesson needs them; README, "make test"). `make test-matrix` runs 1 to 8.
    parser.addoption("--world-sizes", default="suite",
                     help="comma-separated WORLD_SIZE values every notebook is executed with, or 'suite' "
                          "(default): each notebook at its metadata.course.suite_world_sizes")
    # `make test-catch-up`: each notebook run from a fresh copy of the course, as a learner who jumps to it
    parser.addoption("--alone", action="store_true",
                     help="run each notebook from its own fresh copy of the course's tracked files (no file an "
                          "earlier notebook wrote): shows that a learner can start at any lesson")
    # `make test-quick`: only the notebooks that the change since REV touches (utils/course/changes.py says how)
    parser.addoption("--changed-since", default=None, metavar="REV",
                     help="execute only the notebooks that the change since git revision REV touches: the notebook, "
                          "its lab's solution, its scripts or a utils module it imports (utils/course/changes.py)")


def pytest_generate_tests(metafunc):
    if "world_size" in metafunc.fixturenames and "path" in metafunc.fixturenames:
        from utils.course.notebook_runner import course_notebooks, suite_world_sizes

        option = metafunc.config.getoption("--world-sizes")
        paths = course_notebooks()
        if (rev := metafunc.config.getoption("--changed-since")) is not None:
            from utils.course.changes import touched

            paths = touched(paths, rev)
        pairs = [(path, n) for path in paths
                 for n in (suite_world_sizes(path) if option == "suite" else [int(n) for n in option.split(",")])]
        metafunc.parametrize(("path", "world_size"), pairs,
                             ids=[f"{path.parent.name}/{path.name}-ws{n}" for path, n in pairs])


def pytest_xdist_auto_num_workers(config):
    """`make test` runs `pytest -n auto`: as many workers as cores this process may use, at most MAX_WORKERS.
    A notebook spends much of its time waiting (a kernel starting, a rank's timeout, a barrier), so two at
    once on two cores finish sooner than one after the other; more than the cores would only queue."""
    from utils.hardware import usable_cores

    return max(1, min(MAX_WORKERS, usable_cores()))


def pytest_configure(config):
    """Under pytest-xdist each worker runs on its own share of the cores (its CPU affinity, which its kernels,
    rank servers, ranks and torchrun agents inherit, and which utils.hardware.usable_cores reads, so each launch
    gives its ranks threads from that share only). Without it two notebooks at once fight over every core: each
    launch sizes its threads for the whole machine, and a multi-threaded op waits for its slowest thread
    (utils.perf.one_thread). Measured on 2 cores: lesson 11a took 74 s alone and 197 s beside another notebook
    before, 111-118 s with a core of its own; the whole suite 2088 s of pytest before, 1526 s after."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not worker or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= count:  # fewer cores than workers (a -n chosen by hand): nothing to share out
        index = int(worker.removeprefix("gw"))
        os.sched_setaffinity(0, cores[index * len(cores) // count:(index + 1) * len(cores) // count])


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the xdist_group marks set here
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`--dist loadgroup`, the Makefile's): each notebook run is a unit of its own, the
    longest first (utils/course/run_minutes.json), then the modules that hold a slow test, so the last to start is a
    short one; a test module goes whole to
    one worker, so its module-scoped fixtures (a kernel, a site build) are made once; the GPU tests share one
    worker, one notebook at a time on the one GPU."""
    import json

    measured = json.loads((ROOT / "utils" / "course" / "run_minutes.json").read_text())["notebooks"]

    def expected_seconds(item):  # the full-parameter time: a proxy for the SMOKE run's, good enough for an order
        path, world_size = item.callspec.params["path"], item.callspec.params["world_size"]
        return measured.get(f"{path.parent.name}/{path.name}", {}).get("seconds", 0), world_size

    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        group = "gpu" if item.get_closest_marker("gpu") else None
        if group is None and item.originalname != "test_notebook_runs":
            group = item.nodeid.split("::")[0]
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    runs = [item for item in items if item.originalname == "test_notebook_runs"]
    if runs and os.environ.get("PYTEST_XDIST_WORKER"):  # the workers collect and order the tests; the controller
        # hands them out in that order (--no-loadscope-reorder); a run without workers keeps the files' order
        first = sorted(runs, key=expected_seconds, reverse=True)
        rest = [item for item in items if item.originalname != "test_notebook_runs"]
        # then the modules with a slow test (a grading class, a site build), so that no long one starts last
        slow = {item.nodeid.split("::")[0] for item in rest if item.get_closest_marker("slow")}
        items[:] = first + sorted(rest, key=lambda item: item.nodeid.split("::")[0] not in slow)  # stable


def pytest_runtest_logreport(report):
    """Collects the times tests/test_notebooks.py records (record_property("notebook_time", ...)): in the one
    process of a plain run, and in the controller when pytest-xdist runs the tests in workers."""
    if report.when == "call":
        NOTEBOOK_TIMES.extend(tuple(value) for name, value in report.user_properties if name == "notebook_time")


def pytest_terminal_summary(terminalreporter, config):
    if (rev := config.getoption("--changed-since")) is not None:  # `make test-quick`: the lessons' text it edits
        from utils.course.shown_source import changed_shown

        for key, notebooks, how in changed_shown(rev):
            terminalreporter.write_line(f"shown source {how}: {key}, printed by {', '.join(notebooks)}: reread "
                                        "their prose (utils/course/shown_source.py)")
    if not NOTEBOOK_TIMES:
        return
    from utils.course.notebook_runner import print_table

    terminalreporter.write_line("")
    print_table(sorted(NOTEBOOK_TIMES), "Notebooks (SMOKE=True; executed copies in build/test/ws<WORLD_SIZE>/)")


@pytest.fixture
def no_children_left():
    """Checks after the test that it left no new child process (no leaked rank). Children that were there
    before the test are not its leaks: on a machine with mpi4py, the first library to ask MPI for the world
    size (Lightning's cluster detection does) starts OpenMPI's ``orted`` daemon, which lives as long as we do."""
    before = {p.pid for p in child_processes()}

    def new():
        return [p for p in child_processes() if p.pid not in before]

    yield
    deadline = time.monotonic() + 5
    while new() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert new() == []
