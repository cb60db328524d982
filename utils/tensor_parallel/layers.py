"""Megatron-LM's tensor-parallel linear layers (Shoeybi et al. 2019, arXiv 1909.08053), and the plan that puts them
in a transformer from outside.

Derived in notebooks/05a_tensor_parallelism.ipynb (part 1 of lesson 05); used again with sequence parallelism
(``sp=True``) in notebooks/05b_dtensor_and_sequence_parallelism.ipynb. Each layer is built *from* a full ``nn.Linear``
(same seed, then sliced), so the comparison with the unsplit layer is exact by construction:

- ``ColumnParallelLinear``: the weight split by output features (rows of ``nn.Linear``'s (out, in) weight),
  ``f`` at its input; with ``sp=True``, the sequence all-gather instead;
- ``RowParallelLinear``: the weight split by input features, ``g`` at its output and the bias added once, after
  the sum; with ``sp=True``, the sequence reduce-scatter instead;
- ``tensor_parallel``: a copy of a stack of ``utils.tensor_parallel.transformer.TransformerLayer`` holding one
  rank's 1/t of every big matrix (attention by heads, the MLP by hidden units), the degree checked first.
"""

import copy

import torch.nn.functional as F
from torch import nn

from .communications import CopyToTensorParallelRegion, ReduceFromTensorParallelRegion
from .degrees import check_tp_degree
from .sequence_parallel import GatherFromSequenceParallelRegion, ReduceScatterToSequenceParallelRegion

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "tensor_parallel"]


class ColumnParallelLinear(nn.Module):
    """Y_r = f(X) A_r^T + b_r: the weight split by output features (rows of nn.Linear's weight)."""

    def __init__(self, full: nn.Linear, rank: int, t: int, sp: bool = False):
        super().__init__()
        check_tp_degree(t, out_features=full.out_features)
        self.weight = nn.Parameter(full.weight.detach().chunk(t, dim=0)[rank].clone())  # (out/t, in)
        self.bias = nn.Parameter(full.bias.detach().chunk(t, dim=0)[rank].clone())  # (out/t,)
        self.sp = sp  # sequence parallelism (lesson 05b): the input is this rank's tokens only

    def forward(self, x):  # x (s, b, in) on every rank -> (s, b, out/t)
        x = GatherFromSequenceParallelRegion.apply(x) if self.sp else CopyToTensorParallelRegion.apply(x)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Z = g(Y_r B_r^T) + b: the weight split by input features; the bias added once, after the sum."""

    def __init__(self, full: nn.Linear, rank: int, t: int, sp: bool = False):
        super().__init__()
        check_tp_degree(t, in_features=full.in_features)
        self.weight = nn.Parameter(full.weight.detach().chunk(t, dim=1)[rank].clone())  # (out, in/t)
        self.bias = nn.Parameter(full.bias.detach().clone())  # (out,), whole: adding it on every rank
        self.sp = sp  # before the all-reduce would add it t times

    def forward(self, y):  # y (s, b, in/t) -> (s, b, out), the same on every rank
        z = F.linear(y, self.weight)  # partial sum
        z = ReduceScatterToSequenceParallelRegion.apply(z) if self.sp else ReduceFromTensorParallelRegion.apply(z)
        return z + self.bias


def tensor_parallel(model, rank, t, sp=False, column=ColumnParallelLinear, row=RowParallelLinear):
    """A copy of `model` (a stack of TransformerLayers) holding only rank's 1/t of every big matrix.

    `column` and `row` are the classes that replace the linear layers: pass your own (a subclass) to try a
    variant, as the lessons' exercises do."""
    for layer in model:
        check_tp_degree(t, hidden=layer.ln1.normalized_shape[0], heads=layer.attn.qkv.out_features // 3
                        // layer.attn.head_dim)
    model = copy.deepcopy(model)
    for layer in model:  # one fixed order: attention, then MLP
        layer.attn.qkv = column(layer.attn.qkv, rank, t, sp)  # a/t whole heads
        layer.attn.out = row(layer.attn.out, rank, t, sp)
        layer.mlp.fc1 = column(layer.mlp.fc1, rank, t, sp)  # 4h/t hidden units
        layer.mlp.fc2 = row(layer.mlp.fc2, rank, t, sp)
    return model
