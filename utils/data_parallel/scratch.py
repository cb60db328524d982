"""Lesson 02's DDP from scratch: the two helpers that make DDP correct, and the comparisons.

Derived in ``notebooks/02a_ddp_from_scratch.ipynb`` (which prints ``broadcast_state`` and ``allreduce_gradients``
and checks them against one process, ``utils.models.train_reference``, for 2, 3 and 4 ranks); imported again by
``notebooks/02b_ddp_in_practice.ipynb``, which puts gradient accumulation, torch DDP and Lightning beside them.

``broadcast_state`` and ``allreduce_gradients`` run on one rank of an initialised process group; the rest is
plain PyTorch in one process.
"""

import itertools
import statistics

import torch
import torch.distributed as dist

__all__ = ["broadcast_state", "allreduce_gradients", "cpu_state", "max_diff", "global_losses"]


def broadcast_state(model, src=0):
    """Make this replica identical to rank `src`'s: ALL parameters (frozen ones too) and ALL buffers."""
    with torch.no_grad():
        for t in itertools.chain(model.parameters(), model.buffers()):
            dist.broadcast(t, src)  # in place: rank src sends, everyone else overwrites


def allreduce_gradients(model):
    """Replace every gradient by its mean over the ranks."""
    n = dist.get_world_size()
    for p in model.parameters():  # parameters() lists the tied mix1/mix2 weight ONCE
        if p.requires_grad and p.grad is not None:  # the frozen input_scale has no gradient: skip it
            dist.all_reduce(p.grad)  # sum over ranks, in place, same result on every rank
            p.grad /= n  # sum -> mean: each rank's loss was already a mean over its B/n samples


def cpu_state(model):
    """A detached CPU copy of the state dict, to send back from a rank process."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def max_diff(a, b):
    """The largest absolute difference over every entry of two state dicts with the same keys."""
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def global_losses(results):
    """Per step, the mean over ranks of each rank's shard loss (``results[r]["losses"]``): with equal shards,
    the loss of the global batch."""
    return [statistics.fmean(r["losses"][s] for r in results) for s in range(len(results[0]["losses"]))]
