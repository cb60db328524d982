"""utils.experts: the router's capacity and drops, the MoE layer's refusals, and expert parallelism on 2 and 3
ranks equal to one process (outputs and gradients), with and without dropped tokens (notebook 15)."""

import pytest
import torch
import torch.distributed as dist

import utils
from utils.experts import (ExpertParallelMoE, MoELayer, check_expert_split, expert_capacity, load_balancing_loss,
                           route, wire_values_per_token)

TOL = dict(rtol=1e-5, atol=1e-6)


def test_capacity_formula_and_drops():
    assert expert_capacity(tokens=100, num_experts=8, k=2, capacity_factor=1.0) == 25  # ceil(1.0 * 100 * 2 / 8)
    assert expert_capacity(tokens=10, num_experts=4, k=1, capacity_factor=1.25) == 4  # ceil(3.125)
    experts = torch.tensor([[0, 1], [0, 2], [0, 1], [3, 0]])  # expert 0 chosen 4 times, 3 of them first
    weights = torch.full((4, 2), 0.5)
    routes = route(weights, experts, 4, capacity_factor=0.5)  # capacity ceil(0.5 * 4 * 2 / 4) = 1
    assert routes.capacity == 1
    assert routes.dropped == sum(max(0, c - 1) for c in (4, 2, 1, 1))
    kept = set(zip(routes.token.tolist(), routes.expert.tolist()))
    assert (0, 0) in kept and (2, 0) not in kept and (3, 0) not in kept, "first choices in token order win"
    assert routes.expert.tolist() == sorted(routes.expert.tolist()), "sorted by expert for the all-to-all"
    assert route(weights, experts, 4).dropped == 0


def test_load_balancing_loss_bounds():
    E, k = 8, 2
    uniform = torch.full((16, E), 1 / E)
    spread = torch.arange(16 * k).view(16, k) % E  # every expert chosen equally often
    assert load_balancing_loss(uniform, spread, E, alpha=0.01).item() == pytest.approx(0.01)
    one_hot = torch.zeros(16, E)
    one_hot[:, 0] = 1.0
    first_on_0 = torch.stack([torch.zeros(16, dtype=torch.long), torch.ones(16, dtype=torch.long)], 1)
    assert load_balancing_loss(one_hot, first_on_0, E, alpha=0.01).item() == pytest.approx(0.01 * E / k)
    all_on_0 = torch.zeros(16, 1, dtype=torch.long)  # k = 1, Switch's case: one expert takes all
    assert load_balancing_loss(one_hot, all_on_0, E, alpha=0.01).item() == pytest.approx(0.01 * E)


def test_refusals_name_the_numbers():
    with pytest.raises(ValueError, match=r"8 experts do not split evenly over 3 expert-parallel ranks \(8 % 3 = 2\)"):
        check_expert_split(8, 3)
    assert check_expert_split(8, 4) == 2
    with pytest.raises(ValueError, match="k=9"):
        MoELayer(4, 8, num_experts=8, k=9)
    with pytest.raises(ValueError, match="10 tokens do not split into 3"):
        MoELayer(4, 8, num_experts=4, k=2)(torch.randn(10, 4), groups=3)


def test_sparse_layer_equals_dense_definition():
    torch.manual_seed(0)
    layer, x = MoELayer(8, 16, 4, 2), torch.randn(32, 8)
    y, _ = layer(x)
    _, w, c = layer.router(x)
    gate = torch.zeros(32, 4).scatter(1, c, w)
    torch.testing.assert_close(y, sum(gate[:, i:i + 1] * e(x) for i, e in enumerate(layer.experts)), **TOL)
    assert wire_values_per_token(2, 4096, 7 / 8) == 14336  # Mixtral 8x7B on 8 ranks


def _make(capacity_factor, n):
    torch.manual_seed(0)
    return MoELayer(8, 16, 6, 2, capacity_factor), torch.randn(n * 20, 8)


def _expert_parallel(capacity_factor):
    rank, n = dist.get_rank(), dist.get_world_size()
    layer, x_all = _make(capacity_factor, n)
    moe = ExpertParallelMoE(layer)
    x = x_all.chunk(n)[rank].clone().requires_grad_()
    y, aux = moe(x)
    (y.square().sum() + aux).backward()
    return y.detach(), x.grad, {name: p.grad for name, p in moe.named_parameters()}, moe.last["routes"].dropped


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("capacity_factor", [None, 0.75])
def test_expert_parallel_equals_one_process(n, capacity_factor):
    results = utils.run_ranks(_expert_parallel, capacity_factor, world_size=n, verbose=False, timeout=120)
    ref, x_all = _make(capacity_factor, n)
    x_all.requires_grad_()
    y, aux = ref(x_all, groups=n)
    (y.square().sum() + n * aux).backward()
    torch.testing.assert_close(torch.cat([r[0] for r in results]), y.detach(), **TOL)
    torch.testing.assert_close(torch.cat([r[1] for r in results]), x_all.grad, **TOL)
    torch.testing.assert_close(sum(r[2]["router.gate.weight"] for r in results), ref.router.gate.weight.grad, **TOL)
    local = 6 // n
    for rank, (_, _, grads, _) in enumerate(results):
        for i in range(local):
            for rest in ("up.weight", "up.bias", "down.weight", "down.bias"):
                torch.testing.assert_close(grads[f"experts.{i}.{rest}"],
                                           ref.experts[rank * local + i].get_parameter(rest).grad, **TOL)
    dropped = [r[3] for r in results]
    assert dropped == [rt.dropped for rt in ref.last_routes]
    assert (sum(dropped) > 0) == (capacity_factor is not None)


def _uneven_all_to_all():
    rank = dist.get_rank()
    send = [1, 3] if rank == 0 else [2, 0]  # rows to rank 0, rank 1
    recv = [1, 2] if rank == 0 else [3, 0]
    rows = torch.ones(sum(send), 5)
    with utils.CommLedger() as ledger:
        out = torch.empty(sum(recv), 5)
        dist.all_to_all_single(out, rows, output_split_sizes=recv, input_split_sizes=send)
    return ledger.records[0].payload_bytes, ledger.records[0].wire_bytes


def test_ledger_counts_uneven_all_to_all_exactly():
    (p0, w0), (p1, w1) = utils.run_ranks(_uneven_all_to_all, world_size=2, verbose=False, timeout=120)
    assert (p0, w0) == (4 * 5 * 4, 3 * 5 * 4)  # rank 0 hands 4 rows, 3 of them leave
    assert (p1, w1) == (2 * 5 * 4, 2 * 5 * 4)  # rank 1 hands 2 rows, both leave
