"""utils.sharding.memory: the ZeRO formulas and the byte counts notebook 03 puts beside them."""

import pytest
import torch
import torch.distributed as dist

from utils import run_ranks
from utils.sharding.memory import (bytes_per_param, live_tensor_bytes, memory_ledger, state_bytes,
                                  zero_bytes_per_rank)


def test_paper_figure_1():
    """ZeRO paper, Figure 1: 7.5B parameters, 64 ranks, mixed-precision Adam (K=12)."""
    gb = [zero_bytes_per_rank(7.5e9, 64, stage, *bytes_per_param("mixed", "adam"))["total"] / 1e9 for stage in range(4)]
    assert gb == pytest.approx([120, 31.4, 16.6, 1.88], abs=0.05)


def test_one_rank_shards_nothing():
    assert {zero_bytes_per_rank(1000, 1, s, 4, 4, 8)["total"] for s in range(4)} == {16_000}


def test_live_bytes_count_each_storage_once_and_see_dtensor_shards():
    def measure():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        before = live_tensor_bytes()
        base = torch.ones(1000)
        views = (base[10:20], base.view(10, 100))  # noqa: F841 - views share base's storage
        after_views = live_tensor_bytes() - before
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        full = torch.ones(100, 100)  # alive in both snapshots: a scatter still in flight may hold views of it
        before_shard = live_tensor_bytes()  # (after the mesh, which holds a small tensor of its own)
        sharded = distribute_tensor(full, mesh, [Shard(0)])  # noqa: F841
        dist.barrier()
        return after_views, live_tensor_bytes() - before_shard

    views, shard = run_ranks(measure, world_size=2, verbose=False)[0]
    assert views == 4000
    assert shard == 100 * 100 * 4 // 2


def test_state_bytes_by_storage_and_by_tensor():
    """One counter for every model-state count (memory_ledger, mesh3d.model_state_bytes, LitToy.held_bytes):
    by storage, a view of a padded buffer counts the buffer and a storage is counted once; by tensor, numel x size."""
    padded = torch.zeros(12)  # a flat buffer, padded to 12 values
    weight = torch.nn.Parameter(padded[:10])  # a 10-value parameter that is a view of it
    weight.grad = torch.zeros(10)
    optimizer = torch.optim.Adam([weight])
    weight.grad.zero_()
    optimizer.step()  # Adam's state: exp_avg, exp_avg_sq (10 values each) and a step scalar
    by_storage = state_bytes([weight, weight], optimizer)  # the tied weight listed twice: once
    by_tensor = state_bytes([weight], optimizer, by="tensor")
    assert by_storage == {"params": 48, "grads": 40, "optim": 84, "total": 172}
    assert by_tensor == {"params": 40, "grads": 40, "optim": 84, "total": 164}
    assert memory_ledger([weight], optimizer)["total"] == by_storage["total"]
    with pytest.raises(ValueError, match="by='bytes'"):
        state_bytes([weight], by="bytes")
