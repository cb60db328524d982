"""utils.planner's cp and ep dimensions (issue 27) against the course's own measurements: lesson 14's ring and
lesson 15's all-to-alls re-run on CPU ranks and counted by ``utils.comm.ledger``, plus lesson 15's Mixtral figure."""

import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

import utils
import utils.context_parallel as cp
from utils.experts import ExpertParallelMoE, MoELayer, wire_values_per_token
from utils.sharding.memory import bytes_per_param, zero_bytes_per_rank
from utils.planner import (H100_NODE, LLAMA2_7B, MIXTRAL_8X7B, ModelShape, Plan, best_plans, cp_bytes, ep_bytes,
                           estimate, expert_parameters, parameter_count)

B, H, S, D = 1, 6, 12, 4  # lesson 14's shapes, made small: 12 tokens split into 2n zig-zag chunks for n = 2, 3
HID, FFN, E, K, T = 8, 16, 4, 2, 256  # lesson 15's layer, small: 4 experts, top-2, 256 tokens per rank
TABLE = []  # the validation rows: (what, planner bytes, measured bytes), printed by the last test


def _ring_rank():
    rank, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    q, k, v, w = (cp.shard(torch.randn(B, H, S, D, generator=g), rank, n, "zigzag").requires_grad_() for _ in range(4))
    with utils.CommLedger() as ledger:
        (cp.ring_attention(q, k, v, causal=True, layout="zigzag") * w.detach()).sum().backward()
    return ledger.total("wire_bytes")


@pytest.mark.parametrize("n", [2, 3])
def test_cp_bytes_are_lesson_14s_measured_ring(n):
    """One attention layer of lesson 14 (fp32, causal, zig-zag) on n CPU ranks: every rank's bytes, forward and
    backward, equal the planner's cp term for the same shape (heads H, head size D, one layer, one micro-batch)."""
    measured = utils.run_ranks(_ring_rank, world_size=n, verbose=False, timeout=120)
    model = ModelShape(layers=1, hidden=H * D, heads=H, vocab=8, seq_len=S, dropout=False)
    est = estimate(model, Plan(global_batch=B, micro_batch=B, cp=n, precision="fp32"))
    assert est.bytes_per_step["cp"] == 2 * (n - 1) * 2 * B * H * (S // n) * D * 4  # lesson 14's block_bytes, 2 ways
    assert measured == [est.bytes_per_step["cp"]] * n, (measured, est.bytes_per_step["cp"])
    TABLE.append((f"lesson 14 ring, cp={n}", est.bytes_per_step["cp"], measured[0]))


class _WireBytes(TorchDispatchMode):
    """Bytes this rank sends through torch's functional collectives (the ops torch's ring engine calls), by op."""

    def __init__(self):
        super().__init__()
        self.sent = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket).split(".")[-1]
        if name in ("all_gather_into_tensor", "all_to_all_single"):
            t, n = args[0], dist.get_world_size()
            if name == "all_gather_into_tensor":  # my block goes to the n - 1 others
                wire = (n - 1) * t.nbytes
            else:  # all_to_all_single(input, output_split_sizes, input_split_sizes, group): all but my own split
                wire = t.nbytes - args[2][dist.get_rank()] * t.nbytes // t.shape[0]
            self.sent[name] = self.sent.get(name, 0) + wire
        return func(*args, **(kwargs or {}))


def _torch_fused_ring_rank():
    """torch 2.13's ring engine, forward and its fused backward, on this CPU rank (bf16, causal, zig-zag shards)."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as torch_cp
    rank, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    q, k, v, w = (cp.shard(torch.randn(B, H, S, D, generator=g), rank, n, "zigzag").bfloat16() for _ in range(4))
    aten = getattr(torch, "ops").aten
    with _WireBytes() as forward:
        out, lse, *_ = torch_cp._templated_ring_attention(
            dist.group.WORLD, 2, aten._scaled_dot_product_flash_attention_for_cpu, q, k, v, is_causal=True)
    with _WireBytes() as backward:
        torch_cp._templated_ring_attention_backward(
            dist.group.WORLD, 2, aten._scaled_dot_product_flash_attention_for_cpu_backward, w, "grad_out", q, k, v,
            out, lse, True, dropout_p=0.0)
    return forward.sent, backward.sent, torch_cp._cp_options.convert_to_f32


@pytest.mark.parametrize("n", [2, 3])
def test_cp_bytes_fused_backward_is_torchs_ring_engine(n):
    """``cp_bytes(..., backward="fused")`` against torch's own fused ring backward, run on n CPU ranks and its
    functional collectives' bytes counted: forward, K and V of the chunk (n - 1) times (one all-gather); backward,
    K and V again (n - 1) times, and dK, dV rotated n times (all-to-all), in float32 (``convert_to_f32``) although
    K and V are bf16. The course's autograd ring would send dK, dV (n - 1) times, in bf16."""
    runs = utils.run_ranks(_torch_fused_ring_rank, world_size=n, verbose=False, timeout=120)
    block = 2 * B * H * (S // n) * D  # K and V of this rank's chunk, values
    for forward, backward, to_f32 in runs:
        assert to_f32  # torch's default: the gradients accumulate, and travel, in float32
        assert forward == {"all_gather_into_tensor": (n - 1) * block * 2}
        assert backward == {"all_gather_into_tensor": (n - 1) * block * 2, "all_to_all_single": n * block * 4}
    model = ModelShape(layers=1, hidden=H * D, heads=H, vocab=8, seq_len=S, dropout=False)
    plan = Plan(global_batch=B, micro_batch=B, cp=n)
    measured = sum(runs[0][0].values()) + sum(runs[0][1].values())
    assert cp_bytes(model, plan, 2, backward="fused", grad_bytes=4) == measured
    assert cp_bytes(model, plan, 2) == 2 * (n - 1) * block * 2 < measured  # the autograd ring: fewer bytes
    TABLE.append((f"torch's fused ring, bf16, cp={n}", cp_bytes(model, plan, 2, backward="fused"), measured))


def _moe_rank(recompute=False):
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layer, x_all = MoELayer(HID, FFN, E, K), torch.randn(n * T, HID)
    moe = ExpertParallelMoE(layer)
    x = x_all.chunk(n)[rank].clone().requires_grad_()
    with utils.CommLedger() as forward:
        y, aux = checkpoint(moe, x, use_reentrant=False) if recompute else moe(x)
    with utils.CommLedger() as backward:
        (y.square().sum() + aux).backward()  # with recompute: the layer's forward again, then its backward
    leaving = int((moe.last["routes"].expert // moe.local != rank).sum())
    counts = forward.records[0].wire_bytes  # [0]: the counts' exchange, which the planner leaves out
    return forward.total("wire_bytes") + backward.total("wire_bytes") - counts * (2 if recompute else 1), leaving


@pytest.mark.parametrize("n", [2, 4])
def test_ep_bytes_are_lesson_15s_measured_all_to_alls(n):
    """Lesson 15's MoE layer on n CPU ranks (fp32, no capacity limit): the ranks' mean bytes, forward + backward,
    equal the planner's ep term at the measured share of routes leaving their rank (exact), and its default
    uniform share (ep-1)/ep within 20 % (a random router is near uniform, as lesson 15 asserts)."""
    runs = utils.run_ranks(_moe_rank, world_size=n, verbose=False, timeout=120)
    measured = sum(b for b, _ in runs) / n
    leaving = sum(routes for _, routes in runs) / (n * T * K)
    model = ModelShape(layers=1, hidden=HID, heads=1, vocab=8, seq_len=T, dropout=False, biases=False, n_experts=E,
                       top_k=K, expert_ffn=FFN)
    plan = Plan(global_batch=n, dp=n, ep=n, precision="fp32")
    assert ep_bytes(model, plan, 4, leaving=leaving) == pytest.approx(measured, rel=1e-12)
    uniform = estimate(model, plan).bytes_per_step["ep"]
    assert uniform == 2 * wire_values_per_token(K, HID, (n - 1) / n) * T * 4
    assert uniform == pytest.approx(measured, rel=0.2), (uniform, measured, leaving)
    TABLE.append((f"lesson 15 all-to-all, ep={n} (share {leaving:.3f})", ep_bytes(model, plan, 4, leaving), measured))
    TABLE.append((f"  the same, uniform router (share {(n - 1) / n:.3f})", uniform, measured))


def test_full_recompute_replays_the_ep_all_to_alls():
    """Full recompute (``torch.utils.checkpoint`` around lesson 15's layer) replays its forward in backward, dispatch
    and combine included: measured on 2 CPU ranks, the bytes are the planner's ep term with checkpointing="full",
    1.5 times those without."""
    n = 2
    runs = utils.run_ranks(_moe_rank, True, world_size=n, verbose=False, timeout=120)
    measured, leaving = sum(b for b, _ in runs) / n, sum(routes for _, routes in runs) / (n * T * K)
    model = ModelShape(layers=1, hidden=HID, heads=1, vocab=8, seq_len=T, dropout=False, biases=False, n_experts=E,
                       top_k=K, expert_ffn=FFN)
    plan = Plan(global_batch=n, dp=n, ep=n, precision="fp32", checkpointing="full")
    assert ep_bytes(model, plan, 4, leaving=leaving) == pytest.approx(measured, rel=1e-12)
    plain = ep_bytes(model, dataclasses.replace(plan, checkpointing="none"), 4, leaving=leaving)
    assert measured == pytest.approx(1.5 * plain, rel=1e-12)
    TABLE.append((f"lesson 15 all-to-all, ep={n}, full recompute", ep_bytes(model, plan, 4, leaving), measured))


def _capstone_4d(plan):
    from utils.mesh import parallelize3d
    r = parallelize3d.train(plan, steps=2)
    return r["comm"][("cp", "send")]["wire_bytes"], r["losses"], r["grads"]


def test_cp_in_the_capstones_mesh_equals_one_process_and_the_planners_bytes():
    """Lesson 14's last section, on 4 ranks: the capstone's Llama on (dp, pp, cp, tp) = (1, 1, 2, 2) with full
    recompute trains as one process does, and its ring sends the planner's cp bytes (the replayed forward
    included: 3 passes of every block, not 2)."""
    from utils.mesh import parallelize3d
    from utils.mesh.plan3d import mesh_plan
    plan = mesh_plan(1, 1, 2, cp=2, checkpointing="full")  # (dp, pp, cp, tp) = (1, 1, 2, 2): one plan, run and priced
    runs = utils.run_ranks(_capstone_4d, plan, world_size=4, verbose=False, timeout=180)
    ref_losses, ref_grads = parallelize3d.reference(2)
    predicted = cp_bytes(parallelize3d.SHAPE, plan, 4)
    for sent, losses, grads in runs:
        assert sent == predicted == 1.5 * cp_bytes(parallelize3d.SHAPE, dataclasses.replace(plan, checkpointing="none"), 4)
        assert losses == pytest.approx(ref_losses, abs=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-5)
    TABLE.append(("capstone (1, 1, cp=2, tp=2), full recompute", predicted, runs[0][0]))


def test_mixtral_figure_of_lesson_15():
    """Lesson 15: Mixtral 8x7B on 8-way ep sends 2 k h (n-1)/n = 14,336 values per token per layer forward, bf16,
    32 layers: 0.92 MB per token, twice that with backward. The planner's ep bytes per token it holds, the same."""
    plan = Plan(global_batch=8, dp=8, ep=8)
    est = estimate(MIXTRAL_8X7B, plan)
    tokens = plan.microbatches * plan.micro_batch * MIXTRAL_8X7B.seq_len  # this rank's tokens per step
    assert 2 * 2 * 4096 * 7 / 8 == 14336
    assert est.bytes_per_step["ep"] / tokens == 2 * 14336 * 2 * 32
    TABLE.append(("lesson 15 Mixtral, MB per token (fwd + bwd)", est.bytes_per_step["ep"] / tokens / 1e6,
                  2 * 14336 * 2 * 32 / 1e6))


def test_mixtral_shape_is_the_published_one():
    """Mixtral 8x7B: "46.7B" total parameters (Hugging Face model card), 12.9B active per token (Jiang et al. 2024,
    arXiv 2401.04088, "13B active"): both counted from the shape (transformers' MixtralConfig defaults)."""
    psi = parameter_count(MIXTRAL_8X7B)
    assert round(psi / 1e9, 1) == 46.7
    active = psi - MIXTRAL_8X7B.layers * expert_parameters(MIXTRAL_8X7B) * (1 - 2 / 8)
    assert round(active / 1e9, 1) == 12.9


def test_cp_divides_activations_and_shards_zero_over_dp_times_cp():
    """Every activation is per token, so cp splits them all (lesson 14 measures the ring's saved score blocks at
    1/n); ZeRO shards over the dp x cp ranks that hold the same weights (torchtitan's dp_shard_cp)."""
    one, two = (estimate(LLAMA2_7B, Plan(8, dp=2, cp=c, zero_stage=3)) for c in (1, 2))
    assert two.memory.activations * 2 == pytest.approx(one.memory.activations, rel=1e-12)
    states = zero_bytes_per_rank(one.psi_rank, 4, 3, *bytes_per_param("mixed", "adam"))
    assert two.memory.model_states == pytest.approx(states["total"], rel=1e-12)
    assert Plan(8, dp=2, tp=2, pp=2, cp=2).world_size == 16
    gqa = dataclasses.replace(LLAMA2_7B, kv_heads=8)  # K and V of 8 KV heads travel: 1/4 of 32 heads' bytes
    plan = Plan(8, cp=4)
    assert cp_bytes(gqa, plan, 2) * 4 == cp_bytes(LLAMA2_7B, plan, 2)
    assert cp_bytes(LLAMA2_7B, dataclasses.replace(plan, tp=2), 2) * 2 == cp_bytes(LLAMA2_7B, plan, 2)
    assert cp_bytes(LLAMA2_7B, dataclasses.replace(plan, checkpointing="full"), 2) == 1.5 * cp_bytes(LLAMA2_7B, plan, 2)


def test_ep_divides_expert_states_and_their_dp_reduction():
    """Mixtral, plain DP over 8 ranks against 8-way ep inside them: the expert weights, gradients and Adam state per
    rank divide by 8 (dense ones unchanged), and each expert lives on 1 rank of 8, so nothing reduces its gradient."""
    experts = MIXTRAL_8X7B.layers * expert_parameters(MIXTRAL_8X7B)
    dp_only, with_ep = (estimate(MIXTRAL_8X7B, Plan(8, dp=8, ep=e, zero_stage=1)) for e in (1, 8))
    assert dp_only.psi_rank - with_ep.psi_rank == experts * 7 / 8
    assert dp_only.memory.parameters - with_ep.memory.parameters == 2 * experts * 7 / 8  # bf16 weights
    f = 2 * 7 / 8 * 2  # ZeRO-1: reduce-scatter + all-gather of bf16 values over 8 ranks
    assert dp_only.bytes_per_step["dp"] == pytest.approx(f * dp_only.psi_rank, rel=1e-12)
    assert with_ep.bytes_per_step["dp"] == pytest.approx(f * (with_ep.psi_rank - experts / 8), rel=1e-12)
    assert with_ep.bytes_per_step["ep"] > 0 == dp_only.bytes_per_step["ep"]


def test_cp_and_ep_groups_cross_nodes_as_the_rank_order_says():
    """Ranks tp fastest, then cp, pp, dp: tp=8 x cp=2 crosses nodes of 8, so the ring runs at the network's speed."""
    inside = estimate(LLAMA2_7B, Plan(8, tp=4, cp=2, sequence_parallel=True))
    across = estimate(LLAMA2_7B, Plan(8, tp=8, cp=2, sequence_parallel=True))
    assert inside.times["cp"] == inside.bytes_per_step["cp"] / H100_NODE.intra_node_bandwidth
    assert across.times["cp"] == across.bytes_per_step["cp"] / H100_NODE.inter_node_bandwidth
    small = estimate(MIXTRAL_8X7B, Plan(8, dp=8, ep=8), dataclasses.replace(H100_NODE, gpus_per_node=4))
    assert small.times["ep"] == small.bytes_per_step["ep"] / H100_NODE.inter_node_bandwidth


@pytest.mark.parametrize("make, words", [
    (lambda: estimate(LLAMA2_7B, Plan(8, cp=3)), "sequence length 4096 does not split into 2 x 3 = 6 chunks"),
    (lambda: estimate(MIXTRAL_8X7B, Plan(6, dp=3, ep=3)), "8 experts do not split evenly over 3"),
    (lambda: Plan(8, dp=2, ep=4), r"ep must divide 2 and be a multiple of cp=1"),
    (lambda: Plan(8, dp=4, cp=4, ep=2), "be a multiple of cp=4"),
    (lambda: estimate(LLAMA2_7B, Plan(8, dp=2, ep=2)), "this model has none"),
    (lambda: dataclasses.replace(MIXTRAL_8X7B, top_k=9), "top_k=9 experts per token out of n_experts=8"),
    (lambda: ModelShape(2, 8, 2, 8, 8, n_experts=4), "pass biases=False"),
    (lambda: Plan(8, cp=0), "cp must be a positive int"),
    (lambda: cp_bytes(LLAMA2_7B, Plan(8, cp=2), 2, backward="flash"), "the ring backward is one of"),
])
def test_bad_cp_ep_plans_raise_with_the_numbers(make, words):
    with pytest.raises(ValueError, match=words):
        make()


def test_validation_table():
    """The rows measured above, side by side (run with -s to read them); each was asserted in its own test."""
    if not TABLE:
        pytest.skip("run with the measuring tests above")
    print(f"\n{'configuration':<46} {'planner':>14} {'measured':>14}")
    for what, planned, measured in TABLE:
        print(f"{what:<46} {planned:>14,.2f} {measured:>14,.2f}")


def test_tp_and_pp_move_the_tokens_of_a_cp_chunk():
    """A cp rank holds s/cp tokens: its tp collectives and pipeline sends carry s/cp rows, per micro-batch."""
    one, two = (estimate(LLAMA2_7B, Plan(8, tp=2, pp=2, cp=c)) for c in (1, 2))  # SP adds per-step norm terms
    assert two.bytes_per_step["tp"] * 2 == one.bytes_per_step["tp"]
    assert two.bytes_per_step["pp"] * 2 == one.bytes_per_step["pp"]


def test_the_widget_has_cp_and_ep():
    from utils.widgets.planner import PlannerWidget

    w = PlannerWidget()
    w.model.value, w.dp.value = "Mixtral 8x7B", 8
    w.ep.value = 8
    assert w.result.bytes_per_step["ep"] > 0 and "sent per step, ep" in w.table.value
    w.cp.value = 16  # ep=8 is not a multiple of cp=16: said in words
    assert isinstance(w.result, ValueError) and "multiple of cp=16" in w.table.value


def test_best_plans_search_cp_and_ep_when_asked():
    """By default the search keeps cp = ep = 1 (its old results); asked, it tries them, and a plan it returns with
    ep > 1 is priced by ``estimate`` as any other (fastest first)."""
    plain = best_plans(MIXTRAL_8X7B, H100_NODE, 64, 256, top=50)
    assert plain and all(p.cp == p.ep == 1 for _, p in plain)
    wide = best_plans(MIXTRAL_8X7B, H100_NODE, 64, 256, top=200, cp_degrees=(1, 2), ep_degrees=(1, 2, 4, 8))
    assert any(p.ep > 1 for _, p in wide) and any(p.cp > 1 for _, p in wide)
    assert [e.step_time for e, _ in wide] == sorted(e.step_time for e, _ in wide)
    assert wide[0][0].step_time <= plain[0][0].step_time  # a larger search finds no slower best
    assert all(e.step_time == estimate(MIXTRAL_8X7B, p).step_time for e, p in wide[:5])
