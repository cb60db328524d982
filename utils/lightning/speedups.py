"""Timing that holds on a shared machine, for lesson 08's speed-up measurements
(notebooks/08b_lightning_speedups.ipynb, "The six speed-ups, measured")."""

from __future__ import annotations

import contextlib
import time

import torch

__all__ = ["best_seconds", "one_thread"]


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
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
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
