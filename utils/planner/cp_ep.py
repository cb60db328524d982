"""The planner's two newer dimensions (issue 27): bytes on the wire per step and per rank for context parallelism
(``cp_bytes``, the ring of lesson 14) and expert parallelism (``ep_bytes``, the all-to-alls of lesson 15), and the
spans of their groups in the rank order (``utils.planner``, notebook 09b).

Each formula is the one its lesson measured with ``utils.comm.ledger`` (tests/test_planner_cp_ep.py measures it
again on CPU ranks): a cp rank sends the K and V of its own chunk (cp - 1) times per layer forward and their
gradients as often backward (the course's autograd ring; ``backward="fused"`` counts a fused ring backward such as
torch's, which passes K and V again and rotates dK, dV cp times); an ep rank sends 2 k h values per token it holds
times the share of routes that leave it ((ep - 1)/ep for a uniform router) forward, the same backward. Full
recompute replays the forward, so one forward's bytes again: measured for cp on the capstone's 4-D mesh (lesson
14, section 6) and for ep around lesson 15's layer (tests/test_planner_cp_ep.py).
"""

from __future__ import annotations

from ..experts.dispatch import wire_values_per_token
from .shapes import ModelShape, Plan


def _replays(plan: Plan) -> int:
    return 3 if plan.checkpointing == "full" else 2  # forward + backward, + the replayed forward


CP_BACKWARDS = ("autograd", "fused")


def cp_bytes(model: ModelShape, plan: Plan, element_bytes: int, backward: str = "autograd",
             grad_bytes: int = 4) -> float:
    """Bytes one cp rank sends per step. Per layer and micro-batch a block is its chunk's K and V,
    2 b (s/cp) kv_heads d / tp values (a tp rank holds kv_heads/tp heads); the forward passes it (cp - 1) times.
    That is a ring that passes the K/V heads as the model has them. The course's ring (``utils/mesh/context4d.py``)
    expands K and V to all heads (``repeat_interleave``) before passing them, so it sends heads, not kv_heads, per
    block: heads/kv_heads times this count under grouped-query attention. The capstone has kv_heads == heads, so
    there the two agree (lesson 14, section 6, measures it).

    ``backward`` says which ring backward is counted:

    - ``"autograd"`` (default): the course's ring (lesson 14), whose ``RingPass`` backward sends each received
      block's gradient back once: (cp - 1) blocks of dK, dV, at ``element_bytes`` (measured: ``(n-1) x 2 b h (s/n)
      d`` float32 values each way);
    - ``"fused"``: a ring backward that recomputes the scores, as torch's ``_templated_ring_attention_backward``:
      it passes K and V around again, (cp - 1) blocks, and rotates the accumulated dK, dV at every one of its cp
      steps, the last bringing them home: cp blocks, at ``grad_bytes`` (torch accumulates them in float32 while
      ``_cp_options.convert_to_f32``, its default, is on).

    Full recompute replays the forward: (cp - 1) more blocks of K and V."""
    if backward not in CP_BACKWARDS:
        raise ValueError(f"backward={backward!r}: the ring backward is one of {CP_BACKWARDS} (our autograd ring, or "
                         "a fused one that passes K, V and dK, dV).")
    c = plan.cp
    if c == 1:
        return 0.0
    head_dim = model.hidden // model.heads
    block = 2 * plan.micro_batch * (model.seq_len // c) * model.kv_heads * head_dim / plan.tp  # values
    if backward == "autograd":
        per_layer = _replays(plan) * (c - 1) * block * element_bytes
    else:  # forward(s) and the backward's K, V: (replays - 1) + 1 passes; dK, dV: c rotations
        per_layer = _replays(plan) * (c - 1) * block * element_bytes + c * block * grad_bytes
    return per_layer * model.layers / plan.pp * plan.microbatches


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
