"""The two operators of sequence parallelism (Korthikanti et al. 2022, arXiv 2205.05198).

Derived in notebooks/05b_dtensor_and_sequence_parallelism.ipynb (part 2 of lesson 05); the column- and row-parallel
layers of ``utils.tensor_parallel.layers`` use them in place of Megatron's ``f`` and ``g``
(``utils.tensor_parallel.communications``) when built with ``sp=True``. Between the tensor-parallel blocks each
rank holds only its tokens, the (s/t, b, h) shard of the sequence-first activation:

- ``GatherFromSequenceParallelRegion`` (in ``f``'s place, before a column-parallel layer): all-gather forward,
  reduce-scatter backward: attention and the MLP need every token;
- ``ReduceScatterToSequenceParallelRegion`` (in ``g``'s place, after a row-parallel layer): reduce-scatter forward,
  all-gather backward: each rank keeps the summed rows of its own tokens.

An all-reduce is a reduce-scatter followed by an all-gather: the bytes on the wire are those of ``f`` and ``g``.
The collectives run over the default process group: every rank of it is one tensor-parallel rank.
"""

import torch
import torch.distributed as dist

from ..comm import compat  # through the module, so that CommLedger sees the call (utils/comm/compat.py)

__all__ = ["all_gather_seq", "reduce_scatter_seq", "GatherFromSequenceParallelRegion",
           "ReduceScatterToSequenceParallelRegion"]


def all_gather_seq(x):  # (s/t, b, h) -> (s, b, h): concatenate the ranks' tokens along dim 0
    out = x.new_empty((x.shape[0] * dist.get_world_size(), *x.shape[1:]))
    compat.all_gather_single(out, x.contiguous())  # all_gather_into_tensor before torch 2.13
    return out


def reduce_scatter_seq(x):  # (s, b, h) -> (s/t, b, h): sum over ranks, keep this rank's tokens
    out = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
    compat.reduce_scatter_single(out, x.contiguous())  # reduce_scatter_tensor before torch 2.13
    return out


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """All-gather forward, reduce-scatter backward: the g of sequence parallelism (arXiv 2205.05198), in f's place."""

    @staticmethod
    def forward(ctx, x):
        return all_gather_seq(x)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_seq(grad)


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Reduce-scatter forward, all-gather backward: the g-bar of arXiv 2205.05198, in Megatron's g's place."""

    @staticmethod
    def forward(ctx, x):
        return reduce_scatter_seq(x)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_seq(grad)
