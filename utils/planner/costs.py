"""The planner's formulas, one short function a term, each with its source: parameters, activations, bytes on
each mesh dimension, FLOPs (``utils.planner``, notebook 09)."""

from __future__ import annotations

from ..pipeline import one_f_one_b_order, peak_in_flight
from .shapes import ModelShape, Plan


def layer_parameters(model: ModelShape, tp: int = 1, ep: int = 1) -> int:
    """Parameters of one transformer layer held by one of ``tp`` tensor-parallel ranks: weight matrices and the
    column-parallel biases are split, norms and the row-parallel output biases are replicated (Megatron-LM).
    GPT (ffn = 4h, biases, LayerNorm): 12h^2 + 13h at tp=1, Narayanan et al. 2021, Eq. (2). An MoE layer: its
    router (h x E) replicated, its experts split over tp and ``ep`` ranks (``expert_parameters``)."""
    h, f, kv = model.hidden, model.ffn_hidden, model.kv_heads * (model.hidden // model.heads)
    split_bias = (h + 2 * kv + (2 if model.gated_mlp else 1) * f) if model.biases else 0
    kept_bias = 2 * h if model.biases else 0
    norms = 2 * (2 * h if model.norm == "layernorm" else h)
    dense = layer_matrices(model) - expert_parameters(model) - h * model.n_experts
    return (dense + split_bias) // tp + kept_bias + norms + h * model.n_experts + expert_parameters(model, tp, ep)


def expert_parameters(model: ModelShape, tp: int = 1, ep: int = 1) -> int:
    """One layer's expert weights on one rank: E MLPs of ``expert_ffn``, split over tp (etp = tp) and ep; 0 dense."""
    return model.n_experts * (3 if model.gated_mlp else 2) * model.hidden * model.expert_ffn // (tp * ep)


def layer_matrices(model: ModelShape, active: bool = False) -> int:
    """Weights of one layer's matrix multiplications: q and o h x h, k and v h x (kv_heads * head_dim), the MLP's
    two (three when gated) h x ffn matrices, or an MoE layer's router and experts (``active``: the top_k experts a
    token runs, for FLOPs). The FLOPs of a layer are 2 per weight per token, forward."""
    h, kv = model.hidden, model.kv_heads * (model.hidden // model.heads)
    if not model.n_experts:
        return 2 * h * h + 2 * h * kv + (3 if model.gated_mlp else 2) * h * model.ffn_hidden
    experts = expert_parameters(model) * (model.top_k / model.n_experts if active else 1)
    return 2 * h * h + 2 * h * kv + h * model.n_experts + int(experts)


def embedding_parameters(model: ModelShape, tp: int = 1) -> dict:
    """Parameters outside the layers: the input embedding (vocab-parallel: split by tp, a vocabulary that tp does
    not divide padded up, as Megatron-LM does), learned positions, final norm, and the head when it is untied."""
    h, rows = model.hidden, -(-model.vocab // tp)
    return {"embedding": rows * h, "positions": model.seq_len * h if model.positions == "learned" else 0,
            "final_norm": 2 * h if model.norm == "layernorm" else h,
            "head": 0 if model.tied_embeddings else rows * h}


def parameter_count(model: ModelShape) -> int:
    """Psi, exact from the shape: GPT-2 small 124,439,808; Llama-2-7B 6,738,415,616."""
    return model.layers * layer_parameters(model) + sum(embedding_parameters(model).values())


def stage_parameters(model: ModelShape, plan: Plan, stage: int) -> int:
    """Parameters one rank of pipeline ``stage`` holds: its L/pp layers (split by tp), the embedding on the first
    stage, final norm and head on the last (with tied embeddings and pp > 1 the last stage keeps its own copy of
    the embedding as the head, as Megatron-LM does, and their gradients are all-reduced)."""
    emb = embedding_parameters(model, plan.tp)
    total = model.layers // plan.pp * layer_parameters(model, plan.tp, plan.ep)
    if stage == 0:
        total += emb["embedding"] + emb["positions"]
    if stage == plan.pp - 1:
        total += emb["final_norm"] + (emb["head"] or (emb["embedding"] if plan.pp > 1 else 0))
    return total


# ---------------------------------------------------------------- activations (bytes)

def layer_activation_bytes(model: ModelShape, micro_batch: int, tp: int = 1, sequence_parallel: bool = False,
                           checkpointing: str = "none", element_bytes: int = 2) -> float:
    """Bytes one layer keeps for its backward, for one micro-batch, on one tp rank. Korthikanti et al. 2022,
    "Reducing Activation Recomputation in Large Transformer Models", Table 2 (16-bit, ffn = 4h, dropout):
    sbh(34 + 5as/h) without parallelism; sbh(10 + 24/t + 5as/(ht)) with tp; sbh/t (34 + 5as/h) with sequence
    parallelism; the 5as/h score term gone with selective recompute; 2sbh (the layer's input) with full recompute.
    Written term by term so that GQA, a gated MLP, no dropout and fp32 (``element_bytes=4``) follow the same count.
    Two corrections measured in lesson 09c on the capstone's Hugging Face Llama (exact, fp32): with
    ``attention="flash"`` the scores are never kept, the kernel keeps 4 a s b bytes of log-sum-exp instead (and
    selective recompute has nothing left to drop); with ``fused_kernels=False`` each RMSNorm keeps its normalized
    copy (e sbh) and 1/rms (4 sb), and the SwiGLU its silu(gate) (e sbf): 4 + 2/h more e sbh in fp32 for a
    Llama layer of f = 2h."""
    s, b, h, a, e = model.seq_len, micro_batch, model.hidden, model.heads, element_bytes
    sbh, kv, mask = s * b * h, model.kv_heads / model.heads, int(model.dropout)
    f = (model.top_k * model.expert_ffn if model.n_experts else model.ffn_hidden) / h  # MoE: k experts' MLPs a token
    if checkpointing == "full":
        return e * sbh / (tp if sequence_parallel else 1)
    eager = not model.fused_kernels
    norms = 2 * (e + 4 / h) if eager and model.norm == "rmsnorm" else 0  # normalized copy + 1/rms, two norms
    replicated = 4 * e + 2 * mask + norms  # two norm inputs, QKV input, MLP input (e each) + two dropout masks: 10 sbh
    mlp = (4 if eager else 3) if model.gated_mlp else 2  # gate, up, (silu(gate)), down input; GeLU: input, down input
    split = e * (2 + 2 * kv) + mlp * e * f  # Q, K, V, proj input; MLP: 24 sbh
    if model.attention == "flash":
        scores = 4 * a / h  # the kernel's log-sum-exp, fp32: 4 a s b bytes, whatever the recompute
    else:
        scores = 0 if checkpointing == "selective" else (2 * e + mask if model.dropout else e) * a * s / h  # 5as/h
    return sbh * ((replicated + split + scores) / tp if sequence_parallel else replicated + (split + scores) / tp)


def in_flight(plan: Plan, stage: int = 0) -> float:
    """Micro-batches of a whole stage whose activations stage ``stage`` holds at its peak: GPipe m; 1F1B
    min(m, pp - stage) (counted from ``utils.pipeline``'s schedule); interleaved 1F1B on the first stage
    1 + (p - 1)/(p v) stages' worth per micro-batch group, i.e. min(vm, 2(p-1) + (v-1)p + 1) chunks of 1/v stage
    (Korthikanti et al. 2022, Sec. 4.2.3; Narayanan et al. 2021, Sec. 2.2.2)."""
    m, p, v = plan.microbatches, plan.pp, plan.v
    if plan.schedule == "GPipe":
        return m
    if v == 1:
        return peak_in_flight(one_f_one_b_order(stage, p, m))
    return min(v * m, 2 * (p - 1 - stage) + (v - 1) * p + 1) / v


def logits_bytes(model: ModelShape, plan: Plan) -> float:
    """The last stage's logits for the loss, fp32: 4 s b V / tp bytes (Korthikanti et al. 2022, Sec. 4.3)."""
    return 4 * model.seq_len * plan.micro_batch * model.vocab / plan.tp


# ---------------------------------------------------------------- bytes on the wire per step, per rank

def dp_bytes(psi: float, n: int, stage: int, element_bytes: int, microbatches: int = 1, pipelined: bool = False) -> float:
    """Bytes one data-parallel rank sends per step (ZeRO paper, Sec. 7): stages 0-2 move 2 Psi (n-1)/n values (one
    all-reduce, or a reduce-scatter of gradients plus an all-gather of parameters); stage 3 moves 3 Psi (n-1)/n per
    micro-batch (parameters all-gathered for the forward and again for the backward, gradients reduce-scattered).
    ``pipelined``: stage 3 inside a pipeline as torch.distributed.pipelining runs FSDP2 (lesson 09): the weights stay
    gathered from the first forward to the last backward and the gradients are reduce-scattered once, 2 Psi (n-1)/n
    per step whatever the number of micro-batches (measured in lesson 09)."""
    values = 2 * psi if stage < 3 or pipelined else 3 * psi * microbatches
    return values * (n - 1) / n * element_bytes


def tp_bytes(model: ModelShape, plan: Plan, element_bytes: int) -> float:
    """Bytes one tensor-parallel rank sends per step (s: the s/cp tokens of its cp chunk): per layer and micro-batch,
    2 all-reduces of s b h in the forward and 2 in the backward (Shoeybi et al. 2019, the f and g operators),
    8 s b h (t-1)/t values; with sequence parallelism each all-reduce is an all-gather + reduce-scatter, same bytes.
    Full recompute replays the layer's forward in backward, but torch's non-reentrant checkpoint stops the replay
    once it has rebuilt the last tensor backward needs, before the MLP's closing collective (it only feeds the
    residual sum): with sequence parallelism 2 all-gathers + 1 reduce-scatter more, 3 s b h (t-1)/t values
    (measured in lesson 09), without it the attention's all-reduce alone, 2 s b h (t-1)/t."""
    t = plan.tp
    replay = (3 if plan.sequence_parallel else 2) if plan.checkpointing == "full" else 0
    per_layer = (8 + replay) * model.seq_len // plan.cp * plan.micro_batch * model.hidden  # a cp rank: s/cp tokens
    return per_layer * (t - 1) / t * element_bytes * model.layers / plan.pp * plan.microbatches


def tp_end_bytes(model: ModelShape, plan: Plan, stage: int, element_bytes: int) -> float:
    """The tp collectives outside the layers, for pipeline stage ``stage``, per step (measured in lesson 09).
    Per micro-batch: the vocab-parallel embedding's output is summed over tp (first stage: an all-reduce, or with
    sequence parallelism a reduce-scatter forward + all-gather backward, 2 s b h (t-1)/t values either way); the
    head's input is gathered (last stage: identity/all-reduce, or all-gather + reduce-scatter, 2 s b h (t-1)/t);
    without ``loss_parallel`` the logits are all-gathered, s b V (t-1)/t. Per step, with sequence parallelism: each
    norm weight is replicated over tp and its gradient all-reduced, 2 h (t-1)/t (2 norms a layer, the final one)."""
    t = plan.tp
    if t == 1:
        return 0.0
    f, sb = (t - 1) / t, model.seq_len // plan.cp * plan.micro_batch
    first, last = stage == 0, stage == plan.pp - 1
    per_micro = 2 * sb * model.hidden * (first + last) + (0 if plan.loss_parallel else sb * model.vocab) * last
    norms = (2 * model.layers // plan.pp + last) * (2 if model.norm == "layernorm" else 1) * model.hidden
    per_step = 2 * norms if plan.sequence_parallel else 0
    return (per_micro * plan.microbatches + per_step) * f * element_bytes


def tied_bytes(model: ModelShape, plan: Plan, element_bytes: int) -> float:
    """Tied embeddings with pp > 1: the first stage's embedding and the last stage's head are one matrix, their
    gradients all-reduced over the pair once per step (Megatron-LM's embedding group; lesson 06): 2 (2-1)/2 = 1 x
    the gradient this rank holds (split by tp, and by dp from ZeRO-2 on)."""
    if not model.tied_embeddings or plan.pp == 1:
        return 0.0
    held = embedding_parameters(model, plan.tp)["embedding"] / (plan.dp * plan.cp if plan.zero_stage >= 2 else 1)
    return held * element_bytes


def pp_bytes(model: ModelShape, plan: Plan, element_bytes: int) -> float:
    """Bytes the busiest pipeline rank sends per step: s b h activations (s/cp with cp) forward at each chunk
    boundary it owns and their gradients backward, per micro-batch; with sequence parallelism each tp rank sends its
    1/tp slice."""
    p, v = plan.pp, plan.v
    sends = max(sum((k < p * v - 1) + (k > 0) for k in range(r, p * v, p)) for r in range(p)) if p > 1 else 0
    per_send = (model.seq_len // plan.cp * plan.micro_batch * model.hidden * element_bytes
                / (plan.tp if plan.sequence_parallel else 1))
    return sends * per_send * plan.microbatches


# ---------------------------------------------------------------- FLOPs and time

def flops_per_token(model: ModelShape, checkpointing: str = "none") -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) per token of a training step; times the tokens of a step, the FLOPs of that
    step (lessons 08 and 09 take theirs from here). Model: 6 x (matrix parameters, the head included, the
    embedding lookup not) + 12 L h s for attention, the scores QK^T and their weighted sum of the values, 2 s h
    each per layer forward: PaLM's count (Chowdhery et al. 2022, appendix B, 6N + 12 L H Q T; Kaplan et al. 2020,
    Table 1, row "Attention: Mask", count one of the two matmuls' worth, half of it), i.e. Korthikanti et al. 2022's
    72 B s L h^2 (1 + s/6h + V/12hL) per step for GPT. Hardware adds what recompute runs again: the layers'
    forward with full recompute (Narayanan et al. 2021, Eq. (3): 96 B s l h^2 (1 + s/6h + V/16lh)), the
    attention-score forward 4 L h s with selective recompute. Full recompute, measured in lesson 09c: torch's
    non-reentrant checkpoint stops the replay once it has rebuilt what backward needs, before a dense layer's
    last matmul (the MLP's down projection only feeds the residual sum), so it replays the forward less 2 L h f."""
    L, h, s = model.layers, model.hidden, model.seq_len
    forward = 2 * L * layer_matrices(model, active=True) + 4 * L * h * s
    model_flops = 3 * forward + 6 * model.vocab * h
    early_stop = 0 if model.n_experts else 2 * L * h * model.ffn_hidden  # MoE: the router's sum needs the outputs
    extra = {"none": 0, "selective": 4 * L * h * s, "full": forward - early_stop}[checkpointing]
    return model_flops, model_flops + extra
