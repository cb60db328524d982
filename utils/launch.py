"""Run one Python function on N ranks from a notebook: the launcher behind every multi-rank cell.

``run_ranks(fn, *args, world_size=4)`` starts four processes, gives each a default process group
(``torch.distributed`` is initialised, so ``dist.get_rank()`` and ``dist.all_reduce`` just work),
calls ``fn(*args)`` on each and returns the four return values, ordered by rank. Notebook 00 shows
it in use; every later lesson runs its multi-rank cells through it or through ``%%ranks``
(``utils/magics.py``).

How it works, in the order it happens:

1. **Plan.** Backend ``"auto"`` picks NCCL with one GPU per rank when at least N GPUs exist,
   otherwise gloo on the CPU. Bad input (world size 0, NCCL without GPUs) raises before anything
   starts.
2. **Rendezvous.** The ranks find each other through a ``FileStore`` in a fresh temporary folder:
   re-running a cell, or two notebooks at once, never share one, and no port has to be free.
3. **Start.** Ranks are *forked* from the kernel: fast (a fraction of a second), and a function or
   class defined in the notebook needs no pickling. Forking is unsafe once CUDA is initialised in
   the kernel, so then the ranks are *spawned* instead and the function travels with cloudpickle.
4. **Watch.** The launcher prints each rank's output as ``[rank k] ...`` while it runs. If a rank
   raises, it waits a moment for the others to report, stops them all, and raises ``RankError``
   naming the rank that failed *first* with its traceback (the "connection closed" errors of its
   peers are marked as secondary). If the ranks are still running at ``timeout``, it asks each one
   for its Python stack (``faulthandler`` on SIGUSR1), stops them, and raises ``RankTimeoutError``
   showing where every rank was stuck. On a kernel interrupt it stops every rank. No process,
   file or process group is left behind: the kernel itself never joins a process group.

It is the same job torchrun does for scripts, cut down to what a notebook needs; Lightning's
``ddp_notebook`` and accelerate's ``notebook_launcher`` fork in the same way.
What each rank process does, from its first line to its result, is in ``utils/rank_process.py``.
"""

from __future__ import annotations

import dataclasses
import multiprocessing.connection as mpc
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import warnings

import cloudpickle
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from .rank_errors import RankError, failure_error, timeout_error
from .rank_process import rank_main

DEFAULT_TIMEOUT = 180.0  # seconds; pass timeout= for longer cells
FAILURE_GRACE = 1.0  # seconds the other ranks get to report after the first failure
STACK_DUMP_WAIT = 1.0  # seconds to collect the stacks of hung ranks before stopping them


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """What ``run_ranks`` will start: checked and decided before any process exists."""

    world_size: int
    backend: str  # "gloo" or "nccl"
    device: str  # "cpu" or "cuda"
    start_method: str  # "fork" or "spawn"
    threads_per_rank: int  # torch intra-op threads in each rank
    cpu_cores: int
    note: str = ""  # why the start method changed, if it did

    def describe(self) -> str:
        where = f"GPU {'0' if self.world_size == 1 else f'0-{self.world_size - 1}'}" if self.device == "cuda" else "CPU"
        line = (f"[launch] {self.world_size} rank{'s' if self.world_size > 1 else ''} · {self.backend} on {where} · "
                f"{self.start_method} · {self.threads_per_rank} torch thread(s) per rank on {self.cpu_cores} core(s)")
        if self.device == "cpu" and self.world_size > self.cpu_cores:
            line += f" (oversubscribed: {self.world_size} ranks share {self.cpu_cores} cores, so timings are pessimistic)"
        elif self.device == "cpu" and self.start_method == "fork" and self.world_size < self.cpu_cores:
            line += " (forked ranks run one thread each: OpenMP does not survive a fork; start_method='spawn' uses more)"
        return line + (f"\n[launch] {self.note}" if self.note else "")


def plan_launch(world_size, backend="auto", start_method=None) -> LaunchPlan:
    """Check the arguments and decide backend, device and start method, or raise saying what to do."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}; "
                         f"use e.g. world_size=2 (ranks are CPU processes when there are no GPUs).")
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}.")
    if start_method not in (None, "fork", "spawn"):
        raise ValueError(f"start_method must be None (choose for me), 'fork' or 'spawn', got {start_method!r}.")
    gpus = torch.cuda.device_count()  # asks the driver (NVML); does not initialise CUDA in the kernel
    if backend == "nccl" and (gpus < world_size or not dist.is_nccl_available()):
        raise RuntimeError(f"backend='nccl' needs one GPU per rank: {world_size} ranks asked, {gpus} GPU(s) found"
                           f"{'' if dist.is_nccl_available() else ' and this torch has no NCCL'}. "
                           f"Use backend='auto' (gloo on CPU here) or world_size<={gpus}." if gpus else
                           f"backend='nccl' needs one GPU per rank: {world_size} ranks asked, no GPU found. "
                           f"Use backend='auto' or 'gloo' to run the ranks as CPU processes.")
    if backend == "auto":
        backend = "nccl" if gpus >= world_size and dist.is_nccl_available() else "gloo"
    device = "cuda" if backend == "nccl" else "cpu"

    cores = os.cpu_count() or 1
    if device == "cpu" and world_size > 2 * cores:
        warnings.warn(f"{world_size} CPU ranks on {cores} cores is more than this machine can sensibly run: "
                      f"each rank gets {cores / world_size:.2f} of a core, results stay correct but every step is slow. "
                      f"Use world_size<={2 * cores} here, or a machine with more cores.", stacklevel=3)

    note = ""
    if torch.cuda.is_initialized():
        if start_method == "fork":
            raise RuntimeError("CUDA is already initialised in this kernel, and a forked rank cannot use it. "
                               "Use start_method='spawn' (or leave it None), or restart the kernel and run the "
                               "multi-rank cells before any cell that touches the GPU.")
        if start_method is None:
            note = ("CUDA is already initialised in this kernel, so ranks are spawned, not forked (slower start: "
                    "each rank imports torch). Restart the kernel and launch before touching the GPU to fork again.")
        start_method = "spawn"
    start_method = start_method or "fork"
    # A forked rank must stay single-threaded: GNU OpenMP's thread pool does not survive a fork, and
    # a rank that starts a parallel region after the kernel used OpenMP hangs for ever. A spawned
    # rank is a fresh interpreter and shares the cores like torchrun's workers.
    threads = 1 if start_method == "fork" else max(1, cores // world_size)
    return LaunchPlan(world_size, backend, device, start_method, threads, cores, note)


def rank_device() -> torch.device:
    """The device this rank should put its tensors on: ``cuda:<local rank>`` under NCCL, else CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# --------------------------------------------------------------------------------------------
# In the kernel: start, watch, stop
# --------------------------------------------------------------------------------------------

def run_ranks(fn, *args, world_size, timeout=DEFAULT_TIMEOUT, backend="auto", start_method=None,
              verbose=True, **kwargs):
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks and return their results, ordered by rank.

    Each rank starts with the default process group initialised (``dist.get_rank()``,
    ``dist.all_reduce`` ... work at once); ``rank_device()`` tells it where to put its tensors.
    ``fn`` may be defined in the notebook. Its return value comes back by pickle, so return plain
    values (tensors, numbers, dicts), not modules or process groups; tensors in it (also inside
    lists, tuples and dicts) come back on the CPU.

    Raises ``RankError`` when a rank fails (naming the first one, with its traceback) and
    ``RankTimeoutError`` when the ranks are still running after ``timeout`` seconds (showing where
    each was stuck). ``backend`` is "auto", "gloo" or "nccl"; ``start_method`` None (fork, or spawn
    once CUDA is initialised in the kernel), "fork" or "spawn". ``verbose`` prints the plan.
    """
    __tracebackhide__ = True  # IPython and pytest then show the learner's cell, not the launcher
    if not callable(fn):
        raise TypeError(f"run_ranks needs a function to run on every rank, got {type(fn).__name__}.")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}.")
    plan = plan_launch(world_size, backend, start_method)
    if verbose:
        print(plan.describe(), flush=True)
    ctx = torch_mp.get_context(plan.start_method)
    if plan.start_method == "spawn":  # a new interpreter: send the notebook's function by value
        payload = ("pickled", cloudpickle.dumps((fn, args, kwargs)))
    else:  # a fork already holds the function, its arguments and the whole notebook
        payload = ("direct", (fn, args, kwargs))

    # The rendezvous is a file in a fresh temporary folder: two launches (a re-run, or another
    # notebook) never share one, and no port or network lookup is involved. (A TCPStore would need a
    # free port, and torch's socket code does reverse DNS look-ups that can stall 5 s offline.)
    rendezvous = tempfile.mkdtemp(prefix="run_ranks-")
    ranks = []
    try:
        for rank in range(world_size):
            pipes = [ctx.Pipe(duplex=False) for _ in range(3)]  # result, stdout, stderr: (read, write)
            proc = ctx.Process(target=rank_main, name=f"rank-{rank}",
                               args=(rank, plan, timeout, payload, os.path.join(rendezvous, "store"),
                                     *[w for _, w in pipes]))
            proc.start()
            for _, w in pipes:
                w.close()  # the kernel keeps only the read ends, so a dead rank reads as end-of-file
            ranks.append(_Rank(rank, proc, *[r for r, _ in pipes]))
        return _watch(ranks, plan, timeout)
    except KeyboardInterrupt:
        alive = [r.rank for r in ranks if r.proc.is_alive()]
        print(f"[launch] interrupted: stopping rank(s) {alive}", file=sys.stderr, flush=True)
        raise
    finally:
        for r in ranks:
            r.stop()
        shutil.rmtree(rendezvous, ignore_errors=True)


class _Rank:
    """The kernel's view of one rank: its process, its pipes, and what it has said so far."""

    def __init__(self, rank, proc, result, out, err):
        self.rank, self.proc, self.result, self.streams = rank, proc, result, {1: out, 2: err}
        self.partial = {1: b"", 2: b""}
        self.stderr_tail = []  # last lines of stderr, to explain a rank that died without a traceback
        self.report = None  # the error report, if it failed
        self.value = None
        self.returned = self.killed = False
        self.capture = None  # a list while collecting a stack dump instead of printing stderr
        self.exited_at = None

    def handles(self):
        if self.proc.exitcode is None:
            return [c for c in (self.result, *self.streams.values()) if not c.closed] + [self.proc.sentinel]
        # Ended: drain its pipes briefly. A grandchild (a DataLoader worker, say) may hold them open.
        self.exited_at = self.exited_at or time.monotonic()
        drain = time.monotonic() - self.exited_at < 0.5
        return [c for c in (self.result, *self.streams.values()) if not c.closed and (drain or c is self.result)]

    def read(self, conn):
        if conn is self.result:
            try:
                kind, body = pickle.loads(conn.recv_bytes())
            except EOFError:
                conn.close()
                return
            if kind == "ok":
                self.value, self.returned = pickle.loads(body), True
            else:
                self.report = body
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
                self.stderr_tail = (self.stderr_tail + [text])[-200:]
                if self.capture is not None:
                    self.capture.append(text)
                    continue
            print(f"[rank {self.rank}] {text}", file=sys.stdout if fd == 1 else sys.stderr, flush=True)

    def stop(self):
        if self.proc.exitcode is None:
            self.killed = True
            self.proc.kill()
        self.proc.join(5)
        for conn in (self.result, *self.streams.values()):
            conn.close()


def _pump(ranks, until, stop_when=lambda: False):
    """Read whatever the ranks send until ``until`` (a monotonic time) or ``stop_when()``."""
    while not stop_when():
        handles = {h: r for r in ranks for h in r.handles()}
        now = time.monotonic()
        if not handles or now >= until:
            return
        for h in mpc.wait(list(handles), timeout=until - now):
            if isinstance(h, int):  # a sentinel: the process ended; its exit code is now set
                handles[h].proc.join()
            else:
                handles[h].read(h)


def _watch(ranks, plan, timeout):
    __tracebackhide__ = True
    deadline = time.monotonic() + timeout
    failed = lambda: any(r.report or (r.proc.exitcode not in (None, 0)) for r in ranks)  # noqa: E731
    _pump(ranks, deadline, stop_when=failed)
    if failed():  # let the others report (their secondary errors) for a moment, then stop them
        _pump(ranks, min(deadline, time.monotonic() + FAILURE_GRACE))
        for r in ranks:
            r.stop()
        raise failure_error(ranks)
    hung = [r for r in ranks if r.proc.exitcode is None]
    if hung:
        for r in hung:  # faulthandler in each rank prints its stack on SIGUSR1
            r.capture = []
            os.kill(r.proc.pid, signal.SIGUSR1)
        _pump(hung, time.monotonic() + STACK_DUMP_WAIT)
        for r in ranks:
            r.stop()
        raise timeout_error(ranks, plan.world_size, timeout)
    missing = [r.rank for r in ranks if not r.returned]
    if missing:
        raise RankError(f"rank(s) {missing} exited without returning a result (os._exit in the cell?).",
                        missing[0], {})
    return [r.value for r in ranks]
