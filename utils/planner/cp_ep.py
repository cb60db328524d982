"""The planner's two newer dimensions (issue 27): bytes on the wire per step and per rank for context parallelism
(``cp_bytes``, the ring of lesson 14) and expert parallelism (``ep_bytes``, the all-to-alls of lesson 15), and the
spans of their groups in the rank order (``utils.planner``, notebook 09b).

Each formula is the one its lesson measured with ``utils.comm.ledger`` (tests/test_planner_cp_ep.py measures it
again on CPU ranks): a cp rank sends the K and V of its own chunk (cp - 1) times per layer forward and their
gradients as often backward; an ep rank sends 2 k h values per token it holds times the share of routes that leave
it ((ep - 1)/ep for a uniform router) forward, the same backward. Full recompute replays the forward, so one
forward's bytes again: measured for cp on the capstone's 4-D mesh (lesson 14, section 6) and for ep around lesson
15's layer (tests/test_planner_cp_ep.py).
"""

from __future__ import annotations

from ..experts.dispatch import wire_values_per_token
from .shapes import ModelShape, Plan


def _replays(plan: Plan) -> int:
    return 3 if plan.checkpointing == "full" else 2  # forward + backward, + the replayed forward


def cp_bytes(model: ModelShape, plan: Plan, element_bytes: int) -> float:
    """Bytes one cp rank sends per step: per layer and micro-batch, (cp - 1) passes of its chunk's K and V,
    2 b (s/cp) kv_heads d / tp values (a tp rank holds kv_heads/tp heads), forward, and the same of their gradients
    backward (lesson 14: ``(n-1) x 2 b h (s/n) d`` bytes of float32 each way, measured)."""
    c = plan.cp
    if c == 1:
        return 0.0
    head_dim = model.hidden // model.heads
    block = 2 * plan.micro_batch * (model.seq_len // c) * model.kv_heads * head_dim / plan.tp
    return _replays(plan) * (c - 1) * block * element_bytes * model.layers / plan.pp * plan.microbatches


def ep_tokens(model: ModelShape, plan: Plan) -> float:
    """Tokens whose routes one ep rank dispatches per micro-batch: its b s/cp, or its 1/tp share of them with
    sequence parallelism (without it every tp rank holds, and dispatches, them all)."""
    return plan.micro_batch * model.seq_len / plan.cp / (plan.tp if plan.sequence_parallel else 1)


def ep_bytes(model: ModelShape, plan: Plan, element_bytes: int, leaving: float | None = None) -> float:
    """Bytes one ep rank sends per step: per MoE layer and micro-batch, ``wire_values_per_token(k, h, leaving)``
    = 2 k h x leaving values per token forward (dispatch + combine), the same backward (lesson 15, measured).
    ``leaving``: the share of routes whose expert is on another rank, (ep - 1)/ep for a uniform router (the
    default); a measured router's share gives the measured bytes."""
    if plan.ep == 1 or not model.n_experts:
        return 0.0
    share = (plan.ep - 1) / plan.ep if leaving is None else leaving
    per_token = wire_values_per_token(model.top_k, model.hidden, share)
    per_layer = per_token * ep_tokens(model, plan) * element_bytes
    return _replays(plan) * per_layer * model.layers / plan.pp * plan.microbatches


def spans(plan: Plan) -> dict:
    """How many consecutive ranks each group spans, ranks numbered tp fastest, then cp, then pp, then dp (Llama 3's
    [TP, CP, PP, DP]); an ep group is all of cp and ep/cp of the dp ranks (torchtitan), so it spans pp too."""
    tcp = plan.tp * plan.cp
    return {"tp": plan.tp, "cp": tcp, "pp": tcp * plan.pp, "dp": plan.world_size, "tied": tcp * plan.pp,
            "ep": tcp * (plan.pp * plan.ep // plan.cp if plan.ep > plan.cp else 1)}
