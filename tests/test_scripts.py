"""The lesson scripts under torchrun, and their launcher ``utils.launch.scripts``: losses, errors, timeouts.

That each script reproduces its lesson is checked where the lesson is: lessons 02, 04, 05 and 06 run their
script under torchrun against their own cells, lesson 10 runs the capstone's (09) against one process. Here:
the launcher's errors, timeouts and command lines. The tests that start torchrun take seconds each.
"""

import os
import sys
import time

import pytest
import torch

from utils.datasets import batch
from utils.launch.scripts import (ROOT, TorchrunFailed, launch, parse_losses, parse_result, run_agents, run_script,
                                  torchrun_command)
from utils.models import make_optimizer
from utils.scale_out.torchrun import print_result

TOL = dict(rtol=1e-5, atol=1e-5)  # float32 sums in another order than one process's
STEPS = 3


@pytest.mark.slow
def test_a_bad_mesh_fails_with_the_numbers():
    with pytest.raises(TorchrunFailed, match=r"dp x pp x tp = 1 x 1 x 3 = 3, but torchrun started 2 processes"):
        run_script("09_3d_train.py", ["--tp", 3, "--backend", "gloo"], nproc=2, timeout=300)


@pytest.mark.slow
def test_timeout_kills_the_whole_process_group(tmp_path):
    """An agent that hangs, with a child in a session of its own (as torchrun starts its workers): both must be
    dead when launch raises, and launch must not wait for the child, which holds the agent's stdout."""
    pid_file = tmp_path / "child.pid"
    hang = [sys.executable, "-c", "import subprocess, sys, time; "
            "p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(300)"]
    start = time.monotonic()
    with pytest.raises(TorchrunFailed, match="timed out after 3 s"):
        launch([hang], timeout=3)
    assert time.monotonic() - start < 60
    child = int(pid_file.read_text())
    time.sleep(0.2)
    try:
        os.kill(child, 0)
        with open(f"/proc/{child}/stat") as f:  # a zombie (dead, not yet reaped by init) is dead too
            assert f.read().split()[2] == "Z", "the agent's child outlived the timeout"
    except ProcessLookupError:
        pass


def test_a_failing_agent_reports_its_output():
    with pytest.raises(TorchrunFailed, match="exit code 3") as err:
        launch([[sys.executable, "-c", "print('about to fail'); raise SystemExit(3)"]], timeout=60)
    assert "about to fail" in str(err.value)


@pytest.mark.slow
def test_run_agents_returns_codes_and_stops_on_until_or_timeout():
    """Lesson 11's use: a failure is a result, not an error; ``until`` and the timeout stop the launch (code None)."""
    codes, outs, _, stopped = run_agents([[sys.executable, "-c", "print('lost a rank'); raise SystemExit(3)"]], 60)
    assert codes == [3] and "lost a rank" in outs[0] and stopped is None, (codes, outs, stopped)  # it ended by itself
    waits = [sys.executable, "-c", "import time; print('joining as generation 1', flush=True); time.sleep(300)"]
    start = time.monotonic()
    codes, outs, _, stopped = run_agents([waits], 120, until=lambda out: "generation 1" in out)
    assert codes == [None] and stopped == "until" and time.monotonic() - start < 60, (codes, stopped)
    codes, _, seconds, stopped = run_agents([waits, [sys.executable, "-c", "pass"]], 2)
    assert codes == [None, 0] and stopped == "timed out after 2 s" and seconds < 60, (codes, stopped)
    with pytest.raises(ValueError, match="timeout=0"):
        run_agents([waits], 0)


def test_launch_gives_each_command_its_own_environment():
    """Lesson 13b's use: one TF_CONFIG per TensorFlow worker, from a list of dicts; a list of the wrong length is refused."""
    show = [sys.executable, "-c", "import os; print(os.environ['TF_CONFIG'])"]
    outs, _ = launch([show, show], 60, env=[{"TF_CONFIG": "worker 0"}, {"TF_CONFIG": "worker 1"}], progress=False)
    assert [out.strip() for out in outs] == ["worker 0", "worker 1"], outs
    with pytest.raises(ValueError, match="1 environments for 2 commands"):
        launch([show, show], 60, env=[{"TF_CONFIG": "worker 0"}])


def test_the_agents_working_folder_is_a_parameter(tmp_path):
    """The repository unless the caller gives another folder (``cwd``, passed on to ``utils.launch.children``)."""
    where = [sys.executable, "-c", "import os; print(os.getcwd())"]
    (default,), _ = launch([where], 60, progress=False)
    (given,), _ = launch([where], 60, progress=False, cwd=tmp_path)
    assert os.path.realpath(default.strip()) == os.path.realpath(ROOT), default
    assert os.path.realpath(given.strip()) == os.path.realpath(tmp_path), given


def test_losses_round_trip_exactly(capsys):
    values = [2.302585092994046, 1 / 3, 1e-30]
    print_result(values, world_size=2, note="any field")
    out = capsys.readouterr().out
    assert parse_losses(out) == values  # hex keeps every bit
    assert parse_result(out) == {"losses": values, "world_size": 2, "note": "any field"}
    with pytest.raises(TorchrunFailed, match="expected one RESULT line, found 0"):
        parse_losses("no losses here")


def test_command_lines():
    one = torchrun_command("s.py", ["--steps", 3], nproc=4)
    assert one[1:3] == ["-m", "torch.distributed.run"] and "--standalone" in one and one[-3:] == ["s.py", "--steps", "3"]
    two = torchrun_command("s.py", nproc=2, nnodes=2, endpoint="localhost:1234", run_id="x")
    assert "--standalone" not in two
    for flag, value in (("--nnodes", "2"), ("--rdzv-backend", "c10d"), ("--rdzv-endpoint", "localhost:1234"),
                        ("--rdzv-id", "x"), ("--nproc-per-node", "2")):
        assert two[two.index(flag) + 1] == value


def test_batches_cycle_and_optimizers_are_checked():
    x0, _ = batch(0, 240)
    x7, _ = batch(7, 240)  # 1797 // 240 = 7 batches per pass: step 7 is batch 0 again
    assert torch.equal(x0, x7)
    with pytest.raises(ValueError, match="optimizer 'lamb' is not one of"):
        make_optimizer([], "lamb", 0.1)


def test_every_script_that_joins_a_group_leaves_through_finish():
    """A rank that returns normally can abort in Python's teardown (``utils.scale_out.torchrun.finish`` says why), and
    torchrun then reports a failed run after correct results. Lightning's script is left to Lightning, whose
    launcher starts the other ranks and tears the group down itself."""
    from utils.launch.scripts import SCRIPTS
    joins = [p for p in sorted(SCRIPTS.glob("*.py")) if "init_from_env(" in p.read_text()
             or "init_process_group(" in p.read_text()]
    assert len(joins) >= 6, [p.name for p in joins]  # 02, 04, 06, 07, 09, 11 (05 runs 09's main)
    missing = [p.name for p in joins if "finish()" not in p.read_text()]
    assert not missing, f"{missing} join a process group but do not end with utils.scale_out.torchrun.finish()"
