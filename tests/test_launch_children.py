"""utils.launch.children: a child in its own session, its output read, a timeout, its whole tree killed.

One test per promise of the module's docstring. Each child is a small Python (no torch): a second or less.
"""

import os
import subprocess
import sys
import time

import pytest

from utils.launch import ChildResult, kill_tree, run_child, run_children, start_child

pytestmark = pytest.mark.usefixtures("no_children_left")

PY = sys.executable


def gone(pid):
    """True when ``pid`` is dead: no such process, or a zombie waiting for init to reap it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("own_session", [False, True], ids=["same-group", "own-session"])
def test_timeout_kills_the_child_and_its_grandchild(tmp_path, own_session):
    """A child that starts a grandchild which sleeps, then sleeps itself: at the timeout both are gone, whether the
    grandchild stayed in the child's group or left for a session of its own (as torchrun's workers do), and the
    wait does not hang on the grandchild, which holds the child's stdout."""
    pid_file = tmp_path / "grandchild.pid"
    parent = ("import subprocess, time; "
              f"p = subprocess.Popen(['sleep', '300'], start_new_session={own_session}); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(300)")
    start = time.monotonic()
    child = start_child([PY, "-c", parent])
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() - start < 60, "the child never started its grandchild"
        time.sleep(0.05)
    done = child.wait(timeout=2)
    assert done.timed_out and done.stopped == "timed out after 2 s" and done.code is None, done
    assert time.monotonic() - start < 30, "the wait hung on the grandchild's copy of the pipe"
    assert "started" in done.output
    grandchild = int(pid_file.read_text())
    time.sleep(0.2)
    assert gone(child.pid) and gone(grandchild), "a process of the tree outlived the timeout"


def test_output_env_and_cwd_reach_the_child(tmp_path):
    """stdout and stderr are collected (together, as written), the environment given is the child's whole
    environment, and the working folder is the one given."""
    show = ("import os, sys; print('out:', os.getcwd()); print('err:', os.environ.get('COURSE_X'), file=sys.stderr); "
            "print('home:', os.environ.get('HOME'))")
    done = run_child([PY, "-c", show], 60, env={"COURSE_X": "42", "PATH": os.environ["PATH"]}, cwd=tmp_path)
    assert isinstance(done, ChildResult) and done.code == 0 and done.stopped is None and not done.timed_out
    assert f"out: {tmp_path}" in done.output and "err: 42" in done.output and "home: None" in done.output
    assert done.tail(1) == "home: None" and done.command == (PY, "-c", show)


def test_exit_codes_and_signals_are_reported():
    assert run_child([PY, "-c", "raise SystemExit(3)"], 60).code == 3
    assert run_child([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], 60).code == -15


def test_output_is_kept_whole_or_head_and_tail():
    """A child may print without end: with a limit only the first and last limit/2 bytes are kept."""
    prints = [PY, "-c", "import sys; sys.stdout.write('a' * 60 + 'b' * 10_000 + 'c' * 60)"]
    assert run_child(prints, 60).output == "a" * 60 + "b" * 10_000 + "c" * 60
    kept = run_child(prints, 60, limit=100).output
    assert kept == "a" * 50 + "\n[... 10,020 bytes of output left out ...]\n" + "c" * 50


def test_several_children_stop_at_a_failure_or_until(capsys):
    """run_children: a failure stops the others (code None: killed), ``until`` stops all, the echoed lines carry
    the child's index and come in the calling thread, and each child can have its own environment."""
    waits = [PY, "-c", "import time; print('step 1/2 ready', flush=True); time.sleep(300)"]
    fails = [PY, "-c", "import time; time.sleep(0.5); raise SystemExit(2)"]
    start = time.monotonic()
    first, second = run_children([waits, fails], 120, echo=lambda line: line.startswith("step"), prefix="[agent {i}] ")
    assert (first.code, second.code, first.stopped) == (None, 2, "exit code 2") and time.monotonic() - start < 60
    assert capsys.readouterr().out == "[agent 0] step 1/2 ready\n"
    (done,) = run_children([waits], 120, until=lambda out: "ready" in out)
    assert done.code is None and done.stopped == "until"
    show = [PY, "-c", "import os; print(os.environ['WHO'])"]
    outs = [d.output for d in run_children([show, show], 60, env=[{"WHO": "zero"}, {"WHO": "one"}])]
    assert outs == ["zero\n", "one\n"]


def test_a_missing_command_or_folder_errors_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="no program 'no-such-program-here'"):
        run_child(["no-such-program-here", "--flag"], 60)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        run_child([PY, "-c", "pass"], 60, cwd=tmp_path / "missing")
    # a later command that cannot start: the earlier ones, already running, are killed, not left behind
    with pytest.raises(FileNotFoundError, match="no program"):
        run_children([[PY, "-c", "import time; time.sleep(300)"], ["no-such-program-here"]], 60)


@pytest.mark.parametrize("call, message", [
    (lambda: run_child([PY, "-c", "pass"], 0), r"timeout=0: give a positive number of seconds"),
    (lambda: run_child([PY, "-c", "pass"], -5), r"timeout=-5"),
    (lambda: run_children([], 60), r"no command given"),
    (lambda: run_child("python -c pass", 60), r"command 'python -c pass': give a non-empty list of arguments"),
    (lambda: run_children([[PY], [PY]], 60, env=[{}]), r"1 environments for 2 commands"),
    (lambda: run_child([PY, "-c", "pass"], 60, limit=1), r"limit=1: give the bytes of output to keep"),
    (lambda: start_child([]), r"command \[\]: give a non-empty list"),
])
def test_a_bad_argument_raises_at_once_with_its_number(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_kill_tree_also_kills_what_an_ended_child_left_in_its_group(tmp_path):
    """A child that exits and leaves a process in its group (one it did not wait for): kill_tree ends it too."""
    pid_file = tmp_path / "left.pid"
    leaves = f"import subprocess; open({str(pid_file)!r}, 'w').write(str(subprocess.Popen(['sleep', '300']).pid))"
    proc = subprocess.Popen([PY, "-c", leaves], start_new_session=True, stdout=subprocess.DEVNULL)
    proc.wait()
    left = int(pid_file.read_text())
    assert not gone(left)
    kill_tree([proc])
    time.sleep(0.2)
    assert gone(left)
