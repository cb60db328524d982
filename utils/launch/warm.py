"""Warm starts for the test suite: one process imports torch and IPython's kernel once, then forks a kernel for each
notebook and the rank server each of those kernels asks for.

Every notebook the suite runs starts a kernel, and that kernel a rank server (``server.py``); both import torch,
about 3 s of one core each (``python -c "import torch"``: 3.2 s of CPU here). Here one process, the
*zygote* (``python utils/launch/warm.py SOCKET``, started by ``WarmStarts``), imports them once and then forks
(lesson 05a, measured alone on 2 cores: 18.4 s with a cold kernel and server, 8.9 s warm):

- ``("kernel", argv, env, cwd, log)``: a child that becomes ``python -m ipykernel_launcher -f CONNECTION_FILE``
  would (``runpy``, in ``cwd``, with ``env``, its output to ``log``), in a process group of its own (not a session
  of its own, as jupyter_client gives a cold kernel: the server must be able to join the group, which Linux allows
  within one session only);
- ``("server", env, cwd, sys_path, pgid)`` with three file descriptors (its socket to the kernel, the kernel's
  stdout and stderr): a child that joins the kernel's process group and runs ``server.main(fd)``, as
  ``python -m utils.launch.server FD`` would. Its parent is the zygote, so it ends with its kernel's socket
  (server.py) or its group, not by the parent-death signal a cold server has.

Each request is one connection to the zygote's Unix socket, answered ``("pid", pid)``. The zygote imports nothing
of ``utils`` and the children forget what the zygote had of it: a kernel or server imports the course from its own
folder, as a cold one does. What the children inherit is torch and IPython, already imported (so a kernel has
``torch`` in ``sys.modules`` before its notebook imports it; a name is still bound only by the notebook's own
``import``). The zygote runs no Python thread when it forks; numpy's OpenBLAS starts a native thread pool at import,
which the rank server forks past too. It dies with its parent; a request that fails (a kernel killed while it asks)
ends that request only. ``COURSE_WARM_STARTS`` stays in what the kernel passes on (ranks, scripts): a process there
that starts a rank server also gets a warm one.

Learners never meet this: only ``utils.course.notebook_runner.execute(warm=...)``, which the test suite uses,
starts kernels here; a kernel asks here for its rank server only while ``COURSE_WARM_STARTS`` names a zygote that
answers, and otherwise starts one the usual way (``server_handle``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path

ENV = "COURSE_WARM_STARTS"  # the zygote's socket, in a kernel's environment
KERNEL_PRELOAD = ("torch", "cloudpickle", "numpy", "ipykernel.kernelapp")  # what every notebook's kernel imports
HERE = Path(__file__).resolve()


class WarmStarts:
    """The parent's side: starts the zygote (in this process's CPU affinity), forks kernels through it."""

    def __init__(self, env=None):
        self.folder = tempfile.mkdtemp(prefix="warm-starts-")
        self.address = os.path.join(self.folder, "zygote.sock")
        ready_r, ready_w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, str(HERE), self.address, str(ready_w)], pass_fds=[ready_w],
                                     stdin=subprocess.DEVNULL, env=env, cwd=self.folder)
        os.close(ready_w)
        with os.fdopen(ready_r, "rb") as ready:  # the zygote writes one byte once it listens
            if ready.read(1) != b"R":
                raise RuntimeError(f"the warm-start zygote did not start (exit code {self.proc.wait()})")

    def alive(self):
        return self.proc.poll() is None

    def fork_kernel(self, argv, env, cwd, log):
        """pid of a new kernel: argv is the kernel spec's (``... -m ipykernel_launcher -f FILE``)."""
        return request(self.address, ("kernel", list(argv), dict(env, **{ENV: self.address}), str(cwd), str(log)))

    def close(self):
        self.proc.kill()
        self.proc.wait()
        try:
            os.unlink(self.address)
            os.rmdir(self.folder)
        except OSError:
            pass


def request(address, message, fds=()):
    """Send one request to the zygote at ``address``; the pid it forked."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(address)
        conn = Connection(os.dup(sock.fileno()))
        try:
            conn.send(message)
            if fds:
                socket.send_fds(sock, [b"F"], list(fds))
            kind, pid = conn.recv()
        finally:
            conn.close()
    assert kind == "pid", kind
    return pid


def fork_rank_server(fd, env, sys_path):
    """A rank server forked by the zygote this kernel came from, as a ``ForkedProcess``; None when there is none
    (not a warm kernel, or its zygote is gone): the caller starts one the usual way."""
    address = os.environ.get(ENV)
    if not address:
        return None
    try:
        pid = request(address, ("server", dict(env), os.getcwd(), list(sys_path), os.getpgid(0)), (fd, 1, 2))
    except (OSError, EOFError):
        return None
    return ForkedProcess(pid)


class ForkedProcess:
    """What jupyter_client and ``server_handle`` ask of a ``Popen``, for a process that is not our child (its parent,
    the zygote, reaps it): alive while /proc says it is and not a zombie; its exit code is not ours to know (-1)."""

    stdin = stdout = stderr = None

    def __init__(self, pid):
        self.pid, self.returncode = pid, None

    def poll(self):
        if self.returncode is None:
            try:
                state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                state = "X"
            if state in ("Z", "X"):
                self.returncode = -1
        return self.returncode

    def wait(self, timeout=None):
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, signum):
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)


# ---- the zygote (runs as a script: ``python utils/launch/warm.py SOCKET READY_FD``) ----

def _zygote(address, ready_fd):
    import importlib

    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE.parent]  # not utils/launch/ itself
    base_path = list(sys.path)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in KERNEL_PRELOAD:
        importlib.import_module(name)
    import gc

    gc.freeze()
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(16)
    os.write(ready_fd, b"R")
    os.close(ready_fd)
    while True:
        sock, _ = listener.accept()
        conn = Connection(os.dup(sock.fileno()))
        fds = []
        try:
            message = conn.recv()
            fds = socket.recv_fds(sock, 1, 3)[1] if message[0] == "server" else []
            pid = os.fork()
            if pid == 0:
                _child(message, fds, base_path, listener, conn, sock)
            if message[0] == "kernel":
                try:
                    os.setpgid(pid, pid)  # here too, so the group exists before anyone signals it
                except OSError:  # the child got there first
                    pass
            conn.send(("pid", pid))
        except (OSError, EOFError):  # the asker went away (a kernel killed meanwhile): that request only
            pass
        finally:
            for fd in fds:
                os.close(fd)
            conn.close(), sock.close()


def _child(message, fds, base_path, *zygote_files):
    try:
        for each in zygote_files:
            each.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _forget_the_course()
        if message[0] == "kernel":
            _become_kernel(*message[1:], base_path)
        else:
            _become_server(*fds, *message[1:])
    except BaseException:  # noqa: BLE001 - said where the kernel's or notebook's log shows it
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(1)


def _become_kernel(argv, env, cwd, log, base_path):
    """What ``python -m ipykernel_launcher -f FILE`` does, started in ``cwd`` with ``env``."""
    import runpy

    os.setpgid(0, 0)  # a group of its own: jupyter_client signals (interrupts, kills) the group
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0), os.dup2(out, 1), os.dup2(out, 2)
    os.close(out), os.close(null)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env, JPY_PARENT_PID=str(os.getppid()))
    module = argv[argv.index("-m") + 1]
    # ipykernel read JPY_PARENT_PID when the zygote imported it, so say it again: it exits if its parent (here) goes
    sys.argv = [module, *argv[argv.index("-m") + 2:], f"--IPKernelApp.parent_handle={os.getppid()}"]
    sys.path[:] = [cwd, *base_path]  # `python -m` puts the working folder first
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    import atexit

    atexit._run_exitfuncs()  # what a cold kernel's interpreter does as it exits
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)


def _become_server(fd, stdout, stderr, env, cwd, sys_path, pgid):
    """What ``python -m utils.launch.server FD`` does, in the kernel's process group (killed with it), writing where
    the kernel writes (a cold server inherits the kernel's stdout and stderr)."""
    os.dup2(stdout, 1), os.dup2(stderr, 2)
    os.close(stdout), os.close(stderr)
    try:
        os.setpgid(0, pgid)
    except OSError:  # the kernel's group is gone: the kernel too, so the socket is closed and main() returns
        pass
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = sys_path
    from utils.launch.server import main

    main(fd)
    os._exit(0)


def _forget_the_course():
    for name in [name for name in sys.modules if name == "utils" or name.startswith("utils.")]:
        del sys.modules[name]


def _reap():  # server.py's _reap and rank.py's die_with_parent, written again: the zygote imports nothing of utils
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _die_with_parent():
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


if __name__ == "__main__":
    _zygote(sys.argv[1], int(sys.argv[2]))
