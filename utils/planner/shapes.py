"""What the planner is asked about: the model's shape, the plan (mesh, batch, precision, ZeRO, recompute), the
cluster, their checks, and the shapes of published models (``utils.planner``, notebook 09)."""

from __future__ import annotations

import dataclasses

from ..context_parallel.ring import check_sequence
from ..experts.dispatch import check_expert_split


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
    # What the layer's kernels keep for backward (measured in lesson 09c). "eager": attention as matmul + softmax,
    # its s x s scores kept (the paper's count); "flash": a fused kernel (torch's sdpa, FlashAttention) keeps its
    # output and a log-sum-exp per head and token (fp32) instead. ``fused_kernels``: Megatron's fused RMSNorm and
    # SwiGLU (the paper's count); False: plain PyTorch ops as Hugging Face's Llama writes them, whose RMSNorm also
    # keeps its normalized copy and 1/rms, and whose SwiGLU also keeps silu(gate).
    attention: str = "eager"
    fused_kernels: bool = True
    # Mixture of experts (lesson 15): every layer's MLP is ``n_experts`` MLPs of ``expert_ffn`` (default ffn_hidden)
    # and a router (h x E, replicated); each token goes to ``top_k`` of them. 0 experts: a dense model.
    n_experts: int = 0
    top_k: int = 2
    expert_ffn: int | None = None

    def __post_init__(self):
        _positive(layers=self.layers, hidden=self.hidden, heads=self.heads, vocab=self.vocab, seq_len=self.seq_len)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.expert_ffn is None:
            object.__setattr__(self, "expert_ffn", self.ffn_hidden)
        _positive(ffn_hidden=self.ffn_hidden, kv_heads=self.kv_heads, expert_ffn=self.expert_ffn)
        if self.n_experts and not (isinstance(self.n_experts, int) and 1 <= self.top_k <= self.n_experts):
            raise ValueError(f"top_k={self.top_k} experts per token out of n_experts={self.n_experts}: use "
                             f"1 <= top_k <= n_experts (Mixtral: 2 of 8), or n_experts=0 for a dense model.")
        if self.n_experts and self.biases:
            raise ValueError(f"an MoE shape (n_experts={self.n_experts}) is counted without biases, as Mixtral and "
                             "Switch have none: pass biases=False.")
        _divides("hidden size", self.hidden, self.heads, f"pick a hidden size that is a multiple of heads={self.heads}")
        _divides("number of heads", self.heads, self.kv_heads, f"kv_heads={self.kv_heads} must divide heads")
        if self.attention not in ("eager", "flash"):
            raise ValueError(f"attention must be 'eager' (scores kept) or 'flash' (a fused kernel), not "
                             f"{self.attention!r}.")
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
    """The mesh (dp x tp x pp x cp ranks, v model chunks per pipeline rank), batches in sequences, and options.
    ``zero_stage`` shards over the dp x cp ranks (FSDP = stage 3; the cp ranks hold the same weights, torchtitan's
    ``dp_shard_cp``); ``schedule`` is "1F1B" or "GPipe". ``cp``: context parallelism, each sequence split over cp
    ranks (ring attention, lesson 14). ``ep``: expert parallelism, each MoE layer's experts split over ep ranks
    *borrowed* from the dp x cp ranks, not added to the world (torchtitan's ``ParallelDims`` with etp = tp: ep
    takes all of cp and part of dp_shard, ``ep % cp == 0 and (dp_shard * cp) % ep == 0``); the experts are
    also split by tp (etp = tp)."""

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
    cp: int = 1  # context parallelism: ranks that split each sequence
    ep: int = 1  # expert parallelism: ranks, out of the dp x cp ones, that split each layer's experts

    def __post_init__(self):
        _positive(global_batch=self.global_batch, micro_batch=self.micro_batch, dp=self.dp, tp=self.tp,
                  pp=self.pp, v=self.v, cp=self.cp, ep=self.ep)
        if self.ep > 1 and (self.ep % self.cp or (self.dp * self.cp) % self.ep):
            raise ValueError(f"ep={self.ep} expert-parallel ranks are borrowed from the dp x cp = {self.dp} x "
                             f"{self.cp} = {self.dp * self.cp} data ranks (torchtitan): ep must divide "
                             f"{self.dp * self.cp} and be a multiple of cp={self.cp}; e.g. ep=cp x a divisor of dp.")
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
        return self.dp * self.tp * self.pp * self.cp

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
    if plan.cp > 1:  # zig-zag chunks, 2 per rank, as a causal LM balances them (lesson 14; torchtitan's 2 * cp)
        check_sequence(model.seq_len, plan.cp, "zigzag")
    if plan.ep > 1:
        if not model.n_experts:
            raise ValueError(f"ep={plan.ep} splits experts, and this model has none (n_experts=0): use ep=1.")
        check_expert_split(model.n_experts, plan.ep)
    if model.n_experts:
        _divides("expert MLP inner size", model.expert_ffn, plan.tp, f"experts are split by tp={plan.tp} too (etp = "
                 f"tp): use a tp that divides {model.expert_ffn}")
    return plan


# ---------------------------------------------------------------- parameters (Psi, a count)



# Shapes of published models (Psi in the comment, from ``parameter_count``).
GPT2_SMALL = ModelShape(layers=12, hidden=768, heads=12, vocab=50257, seq_len=1024)  # 124,439,808
LLAMA2_7B = ModelShape(layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096, ffn_hidden=11008,
                       tied_embeddings=False, gated_mlp=True, norm="rmsnorm", biases=False, positions="rope",
                       dropout=False)  # 6,738,415,616
LLAMA2_70B = dataclasses.replace(LLAMA2_7B, layers=80, hidden=8192, heads=64, kv_heads=8,
                                 ffn_hidden=28672)  # 68,976,648,192
# Mixtral 8x7B (Jiang et al. 2024, arXiv 2401.04088, Table 1; transformers' MixtralConfig defaults): 32 layers,
# hidden 4096, 32 heads, 8 KV heads, 8 experts of ffn 14336, top-2, vocabulary 32000, untied; "46.7B" total.
MIXTRAL_8X7B = dataclasses.replace(LLAMA2_7B, kv_heads=8, ffn_hidden=14336, expert_ffn=14336, n_experts=8,
                                   top_k=2)  # 46,702,792,704
