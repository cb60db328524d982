"""Lightning's ``ddp_notebook`` strategy, run so that it works on any machine (notebooks 02 and 08).

``ddp_notebook`` forks the process that calls ``trainer.fit``, and a fork inherits everything that
process has done. Forking the notebook's kernel breaks in three ways, depending on the machine:

- on a CPU, OpenMP's thread pool does not survive a fork: once the kernel has multiplied matrices on
  several threads, a forked rank that multiplies on more than one thread waits for ever for pool
  threads that do not exist in it;
- on a machine with a GPU, after the kernel has run ``backward()`` a forked child cannot run
  backward at all (autograd's per-device worker threads), even on CPU tensors;
- and after the kernel has initialised CUDA, a forked child cannot use CUDA.

So ``fit_on_forked_ranks`` never forks the kernel. It ships the ``Trainer`` and the model (by value,
as ``run_ranks`` ships any function) to one fresh process that the rank server forks (notebook 00:
that server has imported torch and nothing else, and never computes), calls ``trainer.fit`` there,
with one torch thread per rank, and ``ddp_notebook`` forks its ranks from *that* clean process.
Afterwards it copies back into the kernel's trainer and model exactly what ``ddp_notebook`` itself
copies back to the process that called ``fit``: rank 0's final weights, the checkpoint callback's
``best_model_path``, ``trainer.state`` and ``trainer.callback_metrics``. Everything else (the
epoch counter, the callbacks' other state, anything the ranks appended to their own copy of the
module) stays in the ranks, as with a plain ``ddp_notebook`` fit.
"""

import torch

from ..launch import run_ranks


def _fit_in_clean_process(trainer, model, fit_kwargs):
    """Runs in the fresh process: the fit, then what ``ddp_notebook`` hands back to its caller."""
    import os

    from .quiet import quiet_lightning

    # the lesson quiets Lightning in its kernel; this process is a fork of the rank server, so it (and the ranks it
    # forks) would print the banners and the warnings the lesson turned off
    quiet_lightning()
    os.environ["OMP_NUM_THREADS"] = "1"  # Lightning then leaves each forked rank on one thread
    torch.set_num_threads(1)
    trainer.fit(model, **fit_kwargs)
    checkpoint = trainer.checkpoint_callback
    return dict(weights={k: v.detach().cpu() for k, v in model.state_dict().items()},
                best_model_path=getattr(checkpoint, "best_model_path", None),
                state=trainer.state,
                callback_metrics={k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                                  for k, v in trainer.callback_metrics.items()})


def fit_on_forked_ranks(trainer, model, timeout=900, **fit_kwargs):
    """``trainer.fit(model, **fit_kwargs)`` for a ``ddp_notebook`` trainer, with its ranks forked from a
    fresh process rather than from the kernel; then rank 0's results copied into ``trainer`` and ``model``.

    ``timeout`` (seconds) stops a fit that hangs, with the stack of the process that called ``fit``.
    """
    out = run_ranks(_fit_in_clean_process, trainer, model, fit_kwargs, world_size=1, backend="gloo",
                    process_group=False, timeout=timeout, verbose=False)[0]
    model.load_state_dict(out["weights"], strict=False)  # as Lightning does: non-strict
    if trainer.checkpoint_callback is not None and out["best_model_path"] is not None:
        trainer.checkpoint_callback.best_model_path = out["best_model_path"]
    trainer.state = out["state"]
    trainer.callback_metrics.update(out["callback_metrics"])
