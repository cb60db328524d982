"""Step 3 of a launch: the rank server, a warm Python that forks ranks on the kernel's request.

Why not fork the kernel itself? A notebook kernel is a poor parent. Once it has run ``backward()``
on a machine with a GPU, autograd's per-device threads make a forked child unable to run backward
at all; once it has asked CUDA anything, a forked child cannot use CUDA; once it has run a parallel
matmul, GNU OpenMP's thread pool does not survive a fork. And a freshly *spawned* interpreter
(what ``torchrun`` starts) takes seconds to import torch.

So each kernel starts one server, ``python -m utils.launch.server FD`` (a grader's, in its sandbox, adds
``--sandboxed``: the server then makes itself undumpable, ``rank.undumpable``): a fresh interpreter (exec'd,
not forked) that imports torch and the heavy modules the notebook uses, then does nothing but fork.
It never runs autograd, CUDA or an OpenMP region, so its children may use all three, and a fork
costs milliseconds. It is the standard library's ``forkserver`` idea, written out here because a
course needs two things that one cannot do: import more modules later (a lesson imports DeepSpeed
half-way through), and give each rank the kernel's *current* environment and folder.

The kernel talks to it over a Unix socket (``FD``), one pickled message at a time:

- ``("preload", modules, env, sys_path)``: import these too, once; answers ``("preloaded", errors)``;
- ``("launch", setup, payload)``, followed by three file descriptors (the rank's result, stdout
  and stderr pipes) and maybe more: the read end of a pipe holding the rank's own arguments (``run_ranks``'s
  ``rank_args``) and the rank's socket to the kernel's relay (``relay.py``), both handed on unread: fork a rank that
  runs ``rank.rank_main``; answers ``("started", pid)``;
- ``("signal", pid, signum, group, alone)``: send a rank (or its process group) a signal: a server in a sandbox
  has a process namespace of its own, so only it knows which process a rank's number is;
- ``("sweep",)``: in a sandbox (``--sandboxed``), kill every process of its namespace but the sandbox's first and
  itself, ranks included: what an answer's code left running (a daemon) never reaches the next answer it serves;
  answers ``("swept", count)`` (always 0 outside a sandbox, where the namespace is the machine's);
- and, whenever a rank ends, the server says ``("exited", pid, exit_code)`` by itself.

When the kernel goes away (the socket closes) the server kills its ranks and exits; Linux also
kills it if the kernel dies (PR_SET_PDEATHSIG), and each rank if the server dies. (The test suite forks
servers from a warm process instead, ``warm.py``: there the socket and the kernel's process group end it.)
"""

from __future__ import annotations

import gc
import importlib
import os
import signal
import socket
import sys
import time
from multiprocessing.connection import Connection, wait

from .rank import die_with_parent, rank_main, undumpable
from .children import send_signal

PRELOAD = ("torch", "torch.distributed", "torch.nn", "torch.optim", "torch.nn.functional", "cloudpickle", "numpy")


def main(fd: int, sandboxed: bool = False):
    conn = Connection(fd)  # pickled messages, framed
    sock = socket.socket(fileno=os.dup(fd))  # the same socket, for the file descriptors that come along
    die_with_parent()  # Linux kills this server if the kernel dies (the socket's end-of-file also tells us)
    if sandboxed:  # a grader's: ranks' own arguments pass through here, beside other processes of the answer's user
        undumpable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a kernel interrupt is the kernel's to handle
    _preload(PRELOAD)
    import torch

    torch.set_num_threads(1)  # no OpenMP pool here, ever: each rank starts its own

    # A rank that ends sends us SIGCHLD; the wake-up pipe turns the signal into something `wait` sees.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children = set()

    while True:
        ready = wait([conn, wake_r])
        if wake_r in ready:
            os.read(wake_r, 4096)
            for pid, code in _reap(children):
                conn.send(("exited", pid, code))
        if conn not in ready:
            continue
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the kernel is gone: so are its ranks
            for pid in children:
                _kill(pid)
            return
        if message[0] == "preload":
            _, modules, env, sys_path = message
            os.environ.update(env)
            sys.path[:] = sys_path
            conn.send(("preloaded", _preload(modules)))
        elif message[0] == "signal":  # to one of our ranks, in our own process namespace (server_handle.signal)
            _, pid, signum, group, alone = message
            if pid in children or group:
                send_signal(pid, signum, group, alone)
        elif message[0] == "sweep":
            conn.send(("swept", _sweep() if sandboxed else 0))
        elif message[0] == "launch":
            _, setup, payload = message
            _, fds, _, _ = socket.recv_fds(sock, 1, 5)
            pid = os.fork()
            if pid == 0:  # the rank: forget the server, then run (rank_main never returns)
                os.setpgid(0, 0)  # its own process group: the kernel stops it with whatever it started
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel decides when ranks stop
                for own in (wake_r, wake_w):
                    os.close(own)
                conn.close(), sock.close()
                rank_main(setup, payload, *fds)
                os._exit(1)  # not reached
            try:
                os.setpgid(pid, pid)  # also here, so the group exists before the kernel may need it
            except OSError:  # the child got there first, or has already ended
                pass
            children.add(pid)
            for child_fd in fds:
                os.close(child_fd)
            conn.send(("started", pid))


def _preload(modules):
    """Import modules once, here, so every rank forked afterwards has them; returns the failures."""
    failed = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a rank that needs it will say so itself
            failed[name] = f"{type(exc).__name__}: {exc}"
    gc.freeze()  # what is imported now is never collected: a rank's gc then skips these objects
    return failed


def _sweep(rounds=20):
    """SIGKILL every process of this (the sandbox's) process namespace but its first (bwrap) and this server, again
    while any is left (one may have forked between a listing and its kill), ``rounds`` times at most; returns how many
    kills. A process that ends meanwhile is not counted."""
    killed = 0
    for _ in range(rounds):
        others = [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) not in (1, os.getpid()) and _alive(e)]
        if not others:
            break
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    return killed


def _alive(pid):
    """Whether process ``pid`` (a /proc entry) still runs: not a zombie waiting for its parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _reap(children):
    """Exit codes of the ranks that have ended (negative: killed by that signal)."""
    ended = []
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        children.discard(pid)
        ended.append((pid, os.waitstatus_to_exitcode(status)))
    return ended


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    main(int(sys.argv[1]), sandboxed="--sandboxed" in sys.argv[2:])
