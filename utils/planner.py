"""A parallelism planner: for a transformer, a mesh and a cluster, what does each rank hold, send and wait for?

Issue 15; the capstone lesson calls it beside the course's measured runs. Pure functions on three small
dataclasses, every formula a short named function with its source:

- ``ModelShape`` (the transformer), ``Plan`` (mesh dp x tp x pp with v virtual stages, batch, precision,
  ZeRO stage, activation checkpointing), ``Cluster`` (GPUs per node, memory, bandwidths, peak FLOP/s);
- ``estimate(model, plan, cluster)`` -> ``Estimate``: Psi, memory per rank term by term
  (``.memory.parameters`` ...), ``.bytes_per_step["dp" | "tp" | "pp"]``, ``.bubble``, ``.times``,
  ``.step_time``, ``.mfu``, and ``.fits`` with ``.reason`` when it does not;
- ``best_plans(model, cluster, n_gpus, global_batch)``: every mesh, ZeRO stage and checkpointing, fastest first.

Notation: Psi is a *count* of parameters; bytes carry their factor (fp32 weights 4 Psi bytes, mixed-precision
Adam model states 16 Psi = 2 Psi + 2 Psi + 12 Psi bytes, ZeRO paper). Per-rank bytes on the wire follow the ring
convention of ``utils.ledger.CommLedger`` (all-reduce 2(n-1)/n of its payload, all-gather and reduce-scatter
(n-1)/n, send 1x), so a measured ledger and the planner can be put side by side. Ranks are numbered tp fastest,
then pp, then dp (the order [TP, CP, PP, DP] of the Llama 3 paper, Grattafiori et al. 2024, Figure 5): a group
stays inside a node when the product of its own and the faster dimensions fits in one node.

Validated term by term against measured runs of lesson 09 (FSDP2 x TP/SP x pipelining of a tiny Llama), which
added three named terms: the tp collectives at the ends of the model (``tp_end_bytes``), the tied embedding's
gradient all-reduce between first and last stage (``bytes_per_step["tied"]``), and ZeRO-3 inside a pipeline
keeping the weights gathered over the micro-batches (``dp_bytes(pipelined=True)``, ``Memory.gathered``).
What is left out, on purpose: the loss's own small reductions under vocab-parallel cross-entropy, Adam's step
counters (a few bytes per parameter tensor), attention with a KV cache, context parallelism, offload, overlap of communication with compute (every byte here waits), and the
allocator's caches and fragmentation (a real peak is higher).
"""

from __future__ import annotations

import dataclasses
import math

from .memory import bytes_per_param, zero_bytes_per_rank
from .pipeline import bubble_fraction, one_f_one_b_order, peak_in_flight

GB = 1e9
PRECISIONS = {"fp32": 4, "bf16": 2}  # bytes per activation / parameter element
CHECKPOINTING = ("none", "selective", "full")


def _positive(**values):
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}.")


def _divides(what, size, by, fix):
    if size % by:
        raise ValueError(f"{what} {size} is not divisible by {by}; {fix}.")


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer. GPT style by default (LayerNorm with biases, GeLU MLP of 4h, learned
    positions, tied embeddings, dropout); Llama style with ``gated_mlp=True, norm="rmsnorm", biases=False,
    positions="rope", tied_embeddings=False, dropout=False``."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    ffn_hidden: int | None = None  # default 4 * hidden
    kv_heads: int | None = None  # default heads (multi-head); fewer: grouped-query attention
    tied_embeddings: bool = True
    gated_mlp: bool = False  # SwiGLU: three ffn matrices instead of two
    norm: str = "layernorm"  # or "rmsnorm" (a weight, no bias)
    biases: bool = True  # biases on the linear layers
    positions: str = "learned"  # or "rope" (no parameters)
    dropout: bool = True  # dropout masks are activations too (1 byte per element)

    def __post_init__(self):
        _positive(layers=self.layers, hidden=self.hidden, heads=self.heads, vocab=self.vocab, seq_len=self.seq_len)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        _positive(ffn_hidden=self.ffn_hidden, kv_heads=self.kv_heads)
        _divides("hidden size", self.hidden, self.heads, f"pick a hidden size that is a multiple of heads={self.heads}")
        _divides("number of heads", self.heads, self.kv_heads, f"kv_heads={self.kv_heads} must divide heads")
        if self.norm not in ("layernorm", "rmsnorm") or self.positions not in ("learned", "rope"):
            raise ValueError(f"norm must be 'layernorm' or 'rmsnorm' (got {self.norm!r}); positions 'learned' or "
                             f"'rope' (got {self.positions!r}).")


@dataclasses.dataclass(frozen=True)
class Cluster:
    """GPUs: memory in bytes, bandwidths in bytes/s per GPU and direction, peak in FLOP/s, ``efficiency`` the
    share of peak that matrix multiplications reach (an assumption to state, not a measurement)."""

    gpus_per_node: int = 8
    memory_bytes: float = 80e9
    intra_node_bandwidth: float = 450e9
    inter_node_bandwidth: float = 50e9
    peak_flops: float = 989e12
    efficiency: float = 0.5

    def __post_init__(self):
        _positive(gpus_per_node=self.gpus_per_node)
        if min(self.memory_bytes, self.intra_node_bandwidth, self.inter_node_bandwidth, self.peak_flops) <= 0:
            raise ValueError(f"memory, bandwidths and peak must be > 0, got {self}.")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency {self.efficiency} is a share of peak: use a number in (0, 1], e.g. 0.5.")


#: 8-GPU H100 SXM nodes: 80 GB, NVLink ~450 GB/s per direction, one 400 Gb/s InfiniBand NIC per GPU (~50 GB/s),
#: 989 TFLOP/s dense bf16 (fp32 matmuls run on TF32 tensor cores at half that).
H100_NODE = Cluster()


@dataclasses.dataclass(frozen=True)
class Plan:
    """The mesh (dp x tp x pp ranks, v model chunks per pipeline rank), batches in sequences, and options.
    ``zero_stage`` shards over the dp dimension (FSDP = stage 3); ``schedule`` is "1F1B" or "GPipe"."""

    global_batch: int
    micro_batch: int = 1
    dp: int = 1
    tp: int = 1
    pp: int = 1
    v: int = 1
    zero_stage: int = 0
    precision: str = "bf16"  # "bf16": mixed precision, fp32 master weights; "fp32": everything fp32
    checkpointing: str = "none"  # "selective" (Korthikanti et al. 2022) or "full" (keep each layer's input)
    sequence_parallel: bool = False  # Megatron SP: the tp group also splits norms and dropouts by sequence
    schedule: str = "1F1B"
    loss_parallel: bool = True  # vocab-parallel cross-entropy (Megatron); False: the logits are all-gathered over tp

    def __post_init__(self):
        _positive(global_batch=self.global_batch, micro_batch=self.micro_batch, dp=self.dp, tp=self.tp,
                  pp=self.pp, v=self.v)
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0 (plain DP), 1, 2 or 3 (FSDP), not {self.zero_stage!r}.")
        if self.precision not in PRECISIONS or self.checkpointing not in CHECKPOINTING:
            raise ValueError(f"precision must be one of {list(PRECISIONS)} (got {self.precision!r}); checkpointing "
                             f"one of {list(CHECKPOINTING)} (got {self.checkpointing!r}).")
        if self.schedule not in ("1F1B", "GPipe") or (self.v > 1 and self.schedule != "1F1B"):
            raise ValueError(f"schedule {self.schedule!r} with v={self.v}: use '1F1B' (interleaved when v > 1) "
                             "or 'GPipe' with v=1.")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel splits activations over the tp group: it needs tp > 1, got tp=1.")
        _divides("global batch", self.global_batch, self.dp * self.micro_batch,
                 f"it must split into dp={self.dp} replicas of micro-batches of {self.micro_batch}: use a multiple "
                 f"of {self.dp * self.micro_batch}")
        if self.v > 1 and self.microbatches % self.pp:
            raise ValueError(f"interleaved 1F1B runs micro-batches in groups of pp={self.pp}; "
                             f"{self.microbatches} micro-batches per replica is not a multiple: change the batch.")

    @property
    def world_size(self):
        return self.dp * self.tp * self.pp

    @property
    def microbatches(self):
        """m: micro-batches each pipeline (each dp replica) runs per step."""
        return self.global_batch // (self.dp * self.micro_batch)


def check_plan(model: ModelShape, plan: Plan):
    """The divisibility rules that tie a plan to a model; raises ``ValueError`` naming the numbers."""
    for what, size in (("number of heads", model.heads), ("number of KV heads", model.kv_heads),
                       ("MLP inner size", model.ffn_hidden)):
        _divides(what, size, plan.tp, f"tensor parallelism cuts it into tp={plan.tp} equal pieces: use a tp "
                                      f"that divides {size}")
    _divides("number of layers", model.layers, plan.pp * plan.v,
             f"each of pp*v={plan.pp}*{plan.v} model chunks needs the same number of layers")
    return plan


# ---------------------------------------------------------------- parameters (Psi, a count)

def layer_parameters(model: ModelShape, tp: int = 1) -> int:
    """Parameters of one transformer layer held by one of ``tp`` tensor-parallel ranks: weight matrices and the
    column-parallel biases are split, norms and the row-parallel output biases are replicated (Megatron-LM).
    GPT (ffn = 4h, biases, LayerNorm): 12h^2 + 13h at tp=1, Narayanan et al. 2021, Eq. (2)."""
    h, f, kv = model.hidden, model.ffn_hidden, model.kv_heads * (model.hidden // model.heads)
    split_bias = (h + 2 * kv + (2 if model.gated_mlp else 1) * f) if model.biases else 0
    kept_bias = 2 * h if model.biases else 0
    norms = 2 * (2 * h if model.norm == "layernorm" else h)
    return (layer_matrices(model) + split_bias) // tp + kept_bias + norms


def layer_matrices(model: ModelShape) -> int:
    """Weights of one layer's matrix multiplications: q and o h x h, k and v h x (kv_heads * head_dim), the MLP's
    two (three when gated) h x ffn matrices. The FLOPs of a layer are 2 per weight per token, forward."""
    h, kv = model.hidden, model.kv_heads * (model.hidden // model.heads)
    return 2 * h * h + 2 * h * kv + (3 if model.gated_mlp else 2) * h * model.ffn_hidden


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
    total = model.layers // plan.pp * layer_parameters(model, plan.tp)
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
    Written term by term so that GQA, a gated MLP, no dropout and fp32 (``element_bytes=4``) follow the same count."""
    s, b, h, a, e = model.seq_len, micro_batch, model.hidden, model.heads, element_bytes
    sbh, kv, f, mask = s * b * h, model.kv_heads / model.heads, model.ffn_hidden / model.hidden, int(model.dropout)
    if checkpointing == "full":
        return e * sbh / (tp if sequence_parallel else 1)
    replicated = 4 * e + 2 * mask  # two norm inputs, QKV input, MLP input (e each) + two dropout masks: 10 sbh
    split = e * (2 + 2 * kv) + (3 if model.gated_mlp else 2) * e * f  # Q, K, V, proj input; MLP: 24 sbh
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
    """Bytes one tensor-parallel rank sends per step: per layer and micro-batch, 2 all-reduces of s b h in the
    forward and 2 in the backward (Shoeybi et al. 2019, the f and g operators), 2 more when full recompute runs
    the forward again; with sequence parallelism each all-reduce is an all-gather + reduce-scatter, same bytes."""
    t = plan.tp
    per_layer = (6 if plan.checkpointing == "full" else 4) * model.seq_len * plan.micro_batch * model.hidden
    return per_layer * 2 * (t - 1) / t * element_bytes * model.layers / plan.pp * plan.microbatches


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
    f, sb = (t - 1) / t, model.seq_len * plan.micro_batch
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
    held = embedding_parameters(model, plan.tp)["embedding"] / (plan.dp if plan.zero_stage >= 2 else 1)
    return held * element_bytes


def pp_bytes(model: ModelShape, plan: Plan, element_bytes: int) -> float:
    """Bytes the busiest pipeline rank sends per step: s b h activations forward at each chunk boundary it owns and
    their gradients backward, per micro-batch; with sequence parallelism each tp rank sends its 1/tp slice."""
    p, v = plan.pp, plan.v
    sends = max(sum((k < p * v - 1) + (k > 0) for k in range(r, p * v, p)) for r in range(p)) if p > 1 else 0
    per_send = model.seq_len * plan.micro_batch * model.hidden * element_bytes / (plan.tp if plan.sequence_parallel else 1)
    return sends * per_send * plan.microbatches


# ---------------------------------------------------------------- FLOPs and time

def flops_per_token(model: ModelShape, checkpointing: str = "none") -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) per token of a training step. Model: 6 x (matrix parameters, the head
    included, the embedding lookup not) + 12 L h s for attention scores, i.e. Korthikanti et al. 2022's
    72 B s L h^2 (1 + s/6h + V/12hL) per step for GPT. Hardware adds what recompute runs again: the layers'
    forward with full recompute (Narayanan et al. 2021, Eq. (3): 96 B s l h^2 (1 + s/6h + V/16lh)), the
    attention-score forward 4 L h s with selective recompute."""
    L, h, s = model.layers, model.hidden, model.seq_len
    forward = 2 * L * layer_matrices(model) + 4 * L * h * s
    model_flops = 3 * forward + 6 * model.vocab * h
    extra = {"none": 0, "selective": 4 * L * h * s, "full": forward}[checkpointing]
    return model_flops, model_flops + extra


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes one rank holds at its peak, term by term."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    gathered: float = 0.0  # ZeRO-3 in a pipeline: the stage's unsharded weights, kept from forward to backward

    @property
    def total(self):
        return self.parameters + self.gradients + self.optimizer + self.activations + self.gathered

    @property
    def model_states(self):
        """Parameters, gradients and optimizer state: what a rank holds between steps (its shards)."""
        return self.parameters + self.gradients + self.optimizer


@dataclasses.dataclass(frozen=True)
class Estimate:
    psi: int  # parameters of the model (a count)
    psi_rank: int  # parameters of the busiest pipeline stage on one tp rank, before ZeRO shards them
    memory: Memory  # the pipeline stage with the largest total (the first, or the last with its logits)
    bytes_per_step: dict  # {"dp", "tp", "pp"}: bytes one rank sends per step
    bubble: float  # (p - 1) / (v m + p - 1)
    flops_per_step: float  # model FLOPs of the whole step, all ranks (MFU counts these)
    times: dict  # seconds: {"compute", "dp", "tp", "pp"}
    step_time: float
    mfu: float
    fits: bool
    reason: str  # "" when it fits


def link_bandwidth(cluster: Cluster, span: int) -> float:
    """A group whose ranks lie ``span`` consecutive ranks apart or less talks over NVLink when that span fits in
    a node, otherwise at the inter-node bandwidth of each GPU (the slowest link of a ring sets its pace)."""
    return cluster.intra_node_bandwidth if span <= cluster.gpus_per_node else cluster.inter_node_bandwidth


def _stage_memory(model, plan, stage, e):
    psi = stage_parameters(model, plan, stage)
    gathered = PRECISIONS[plan.precision] * psi if plan.zero_stage == 3 and plan.pp > 1 else 0.0
    states = zero_bytes_per_rank(psi, plan.dp, plan.zero_stage,
                                 *bytes_per_param("fp32" if plan.precision == "fp32" else "mixed", "adam"))
    per_layer = layer_activation_bytes(model, plan.micro_batch, plan.tp, plan.sequence_parallel, plan.checkpointing, e)
    acts = per_layer * model.layers / plan.pp * in_flight(plan, stage)
    if stage == plan.pp - 1:
        acts += logits_bytes(model, plan)
    return psi, Memory(states["params"], states["grads"], states["optim"], acts, gathered)


def estimate(model: ModelShape, plan: Plan, cluster: Cluster = H100_NODE) -> Estimate:
    """Memory, bytes, bubble, time and MFU of one training step of ``model`` under ``plan`` on ``cluster``."""
    check_plan(model, plan)
    e = PRECISIONS[plan.precision]
    stages = [_stage_memory(model, plan, s, e) for s in sorted({0, plan.pp - 1})]
    psi_rank = max(psi for psi, _ in stages)
    memory = max((mem for _, mem in stages), key=lambda mem: mem.total)
    ends = max(tp_end_bytes(model, plan, s, e) for s in sorted({0, plan.pp - 1}))  # the busier end
    sent = {"dp": dp_bytes(psi_rank, plan.dp, plan.zero_stage, e, plan.microbatches, pipelined=plan.pp > 1),
            "tp": tp_bytes(model, plan, e) + ends, "pp": pp_bytes(model, plan, e), "tied": tied_bytes(model, plan, e)}
    spans = {"tp": plan.tp, "pp": plan.tp * plan.pp, "dp": plan.world_size, "tied": plan.tp * plan.pp}
    times = {k: sent[k] / link_bandwidth(cluster, spans[k]) for k in sent}
    tokens = plan.global_batch * model.seq_len
    model_flops, hardware_flops = (f * tokens for f in flops_per_token(model, plan.checkpointing))
    peak = cluster.peak_flops * (0.5 if plan.precision == "fp32" else 1.0)  # fp32 matmuls: TF32, half the bf16 rate
    times["compute"] = hardware_flops / plan.world_size / (peak * cluster.efficiency)
    bubble = bubble_fraction(plan.pp, plan.microbatches, plan.v)
    step = (times["compute"] + times["tp"] + times["pp"]) / (1 - bubble) + times["dp"] + times["tied"]
    fits = memory.total <= cluster.memory_bytes
    reason = "" if fits else _why_not(memory, cluster)
    return Estimate(parameter_count(model), psi_rank, memory, sent, bubble, model_flops, times, step,
                    model_flops / (step * plan.world_size * cluster.peak_flops), fits, reason)


def _why_not(memory, cluster):
    terms = dataclasses.asdict(memory)
    big = max(terms, key=terms.get)
    fix = {"activations": "checkpointing, sequence parallelism, a smaller micro-batch or more tp/pp",
           "optimizer": "a higher ZeRO stage or more tp/pp", "gradients": "ZeRO stage 2 or 3, or more tp/pp",
           "parameters": "ZeRO stage 3 (FSDP) or more tp/pp",
           "gathered": "ZeRO-1 inside the pipeline, or more tp/pp"}[big]
    return (f"does not fit: {memory.total / GB:.1f} GB per rank > {cluster.memory_bytes / GB:.1f} GB, over by "
            f"{(memory.total - cluster.memory_bytes) / GB:.1f} GB; the largest term is {big} "
            f"({terms[big] / GB:.1f} GB): try {fix}.")


def best_plans(model: ModelShape, cluster: Cluster, n_gpus: int, global_batch: int, micro_batches=(1, 2, 4),
               precision="bf16", zero_stages=(0, 1, 2, 3), checkpointing=CHECKPOINTING, chunks=(1, 2), top=10):
    """The fitting plans of ``n_gpus`` GPUs, fastest predicted step first: a list of (Estimate, Plan).

    Rules: tp within a node (tp divides gpus_per_node); sequence parallelism whenever tp > 1; with a pipeline at
    most ZeRO-1 (stages 2 and 3 would reduce or gather every micro-batch's gradients or weights);
    interleaving (v > 1) only with a pipeline."""
    _positive(n_gpus=n_gpus, global_batch=global_batch)
    found = []
    for tp in (t for t in range(1, cluster.gpus_per_node + 1) if cluster.gpus_per_node % t == 0 and n_gpus % t == 0):
        for pp in (p for p in range(1, model.layers + 1) if (n_gpus // tp) % p == 0):
            dp = n_gpus // (tp * pp)
            for v in (c for c in chunks if c == 1 or pp > 1):
                for mb in micro_batches:
                    for zero in (z for z in zero_stages if pp == 1 or z <= 1):
                        for ckpt in checkpointing:
                            try:
                                plan = Plan(global_batch, mb, dp, tp, pp, v, zero, precision, ckpt, tp > 1)
                                est = estimate(model, plan, cluster)
                            except ValueError:
                                continue
                            if est.fits:
                                found.append((est, plan))
    return sorted(found, key=lambda pair: pair[0].step_time)[:top]


# Shapes of published models (Psi in the comment, from ``parameter_count``).
GPT2_SMALL = ModelShape(layers=12, hidden=768, heads=12, vocab=50257, seq_len=1024)  # 124,439,808
LLAMA2_7B = ModelShape(layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096, ffn_hidden=11008,
                       tied_embeddings=False, gated_mlp=True, norm="rmsnorm", biases=False, positions="rope",
                       dropout=False)  # 6,738,415,616
LLAMA2_70B = dataclasses.replace(LLAMA2_7B, layers=80, hidden=8192, heads=64, kv_heads=8,
                                 ffn_hidden=28672)  # 68,976,648,192
