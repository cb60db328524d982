"""Torch's own reduce-scatter on some of the ranks, cut into the chunks ``torch.tensor_split`` makes.

Lab 01b needs a working reduce-scatter to build its all-reduce on (recursive halving is lab 01a's
exercise, so it is not handed out here): ``reduce_scatter_chunks(tensor, ranks)`` is torch's
``dist.reduce_scatter``, run by the ranks ``ranks`` only (a lab's fold leaves some ranks out), on a
group made once per set of ranks. The chunks are those of ``torch.tensor_split(flat, p)``, the
layout MPICH's recursive halving uses too (the first ``numel % p`` chunks one element longer), so
``chunk_bounds`` is where each one starts.

Torch numbers a group's ranks in the order of their global ranks (``new_group`` sorts them), so
``ranks`` must be sorted: the rank ``ranks[v]`` receives chunk ``v``. The group is made with
``use_local_synchronization=True``: only its members call ``new_group``, which a rank that sits out
cannot do. ``dist.reduce_scatter`` is looked up when called, so ``CommLedger`` records it.
"""

import itertools

import torch
import torch.distributed as dist

__all__ = ["chunk_bounds", "reduce_scatter_chunks"]

_GROUPS = {}  # (ranks, world) -> the process group of those ranks, made once per rank process


def chunk_bounds(numel, p):
    """The p + 1 offsets at which ``torch.tensor_split`` cuts ``numel`` elements into p chunks."""
    if p < 1:
        raise ValueError(f"p={p}: a tensor is cut into at least 1 chunk.")
    return [0, *itertools.accumulate(numel // p + (v < numel % p) for v in range(p))]


def _group(ranks):
    if list(ranks) == list(range(dist.get_world_size())):
        return None  # all of them: the default group
    key = (tuple(ranks), id(dist.group.WORLD))  # a new launch (a new default group) gets new groups
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(ranks), use_local_synchronization=True)
    return _GROUPS[key]


def reduce_scatter_chunks(tensor: torch.Tensor, ranks) -> None:
    """Sum ``tensor`` over the ranks ``ranks`` (sorted global ranks, this one among them) with torch's
    ``dist.reduce_scatter``: afterwards rank ``ranks[v]`` holds chunk v of ``tensor_split(flat, len(ranks))``
    of the sum, in place; its other chunks are left as they were. The other ranks must not call it."""
    ranks = list(ranks)
    if ranks != sorted(set(ranks)) or dist.get_rank() not in ranks:
        raise ValueError(f"ranks={ranks}: give the ranks that take part sorted, without repeats, and this rank "
                         f"({dist.get_rank()}) among them (torch's group numbers them in that order).")
    flat = tensor.view(-1)  # (numel,), a view: writing a chunk writes into tensor
    chunks = flat.tensor_split(len(ranks))
    if len(ranks) == 1:
        return
    inputs = [c.clone() for c in chunks]  # the output is one of the chunks: torch must not read what it writes
    dist.reduce_scatter(chunks[ranks.index(dist.get_rank())], inputs, group=_group(ranks))
