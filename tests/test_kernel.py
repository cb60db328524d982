"""The launcher and %%ranks inside a real Jupyter kernel, where notebooks actually run them:
functions and classes defined in the notebook, per-rank output, variables brought back, errors
shown, and a kernel interrupt that stops every rank."""

import time

import psutil
import pytest
from conftest import child_processes


@pytest.fixture(scope="module")
def course_kernel(kernel):
    reply, _, err = kernel.run("import torch, torch.distributed as dist\nimport utils\n%load_ext utils")
    assert reply["status"] == "ok", err
    return kernel


def test_notebook_defined_function_and_class(course_kernel):
    reply, out, err = course_kernel.run(
        "class Box:\n"
        "    def __init__(self, v): self.v = v\n"
        "def work(scale):\n"
        "    t = torch.tensor([float(dist.get_rank())]); dist.all_reduce(t)\n"
        "    return Box(t.item() * scale)\n"
        "boxes = utils.run_ranks(work, 10, world_size=3)\n"
        "assert all(isinstance(b, Box) for b in boxes), 'the same class comes back'\n"
        "print([b.v for b in boxes])")
    assert reply["status"] == "ok", err
    assert out.strip().endswith("[30.0, 30.0, 30.0]")
    assert "[launch] 3 ranks · gloo on CPU" in out


def test_ranks_magic_prefixes_output_and_returns_variables(course_kernel):
    reply, out, err = course_kernel.run(
        "offset = 100  # a kernel variable the ranks can read\n"
        "def double(x):\n    return 2 * x\n")
    assert reply["status"] == "ok", err
    reply, out, err = course_kernel.run(
        "%%ranks 2 --return total mine\n"
        "t = torch.tensor([float(rank)])\n"
        "dist.all_reduce(t)\n"
        "total = t.item() + offset\n"
        "mine = double(rank)\n"
        "print(f'rank {rank} of {world_size} on {device}')\n")
    assert reply["status"] == "ok", err
    assert "[rank 0] rank 0 of 2 on cpu" in out and "[rank 1] rank 1 of 2 on cpu" in out
    reply, out, err = course_kernel.run("print(total, mine)")
    assert out.strip() == "[101.0, 101.0] [0, 2]"


def test_ranks_magic_error_names_the_rank_and_the_cell_line(course_kernel):
    reply, out, err = course_kernel.run(
        "%%ranks 2\n"
        "x = 1\n"
        "if rank == 1:\n"
        "    raise KeyError('missing on rank one')\n"
        "dist.barrier()\n")
    assert reply["status"] == "error" and reply["ename"] == "RankError"
    assert "rank 1 of 2 failed first: KeyError" in err
    assert "raise KeyError('missing on rank one')" in err  # the cell's own line, from its source


def test_ranks_magic_rejects_bad_world_size(course_kernel):
    reply, out, err = course_kernel.run("%%ranks 0\nx = 1\n")
    assert reply["status"] == "error" and "world_size must be a positive integer" in err


def test_ranks_magic_after_backward_in_the_kernel(course_kernel):
    # The lessons compute a single-process reference in the kernel, then launch ranks: on a GPU
    # machine that broke forked ranks. The ranks now come from the server, whatever the kernel did.
    reply, out, err = course_kernel.run(
        "w = torch.randn(20, 20, requires_grad=True); (w @ w).sum().backward()\n"
        "scale = 3\n"
        "def triple(x):\n    return scale * x\n")
    assert reply["status"] == "ok", err
    reply, out, err = course_kernel.run(
        "%%ranks 2 --return y g\n"
        "x = torch.ones(3, requires_grad=True); (x * 2).sum().backward()\n"
        "y, g = triple(rank), x.grad.tolist()\n")
    assert reply["status"] == "ok", err
    reply, out, err = course_kernel.run("print(y, g[1])")
    assert out.strip() == "[0, 3] [2.0, 2.0, 2.0]"


def test_ranks_magic_names_a_variable_that_cannot_travel(course_kernel):
    reply, out, err = course_kernel.run("import threading\nlock = threading.Lock()\n")
    assert reply["status"] == "ok", err
    reply, out, err = course_kernel.run("%%ranks 2\nwith lock:\n    pass\n")
    assert reply["status"] == "error" and "the cell uses 'lock' (lock), which cannot be sent to the ranks" in err


def test_a_notebook_function_traceback_shows_its_cell_line(course_kernel):
    reply, out, err = course_kernel.run(
        "def broken():\n"
        "    if dist.get_rank() == 0:\n"
        "        raise ValueError('broken in a notebook cell')\n"
        "    dist.barrier()\n")
    assert reply["status"] == "ok", err
    reply, out, err = course_kernel.run("utils.run_ranks(broken, world_size=2)")
    assert reply["status"] == "error" and reply["ename"] == "RankError"
    assert "raise ValueError('broken in a notebook cell')" in err  # the source line, shipped from the kernel


def test_kernel_interrupt_stops_every_rank(course_kernel):
    kernel = course_kernel
    # stop_on_error=False: after the interrupt's error ipykernel aborts the requests queued behind it, and on a busy
    # machine the next launch below can arrive while it still does (its reply was "aborted" once, at load 10)
    kernel.kc.execute("%%ranks 2 --timeout 120\nimport time\ndist.barrier()\ntime.sleep(120)\n", stop_on_error=False)
    def ranks_running():
        return child_processes(kernel.pid)

    deadline = time.monotonic() + 20
    while len(ranks_running()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    ranks = ranks_running()
    assert len(ranks) >= 2, "the ranks never started"
    time.sleep(1)  # let them reach the sleep
    start = time.monotonic()
    kernel.km.interrupt_kernel()
    reply = kernel.kc.get_shell_msg(timeout=20)["content"]
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - start < 10
    gone, alive = psutil.wait_procs(ranks, timeout=5)
    assert alive == [], f"ranks still running after the interrupt: {alive}"
    reply, out, err = kernel.run("print(utils.run_ranks(lambda: dist.get_rank(), world_size=2, verbose=False))")
    assert out.strip() == "[0, 1]", f"the kernel launches again after an interrupt: {reply['status']} {err[-3000:]}"
