"""Lightning's ``ddp_notebook`` strategy, made safe on any core count (notebooks 02 and 08).

``ddp_notebook`` forks the process that calls ``trainer.fit``: here, the notebook's kernel. Unlike
``run_ranks`` (whose ranks come from a rank server, notebook 00), a fork of the kernel inherits
whatever the kernel has done, and one thing breaks it on a CPU: OpenMP's thread pool does not
survive a fork. Once the kernel has multiplied matrices on several threads, a forked rank that
multiplies on more than one thread waits for ever for pool threads that do not exist in it (gdb
shows it in ``gomp_team_barrier_wait_end``). Lightning gives each rank ``cores // ranks`` threads
unless ``OMP_NUM_THREADS`` is set: 1 on a 2-core laptop from 2 ranks up, but 2 with one rank there,
and 8 with 2 ranks on a 16-core machine. ``fit_on_forked_ranks`` keeps every forked rank on one thread.

On a GPU machine a fork of the kernel has two more problems, which no setting fixes: after the
kernel has run ``backward()``, a forked child cannot run backward (autograd's per-device threads),
and after the kernel has initialised CUDA, a forked child cannot use it. Lightning's answer is the
``ddp`` strategy from a script (notebook 08 runs one).
"""

import os

import torch


def fit_on_forked_ranks(trainer, model, **fit_kwargs):
    """``trainer.fit(model)`` with every rank that ``ddp_notebook`` forks on one torch thread."""
    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)  # inherited by the forked ranks
    os.environ["OMP_NUM_THREADS"] = "1"  # so that Lightning leaves it at 1
    try:
        return trainer.fit(model, **fit_kwargs)
    finally:
        torch.set_num_threads(threads)
        if omp is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = omp
