"""utils.data_parallel.scratch: lesson 02's DDP from scratch (notebooks 02a and 02b)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from utils import run_ranks
from utils.data_parallel.scratch import allreduce_gradients, broadcast_state, cpu_state, global_losses, max_diff
from utils.datasets import batch
from utils.models import make_model, train_reference


def _two_steps(steps, size, lr, broadcast):
    rank, n = dist.get_rank(), dist.get_world_size()
    model = make_model(seed=rank)  # different on every rank until the broadcast
    if broadcast:
        broadcast_state(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = (t[rank::n] for t in batch(step, size))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        allreduce_gradients(model)
        opt.step()
        losses.append(loss.item())
    return dict(state=cpu_state(model), losses=losses)


def test_scratch_ddp_equals_one_process_and_needs_the_broadcast():
    ref_state, ref_losses = train_reference(2, 240, "sgd", 0.5)
    got = run_ranks(_two_steps, 2, 240, 0.5, True, world_size=2, verbose=False)
    torch.testing.assert_close(got[0]["state"], ref_state, rtol=1e-5, atol=1e-6)
    assert max_diff(got[0]["state"], got[1]["state"]) == 0  # the replicas stay bitwise equal
    torch.testing.assert_close(global_losses(got), ref_losses, rtol=1e-5, atol=1e-6)
    apart = run_ranks(_two_steps, 2, 240, 0.5, False, world_size=2, verbose=False)
    assert max_diff(apart[1]["state"], ref_state) > 1e-2  # no broadcast: rank 1 never joins the reference


def test_helpers_in_one_process():
    a = {"w": torch.zeros(2, 2), "b": torch.ones(3)}
    b = {"w": torch.tensor([[0.0, -0.5], [0.0, 0.0]]), "b": torch.ones(3)}
    assert max_diff(a, b) == 0.5
    assert global_losses([{"losses": [1.0, 2.0]}, {"losses": [3.0, 4.0]}]) == [2.0, 3.0]
    state = cpu_state(make_model(0))
    assert all(t.device.type == "cpu" and not t.requires_grad for t in state.values())
    assert "input_shift" in state and "input_scale" in state  # the buffer and the frozen parameter too
