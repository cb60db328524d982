"""FSDP2 on the course model, the plan lesson 04a derives (notebooks/04a_fsdp2_zero_redundancy.ipynb): the blocks
first, the root last, and the tied mix1/mix2 pair in one group. Lesson 04's script and lesson 08's
``LitToy.configure_model`` apply the same plan from here; lesson 04c
(notebooks/04c_fsdp2_overlap_and_accumulation.ipynb) passes ``reshard_after_forward`` to the blocks.

Lesson 04's batches are here too: ``fsdp_batch``, rank r's equal slice of a global batch (lessons 04a, 04b and 04c
train on it), and ``fsdp_losses``, the bare loop that lesson 04's ``torchrun`` script
(``notebooks/scripts/04_fsdp_train.py``) runs, so that the lesson can check that ``torchrun`` reproduces its cells.
The one process they must reproduce is ``utils.models.train_reference(steps, FSDP_BATCH, "adam", FSDP_LR,
ordered=False)``. ``full_tensor_unremarked`` gathers a parameter that FSDP2 shards over a tensor-parallel one
(lesson 08c; lessons 09 and 14 through ``utils.mesh.parallelize3d``) without torch's note on it."""

import contextlib
import logging

import torch.distributed as dist
import torch.nn.functional as F

from ..data_parallel.torch_ddp import global_mean, say_step
from ..datasets import batch
from ..launch import rank_device
from ..models import make_model, make_optimizer

__all__ = ["FSDP2_GROUPS", "FSDP_BATCH", "FSDP_LR", "shard_with_fsdp2", "fsdp_batch", "fsdp_losses",
           "full_tensor_unremarked"]

#: the groups ``shard_with_fsdp2`` makes, in forward order: the ToyNet submodules of each block group
FSDP2_GROUPS = (("embed",), ("mix1", "mix2"), ("head",))
FSDP_BATCH, FSDP_LR = 120, 1e-3  # lesson 04: global batch, Adam learning rate


def shard_with_fsdp2(net, mesh, reshard_after_forward=None):
    """FSDP2 on ToyNet, blocks first and the root last; the tied mix1/mix2 pair in ONE group (lesson 04).

    ``reshard_after_forward`` goes to the three block groups (``None``: FSDP2's default, True for them); the
    root keeps FSDP2's default, False for a root (lesson 04c)."""
    from torch.distributed.fsdp import fully_shard

    blocks = {} if reshard_after_forward is None else {"reshard_after_forward": reshard_after_forward}
    fully_shard(net.embed, mesh=mesh, **blocks)
    fully_shard([net.mix1, net.mix2], mesh=mesh, **blocks)  # one tensor used by two layers: one group
    fully_shard(net.head, mesh=mesh, **blocks)
    fully_shard(net, mesh=mesh)  # the root: the leftovers (frozen input_scale) and the driver


def fsdp_batch(step, rank=0, n=1, device="cpu", size=FSDP_BATCH):
    """Rank `rank`'s slice of lesson 04's global batch `step`: (size/n, 64) inputs, (size/n,) labels.

    Equal slices on purpose: every rank's loss is a mean over its own slice and the ranks' gradients
    are then averaged, which is the global mean only when the slices are equal. With 64 rows on 3
    ranks (22 + 22 + 20), each of rank 2's rows weighed 1/60 and the others' 1/66 instead of 1/64,
    and FSDP2 ended 3.8e-3 away from one process after 3 steps, 380x the tolerance lesson 04a uses.
    Derived in lesson 04a (notebooks/04a_fsdp2_zero_redundancy.ipynb); lesson 04b trains on the same batches."""
    if size % n:
        raise ValueError(f"a global batch of {size} does not split into {n} equal slices; use a multiple of {n}")
    x, y = batch(step, size, ordered=False)  # rows [step*size, (step+1)*size) of the digits
    return x.chunk(n)[rank].to(device), y.chunk(n)[rank].to(device)


def fsdp_losses(steps, hidden=512, size=FSDP_BATCH, lr=FSDP_LR):
    """Lesson 04's FSDP2: blocks first (the tied mix1/mix2 pair in one group), then the root; Adam."""
    from torch.distributed.device_mesh import init_device_mesh
    rank, n, device = dist.get_rank(), dist.get_world_size(), rank_device()
    model = make_model(hidden=hidden).to(device)
    shard_with_fsdp2(model, init_device_mesh(device.type, (n,)))  # in place: embed, [mix1, mix2], head, root
    opt = make_optimizer(model.parameters(), "adam", lr)  # sees DTensors: its state is sharded too
    losses = []
    for step in range(steps):
        x, y = fsdp_batch(step, rank, n, device, size)  # (B/n, 64); refuses unequal slices
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()  # reduce-scatter: each rank gets the mean gradient of its rows
        opt.step()
        losses.append(global_mean(loss))
        say_step(step, steps, losses[-1])
    return losses


@contextlib.contextmanager
def full_tensor_unremarked():
    """Drops one note of torch's, and only it, while a check gathers DTensors: a weight that tp shards on dim 0 has,
    under FSDP2, placements (_StridedShard(dim=0), Shard(dim=0)), and ``full_tensor()`` gathers it with two
    all-gathers, one per mesh dimension, that DTensor cannot merge into one ("non-ascending order").
    ``torch/distributed/tensor/_redistribute.py`` (``_warn_flatten_optimization_not_possible``) logs a warning for
    that once per process for each key (mesh, mesh dimensions, reason): "suboptimal", more latency, "may give
    inconsistent results between ranks due to different reduction orders". An all-gather reduces nothing, so the
    gathered tensor is exact; the latency, one more collective in a check run once. Its other messages, and this one
    for other collectives (a reduce_scatter, which does reduce), pass, within torch's once-per-key limit: a key whose
    all_gather note was dropped here is not warned about again, for any collective."""
    def keep(record):  # the format's arguments: source, target, count, collective, reason
        return not (str(record.msg).startswith("While redistributing from") and record.args[3:4] == ("all_gather",))
    log = logging.getLogger("torch.distributed.tensor._redistribute")
    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)
