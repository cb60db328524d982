"""utils.fx.cost (lesson 12a): the cost pass against hand counts, the linear partition against brute force."""

import itertools
import random

import pytest
import torch
from torch import fx, nn

from utils.fx.cost import (annotate_costs, balanced_split, even_split, imbalance, split_stages, stage_times,
                           unit_costs, unit_of)


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class Net(nn.Module):
    """Two blocks, then a product of two activations (a ``@`` node) and a head."""

    def __init__(self, width=8, classes=5):
        super().__init__()
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.head = nn.Linear(width, classes)

    def forward(self, x):  # (rows, width)
        h = self.blocks(x)
        h = (h @ h.transpose(0, 1)) @ h  # (rows, rows) then (rows, width)
        return self.head(h)


UNITS = ["blocks.0", "blocks.1", "head"]


def _annotated(rows=6, width=8):
    torch.manual_seed(0)
    model = Net(width)
    return model, annotate_costs(fx.symbolic_trace(model), torch.randn(rows, width, requires_grad=True))


def test_flops_and_bytes_match_hand_counts():
    rows, width, classes = 6, 8, 5
    model, gm = _annotated(rows, width)
    block = 2 * rows * (width * 2 * width) * 2  # two linear layers of width x 2 width, 2 FLOPs per multiply-add
    matmuls = 2 * rows * rows * width + 2 * rows * width * rows  # (rows, w) @ (w, rows), then (rows, rows) @ (rows, w)
    head = 2 * rows * width * classes
    total = sum(n.meta["cost"]["flops"] for n in gm.graph.nodes)
    assert total == 2 * block + matmuls + head
    assert unit_costs(gm, UNITS) == [block, block, head]  # the two matmuls sit at the top level: no unit
    assert sum(n.meta["cost"]["param_bytes"] for n in gm.graph.nodes) == sum(p.numel() * 4 for p in model.parameters())
    head_node = next(n for n in gm.graph.nodes if n.target == "head")
    assert head_node.meta["cost"]["out_bytes"] == rows * classes * 4


def test_saved_bytes_counted_once_per_storage():
    torch.manual_seed(0)
    lin = nn.Sequential(nn.Linear(4, 4))
    x = torch.randn(3, 4, requires_grad=True)
    gm = annotate_costs(fx.symbolic_trace(lin), x)
    # Linear saves its input (3 x 4 floats) for the weight's gradient; its weight is a parameter: excluded
    assert sum(n.meta["cost"]["saved_bytes"] for n in gm.graph.nodes) == 3 * 4 * 4


def test_units_come_from_the_module_stack():
    _, gm = _annotated()
    found = {unit_of(n, UNITS) for n in gm.graph.nodes}
    assert found == {None, *UNITS}
    up = next(n for n in gm.graph.nodes if n.target == "blocks.1.up")
    assert unit_of(up, UNITS) == "blocks.1"


@pytest.mark.parametrize("seed", range(20))
def test_balanced_split_is_optimal(seed):
    rng = random.Random(seed)
    costs = [rng.randint(0, 20) for _ in range(rng.randint(2, 8))]
    stages = rng.randint(1, len(costs))
    bounds = balanced_split(costs, stages)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(costs) and len(bounds) == stages
    assert all(a < b for a, b in bounds) and all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
    best = min(max(sum(costs[a:b]) for a, b in zip((0, *cuts), (*cuts, len(costs))))
               for cuts in itertools.combinations(range(1, len(costs)), stages - 1))
    assert max(sum(costs[a:b]) for a, b in bounds) == best


def test_splits_refuse_impossible_requests():
    with pytest.raises(ValueError, match="3 units into 4 stages"):
        balanced_split([1, 2, 3], 4)
    with pytest.raises(ValueError, match="2 layers into 3 stages"):
        even_split(2, 3)


def test_even_split_puts_embedding_first_and_head_last():
    assert even_split(4, 2, first=1, last=2) == [(0, 3), (3, 7)]
    assert even_split(5, 2, first=1, last=1) == [(0, 4), (4, 7)]
    assert imbalance([1, 3]) == 1.5 and imbalance([2, 2]) == 1.0


def test_split_stages_computes_the_same_function_and_times_each_stage():
    model, gm = _annotated()
    split = split_stages(gm, UNITS, [(0, 1), (1, 3)])
    x = torch.randn(6, 8)
    torch.testing.assert_close(split(x), model(x), rtol=0, atol=0)  # the same operations, cut in two
    times = stage_times({"two": split, "three": split_stages(gm, UNITS, [(0, 1), (1, 2), (2, 3)])}, (x,), repeats=2)
    assert list(times) == ["two", "three"] and [len(t) for t in times.values()] == [2, 3]
    assert all(t >= 0 for stage in times.values() for t in stage)
    with pytest.raises(TypeError, match="dict of label"):
        stage_times(split, (x,))  # one split, not a dict: the message says how to pass it
