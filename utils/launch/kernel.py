"""Steps 2 and 5 of a launch, in the kernel: hand the ranks to the server, then watch them.

``run_ranks(fn, *args, world_size=4)`` runs ``fn(*args)`` on four ranks and returns the four
return values, ordered by rank. In the order it happens:

1. **Plan** (``plan.py``): backend, device and threads, or an error saying what to do.
2. **Pack.** ``fn`` and its arguments are pickled *by value* with cloudpickle: a function or class
   defined in the notebook travels with the globals it uses. So do the source lines of the
   notebook's cells (tracebacks then show them) and the kernel's folder, ``sys.path`` and
   environment. The rendezvous is a ``FileStore`` in a fresh temporary folder: two launches (a
   re-run, or another notebook) never share one, and no port has to be free.
3. **Start.** The kernel's rank server (``server.py``, started once per kernel) forks one process
   per rank. Before that it imports whatever heavy library the notebook has imported since (say
   DeepSpeed), so that no rank has to. Each rank gets three pipes of the kernel's: its result,
   its stdout and its stderr.
4. **Watch.** Each rank's output is printed as ``[rank k] ...`` while it runs. If a rank raises, the
   others get a moment to report, then all are stopped, and ``RankError`` names the rank that
   failed *first* with its traceback (its peers' "connection closed" errors are marked secondary).
   If the ranks are still running at ``timeout``, each is asked for its Python stack
   (``faulthandler`` on SIGUSR1), all are stopped, and ``RankTimeoutError`` shows where each was
   stuck. On a kernel interrupt every rank is stopped. No process, pipe or folder is left behind,
   and the kernel itself never joins a process group, runs CUDA or forks.

It is the job torchrun does for scripts, cut down to what a notebook needs.
"""

from __future__ import annotations

import fcntl
import linecache
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from multiprocessing.connection import Connection, wait

import cloudpickle

from .errors import RankError, RankOutcome, failure_error, timeout_error
from .plan import RankSetup, plan_launch
from .relay import Relay
from .restricted import RESULT_LIMIT, loads_plain, loads_tensors, restricted
from .server_handle import rank_server

DEFAULT_TIMEOUT = 180.0  # seconds; pass timeout= for longer cells
FAILURE_GRACE = 1.0  # seconds the other ranks get to report after the first failure
SECRET_LIMIT = 60_000  # bytes of rank_args a rank; a pipe holds 64 KiB before a write blocks
STACK_DUMP_WAIT = 1.0  # seconds to collect the stacks of hung ranks before stopping them



def run_ranks(fn, *args, world_size, timeout=DEFAULT_TIMEOUT, backend="auto", threads_per_rank=None,
              process_group=True, verbose=True, rank_args=None, traffic=None, **kwargs):
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks and return their results, ordered by rank.

    Each rank starts with the default process group initialised (``dist.get_rank()``,
    ``dist.all_reduce`` ... work at once); ``rank_device()`` tells it where to put its tensors.
    ``fn`` may be defined in the notebook: it travels to the ranks by value (cloudpickle), with its
    arguments and the globals it uses. Its return value comes back the same way, so return plain
    values (tensors, numbers, dicts), not modules or process groups; tensors in it (also inside
    lists, tuples and dicts) come back on the CPU. Where this process reads its ranks restricted
    (``restricted.RESTRICTED_ENV``: the workshop's grader), only plain data and tensors come back.

    Raises ``RankError`` when a rank fails (naming the first one, with its traceback) and
    ``RankTimeoutError`` when the ranks are still running after ``timeout`` seconds (showing where
    each was stuck). ``backend`` is "auto", "gloo" or "nccl"; ``threads_per_rank`` None shares the
    cores out; ``process_group=False`` starts the processes without one (for a library that makes
    its own, like Lightning's ``ddp_notebook``); ``verbose`` prints the plan.

    ``rank_args``: one tuple of plain values and tensors per rank, passed after ``args`` to that rank alone, for what
    one rank may know and its peers may not (a checker's secret inputs, ``utils.checkers.rank_secrets``). A tensor that
    views a larger storage travels as a copy of its own elements. They do not travel with the payload: each rank's come
    on a pipe of its own, which the server hands on unread. In the grader's sandbox the server and its ranks are
    undumpable (``PR_SET_DUMPABLE`` 0), so that no other process of the answer's user reads them from a rank's memory.

    ``backend="relay"`` (CPU ranks, ``relay.py``): every message between the ranks passes through this process, and each
    rank is sealed (``seal.py``) before its code runs, so that only what ``seal.py`` lists stays open between them.
    ``traffic``, a list, then gets one list a rank of what the relay carried for it, in order (``("send", peer,
    bytes)``, ``("collective", kind, bytes)``), filled as it happens: it is there after a ``RankError`` or a timeout
    too.
    """
    __tracebackhide__ = True  # IPython and pytest then show the learner's cell, not the launcher
    if not callable(fn):
        raise TypeError(f"run_ranks needs a function to run on every rank, got {type(fn).__name__}.")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}.")
    plan = plan_launch(world_size, backend, threads_per_rank)
    if backend == "relay" and not process_group:
        raise ValueError("backend='relay' is a process group: process_group=False makes none.")
    if traffic is not None and backend != "relay":
        raise ValueError(f"traffic= is the relay's record: pass backend='relay' with it, not {backend!r}.")
    secrets = _rank_args(rank_args, world_size)
    if verbose:
        print(plan.describe(), flush=True)
    payload = cloudpickle.dumps((fn, args, kwargs))
    server = rank_server()
    server.mirror_imports()
    rendezvous = tempfile.mkdtemp(prefix="run_ranks-")
    same_on_every_rank = dict(timeout=timeout, store=os.path.join(rendezvous, "store"), process_group=process_group,
                              cwd=os.getcwd(), sys_path=tuple(sys.path), env=dict(os.environ),
                              cell_sources=_cell_sources())
    ranks, relay = [], None
    try:
        relay = Relay(world_size, traffic) if backend == "relay" else None
        for rank in range(world_size):
            pipes = [os.pipe() for _ in range(3)]  # result, stdout, stderr: (read, write)
            secret = _secret_pipe(secrets[rank]) if secrets else None  # the read end, already filled
            try:
                pid = server.launch(RankSetup.for_rank(plan, rank, **same_on_every_rank), payload,
                                    [w for _, w in pipes] + ([secret] if secret is not None else [])
                                    + ([relay.fd(rank)] if relay is not None else []))
            finally:
                for _, w in pipes:
                    os.close(w)  # the kernel keeps only the read ends, so a dead rank reads as end-of-file
                if secret is not None:
                    os.close(secret)
            ranks.append(_Rank(rank, pid, server, *[Connection(r, writable=False) for r, _ in pipes]))
        if relay is not None:
            relay.start()
        return _watch(ranks, plan, timeout, server)
    except KeyboardInterrupt:
        alive = [r.rank for r in ranks if r.exitcode is None]
        print(f"[launch] interrupted: stopping rank(s) {alive}", file=sys.stderr, flush=True)
        raise
    finally:
        _stop(ranks, server)
        if relay is not None:
            relay.close()
        shutil.rmtree(rendezvous, ignore_errors=True)


def _rank_args(rank_args, world_size):
    """Each rank's ``rank_args``, pickled (plain values, at most a pipe's capacity each); None when there are none."""
    if rank_args is None:
        return None
    if not isinstance(rank_args, (list, tuple)) or len(rank_args) != world_size or not all(
            isinstance(a, tuple) for a in rank_args):
        raise ValueError(f"rank_args must hold one tuple per rank ({world_size}), got {rank_args!r:.200}.")
    out = [_dumps_own(a) for a in rank_args]
    if max(map(len, out)) > SECRET_LIMIT:
        raise ValueError(f"rank_args of {max(map(len, out)):,} bytes for one rank: they travel in a pipe of at most "
                         f"{SECRET_LIMIT:,}; send a seed and make the data from it on the rank.")
    return out


def _dumps_own(value):
    """``value`` pickled with each tensor in it, whatever holds it, as a copy of its own elements: pickle sends a
    tensor's whole storage, so a view (a rank's slice of a batch) would carry its peers' shares with it."""
    import io

    import torch

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, torch.Tensor) and obj.untyped_storage().nbytes() != obj.numel() * obj.element_size():
                return obj.clone(memory_format=torch.contiguous_format).__reduce_ex__(pickle.DEFAULT_PROTOCOL)
            return NotImplemented

    out = io.BytesIO()
    Pickler(out).dump(value)
    return out.getvalue()


def _secret_pipe(data):
    """A pipe holding ``data``: its read end, for the rank, and nothing else open."""
    r, w = os.pipe()
    try:
        room = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) if hasattr(fcntl, "F_GETPIPE_SZ") else 4096
        if len(data) > room:  # the write would wait for a reader that is not there yet (a user over its pipe quota)
            os.close(r)
            raise ValueError(f"rank_args of {len(data):,} bytes for one rank, and this pipe holds {room:,}: send a seed "
                             "and make the data from it on the rank.")
        os.write(w, data)
    finally:
        os.close(w)
    return r


def _cell_sources():
    """Source lines of the code typed into this kernel (its cells), which exist in no file: a rank
    needs them to show the notebook's lines in a traceback. IPython keeps them in linecache."""
    return {name: entry[2] for name, entry in list(linecache.cache.items())
            if len(entry) == 4 and entry[1] is None and not os.path.exists(name)}


# --------------------------------------------------------------------------------------------
# Watching the ranks
# --------------------------------------------------------------------------------------------

class _Rank:
    """The kernel's view of one rank: its pid, its pipes, and what it has said so far."""

    def __init__(self, rank, pid, server, result, out, err):
        self.rank, self.pid, self.server, self.result, self.streams = rank, pid, server, result, {1: out, 2: err}
        self.partial = {1: b"", 2: b""}
        self.outcome = RankOutcome(rank)
        self.value = None
        self.capture = None  # a list while collecting a stack dump instead of printing stderr
        self.exited_at = None

    @property
    def exitcode(self):
        return self.server.exit_codes.get(self.pid)

    def handles(self):
        open_ = [c for c in (self.result, *self.streams.values()) if not c.closed]
        if self.exitcode is None:
            return open_
        # Ended: drain its pipes briefly. A grandchild (a DataLoader worker, a forked daemon) may hold them open, the
        # result pipe too: once the rank has said its one message, that pipe has nothing more to say.
        self.exited_at = self.exited_at or time.monotonic()
        drain = time.monotonic() - self.exited_at < 0.5
        said = self.outcome.returned or bool(self.outcome.report)
        return [c for c in open_ if drain or (c is self.result and not said)]

    def read(self, conn):
        if conn is self.result:
            try:
                data = conn.recv_bytes(RESULT_LIMIT if restricted() else None)
            except EOFError:
                conn.close()
                return
            except OSError:  # longer than RESULT_LIMIT: refused unread (the connection is then unusable)
                conn.close()
                self.outcome.report = dict(time=time.monotonic(), type="UnreadableResult", secondary=False,
                                           message=f"rank {self.rank} sent a result of more than {RESULT_LIMIT:,} bytes",
                                           traceback="Return plain values of a sensible size.\n")
                return
            kind, body = _envelope(data, self.rank)
            if kind == "ok":
                self.value, self.outcome.returned = body, True
            else:
                self.outcome.report = body
            return
        fd = 1 if conn is self.streams[1] else 2
        data = os.read(conn.fileno(), 65536)
        if not data:
            conn.close()
            data = b"\n" if self.partial[fd] else b""
        *lines, self.partial[fd] = (self.partial[fd] + data).split(b"\n")
        for line in lines:
            text = line.decode(errors="replace")
            if fd == 2:
                self.outcome.stderr_tail = (self.outcome.stderr_tail + [text])[-200:]
                if self.capture is not None:
                    self.capture.append(text)
                    continue
            print(f"[rank {self.rank}] {text}", file=sys.stdout if fd == 1 else sys.stderr, flush=True)

    def failed(self):
        return bool(self.outcome.report) or self.exitcode not in (None, 0)

    def kill(self):
        """Stop the rank, and whatever it started (its process group: DataLoader workers, a library's
        own ranks), even after it ended; a group's number is never reused while the group exists."""
        running = self.exitcode is None
        self.outcome.killed |= running
        self.server.signal(self.pid, signal.SIGKILL, group=True, alone=running)

    def close(self):
        for conn in (self.result, *self.streams.values()):
            conn.close()

    def final(self):
        """What errors.py needs to know about this rank."""
        self.outcome.exitcode = self.exitcode
        self.outcome.stack = self.capture
        return self.outcome


def _envelope(data, rank):
    """A rank's message, ("ok", value) or ("error", report), read as plain data: no code named in it runs here.
    Where the kernel reads its ranks restricted (``restricted.py``: a grader's ranks run a learner's code), the value
    is read as plain data and tensors only, and anything else a rank could send is its error, not the kernel's."""
    try:
        kind, body = loads_plain(data)
        if kind == "ok":
            return kind, loads_tensors(body) if restricted() else cloudpickle.loads(body)
        if not all(isinstance(body[key], str) for key in ("type", "message", "traceback")):
            raise TypeError("a report's type, message and traceback are text")
        report = dict(time=float(body["time"]), type=body["type"][:200], message=body["message"][:20_000],
                      traceback=body["traceback"][:50_000], secondary=body["secondary"] is True)
        return "error", report
    except Exception as err:  # noqa: BLE001 -- whatever a rank sent that is not the launcher's message
        return "error", dict(time=time.monotonic(), type="UnreadableResult", secondary=False,
                             message=f"rank {rank} sent a result that cannot be read as data: "
                                     f"{type(err).__name__}: {str(err)[:300]}",
                             traceback="Return plain values: tensors, numbers, strings, lists, dicts.\n")


def _pump(ranks, server, until, stop_when=lambda: False):
    """Read whatever the ranks and the server send until ``until`` (a monotonic time) or ``stop_when()``."""
    while not stop_when():
        handles = {h: r for r in ranks for h in r.handles()}
        now = time.monotonic()
        if now >= until or (not handles and all(r.exitcode is not None for r in ranks)):
            return
        # a rank that has ended is drained only briefly (``_Rank.handles``): look again soon, or a process it left
        # holding its output (a daemon) keeps this wait, and the cell, until the timeout
        step = until - now if all(r.exitcode is None for r in ranks) else min(until - now, 0.1)
        for h in wait([*handles, server.conn], timeout=step):
            if h is server.conn:
                server.poll()
            else:
                handles[h].read(h)


def _watch(ranks, plan, timeout, server):
    __tracebackhide__ = True
    deadline = time.monotonic() + timeout
    _pump(ranks, server, deadline, stop_when=lambda: any(r.failed() for r in ranks))
    if any(r.failed() for r in ranks):  # let the others report (their secondary errors) for a moment
        _pump(ranks, server, min(deadline, time.monotonic() + FAILURE_GRACE))
        _stop(ranks, server)
        raise failure_error([r.final() for r in ranks])
    hung = [r for r in ranks if r.exitcode is None]
    if hung:
        for r in hung:  # faulthandler in each rank prints its stack on SIGUSR1
            r.capture = []
            r.server.signal(r.pid, signal.SIGUSR1)
        _pump(hung, server, time.monotonic() + STACK_DUMP_WAIT)
        _stop(ranks, server)
        raise timeout_error([r.final() for r in ranks], plan.world_size, timeout)
    missing = [r.rank for r in ranks if not r.outcome.returned]
    if missing:
        raise RankError(f"rank(s) {missing} exited without returning a result (os._exit in the cell?).",
                        missing[0], {})
    return [r.value for r in ranks]


def _stop(ranks, server):
    """Kill the ranks still running, wait (5 s at most) until the server has seen each end, close pipes."""
    for r in ranks:
        r.kill()
    deadline = time.monotonic() + 5
    while any(r.exitcode is None for r in ranks) and time.monotonic() < deadline:
        server.poll(timeout=deadline - time.monotonic())
    for r in ranks:
        r.close()
