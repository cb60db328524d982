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


@pytest.fixture(scope="module")
def warm():
    from utils.course.notebook_runner import kernel_env
    from utils.launch.warm import WarmStarts

    starts = WarmStarts(env=kernel_env())
    yield starts
    starts.close()


def _notebook(folder, *cells):
    import nbformat

    path = folder / "nb.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells],
                                  metadata={"kernelspec": {"name": "python3", "language": "python",
                                                           "display_name": "Python 3"}})
    nbformat.write(nb, str(path))
    return path


def test_a_warm_kernel_is_a_fresh_kernel_in_the_notebooks_folder_and_its_rank_server_is_forked_too(tmp_path, warm,
                                                                                                   monkeypatch):
    """The suite's warm start (utils/launch/warm.py): the kernel runs in the notebook's folder with the course's
    environment, imports the course from the repository, has no name the notebook did not bind, and its rank
    server (in the kernel's process group, not the kernel's child) forks ranks that run."""
    import json

    from utils.course.notebook_runner import execute

    monkeypatch.delenv("JUPYTER_PATH", raising=False)  # the kernel gets the course's all the same (kernel_env)
    path = _notebook(tmp_path, "import json, os, sys\nassert 'torch' not in dir() and 'utils' not in sys.modules\nimport psutil",
                     f"sys.path.insert(0, {str(ROOT)!r})\nfrom utils import run_ranks\nfrom utils.launch import rank_server",
                     "ppids = run_ranks(lambda: os.getppid(), world_size=2)\nserver = rank_server().proc",
                     "json.dump({'cwd': os.getcwd(), 'ppids': ppids, 'server': server.pid, 'kernel': os.getpid(),"
                     " 'server_pgid': os.getpgid(server.pid), 'pgid': os.getpgid(0), 'utils': sys.modules['utils'].__file__,"
                     " 'jupyter_path': os.environ.get('JUPYTER_PATH'), 'parents': [os.getppid(), psutil.Process(server.pid).ppid()]},"
                     " open('facts.json', 'w'))")
    ok, _, log = execute(path, tmp_path / "out", timeout=120, warm=warm)
    assert ok, log[-3000:]
    facts = json.loads((tmp_path / "facts.json").read_text())
    assert os.path.samefile(facts["cwd"], tmp_path) and facts["utils"] == str(ROOT / "utils" / "__init__.py")
    assert facts["ppids"] == [facts["server"]] * 2 and facts["server_pgid"] == facts["pgid"] == facts["kernel"]
    assert facts["parents"] == [warm.proc.pid] * 2  # both forked by the zygote, not started cold
    assert facts["jupyter_path"] and facts["jupyter_path"].startswith(sys.prefix)


@pytest.mark.slow
def test_a_warm_notebook_past_its_timeout_is_killed_with_its_ranks(tmp_path, warm):
    """Past its timeout the kernel's group is killed, rank server and ranks too, and the run fails saying so."""
    import time

    import psutil

    from utils.course.notebook_runner import execute

    path = _notebook(tmp_path, f"import os, sys, time\nsys.path.insert(0, {str(ROOT)!r})\nfrom utils import run_ranks",
                     "from utils.launch import rank_server\n"
                     "open('pids', 'w').write(f'{os.getpid()} {rank_server().proc.pid}')\n"
                     "run_ranks(lambda: (open(f'rank{os.getpid()}', 'w'), time.sleep(600)), world_size=2, timeout=900)")
    start = time.monotonic()
    ok, seconds, log = execute(path, tmp_path / "out", timeout=10, warm=warm)
    assert not ok and "did not finish within its 10 s timeout" in log and seconds < 60, (seconds, log[-2000:])
    kernel, server = map(int, (tmp_path / "pids").read_text().split())
    ranks = [int(p.name.removeprefix("rank")) for p in tmp_path.glob("rank*")]
    assert len(ranks) == 2, ranks
    time.sleep(1)  # the zygote reaps the kernel; each rank's death signal comes with its server's
    left = [pid for pid in [kernel, server, *ranks] if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert not left and time.monotonic() - start < 60, left


def test_a_warm_notebooks_error_is_in_the_log(tmp_path, warm):
    from utils.course.notebook_runner import execute

    ok, _, log = execute(_notebook(tmp_path, "raise ValueError('WORLD_SIZE = 5 cannot split 12 heads')"),
                         tmp_path / "out", timeout=60, warm=warm)
    assert not ok and "ValueError" in log and "WORLD_SIZE = 5 cannot split 12 heads" in log


def test_a_request_that_fails_leaves_the_zygote_serving(tmp_path, warm):
    """An asker that goes away mid-request (a kernel killed while it asks for its server) ends that request only."""
    import socket

    from utils.course.notebook_runner import execute

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(warm.address)
        sock.sendall(b"\x00\x00")  # half a message, then gone
    ok, _, log = execute(_notebook(tmp_path, "print('still here')"), tmp_path / "out", timeout=60, warm=warm)
    assert warm.alive() and ok, log[-2000:]


def test_a_dead_zygote_means_a_cold_start(tmp_path):
    from utils.course.notebook_runner import execute, kernel_env
    from utils.launch.warm import WarmStarts

    starts = WarmStarts(env=kernel_env())
    starts.close()
    ok, _, log = execute(_notebook(tmp_path, "import sys\nassert 'torch' not in sys.modules"), tmp_path / "out",
                         timeout=60, warm=starts)
    assert ok, log[-2000:]
