"""Megatron-LM's two conjugate operators of tensor parallelism (Shoeybi et al. 2019, arXiv 1909.08053, section 3),
written in lesson 05 (notebooks/05a_tensor_parallelism.ipynb) and used again by lesson 12's graph rewrite
(``utils.fx.passes``): the communication of a tensor-parallel MLP, kept beside the degrees it runs on.

- ``f`` = ``CopyToTensorParallelRegion``: identity forward, all-reduce backward (before the column-parallel layer);
- ``g`` = ``ReduceFromTensorParallelRegion``: all-reduce forward, identity backward (after the row-parallel layer).

The all-reduce runs over the default process group: every rank of it is one tensor-parallel rank.
"""

import torch
import torch.distributed as dist

__all__ = ["CopyToTensorParallelRegion", "ReduceFromTensorParallelRegion", "copy_to_tensor_parallel_region",
           "reduce_from_tensor_parallel_region"]


class CopyToTensorParallelRegion(torch.autograd.Function):
    """Identity forward, all-reduce backward: the f operator of Megatron-LM (arXiv 1909.08053)."""

    @staticmethod
    def forward(ctx, x):
        return x  # every rank already holds the whole X

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()  # each rank's dX came from its own slice of A: sum them
        dist.all_reduce(grad)
        return grad


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """All-reduce forward, identity backward: the g operator of Megatron-LM (arXiv 1909.08053)."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous().clone()  # partial sums Y_r B_r -> Z on every rank
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad  # dZ is the same on every rank, and it is what each partial sum needs


def copy_to_tensor_parallel_region(x):
    """``f``: a plain function, so that a graph node can call it (``call_function``) and ``gm.code`` names it."""
    return CopyToTensorParallelRegion.apply(x)


def reduce_from_tensor_parallel_region(x):
    """``g``: a plain function for the graph, like ``f``."""
    return ReduceFromTensorParallelRegion.apply(x)
