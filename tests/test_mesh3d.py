"""utils.mesh.mesh3d (lesson 09): mesh factorisations, refusals with the numbers, bytes attributed per dimension."""

import pytest
import torch
import torch.distributed as dist

import utils
from utils.mesh.mesh3d import MeshCommLedger, check_mesh, meshes, model_state_bytes

SIZES = dict(heads=4, kv_heads=2, layers=4, batch=8, microbatches=2)


def test_meshes_are_the_factorisations():
    for n in range(1, 9):
        found = meshes(n)
        assert len(found) == len(set(found)) and all(d * p * t == n for d, p, t in found)
        assert len(found) == sum(1 for d in range(1, n + 1) for p in range(1, n + 1) if n % (d * p) == 0)


@pytest.mark.parametrize("mesh, words", [((1, 1, 4), ["2 key/value heads", "tp=4"]), ((1, 3, 1), ["4 layers", "pp=3"]),
                                         ((3, 1, 1), ["batch 8", "dp=3", "2 micro-batches"]),
                                         ((1, 1, 3), ["4 attention heads", "tp=3"])])
def test_check_mesh_refuses_with_the_numbers(mesh, words):
    with pytest.raises(ValueError) as e:
        check_mesh(*mesh, world_size=mesh[0] * mesh[1] * mesh[2], **SIZES)
    assert all(w in str(e.value) for w in words), str(e.value)
    with pytest.raises(ValueError, match="WORLD_SIZE = 3"):
        check_mesh(1, 1, 2, world_size=3, **SIZES)
    assert check_mesh(2, 2, 2, world_size=8, **SIZES) == (2, 2, 2)


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
