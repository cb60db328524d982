"""utils.sharding.fsdp2_controls and the memory helpers lesson 04c adds (notebooks/04c_fsdp2_overlap_and_accumulation.ipynb):
the formulas on hand-computed cases, and the measurements on one process (no ranks: a few seconds)."""

import pytest
import torch

from utils.sharding.fsdp2_controls import first_index, padded_bytes, reshard_sizes, step_wire_bytes
from utils.sharding.memory import parameter_grad_bytes, quiet_profile


def test_padded_bytes_pads_dim0_to_a_multiple_of_the_shard():
    weight, bias, scalar = torch.zeros(10, 3), torch.zeros(10), torch.zeros(())
    assert padded_bytes([weight], 4) == 12 * 3 * 4  # 10 rows -> 3 per rank -> 12 rows gathered
    assert padded_bytes([bias], 5) == 10 * 4  # divides: no padding
    assert padded_bytes([scalar], 3) == 3 * 4  # a 0-d tensor is one row
    assert padded_bytes([weight.half()], 1) == 10 * 3 * 2
    with pytest.raises(ValueError, match="shard=0"):
        padded_bytes([weight], 0)


def test_reshard_sizes_are_the_proper_divisors():
    assert reshard_sizes(2) == [] and reshard_sizes(4) == [2] and reshard_sizes(12) == [2, 3, 4, 6]


def test_step_wire_bytes_by_hand():
    P, Pr = 1200, 40  # padded bytes of the blocks and of the (frozen) root, on 4 shards
    default = step_wire_bytes(P, Pr, 4)
    assert default == {"all_gather": 0.75 * (P + Pr) + 0.75 * P, "reduce_scatter": 0.75 * P, "all_reduce": 0.0}
    assert step_wire_bytes(P, Pr, 4, reshard_after_forward=False)["all_gather"] == 0.75 * (P + Pr)
    assert step_wire_bytes(P, Pr, 4, reshard_after_forward=2)["all_gather"] == 0.75 * (P + Pr) + 0.5 * P
    hsdp = step_wire_bytes(P, Pr, 2, replicate=3)  # 3 replicas of 2 shards
    assert hsdp["all_reduce"] == 2 * 2 / 3 * P / 2 and hsdp["reduce_scatter"] == 0.5 * P
    assert step_wire_bytes(P, Pr, 4, root_trainable=True)["reduce_scatter"] == 0.75 * (P + Pr)
    no_sync = step_wire_bytes(P, Pr, 2, replicate=3, sync=False)
    assert no_sync["reduce_scatter"] == no_sync["all_reduce"] == 0 and no_sync["all_gather"] == hsdp["all_gather"]


@pytest.mark.parametrize("k", [1, 3, 4])
def test_step_wire_bytes_refuses_what_fsdp2_would_not_take_as_a_new_mesh(k):
    with pytest.raises(ValueError, match=r"use True, False or one of \[2\]"):
        step_wire_bytes(100, 0, 4, reshard_after_forward=k)


def test_first_index():
    timeline = ["FSDP::pre_forward (a)", "FSDP::all_gather (b)", "FSDP::all_gather (a)"]
    assert first_index(timeline, "FSDP::all_gather (a)") == 2 and first_index(timeline, "FSDP::all_gather", 2) == 2
    with pytest.raises(ValueError, match="no 'FSDP::pre_backward'"):
        first_index(timeline, "FSDP::pre_backward")


def test_quiet_profile_still_records():
    with quiet_profile() as prof:
        torch.ones(3).mul(2)
    assert any(e.name == "aten::mul" for e in prof.events())


def test_parameter_grad_bytes_counts_each_gradient_once():
    before = parameter_grad_bytes()
    layer = torch.nn.Linear(8, 4)  # 32 + 4 numbers
    layer(torch.ones(2, 8)).sum().backward()
    assert parameter_grad_bytes() - before == (32 + 4) * 4
    layer.zero_grad(set_to_none=True)
    assert parameter_grad_bytes() == before
