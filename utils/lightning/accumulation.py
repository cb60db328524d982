"""Gradient accumulation with Lightning's ``accumulate_grad_batches`` (notebook 08c).

``Trainer(accumulate_grad_batches=k)`` runs k micro-batches through the *same full model*, one after
the other, adding their gradients, and steps the optimizer once. Two things in Lightning's loop make
that equal to one step on the k-times larger batch (read them in ``lightning/pytorch/loops``):

- ``optimization/automatic.py``: ``ClosureResult.from_training_step_output`` divides the loss that
  ``training_step`` returns by ``trainer.accumulate_grad_batches`` before ``backward``, so k means
  of equal micro-batches add up to the mean of the large batch;
- the same file runs every micro-batch but the last of a group inside
  ``_block_parallel_sync_behavior`` (``loops/utilities.py``), which under DDP is ``model.no_sync()``
  (``ParallelStrategy.block_backward_sync``): the gradients are all-reduced once per optimizer step,
  not once per micro-batch.

``LitAccumulate`` is lesson 08's ``LitToy`` plus a DDP communication hook that counts the all-reduces a
rank issues, so that the lesson can measure the second point; ``fit_accumulating`` runs one fit, in the
kernel (one process) or in every rank of ``run_ranks`` under ``strategy="ddp"`` (Lightning joins ranks that
already exist, as lesson 08a showed, instead of launching its own).
"""

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from ..perf.measure import stopwatch
from .toy import LitToy, quiet_lightning, quiet_trainer

__all__ = ["LitAccumulate", "fit_accumulating"]


class LitAccumulate(LitToy):
    """``LitToy`` that counts, in each rank, the bucket all-reduces its DDP wrapper issues (0 without DDP)."""

    def on_fit_start(self):
        super().on_fit_start()
        self.allreduces = 0
        ddp = self.trainer.strategy.model  # under strategy="ddp": torch DDP around the module, wrapped by now
        if isinstance(ddp, DistributedDataParallel):
            def counting_allreduce(state, bucket):  # the default all-reduce, counted
                self.allreduces += 1
                return allreduce_hook(state, bucket)
            ddp.register_comm_hook(state=None, hook=counting_allreduce)  # state None: the default process group


def fit_accumulating(train_data, steps, micro_batches, global_batch, lr):
    """``steps`` optimizer steps of SGD on ``global_batch`` samples each, fed as ``micro_batches`` micro-batches
    per step (``Trainer(accumulate_grad_batches=micro_batches)``), on the CPU.

    Called in the kernel: one process. Called in every rank of ``run_ranks``: ``strategy="ddp"`` over the
    existing process group (even a group of one, so that there is a DDP wrapper to count), each rank taking ``global_batch / world / micro_batches`` samples per micro-batch.
    Returns this process's micro-batch losses (before Lightning divides them by ``micro_batches``), the final
    weights, the optimizer steps taken, the all-reduces its DDP issued and the fit's seconds.
    """
    quiet_lightning()
    world = dist.get_world_size() if dist.is_initialized() else 1
    if global_batch % (world * micro_batches):
        raise ValueError(f"global batch {global_batch} does not split into {micro_batches} micro-batches on {world} "
                         f"ranks; use a multiple of {world * micro_batches}")
    # LitToy's loader cuts batches of global_batch / world per rank: hand it one micro-batch's worth
    model = LitAccumulate(train_data, global_batch=global_batch // micro_batches, lr=lr)
    trainer = quiet_trainer(accelerator="cpu", devices=world, strategy="ddp" if dist.is_initialized() else "auto",
                            max_steps=steps, accumulate_grad_batches=micro_batches, enable_checkpointing=False,
                            limit_val_batches=0)
    with stopwatch() as clock:
        trainer.fit(model)
    return dict(losses=model.losses, weights={k: v.detach().clone() for k, v in model.net.state_dict().items()},
                optimizer_steps=trainer.global_step, allreduces=model.allreduces, seconds=clock.seconds)
