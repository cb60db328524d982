"""Lesson 02's torch DDP (``notebooks/02b_ddp_in_practice.ipynb``): the Python all-reduce hook the ledger sees, and
the loop this lesson's ``torchrun`` script runs (``notebooks/scripts/02_ddp_train.py``).

The lesson writes its loop in its own cells, where it also measures bytes; the script runs ``ddp_losses`` with the
same model, data order (``utils.datasets.batch``), hook and SGD, so the lesson can check that ``torchrun``
reproduces the losses of its own cells. ``global_mean`` and ``say_step`` are the two lines every course loop under
``torchrun`` shares (FSDP2's in ``utils.sharding.fsdp2``, the pipeline's in ``utils.pipeline.pipelining``): the
global loss of a step, and rank 0's progress line.

Every ``*_losses`` loop runs on one rank of an initialised process group and returns the per-step *global* losses
(the mean over ranks of each rank's mean loss), the same list on every rank; ``utils.models.train_reference`` is
the one process on the whole batch that they must reproduce.
"""

import torch.distributed as dist
import torch.nn.functional as F

from ..datasets import batch
from ..launch import rank_device
from ..models import make_model, make_optimizer

__all__ = ["DDP_BATCH", "DDP_LR", "allreduce_hook", "global_mean", "say_step", "ddp_losses"]

DDP_BATCH, DDP_LR = 240, 0.5  # lesson 02: global batch, plain SGD learning rate


def allreduce_hook(state, bucket):
    """Lesson 02's DDP communication hook: torch's default all-reduce, written in Python so the ledger sees it.

    DDP calls it once per bucket during backward; ``bucket.buffer()`` is a flat tensor of several gradients,
    and the hook returns a Future of the reduced tensor."""
    flat = bucket.buffer().div_(dist.get_world_size())  # pre-divide, then sum = mean
    return dist.all_reduce(flat, async_op=True).get_future().then(lambda fut: fut.value()[0])


def global_mean(loss):
    """The mean over ranks of each rank's mean loss: the global mean loss when the shards are equal."""
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def say_step(step, steps, loss):
    """Rank 0's progress line after each step, which ``utils.launch.scripts.launch`` shows in the notebook as it
    comes."""
    if dist.get_rank() == 0:
        print(f"step {step + 1}/{steps}: loss {loss:.6f}", flush=True)


def ddp_losses(steps, size=DDP_BATCH, optimizer="sgd", lr=DDP_LR):
    """Lesson 02's torch DDP: rank r trains on samples r, r+n, ... of each global batch (as DistributedSampler)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank, n, device = dist.get_rank(), dist.get_world_size(), rank_device()
    if size % n:
        raise ValueError(f"a global batch of {size} does not split into {n} equal shards; use a multiple of {n}")
    model = DDP(make_model(seed=rank).to(device), device_ids=[device] if device.type == "cuda" else None)
    model.register_comm_hook(state=None, hook=allreduce_hook)  # DDP broadcast rank 0's weights when built
    opt = make_optimizer(model.parameters(), optimizer, lr)
    losses = []
    for step in range(steps):
        x, y = (t[rank::n].to(device) for t in batch(step, size))  # (B/n, 64)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()  # the hook all-reduces every bucket in here
        opt.step()
        losses.append(global_mean(loss))
        say_step(step, steps, losses[-1])
    return losses
