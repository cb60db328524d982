"""utils/pipeline/zero_bubble.py and the split backward in utils/pipeline (simulate, peak_in_flight, run_stage):
the B/W formulas of a linear layer, ZB-H1's order, its bubble and its memory (pure Python and one process, fast).

The runs on ranks (ZB-H1 on fixed-cost stages, torch's ZBV and DualPipeV against one process) are in
notebooks/06c_zero_bubble.ipynb.
"""

import itertools

import pytest
import torch
from torch import nn

from utils.pipeline import (PipelineDeadlock, bubble_fraction, idle_fraction, one_f_one_b_order, peak_in_flight,
                            simulate)
from utils.pipeline.zero_bubble import (held_for_weights, linear_input_grad, linear_weight_grad, torch_order,
                                        torch_schedule_class, zb_h1_bubble, zb_h1_order)

COSTS = (0.25, 0.5, 1.0, 1.5, 3.0)


def test_linear_split_is_the_backward():
    torch.manual_seed(0)
    layer, x, dy = nn.Linear(7, 3), torch.randn(5, 7, requires_grad=True), torch.randn(5, 3)
    layer(x).backward(dy)
    dw, db = linear_weight_grad(x.detach(), dy)
    torch.testing.assert_close(linear_input_grad(dy, layer.weight.detach()), x.grad, rtol=0, atol=1e-6)
    torch.testing.assert_close(dw, layer.weight.grad, rtol=0, atol=1e-6)
    torch.testing.assert_close(db, layer.bias.grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("m_over_p", [1, 2, 3])
def test_zb_h1_bubble_is_the_papers_and_a_third_of_1f1b(p, m_over_p):
    m = p * m_over_p + (m_over_p == 3)  # also an m that is not a multiple of p
    zb = simulate([zb_h1_order(s, p, m) for s in range(p)], 1.0, 1.0, weight=1.0)
    ofob = simulate([one_f_one_b_order(s, p, m) for s in range(p)], 1.0, 2.0)
    assert idle_fraction(zb) == pytest.approx(zb_h1_bubble(p, m), abs=1e-12) == (p - 1) / (3 * m + p - 1)
    assert idle_fraction(ofob) == pytest.approx(bubble_fraction(p, m), abs=1e-12)
    idle = [idle_fraction(t) * p * max(iv.end for iv in t) for t in (zb, ofob)]
    assert idle[0] / idle[1] == pytest.approx(1 / 3)


@pytest.mark.parametrize("p, m", [(2, 2), (3, 7), (4, 8), (6, 6)])
def test_zb_h1_bubble_holds_while_w_is_no_longer_than_f_and_b(p, m):
    orders = [zb_h1_order(s, p, m) for s in range(p)]
    for tf, tb, tw in itertools.product(COSTS, COSTS, COSTS):
        got = idle_fraction(simulate(orders, tf, tb, weight=tw))
        if tw <= min(tf, tb):
            assert got == pytest.approx(zb_h1_bubble(p, m, tf, tb, tw), abs=1e-12), (tf, tb, tw)
        else:  # the handcrafted order no longer fits its W's in the slots: the bubble grows past the expression
            bubble = (p - 1) * (tf + tb - tw)
            assert got > bubble / (m * (tf + tb + tw) + bubble) + 1e-9, (tf, tb, tw)
            with pytest.raises(ValueError, match="T_W <= min"):
                zb_h1_bubble(p, m, tf, tb, tw)


@pytest.mark.parametrize("p, m", [(2, 4), (4, 4), (4, 9), (5, 3), (3, 1)])
def test_memory(p, m):
    orders = [zb_h1_order(s, p, m) for s in range(p)]
    assert [peak_in_flight(ops) for ops in orders] == [min(p, m)] * p  # 1F1B: min(p - s, m)
    if m >= p:
        assert [held_for_weights(ops) for ops in orders] == list(range(p))
    for ops in orders:  # every op once, each W after its B
        assert sorted(ops) == sorted((k, mb) for k in "FBW" for mb in range(m))
        assert all(ops.index(("W", mb)) > ops.index(("B", mb)) > ops.index(("F", mb)) for mb in range(m))


def test_w_in_the_simulator():
    assert peak_in_flight([("F", 0), ("B", 0), ("F", 1), ("W", 0), ("B", 1), ("W", 1)]) == 2  # held until W
    assert held_for_weights([("F", 0), ("B", 0), ("W", 0)]) == 0
    with pytest.raises(ValueError, match="one W per B"):
        simulate([[("F", 0), ("B", 0), ("W", 0), ("F", 1), ("B", 1)]])
    with pytest.raises(PipelineDeadlock, match="weight gradient|backward of micro-batch 0"):
        simulate([[("F", 0), ("W", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="placement"):
        simulate([[("F", 0), ("B", 0)]], placement="v")
    with pytest.raises(ValueError, match="m >= p"):
        zb_h1_bubble(4, 3)
    with pytest.raises(ValueError, match="stage 4 does not exist"):
        zb_h1_order(4, 4, 8)


def test_torch_names():
    assert torch_schedule_class("Schedule1F1B").__name__ == "Schedule1F1B"
    with pytest.raises(ImportError, match=r"torch .* has no ScheduleNoSuch.*Schedule1F1B"):
        torch_schedule_class("ScheduleNoSuch")


def test_torch_order_maps_i_to_b():
    from torch.distributed.pipelining.schedules import _Action, _ComputationType as T

    actions = [None, _Action(3, T.FORWARD, 0), _Action(3, T.BACKWARD_INPUT, 0), _Action(3, T.BACKWARD_WEIGHT, 0)]
    assert torch_order(actions, {0: 0, 3: 1}) == [("F", 0, 1), ("B", 0, 1), ("W", 0, 1)]
    with pytest.raises(ValueError, match="does not map"):
        torch_order([_Action(0, T.FULL_BACKWARD, 0)], {0: 0})
