"""The guarantees of utils.run_ranks, one test each (see utils/launch/ for how they are kept)."""

import collections
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from utils import RankError, RankTimeoutError, rank_device, run_ranks
from utils.launch import plan_launch, rank_server
from utils.hardware import usable_cores

pytestmark = pytest.mark.usefixtures("no_children_left")


def rank_and_sum(offset=0, *, scale=1):
    t = torch.tensor([float(dist.get_rank())], device=rank_device())  # a CUDA tensor under NCCL (one GPU: size 1)
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item() * scale + offset


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_returns_one_value_per_rank_in_rank_order(world_size, capsys):
    results = run_ranks(rank_and_sum, 10, world_size=world_size, scale=2)
    total = world_size * (world_size - 1) / 2
    assert results == [(r, world_size, total * 2 + 10) for r in range(world_size)]
    said = capsys.readouterr().out
    assert "gloo on CPU" in said or "nccl on GPU" in said  # the backend and device are said out loud


def test_output_of_each_rank_is_prefixed(capsys):
    def hello():
        print(f"hello from {dist.get_rank()}")
        print("a warning", file=sys.stderr)

    run_ranks(hello, world_size=2, verbose=False)
    out, err = capsys.readouterr()
    assert sorted(out.splitlines()) == ["[rank 0] hello from 0", "[rank 1] hello from 1"]
    assert sorted(err.splitlines()) == ["[rank 0] a warning", "[rank 1] a warning"]


def fails_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("rank one is broken")
    dist.all_reduce(torch.ones(1))  # the others wait for rank 1 here, then lose their connection


def test_a_raising_rank_is_named_with_its_traceback_within_10s():
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run_ranks(fails_on_rank_1, world_size=4, verbose=False)
    assert time.monotonic() - start < 10
    err = info.value
    assert err.rank == 1
    message = str(err)
    assert message.startswith("rank 1 of 4 failed first: ValueError: rank one is broken")
    assert 'raise ValueError("rank one is broken")' in message  # the traceback, with its source line
    assert "in fails_on_rank_1" in message
    for peer in (0, 2, 3):  # peers either saw the closed connection (secondary) or were stopped
        line = next(line for line in message.splitlines() if line.startswith(f"rank {peer}:"))
        assert "secondary error" in line or "stopped by the launcher" in line, line


def test_a_rank_killed_by_a_signal_is_named():
    def segfault_on_rank_0():
        if dist.get_rank() == 0:
            os.kill(os.getpid(), signal.SIGSEGV)
        dist.barrier()

    with pytest.raises(RankError) as info:
        run_ranks(segfault_on_rank_0, world_size=2, verbose=False)
    assert info.value.rank == 0
    assert "killed by signal SIGSEGV" in str(info.value)
    assert "segfault_on_rank_0" in str(info.value)  # faulthandler's stack of the dying rank


def hangs_in_a_collective():
    if dist.get_rank() == 0:
        dist.barrier()  # rank 1 never arrives
    else:
        time.sleep(600)


@pytest.mark.slow
def test_a_hanging_rank_times_out_showing_where_each_rank_was():
    start = time.monotonic()
    with pytest.raises(RankTimeoutError) as info:
        run_ranks(hangs_in_a_collective, world_size=2, timeout=3, verbose=False)
    elapsed = time.monotonic() - start
    assert 3 <= elapsed < 3 + 5
    stacks = info.value.stacks
    assert "in barrier" in stacks[0] and "in hangs_in_a_collective" in stacks[0]
    assert "in hangs_in_a_collective" in stacks[1]


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_twenty_runs_in_a_row_leak_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # our own temporary folder: others use /tmp too
    run_ranks(rank_and_sum, world_size=2, verbose=False)  # warm up lazy imports before counting
    fds, tmp = _open_fds(), set(os.listdir(tempfile.gettempdir()))
    others = {p.pid for p in psutil.Process().children(recursive=True)} - {rank_server().proc.pid}  # e.g. MPI's orted
    for _ in range(20):
        assert run_ranks(rank_and_sum, world_size=2, verbose=False)[1][2] == 1.0
    assert not dist.is_initialized()  # the caller never joins a process group
    left = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in others]
    assert left == [rank_server().proc.pid]  # the server only
    assert _open_fds() == fds  # no pipe left open
    assert {d for d in os.listdir(tempfile.gettempdir()) if d.startswith("run_ranks-")} <= tmp  # no rendezvous left


@pytest.mark.slow
def test_two_notebooks_at_once_do_not_clash(tmp_path):
    script = tmp_path / "launch_five_times.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        from utils import run_ranks
        def total():
            t = torch.ones(1); dist.all_reduce(t); return t.item()
        for _ in range(5):
            assert run_ranks(total, world_size=2, verbose=False) == [2.0, 2.0]
        print("ok")
    """))
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and outs == ["ok\n", "ok\n"]


def test_unpicklable_return_value_says_what_to_return():
    with pytest.raises(RankError, match="cannot be sent back"):
        run_ranks(lambda: (x for x in range(3)), world_size=2, verbose=False)


@pytest.mark.parametrize("bad", [0, -2, 2.5, "2", True, None])
def test_world_size_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        run_ranks(rank_and_sum, world_size=bad)


def test_nccl_without_gpus_is_refused_with_the_numbers():
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs")
    with pytest.raises(RuntimeError, match=r"needs one GPU per rank: 2 ranks asked"):
        run_ranks(rank_and_sum, world_size=2, backend="nccl")


def test_too_many_cpu_ranks_warns_with_the_numbers():
    cores = usable_cores()  # the affinity the launcher shares out
    with pytest.warns(UserWarning, match=rf"{2 * cores + 1} CPU ranks on {cores} cores"):
        plan_launch(2 * cores + 1, backend="gloo")


def test_bad_timeout_is_refused():
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        run_ranks(rank_and_sum, world_size=2, timeout=0)


def test_ranks_are_forked_by_the_server_never_by_the_caller():
    server = rank_server()
    parents = run_ranks(os.getppid, world_size=3, verbose=False)
    assert parents == [server.proc.pid] * 3
    assert server.proc.pid != os.getpid() and psutil.Process(server.proc.pid).ppid() == os.getpid()


def test_after_backward_and_cuda_questions_in_the_caller_ranks_still_run_backward():
    # On a GPU machine a process that has run backward() cannot fork a child that runs backward;
    # the caller here does both first, and its ranks (children of the server) are unaffected.
    w = torch.randn(50, 50, requires_grad=True)
    (w @ w).sum().backward()
    torch.cuda.is_available()  # fork-safe: `import utils` set PYTORCH_NVML_BASED_CUDA_CHECK=1
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"

    def grad_norm():
        x = torch.randn(30, 30, requires_grad=True)
        (x @ x).sum().backward()
        return x.grad.shape[0]

    assert run_ranks(grad_norm, world_size=2, verbose=False) == [30, 30]


def test_a_notebook_closure_travels_by_value():
    base = 100

    def local_function():  # a closure: only cloudpickle can send it to another process
        return base + dist.get_rank()

    assert run_ranks(local_function, world_size=2, verbose=False) == [100, 101]


def test_ranks_see_the_callers_folder_path_and_environment_of_now(tmp_path, monkeypatch):
    rank_server()  # started before the changes below: the ranks must still see them
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COURSE_TEST_VALUE", "42")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "course_test_module.py").write_text("VALUE = 7\n")

    def look():
        import course_test_module
        return os.getcwd(), os.environ["COURSE_TEST_VALUE"], course_test_module.VALUE

    assert run_ranks(look, world_size=2, verbose=False) == [(str(tmp_path), "42", 7)] * 2


def test_torch_distributed_debug_set_after_the_server_started_reaches_the_ranks(monkeypatch):
    rank_server()  # torch, imported by the server before the change below, read the variable then
    debug_level = lambda: str(dist.get_debug_level())  # noqa: E731
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    assert run_ranks(debug_level, world_size=2, verbose=False) == [str(dist.DebugLevel.DETAIL)] * 2
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG")
    assert run_ranks(debug_level, world_size=2, verbose=False) == [str(dist.DebugLevel.OFF)] * 2


def test_the_server_imports_what_the_caller_imported_so_ranks_need_not():
    import torch.distributed.pipelining  # noqa: F401 - a heavy module, now imported by the caller

    def already_imported():
        return "torch.distributed.pipelining" in sys.modules  # before this rank imports anything

    assert run_ranks(already_imported, world_size=2, verbose=False) == [True, True]


def test_threads_per_rank_default_shares_the_cores_and_can_be_set():
    cores = usable_cores()  # the affinity the launcher shares out
    assert run_ranks(torch.get_num_threads, world_size=1, verbose=False) == [cores]
    assert run_ranks(torch.get_num_threads, world_size=2, verbose=False) == [max(1, cores // 2)] * 2
    assert run_ranks(torch.get_num_threads, world_size=2, threads_per_rank=3, verbose=False) == [3, 3]
    with pytest.raises(ValueError, match="threads_per_rank must be"):
        run_ranks(torch.get_num_threads, world_size=2, threads_per_rank=0)


def test_without_a_process_group_for_libraries_that_make_their_own():
    assert run_ranks(dist.is_initialized, world_size=2, process_group=False, verbose=False) == [False, False]


@pytest.mark.slow
def test_the_server_dies_with_its_caller(tmp_path):
    script = tmp_path / "launch_then_wait.py"
    script.write_text(textwrap.dedent("""
        import time, torch.distributed as dist
        from utils import run_ranks
        from utils.launch import rank_server
        run_ranks(dist.get_rank, world_size=2, verbose=False)
        print(rank_server().proc.pid, flush=True)
        time.sleep(60)
    """))
    caller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    server = psutil.Process(int(caller.stdout.readline()))
    caller.kill()
    caller.wait()
    gone, alive = psutil.wait_procs([server], timeout=10)
    assert alive == [], "the rank server outlived the process that started it"


def test_tensors_come_back_detached_on_the_cpu():
    def make():
        w = torch.ones(2, requires_grad=True) * (dist.get_rank() + 1)
        return {"w": w, "pair": (w, [w])}

    results = run_ranks(make, world_size=2, verbose=False)
    assert results[1]["w"].tolist() == [2.0, 2.0] and not results[1]["w"].requires_grad
    assert results[1]["pair"][1][0].device.type == "cpu"


def test_a_rank_uses_openmp_after_the_caller_did():
    a = torch.randn(600, 600)
    (a @ a).sum()  # the caller's OpenMP pool now exists; the ranks never inherit it

    def matmul():
        b = torch.randn(400, 400)
        return float((b @ b).sum() * 0) + torch.get_num_threads()

    assert run_ranks(matmul, world_size=1, timeout=20, verbose=False) == [float(usable_cores())]


@pytest.mark.slow
def test_a_rank_returning_at_once_does_not_break_its_peers_connection():
    # Without a barrier after init, rank 1 could return and exit while rank 0 was still connecting
    # to it (seen in 3 of 150 launches): rank 0 then failed with "Connection closed by peer".
    for _ in range(60):
        assert run_ranks(dist.get_rank, world_size=2, verbose=False, timeout=20) == [0, 1]


def test_each_rank_is_told_a_typed_frozen_setup_with_the_plans_names():
    """The kernel-to-rank contract is a frozen ``RankSetup`` beside ``LaunchPlan``, with the plan's own field names."""
    import dataclasses

    from utils.launch import RankSetup

    plan = plan_launch(2, "gloo", threads_per_rank=1)
    setup = RankSetup.for_rank(plan, 1, timeout=5.0, store="/tmp/store", process_group=True, cwd="/", sys_path=(),
                               env={}, cell_sources={})
    assert (setup.rank, setup.world_size, setup.backend, setup.threads_per_rank) == (1, 2, "gloo", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setup.rank = 0
    # what a rank reads of it is exactly these fields: the values below come from inside the ranks
    got = run_ranks(lambda: (torch.get_num_threads(), str(rank_device())), world_size=2, threads_per_rank=1,
                    verbose=False)
    assert got == [(1, "cpu"), (1, "cpu")]


def test_a_process_a_rank_leaves_holding_its_output_does_not_hold_the_cell():
    """A rank that started a process in a session of its own (a daemon, a server) and returned: run_ranks returns its
    value once the rank has ended and its output drained briefly, not at the timeout (the process still holds the
    rank's stdout)."""
    import subprocess

    marker = f"31337.{os.getpid()}"
    start = time.monotonic()
    try:
        assert run_ranks(_leave_a_daemon, marker, world_size=1, process_group=False, verbose=False, timeout=60) == [
            "left"]
        took = time.monotonic() - start
        assert subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True).stdout, "no daemon: proves nothing"
        assert took < 30, f"run_ranks waited {took:.1f} s for a daemon's pipe"
    finally:
        subprocess.run(["pkill", "-f", f"sleep {marker}"])


def _leave_a_daemon(marker):
    import subprocess
    subprocess.Popen(["sleep", marker], start_new_session=True)  # holds the rank's stdout and stderr
    if os.fork() == 0:  # a forked child holds every pipe of the rank's, its result pipe too
        time.sleep(20)
        os._exit(0)
    return "left"


Share = collections.namedtuple("Share", "rows")  # a holder pickle rebuilds by name: defined at the module's top


def test_a_view_in_a_ranks_own_arguments_carries_only_its_elements():
    """Pickling a view sends its whole storage: a rank given its slice of a batch would get its peers' shares too.
    run_ranks sends each tensor of ``rank_args`` in a storage of its own."""
    import torch

    import collections

    batch = torch.arange(1000.0).view(10, 100)

    def storage(share, held):
        return share.untyped_storage().nbytes(), share.sum().item(), held.rows["x"].untyped_storage().nbytes()

    held = [Share(collections.OrderedDict(x=batch[k])) for k in range(2)]  # whatever holds the view
    shares = run_ranks(storage, world_size=2, rank_args=[(batch[k], held[k]) for k in range(2)], verbose=False)
    assert shares == [(400, batch[0].sum().item(), 400), (400, batch[1].sum().item(), 400)], shares
