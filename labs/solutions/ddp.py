"""Reference solution of labs/02_ddp_lab.ipynb: the two collectives of data parallelism.

Data-parallel training keeps one replica of the model per rank. Two calls keep the replicas equal:

- ``broadcast_parameters`` once, before training: every rank copies rank 0's parameters *and
  buffers*, so all replicas start from the same state (frozen parameters included: they have no
  gradient, but they are state);
- ``average_gradients`` after every backward: each gradient becomes the mean over ranks, which is
  the gradient of the mean loss over the global batch when every rank has an equal-sized shard.
  Parameters without a gradient are skipped, and a tied tensor is reduced once.
"""

import torch
import torch.distributed as dist


def broadcast_parameters(model: torch.nn.Module) -> None:
    """Copy rank 0's parameters and buffers into every rank's model, in place."""
    # parameters() and buffers() list each tensor once, so the tied weight is sent once.
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)


def average_gradients(model: torch.nn.Module) -> None:
    """Replace every gradient by its mean over ranks (call after backward, before step)."""
    world_size = dist.get_world_size()
    for param in model.parameters():  # unique tensors: a tied weight appears once
        if param.grad is None:  # frozen (requires_grad=False) or unused: nothing to reduce
            continue
        dist.all_reduce(param.grad)  # sum over ranks
        param.grad.div_(world_size)  # ... then the mean
