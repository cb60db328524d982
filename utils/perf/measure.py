"""The course's one timing home: ``measure`` (warm up, wait for the device, time, wait again), ``stopwatch`` (one
interval) and ``best_seconds`` (variants in turns). Lessons 00, 01b, 02b, 03, 04a, 04b, 06b-07c, 08a, 08b, 08d,
09a-11b, 13b and labs 01a and 01b time with them, and so do utils.lightning's runs; lesson 08b derives
``best_seconds`` and ``one_thread``, notebooks/08b_lightning_speedups.ipynb.

Two rules hold every timing in the course. A GPU runs behind Python: a kernel launched is not a kernel done, so the
clock is read only after ``synchronize``. And the first calls are not the steady state (allocations, cuBLAS's choice
of kernels, ``torch.compile`` compiling, DDP rebuilding its buckets): they are run untimed, as warm-up.
"""

from __future__ import annotations

import contextlib
import time

import torch

__all__ = ["synchronize", "stopwatch", "measure", "best_seconds", "one_thread"]


def synchronize():
    """Wait for the kernels this process queued on its GPU; nothing to wait for when it never started CUDA (a CPU
    run), and asking ``is_initialized`` first leaves CUDA alone there."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Stopwatch:
    """What ``stopwatch`` yields: ``seconds`` is ``None`` inside the block and the interval once it has ended."""

    def __init__(self):
        self.seconds = None


@contextlib.contextmanager
def stopwatch(sync=synchronize, clock=time.perf_counter):
    """The wall time of one interval, as the notebook sees it: ``with stopwatch() as clock: ...``, then
    ``clock.seconds``.

    One interval, timed once, in the kernel or in a rank: it holds whatever the block holds (around a launch, the
    ranks' start-up, imports and rendezvous: what the learner waits for). Steps of a loop are ``measure``'s business
    (warm-up, steady state, one interval per step or per run). ``sync`` runs before the clock is read at both ends,
    so that queued GPU kernels land in the interval they belong to; an exception inside the block leaves
    ``seconds`` at ``None``. ``sync`` and ``clock`` are parameters so that a test can hand in a fake clock."""
    watch = Stopwatch()
    sync()
    start = clock()
    yield watch
    sync()
    watch.seconds = clock() - start


def measure(step, steps, warmup=0, *, each=False, before=None, sync=synchronize, clock=time.perf_counter):
    """Seconds per call of ``step()``: ``warmup`` calls untimed, then ``steps`` timed; returns (seconds, what the
    last call returned).

    ``each=False``: one interval around all ``steps`` calls, the device waited for at both ends; ``seconds`` is
    ``[the mean step]``. The throughput of training: the GPU is never left idle between steps.
    ``each=True``: each call timed alone, the device waited for after each; ``seconds`` has one entry per step, for
    the minimum or median of noisy steps. ``before`` (only with ``each``) runs before every call, warm-up included,
    outside the clock: a barrier so that ranks start together, gradients zeroed. ``sync`` and ``clock`` are
    parameters so that a test can hand in a fake clock."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps={steps} must be >= 1 and warmup={warmup} >= 0.")
    if before is not None and not each:
        raise ValueError("before= runs outside the clock, which needs each=True: one interval per step.")
    result = None
    for _ in range(warmup):
        if before is not None:
            before()
        result = step()
    sync()  # the warm-up's kernels are not the timed steps' business
    if not each:
        start = clock()
        for _ in range(steps):
            result = step()
        sync()
        return [(clock() - start) / steps], result
    seconds = []
    for _ in range(steps):
        if before is not None:
            before()
        start = clock()
        result = step()
        sync()
        seconds.append(clock() - start)
    return seconds, result


def best_seconds(fns, repeats):
    """{name: fn} -> {name: seconds}: each fn timed `repeats` times, round-robin, keeping the minimum.

    Round-robin, so that a burst of load from other processes hits every variant alike; the minimum,
    because other processes only ever add time: the least disturbed run is the closest to the truth.
    """
    if repeats < 1 or not fns:
        raise ValueError(f"best_seconds needs at least one function and repeats >= 1, got {len(fns)} and {repeats}.")
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name] += measure(fn, 1, each=True)[0]
    return {name: min(ts) for name, ts in times.items()}


@contextlib.contextmanager
def one_thread():
    """Time kernel-side code on one torch thread. On a shared machine a multi-threaded op waits for its
    slowest thread, and a descheduled one costs a whole scheduler time slice: we saw 2-thread steps
    30-100x slower than usual. One thread is immune; a ratio (bf16 / fp32, grad / no_grad) is what we want."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
