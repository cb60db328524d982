"""Reference solution of labs/05_tensor_parallel_lab.ipynb: Megatron's f and g, column- and row-parallel linears.

Megatron-LM (Shoeybi et al., arXiv 1909.08053) splits ``Z = GeLU(X A) B`` over t ranks: A by
columns (output features), so each rank computes its share of the hidden units with no
communication, and B by rows (input features), so each rank's ``Y_r B_r`` is a partial sum that
one all-reduce completes. The two conjugate operators carry the communication:

- ``f`` (CopyToTensorParallelRegion): identity forward, all-reduce backward, at the input of the
  column-parallel layer (every rank's input gradient comes from its own slice of A);
- ``g`` (ReduceFromTensorParallelRegion): all-reduce forward, identity backward, at the output of
  the row-parallel layer.

nn.Linear stores its weight as (out, in), so *column*-parallel cuts the weight's rows (dim 0).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from utils.tensor_parallel import check_tp_degree


class CopyToTensorParallelRegion(torch.autograd.Function):
    """Identity forward, all-reduce backward: the f operator of Megatron-LM (arXiv 1909.08053)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()  # never all-reduce a tensor that is not yours
        dist.all_reduce(grad)
        return grad


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """All-reduce forward, identity backward: the g operator of Megatron-LM (arXiv 1909.08053)."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(nn.Module):
    """Y_r = f(X) A_r^T + b_r: weight (out/t, in), bias (out/t,), rank's rows of the full layer."""

    def __init__(self, full: nn.Linear, rank: int, world_size: int):
        super().__init__()
        check_tp_degree(world_size, out_features=full.out_features)
        self.weight = nn.Parameter(full.weight.detach().chunk(world_size, dim=0)[rank].clone())
        self.bias = nn.Parameter(full.bias.detach().chunk(world_size, dim=0)[rank].clone())

    def forward(self, x):  # (..., in) -> (..., out/t)
        return F.linear(CopyToTensorParallelRegion.apply(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Z = g(Y_r B_r^T) + b: weight (out, in/t), the whole bias, added once after the sum."""

    def __init__(self, full: nn.Linear, rank: int, world_size: int):
        super().__init__()
        check_tp_degree(world_size, in_features=full.in_features)
        self.weight = nn.Parameter(full.weight.detach().chunk(world_size, dim=1)[rank].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, y):  # (..., in/t) -> (..., out), the same on every rank
        return ReduceFromTensorParallelRegion.apply(F.linear(y, self.weight)) + self.bias
