"""Every notebook and lab, executed end to end by papermill with small parameters, on a kernel forked warm
(utils/launch/warm.py: torch already imported; papermill in this worker).

A notebook is a test: its asserts are the claims of the lesson. Parameters injected into the cell
tagged ``parameters``: SMOKE=True (tiny sizes) and WORLD_SIZE, once per size of ``--world-sizes``
(conftest.py: by default the sizes in each notebook's ``metadata.course.suite_world_sizes``, else 2;
``pytest --world-sizes=1,2,3,4,5,6,7,8`` for the full matrix); labs also get
USE_REFERENCE=True, so that their checker runs on the reference solution (tests/checkers/ feeds
it wrong ones). A notebook whose lesson cannot use a size lists the sizes it can in
``metadata.course.world_sizes``: the other sizes are skipped here, and the notebook itself raises
a clear error for them (tested below). An optional lesson lists the modules it needs beyond the
course's own in ``metadata.course.requires``; where one is not installed it is skipped, with the reason.
An executed notebook's warnings and stderr lines must each be on its ``metadata.course.expected_output`` list
(utils/course/stray_output.py), which names the cell whose text explains it.
"""

import sys

import pytest
from utils.course.notebook_runner import (BUILD, ROOT, alone_copy, course_notebooks, execute, kernel_env,
                                          missing_requirements, parameters_for, suite_world_sizes,
                                          supported_world_sizes)
from utils.course.stray_output import stray_output
from utils.launch.warm import WarmStarts


@pytest.fixture(scope="session")
def warm():
    """One zygote per worker (utils/launch/warm.py, in the worker's cores): every notebook's kernel and rank server
    are forked from it with torch already imported (lesson 05a alone: 8.9 s instead of 18.4 s)."""
    starts = WarmStarts(env=kernel_env())
    yield starts
    starts.close()


@pytest.mark.notebook
def test_notebook_runs(path, world_size, record_property, request, tmp_path, warm):  # (path, world_size): --world-sizes (conftest.py)
    supported = supported_world_sizes(path)
    if supported is not None and world_size not in supported:
        pytest.skip(f"{path.name} cannot use WORLD_SIZE={world_size} (metadata.course.world_sizes = {supported}); "
                    "its parameters cell says why")
    if missing := missing_requirements(path):
        pytest.skip(f"{path.name} needs {', '.join(missing)} (metadata.course.requires), not installed in "
                    f"{sys.prefix}: `make frameworks` installs it, `make test-frameworks` runs it")
    out = BUILD / "test" / f"ws{world_size}"
    run = alone_copy(path, tmp_path / "course") if request.config.getoption("--alone") else path  # make test-catch-up
    ok, seconds, log = execute(run, out, parameters_for(path, SMOKE=True, WORLD_SIZE=world_size), warm=warm)
    record_property("notebook_time", (f"{path.relative_to(ROOT)} (WORLD_SIZE={world_size})", ok, seconds))
    assert ok, f"{path.name} failed under papermill with WORLD_SIZE={world_size} (executed copy in {out}):\n{log[-6000:]}"
    assert_no_stray_output(out / path.parent.name / path.name, path, f"WORLD_SIZE={world_size}")


def assert_no_stray_output(executed, path, run):
    """Every warning and stderr line of the executed copy is listed and explained (utils/course/stray_output.py)."""
    stray = stray_output(executed, path)
    assert not stray, (f"{path.name} ({run}) printed warnings or stderr that its text does not explain: explain each "
                       "in a cell and list it in metadata.course.expected_output, or silence it at its source with a "
                       "comment saying why:\n" + "\n".join(stray))


@pytest.mark.gpu
@pytest.mark.notebook
@pytest.mark.parametrize("path", course_notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_on_one_gpu(path, record_property):
    """WORLD_SIZE=1 on a CUDA machine: one rank on one GPU, so the NCCL path with CUDA tensors.

    (Two NCCL ranks cannot share one GPU: a 1-GPU machine runs 2-4 ranks over gloo, in the test above.)"""
    import torch

    if torch.cuda.device_count() == 0:  # device_count, never is_available(): that would initialise CUDA here
        pytest.skip("no CUDA device: the NCCL path runs only on a GPU machine")
    supported = supported_world_sizes(path)
    if supported is not None and 1 not in supported:
        pytest.skip(f"{path.name} cannot use WORLD_SIZE=1 (metadata.course.world_sizes = {supported})")
    if missing := missing_requirements(path):
        pytest.skip(f"{path.name} needs {', '.join(missing)} (metadata.course.requires): `make frameworks`")
    out = BUILD / "test" / "gpu-ws1"
    ok, seconds, log = execute(path, out, parameters_for(path, SMOKE=True, WORLD_SIZE=1))
    record_property("notebook_time", (f"{path.relative_to(ROOT)} (GPU, WORLD_SIZE=1)", ok, seconds))
    assert ok, f"{path.name} failed under papermill on a GPU with WORLD_SIZE=1 (executed copy in {out}):\n{log[-6000:]}"
    assert_no_stray_output(out / path.parent.name / path.name, path, "GPU, WORLD_SIZE=1")


def test_world_sizes_metadata():
    """Each list is a sorted set of sizes within 1-8 that includes 2, the size every lesson runs at; the
    suite's sizes are sizes the lesson supports."""
    for path in course_notebooks():
        sizes = supported_world_sizes(path)
        if sizes is not None:
            assert sizes == sorted(set(sizes)) and 2 in sizes and all(1 <= n <= 8 for n in sizes), (path.name, sizes)
        suite = suite_world_sizes(path)
        assert suite and suite == sorted(set(suite)), (path.name, suite)
        assert sizes is None or set(suite) <= set(sizes), f"{path.name}: suite_world_sizes {suite} not all in {sizes}"


def _unsupported(path):
    sizes = supported_world_sizes(path)
    return [] if sizes is None else [n for n in range(1, 7) if n not in sizes]


UNSUPPORTED = [p for p in course_notebooks() if _unsupported(p)]
EARLY_CELLS = 4  # a size the lesson cannot use must stop it within its first 4 code cells


@pytest.fixture(scope="module")
def early_errors(tmp_path_factory):
    """Every such notebook's first cells at its first unsupported size, all in one Python
    (utils/course/early_errors.py): the check needs no kernel and no papermill per notebook. Killed, like a
    notebook, past its timeout."""
    import json
    import subprocess

    folder = tmp_path_factory.mktemp("early")
    jobs = [[str(p), parameters_for(p, SMOKE=True, WORLD_SIZE=_unsupported(p)[0])] for p in UNSUPPORTED]
    (folder / "in.json").write_text(json.dumps(jobs))
    done = subprocess.run([sys.executable, "-m", "utils.course.early_errors", str(EARLY_CELLS),
                           str(folder / "in.json"), str(folder / "out.json")], capture_output=True, text=True,
                          timeout=120 + 20 * len(jobs), env=kernel_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "out.json").read_text())


@pytest.mark.notebook
@pytest.mark.parametrize("path", UNSUPPORTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_unsupported_world_size_fails_early(path, early_errors):
    """The first size a lesson cannot use stops it in its first code cells, with a ValueError naming it."""
    import re

    world_size, got = _unsupported(path)[0], early_errors[str(path)]
    assert got["error"] is not None, (f"{path.name} ran its first {got['cells']} code cells with WORLD_SIZE="
                                      f"{world_size}, which its metadata says it cannot use, and raised nothing")
    assert got["error"] == "ValueError" and re.search(rf"WORLD_SIZE ?= ?{world_size}\b", got["message"]), got
