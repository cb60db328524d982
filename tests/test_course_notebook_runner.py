"""utils/course/notebook_runner.py's tools: a process tree's peak memory, a notebook's copy to run alone, its working
folder."""

import os
import subprocess
import sys

import pytest

from utils.course.notebook_runner import ROOT, PeakMemory, alone_copy


def test_peak_memory_counts_the_children():
    """A parent that starts a child holding 200 MB: the tree's peak includes the child's memory."""
    child = "import time; block = bytearray(200 * 2**20); block[::4096] = b'x' * len(block[::4096]); time.sleep(2)"
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"])
    memory = PeakMemory(parent.pid, interval=0.1)
    parent.wait()
    peak = memory.stop()
    assert 200 * 2**20 < peak < 2 * 2**30, f"{peak / 2**20:.0f} MB"


def test_alone_copy_holds_the_tracked_files_only(tmp_path):
    (ROOT / "build").mkdir(exist_ok=True)
    run = alone_copy(ROOT / "notebooks" / "00_start_here.ipynb", tmp_path)
    assert run == tmp_path / "notebooks" / "00_start_here.ipynb" and run.read_bytes() == (ROOT / run.relative_to(tmp_path)).read_bytes()
    assert (tmp_path / "labs" / "solutions").is_dir() and (tmp_path / "data" / "README.md").is_file()
    assert not (tmp_path / "build").exists() and not (tmp_path / ".venv").exists()
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["README.md"]


def test_only_a_kernel_port_clash_is_run_again():
    from utils.course.notebook_runner import kernel_port_clash

    clash = ("zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:34615')\n"
             "RuntimeError: Kernel died before replying to kernel_info")
    assert kernel_port_clash(clash)
    assert not kernel_port_clash("AssertionError: the bubble is 0.31, not 0.25")
    assert not kernel_port_clash("OSError: [Errno 98] Address already in use")  # a notebook's own server: its failure


@pytest.mark.slow
def test_the_notebooks_working_folder_is_a_parameter(tmp_path):
    """``execute`` runs papermill and the kernel in the notebook's folder, or in ``cwd`` when given."""
    import nbformat

    from utils.course.notebook_runner import execute

    (tmp_path / "nb").mkdir(), (tmp_path / "elsewhere").mkdir()
    notebook = tmp_path / "nb" / "where.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os\nopen('where.txt', 'w').write(os.getcwd())")]), str(notebook))
    for cwd, folder in ((None, tmp_path / "nb"), (tmp_path / "elsewhere", tmp_path / "elsewhere")):
        ok, _, log = execute(notebook, tmp_path / "out", timeout=120, cwd=cwd)
        assert ok, log[-2000:]
        assert os.path.samefile((folder / "where.txt").read_text(), folder)
