"""The tensor-parallel lab's checker (utils/checkers/tensor_parallel.py) accepts the reference and rejects planted wrong answers.

Each classic mistake of labs/05_tensor_parallel_lab.ipynb is planted here: the weight split along
the wrong dimension, the all-reduce in the wrong direction (f and g swapped, in the operators or in
the layers), the row bias added on every rank, the missing backward all-reduce, and no divisibility
check. The test asserts that the checker names each (``LabCheckFailed.mistake``) and says the key
phrase of its hint. Also: ``utils.tensor_parallel.check_tp_degree``'s message. The lab's notebook
itself runs in tests/test_notebooks.py.
"""

import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lab_grading import expect_rejection
from notebook_runner import ROOT
from torch import nn

from utils.tensor_parallel import check_tp_degree, nearest_tp_degrees, valid_tp_degrees
from utils.checkers.tensor_parallel import check_operators, check_parallel_linear

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from solutions.tensor_parallel import CopyToTensorParallelRegion as f
from solutions.tensor_parallel import ReduceFromTensorParallelRegion as g

WORLD_SIZES = (2,)  # one world size keeps the file fast; the lab itself runs 2 and 4


# ------------------------------------------------------------------ the degree check

def test_check_tp_degree_names_numbers_and_nearest_degrees():
    with pytest.raises(ValueError, match=r"hidden size 1000 is not divisible by tensor-parallel degree 3; use 2, 4 "
                                         r"or 5\."):
        check_tp_degree(3, hidden=1000)
    with pytest.raises(ValueError, match=r"number of heads 6 .* degree 4; use 2, 3 or 6"):
        check_tp_degree(4, hidden=96, heads=6)
    assert check_tp_degree(4, hidden=64, heads=8) == 4
    assert valid_tp_degrees(64, 8) == [2, 4, 8] and nearest_tp_degrees(6, 1000) == [4, 5, 8]


# ------------------------------------------------------------------ the reference passes

def test_reference_passes():
    assert "PASSED" in str(check_operators(f, g, world_sizes=WORLD_SIZES))
    assert "PASSED" in str(check_parallel_linear(ColumnParallelLinear, RowParallelLinear, world_sizes=WORLD_SIZES))


# ------------------------------------------------------------------ operators: wrong answers

class FIdentityBothWays(torch.autograd.Function):
    """f without its backward all-reduce."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class GInPlace(torch.autograd.Function):
    """g that all-reduces the caller's tensor."""

    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class GBothWays(g):
    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


@pytest.mark.parametrize("f_op, g_op, mistake, phrase", [
    (g, f, "f_g_swapped", "wrong direction"),
    (FIdentityBothWays, g, "missing_backward_all_reduce", "backward must all-reduce"),
    (f, FIdentityBothWays, "missing_forward_all_reduce", "forward must all-reduce"),
    (f, GInPlace, "in_place", "x.clone()"),
    (f, GBothWays, "all_reduce_both_ways", "one direction only"),
], ids=["swapped", "f_no_backward", "g_no_forward", "g_in_place", "g_both_ways"])
def test_operators_reject(f_op, g_op, mistake, phrase):
    expect_rejection(check_operators, f_op, g_op, world_sizes=WORLD_SIZES, mistake=mistake, phrase=phrase)


# ------------------------------------------------------------------ layers: wrong answers

class ColumnWrongDim(ColumnParallelLinear):
    """Splits the input features (dim 1 of the weight): the row-parallel split, in the wrong layer."""

    def __init__(self, full, rank, world_size):
        super().__init__(full, rank, world_size)
        self.weight = nn.Parameter(full.weight.detach().chunk(world_size, dim=1)[rank].clone())


class RowBiasEveryRank(RowParallelLinear):
    def forward(self, y):
        return g.apply(F.linear(y, self.weight, self.bias))  # the bias inside the sum: t times


class ColumnWithG(ColumnParallelLinear):
    """f and g swapped in the layers: g at the column layer's input ..."""

    def forward(self, x):
        return F.linear(g.apply(x), self.weight, self.bias)


class RowWithF(RowParallelLinear):
    """... and f at the row layer's output."""

    def forward(self, y):
        return f.apply(F.linear(y, self.weight)) + self.bias


class ColumnWithoutF(ColumnParallelLinear):
    """No f: the input gradient is never summed (the missing backward all-reduce)."""

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class ColumnNoCheck(ColumnParallelLinear):
    def __init__(self, full, rank, world_size):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(full.weight.detach().chunk(world_size, dim=0)[rank].clone())
        self.bias = nn.Parameter(full.bias.detach().chunk(world_size, dim=0)[rank].clone())


@pytest.mark.parametrize("column, row, mistake, phrase", [
    (ColumnWrongDim, RowParallelLinear, "wrong_dimension", "OUTPUT features"),
    (ColumnParallelLinear, RowBiasEveryRank, "bias_every_rank", "add it once"),
    (ColumnWithG, RowWithF, "f_g_swapped", "wrong direction"),
    (ColumnWithoutF, RowParallelLinear, "missing_backward_all_reduce", "must call f"),
    (ColumnNoCheck, RowParallelLinear, "no_divisibility_check", "check_tp_degree"),
], ids=["wrong_dimension", "bias_every_rank", "swapped_in_layers", "no_f", "no_divisibility_check"])
def test_layers_reject(column, row, mistake, phrase):
    expect_rejection(check_parallel_linear, column, row, world_sizes=WORLD_SIZES, mistake=mistake, phrase=phrase)


class FStub(torch.autograd.Function):
    """What the lab ships: the learner's stub raises its own NotImplementedError."""

    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("f.forward is not written yet")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("f.backward is not written yet")


def test_stub_raises_its_own_error():
    with pytest.raises(NotImplementedError, match="f.forward is not written yet"):
        check_operators(FStub, g, world_sizes=WORLD_SIZES)
