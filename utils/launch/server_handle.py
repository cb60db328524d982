"""The kernel's handle on its rank server (``server.py``): start it once per kernel, speak its protocol.

``kernel.py`` (``run_ranks``) asks ``rank_server()`` for the server, has it import the heavy libraries the
notebook has imported (``mirror_imports``), fork one rank per ``launch`` and report the ranks' exits (``poll``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection

from .children import send_signal
from .restricted import loads_plain
from .warm import ENV as WARM_ENV
from .warm import fork_rank_server

# Libraries that take seconds to import. Once the notebook has imported one of them (or a part of
# one), the server imports the same modules too, once, so that ranks start with them instead of
# importing them each.
HEAVY_MODULES = ("lightning", "deepspeed", "torch._dynamo", "torch.distributed.fsdp", "torch.distributed.tensor",
                 "torch.distributed.pipelining", "torch.distributed.checkpoint", "transformers", "sklearn")

_SERVER = None
# A function that wraps the server's command line (``argv -> argv``), or None: the workshop's grader starts the
# server, and so every rank, inside its sandbox (``utils.workshop.sandbox``), and only then
SERVER_WRAPPER = None


def warm_rank_server(fd, env, root):
    """In the test suite's kernels only (``warm.py``): the same server, forked from a process that has already
    imported torch. None everywhere else."""
    if not os.environ.get(WARM_ENV):
        return None
    cwd = os.getcwd()
    return fork_rank_server(fd, env, [cwd, root, *[p for p in sys.path if p not in ("", cwd, root)]])


def rank_server() -> RankServer:
    """This kernel's rank server, started on first use (and again if it died)."""
    global _SERVER
    if _SERVER is None or not _SERVER.alive():
        _SERVER = RankServer()
    return _SERVER


def stop_rank_server():
    """Stop this kernel's rank server, if it runs, and wait for it to end (the workshop's judge, between answers:
    each learner gets a server of its own, in a sandbox of its own, stopped after the learner's last answer)."""
    global _SERVER
    if _SERVER is not None:
        _SERVER.stop()
        _SERVER = None


def sweep_rank_server():
    """If this kernel's rank server runs in a sandbox, have it kill what else runs there (``RankServer.sweep``): the
    workshop's judge, between two answers of one learner, whose server it keeps. Returns how many; a server that has
    died meanwhile is stopped (the next answer starts another)."""
    global _SERVER
    if _SERVER is None or not _SERVER.alive():
        return 0
    try:
        return _SERVER.sweep()
    except (OSError, EOFError, RuntimeError, TimeoutError):  # died, or stopped by what it should have swept
        stop_rank_server()
        return 0


class RankServer:
    """Starts ``python -m utils.launch.server`` and speaks its protocol (see server.py)."""

    def __init__(self):
        ours, theirs = socket.socketpair()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds utils/
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PYTHONPATH=path)
        # -P: the folder it starts in (a learner's, in a grader) is not on its path, so no file there shadows a module
        command = [sys.executable, "-P", "-m", "utils.launch.server", str(theirs.fileno())]
        if SERVER_WRAPPER is not None:  # a sandbox: never the test suite's warm fork, which would be outside it
            # its output not the answer's that started it: the server may outlive that answer (its learner's next)
            self.proc = subprocess.Popen(SERVER_WRAPPER([*command, "--sandboxed"]), pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        else:
            self.proc = warm_rank_server(theirs.fileno(), env, root) or subprocess.Popen(
                command, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        self.sock = ours
        self.conn = Connection(os.dup(ours.fileno()))
        self.exit_codes = {}  # pid -> exit code, as the server reports ranks ending
        self.imported = set()

    def alive(self):
        return self.proc.poll() is None

    def stop(self, wait=10.0):
        """Close the socket (the server then kills its ranks and exits), wait ``wait`` seconds, then kill it."""
        self.conn.close()
        self.sock.close()
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def sweep(self, wait=10.0):
        """Have a sandboxed server kill every other process of its sandbox (what an answer left running) and say how
        many (``server.py``); 0 for a server outside a sandbox, which kills nothing."""
        if SERVER_WRAPPER is None:
            return 0
        self.conn.send(("sweep",))
        deadline = time.monotonic() + wait
        while self.conn.poll(max(0.0, deadline - time.monotonic())):
            message = self._read()
            if message[0] == "swept":
                return message[1]
        raise TimeoutError(f"the rank server did not sweep its sandbox within {wait:g} s (stopped by a process there?)")

    def mirror_imports(self):
        """Have the server import the heavy libraries this kernel has imported since it started."""
        self.preload([name for name in list(sys.modules)
                      if any(name == heavy or name.startswith(heavy + ".") for heavy in HEAVY_MODULES)])

    def preload(self, modules):
        """Have the server import ``modules`` (those it has not yet), once, so that no rank forked later has to; a
        module that fails to import is left to the rank that needs it. Returns {module: error} of the failures."""
        wanted = [name for name in dict.fromkeys(modules) if name not in self.imported]
        if not wanted:
            return {}
        self.conn.send(("preload", wanted, dict(os.environ), list(sys.path)))
        failed = self._reply("preloaded")[1]
        self.imported.update(wanted)
        return failed

    def launch(self, setup, payload, fds):
        """Fork one rank with these pipes (write ends); returns its pid."""
        self.conn.send(("launch", setup, payload))
        socket.send_fds(self.sock, [b"F"], fds)
        return self._reply("started")[1]

    def signal(self, pid, signum, group=False, alone=True):
        """Signal a rank (``send_signal``). A server in a sandbox numbers its ranks in its own process namespace, where
        the same number is another process here: it is asked to send the signal itself."""
        if SERVER_WRAPPER is None:
            send_signal(pid, signum, group, alone)
        else:
            try:
                self.conn.send(("signal", pid, int(signum), group, alone))
            except OSError:  # the server is gone, and its ranks with it (PR_SET_PDEATHSIG)
                pass

    def poll(self, timeout=0.0):
        """Read the server's messages that are waiting (or arrive within ``timeout``)."""
        while self.conn.poll(timeout):
            self._read()
            timeout = 0.0

    def _reply(self, kind):
        while True:
            message = self._read()
            if message[0] == kind:
                return message

    def _read(self):
        try:  # plain data only: in a grader the server runs in the answer's sandbox, beside its code
            message = loads_plain(self.conn.recv_bytes())
        except (EOFError, OSError):
            raise RuntimeError("the rank server died (is the machine out of memory?); run the cell again "
                               "to start a new one") from None
        if message[0] == "exited":
            self.exit_codes[message[1]] = message[2]
        return message
