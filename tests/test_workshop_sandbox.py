"""The sandbox an untrusted answer runs in (utils/workshop/sandbox.py, issue 37): it sees what it is given read-only,
not what is hidden, writes only its own folder, takes every process it started with it, and meets its limits.
Skipped, with the reason, where bubblewrap cannot run (its message is tested everywhere)."""

import os
import subprocess
import sys
import time

import pytest

from utils.course.notebook_runner import ROOT
from utils.workshop import sandbox

WHY = sandbox.available()
needs_bwrap = pytest.mark.skipif(WHY is not None, reason=f"the sandbox cannot run here: {WHY}")


def run(code, tmp_path, **how):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    command = sandbox.sandboxed([sys.executable, "-c", code], work, **how)
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_a_missing_bwrap_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda tool: None if tool == "bwrap" else f"/usr/bin/{tool}")
    assert "apt install bubblewrap" in sandbox.available()


@needs_bwrap
def test_it_reads_what_it_is_given_and_nothing_hidden(tmp_path):
    given, hidden = tmp_path / "course", tmp_path / "course" / "solutions"
    hidden.mkdir(parents=True)
    (given / "lesson.txt").write_text("lesson")
    (hidden / "answer.txt").write_text("the answer")
    (tmp_path / "other_learner.txt").write_text("theirs")
    done = run(f"""
import os
print(open({str(given / 'lesson.txt')!r}).read())
print(os.listdir({str(hidden)!r}))
for path in ({str(tmp_path / 'other_learner.txt')!r}, {str(hidden / 'answer.txt')!r}):
    print(os.path.exists(path))
try:
    open({str(given / 'planted.txt')!r}, 'w')
except OSError as err:
    print(err.strerror)
open('mine.txt', 'w').write('ok')
""", tmp_path, readable=[given], hidden=[hidden])
    assert done.stdout.split("\n")[:5] == ["lesson", "[]", "False", "False", "Read-only file system"], done
    assert (tmp_path / "work" / "mine.txt").read_text() == "ok"
    assert not (given / "planted.txt").exists()


@needs_bwrap
def test_what_it_writes_outside_its_folder_lands_on_disk_or_nowhere(tmp_path):
    """/tmp and /dev/shm are folders of its own on disk (a tmpfs there would hold memory no RLIMIT_AS counts); a
    hidden folder is read-only and a hidden file empty."""
    course = tmp_path / "course"
    (course / "solutions").mkdir(parents=True)
    (course / "scores.json").write_text("the mutants' verdicts")
    done = run(f"""
import os
for path in ('/tmp/big', '/dev/shm/big'):
    open(path, 'wb').write(bytes(1 << 20))
print(repr(open({str(course / 'scores.json')!r}).read()))
try:
    open({str(course / 'solutions' / 'x')!r}, 'w')
except OSError as err:
    print(err.strerror)
""", tmp_path, readable=[course], hidden=[course / "solutions", course / "scores.json"])
    assert done.stdout.split("\n")[:2] == ["''", "Read-only file system"], done
    for name in ("tmp", "shm"):  # beside work, never in it (review of issue 37: a symlink left there was followed)
        assert [p.stat().st_size for p in tmp_path.glob(f".sandbox-*/{name}/big")] == [1 << 20]
    assert not list((tmp_path / "work").glob(".sandbox-*"))


@needs_bwrap
def test_no_capability_inside_even_for_root(tmp_path):
    """Started by root, bwrap would keep root's capabilities inside (CAP_SYS_ADMIN: unmount what hides the
    solutions); the sandbox's own user has none, whoever starts it (review of issue 37)."""
    done = run("print([l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm'))])",
               tmp_path)
    assert done.stdout.strip() == "['0000000000000000', '0000000000000000']", done


@needs_bwrap
def test_every_process_it_started_ends_with_it(tmp_path):
    marker = "31337.25"
    done = run(f"import subprocess; subprocess.Popen(['sleep', '{marker}'], start_new_session=True); print('left')",
               tmp_path)
    assert done.stdout.strip() == "left", done
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout.split()
    assert left == [], f"a process outlived the sandbox: {left}"


@needs_bwrap
def test_no_network_but_loopback(tmp_path):
    done = run("import socket; print(sorted(n for _, n in socket.if_nameindex()))", tmp_path)
    assert done.stdout.strip() == "['lo']", done


@needs_bwrap
def test_memory_and_cpu_limits(tmp_path):
    done = run("import torch\ntry:\n    torch.empty(8 << 30, dtype=torch.uint8).fill_(1)\nexcept RuntimeError as e:\n"
               "    print('refused' if \"can't allocate memory\" in str(e) else e)", tmp_path, memory=2 << 30)
    assert done.stdout.strip() == "refused", done
    done = run("while True:\n    pass", tmp_path, cpu=1)
    assert done.returncode == 128 + 24, done  # bwrap exits with 128 + the signal that ended its program: SIGXCPU


@needs_bwrap
def test_a_process_cannot_read_an_undumpable_neighbours_memory(tmp_path):
    """A rank that holds its own arguments (``run_ranks``'s ``rank_args``: a checker's secret seed) makes itself
    undumpable (``rank.undumpable``); in the sandbox a neighbour of the same user cannot read its memory or open its
    files through /proc, while it can read a dumpable one's (the control)."""
    code = """
import ctypes, os, time
def child(secret):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        if secret:
            ctypes.CDLL(None).prctl(4, 0)  # PR_SET_DUMPABLE 0, as utils.launch.rank.undumpable does
        os.write(w, b"x"); os.close(w)
        time.sleep(30)
        os._exit(0)
    os.close(w); os.read(r, 1); os.close(r)
    return pid
for secret in (False, True):
    pid = child(secret)
    for what in ("environ", "mem", "fd/0"):
        try:
            with open(f"/proc/{pid}/{what}", "rb") as f:
                f.read(1) if what != "mem" else None
            print(secret, what, "read")
        except OSError as err:
            print(secret, what, type(err).__name__)
    os.kill(pid, 9)
"""
    done = run(code, tmp_path)
    lines = done.stdout.split("\n")
    if "False mem read" not in lines:  # the control: a kernel whose Yama forbids even this (ptrace_scope 2 or 3)
        pytest.skip(f"this kernel refuses reading a dumpable child's memory too, so the test shows nothing: {lines}")
    assert "False environ read" in lines, done  # the control: same user, dumpable
    assert [line for line in lines if line.startswith("True")] == [f"True {what} PermissionError"
                                                                  for what in ("environ", "mem", "fd/0")], done


def test_a_rank_gets_its_own_arguments_alone_and_a_graders_ranks_are_undumpable(monkeypatch):
    """``rank_args`` reach their rank only, after the shared arguments. A notebook's ranks stay dumpable (the learner's
    debugger may attach); a server started the grader's way (through ``SERVER_WRAPPER``, here one that wraps nothing)
    makes itself undumpable, and so are the ranks it forks."""
    from utils.launch import run_ranks, server_handle

    def report(shared, *own):
        import ctypes
        return shared, own, ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # 3 = PR_GET_DUMPABLE

    assert run_ranks(report, "all", world_size=2, rank_args=[(10,), (11,)], verbose=False) == [
        ("all", (10,), 1), ("all", (11,), 1)]
    server_handle.stop_rank_server()
    monkeypatch.setattr(server_handle, "SERVER_WRAPPER", lambda argv: argv)
    try:
        assert run_ranks(report, "all", world_size=2, rank_args=[(10,), (11,)], verbose=False) == [
            ("all", (10,), 0), ("all", (11,), 0)]
    finally:
        server_handle.stop_rank_server()


def test_a_scratch_folder_the_caller_gives_holds_the_sandboxs_own_and_must_be_fresh(tmp_path):
    """The hub gives each learner's server a scratch folder it removes when the server stops; a folder that is not
    empty, or inside ``work`` (where the sandboxed code writes), is refused."""
    work, scratch = tmp_path / "work", tmp_path / "scratch"
    scratch.mkdir()
    command = sandbox.sandboxed(["true"], work, scratch=scratch)
    assert str(scratch / "tmp") in command and sorted(p.name for p in scratch.iterdir()) == ["shm", "tmp"]
    assert not list(tmp_path.glob(".sandbox-*")), "a folder made beside work, though the caller gave one"
    for bad in (scratch, work / "inside"):
        bad.mkdir(exist_ok=True)
        with pytest.raises(ValueError, match="must be empty and outside work"):
            sandbox.sandboxed(["true"], work, scratch=bad)


@needs_bwrap
def test_a_sandboxed_rank_server_sweeps_what_an_answer_left_running(monkeypatch, tmp_path):
    """The judge keeps a learner's rank server for the learner's next answer; between two, the server kills what the
    answer's code left in the sandbox (a daemon of a rank, in a session of its own), and keeps serving."""
    from utils.launch import run_ranks, server_handle

    marker = f"31337.{os.getpid()}"

    def leave_a_daemon(marker):
        import subprocess
        subprocess.Popen(["sleep", marker], start_new_session=True)
        return "left"

    def running():
        return subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout.split()

    server_handle.stop_rank_server()
    monkeypatch.setattr(server_handle, "SERVER_WRAPPER",
                        lambda argv: sandbox.sandboxed(argv, tmp_path / "work", readable=[ROOT]))
    try:
        assert run_ranks(leave_a_daemon, marker, world_size=1, process_group=False, verbose=False) == ["left"]
        assert running(), "the planted daemon did not start: the test proves nothing"
        assert server_handle.sweep_rank_server() >= 1
        time.sleep(0.5)
        assert running() == [], "the daemon outlived the sweep"
        assert run_ranks(leave_a_daemon, "0.1", world_size=1, process_group=False, verbose=False) == ["left"]
    finally:
        server_handle.stop_rank_server()
