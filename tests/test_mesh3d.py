"""utils.mesh.mesh3d and plan3d (lesson 09): mesh factorisations, a run as a Plan refused with the numbers, bytes
attributed per dimension."""

import dataclasses

import pytest
import torch
import torch.distributed as dist

import utils
from utils.mesh.mesh3d import MeshCommLedger, meshes, model_state_bytes
from utils.mesh.plan3d import SHAPE, mesh_plan, plan_4d, unrunnable
from utils.planner import check_plan


def test_meshes_are_the_factorisations():
    for n in range(1, 9):
        found = meshes(n)
        assert len(found) == len(set(found)) and all(d * p * t == n for d, p, t in found)
        assert len(found) == sum(1 for d in range(1, n + 1) for p in range(1, n + 1) if n % (d * p) == 0)


@pytest.mark.parametrize("mesh, words", [((1, 3, 1), ["number of layers 4", "pp*v=3*1"]),
                                         ((3, 1, 1), ["global batch 8", "dp=3", "micro-batches of 2"]),
                                         ((1, 1, 3), ["number of heads 4", "tp=3"])])
def test_a_mesh_that_does_not_fit_the_model_is_refused_with_the_numbers(mesh, words):
    """One check of a run, the planner's: ``Plan`` refuses a batch that does not split, ``check_plan`` a mesh that
    does not divide the model (``build`` calls it first)."""
    with pytest.raises(ValueError) as e:
        check_plan(SHAPE, mesh_plan(*mesh))
    assert all(w in str(e.value) for w in words), str(e.value)
    with pytest.raises(ValueError, match="number of KV heads 2 is not divisible by 4"):
        check_plan(dataclasses.replace(SHAPE, kv_heads=2), mesh_plan(1, 1, 4))  # grouped-query attention
    plan = check_plan(SHAPE, mesh_plan(2, 2, 2))
    assert (plan.world_size, plan.microbatches, plan.micro_batch, unrunnable(plan)) == (8, 2, 2, "")


@pytest.mark.parametrize("knobs, phrase", [(dict(precision="bf16"), "in fp32"), (dict(sequence_parallel=False),
                                           "without sequence_parallel"), (dict(zero_stage=2), "ZeRO-2 with dp=2"),
                                           (dict(v=2, schedule="1F1B"), "v=2"),
                                           (dict(checkpointing="selective"), "selective")])
def test_the_step_names_a_knob_it_does_not_have(knobs, phrase):
    assert phrase in unrunnable(dataclasses.replace(mesh_plan(2, 2, 2), **knobs))


def test_plan_4d_fits_the_model_or_says_why():
    plan, _ = plan_4d(8)
    assert (plan.dp, plan.pp, plan.cp, plan.tp) == (1, 1, 2, 4) and plan.world_size == 8
    plan, why = plan_4d(6)
    assert plan is None and len(why) == 3 and all(" 3" in w or " 6" in w for w in why), why  # a factor 3 each
    assert plan_4d(3) == (None, ["3 ranks do not split into cp = 2 and the rest"])


def _build(plan):
    from utils.mesh.parallelize3d import build
    build(plan, torch.device("cpu"))


def test_build_refuses_a_plan_for_another_number_of_ranks():
    with pytest.raises(utils.RankError, match="its mesh is 2 ranks, 1 run it: launch 2 or plan for 1"):
        utils.run_ranks(_build, mesh_plan(1, 1, 2), world_size=1, verbose=False, timeout=120)


def _attributed():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    x = distribute_tensor(torch.ones(4, 8), mesh["tp"], [Shard(0)])  # (2, 8) per rank
    out = torch.zeros(8)
    with MeshCommLedger(mesh) as ledger:
        x.redistribute(mesh["tp"], [Replicate()])  # DTensor: a functional all-gather on tp
        dist.all_gather_into_tensor(out, torch.ones(4), group=mesh.get_group("dp"))  # c10d op on dp
        if mesh.get_local_rank("dp") == 0:
            dist.send(torch.ones(3), group=mesh.get_group("dp"), group_dst=1)
        else:
            dist.recv(torch.zeros(3), group=mesh.get_group("dp"), group_src=0)
    return ledger.summary()


def test_ledger_attributes_collectives_to_mesh_dimensions():
    for summary in utils.run_ranks(_attributed, world_size=4, verbose=False):
        assert summary[("tp", "all_gather")]["payload_bytes"] == 4 * 8 * 4  # the gathered (4, 8) fp32
        assert summary[("tp", "all_gather")]["wire_bytes"] == 4 * 8 * 4 / 2
        assert summary[("dp", "all_gather")]["wire_bytes"] == 8 * 4 / 2
        sent = summary.get(("dp", "send"), {"wire_bytes": 0})["wire_bytes"]
        assert sent in (0, 12) and not any(dim == "other" for dim, _ in summary)


def test_model_state_bytes_counts_a_tied_weight_once():
    model = utils.ToyNet()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 64)).sum().backward()
    opt.step()
    params = list(dict.fromkeys(model.parameters()))
    psi = sum(p.numel() for p in params if p.requires_grad)
    got = model_state_bytes(model, opt)
    assert got["grads"] == 4 * psi and got["optim"] == 8 * psi + 4 * len([p for p in params if p.requires_grad])
