"""``estimate``: the terms of ``costs`` summed into memory per rank, bytes, bubble, step time and MFU for one plan;
``best_plans``: every plan searched, fastest first (``utils.planner``, notebook 09)."""

from __future__ import annotations

import dataclasses
import itertools

from ..sharding.memory import bytes_per_param, zero_bytes_per_rank
from ..pipeline import bubble_fraction
from .shapes import GB, PRECISIONS, CHECKPOINTING, ModelShape, Cluster, H100_NODE, Plan, check_plan, _positive
from .costs import (parameter_count, stage_parameters, layer_activation_bytes, in_flight, logits_bytes, dp_bytes,
                    tp_bytes, tp_end_bytes, tied_bytes, pp_bytes, flops_per_token, expert_parameters)
from .cp_ep import cp_bytes, ep_bytes, spans


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes one rank holds at its peak, term by term."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    # ZeRO-2/3 in a pipeline: what stays unsharded over the micro-batches (torch.distributed.pipelining turns off
    # FSDP2's gradient sync and resharding until the last backward): the stage's weights (ZeRO-3) and its
    # accumulated gradients in fp32 (ZeRO-2 and 3; FSDP2's ``unsharded_accumulated_grad``, in the reduce dtype)
    gathered: float = 0.0

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
    bytes_per_step: dict  # {"dp", "tp", "pp", "tied", "cp", "ep"}: bytes one rank sends per step
    bubble: float  # (p - 1) / (v m + p - 1)
    flops_per_step: float  # model FLOPs of the whole step, all ranks (MFU counts these)
    times: dict  # seconds: {"compute", "dp", "tp", "pp", "tied", "cp", "ep"}
    step_time: float
    mfu: float
    fits: bool
    reason: str  # "" when it fits


def link_bandwidth(cluster: Cluster, span: int) -> float:
    """A group whose ranks lie ``span`` consecutive ranks apart or less talks over NVLink when that span fits in
    a node, otherwise at the inter-node bandwidth of each GPU (the slowest link of a ring sets its pace)."""
    return cluster.intra_node_bandwidth if span <= cluster.gpus_per_node else cluster.inter_node_bandwidth


def _states(model, plan, psi):
    """Model states of a rank holding ``psi`` parameters: the dense ones sharded by ZeRO over the dp x cp ranks,
    the experts (already 1/ep of them) over the dp x cp / ep ranks that hold the same experts (torchtitan's
    ``dp_shard_cp`` and ``dp_shard_in_ep`` meshes). Returns (dense psi, expert psi, {params, grads, optim})."""
    experts = model.layers // plan.pp * expert_parameters(model, plan.tp, plan.ep)
    kinds = bytes_per_param("fp32" if plan.precision == "fp32" else "mixed", "adam")
    data = plan.dp * plan.cp
    dense, moe = (zero_bytes_per_rank(psi - experts, data, plan.zero_stage, *kinds),
                  zero_bytes_per_rank(experts, data // plan.ep, plan.zero_stage, *kinds) if experts else None)
    return psi - experts, experts, {k: dense[k] + (moe[k] if moe else 0) for k in ("params", "grads", "optim")}


def _stage_memory(model, plan, stage, e):
    psi = stage_parameters(model, plan, stage)
    weights = PRECISIONS[plan.precision] * psi if plan.zero_stage == 3 and plan.pp > 1 else 0.0
    gradients = 4 * psi if plan.zero_stage >= 2 and plan.pp > 1 else 0.0  # fp32: the reduce dtype
    gathered = weights + gradients
    states = _states(model, plan, psi)[2]
    per_layer = layer_activation_bytes(model, plan.micro_batch, plan.tp, plan.sequence_parallel, plan.checkpointing, e)
    acts = per_layer * model.layers / plan.pp * in_flight(plan, stage)
    if stage == plan.pp - 1:
        acts += logits_bytes(model, plan)
    if plan.cp > 1:  # every activation is per token: the ring splits them all, its score blocks too (lesson 14)
        acts /= plan.cp
    return psi, Memory(states["params"], states["grads"], states["optim"], acts, gathered)


def estimate(model: ModelShape, plan: Plan, cluster: Cluster = H100_NODE) -> Estimate:
    """Memory, bytes, bubble, time and MFU of one training step of ``model`` under ``plan`` on ``cluster``."""
    check_plan(model, plan)
    e = PRECISIONS[plan.precision]
    stages = [_stage_memory(model, plan, s, e) for s in sorted({0, plan.pp - 1})]
    psi_rank = max(psi for psi, _ in stages)
    memory = max((mem for _, mem in stages), key=lambda mem: mem.total)
    ends = max(tp_end_bytes(model, plan, s, e) for s in sorted({0, plan.pp - 1}))  # the busier end
    dense, experts, _ = _states(model, plan, psi_rank)
    data, dp_args = plan.dp * plan.cp, (plan.zero_stage, e, plan.microbatches, plan.pp > 1)
    sent = {"dp": dp_bytes(dense, data, *dp_args) + (dp_bytes(experts, data // plan.ep, *dp_args) if experts else 0),
            "tp": tp_bytes(model, plan, e) + ends, "pp": pp_bytes(model, plan, e), "tied": tied_bytes(model, plan, e),
            "cp": cp_bytes(model, plan, e), "ep": ep_bytes(model, plan, e)}
    span = spans(plan)
    times = {k: sent[k] / link_bandwidth(cluster, span[k]) for k in sent}
    tokens = plan.global_batch * model.seq_len
    model_flops, hardware_flops = (f * tokens for f in flops_per_token(model, plan.checkpointing))
    peak = cluster.peak_flops * (0.5 if plan.precision == "fp32" else 1.0)  # fp32 matmuls: TF32, half the bf16 rate
    times["compute"] = hardware_flops / plan.world_size / (peak * cluster.efficiency)
    bubble = bubble_fraction(plan.pp, plan.microbatches, plan.v)
    on_path = times["compute"] + times["tp"] + times["pp"] + times["cp"] + times["ep"]  # per micro-batch: in the bubble
    step = on_path / (1 - bubble) + times["dp"] + times["tied"]
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
           "gathered": "ZeRO-1 inside the pipeline (its gradients and weights stay unsharded), or more tp/pp"}[big]
    return (f"does not fit: {memory.total / GB:.1f} GB per rank > {cluster.memory_bytes / GB:.1f} GB, over by "
            f"{(memory.total - cluster.memory_bytes) / GB:.1f} GB; the largest term is {big} "
            f"({terms[big] / GB:.1f} GB): try {fix}.")


def best_plans(model: ModelShape, cluster: Cluster, n_gpus: int, global_batch: int, micro_batches=(1, 2, 4),
               precision="bf16", zero_stages=(0, 1, 2, 3), checkpointing=CHECKPOINTING, chunks=(1, 2), top=10,
               tp_degrees=None, cp_degrees=(1,), ep_degrees=(1,)):
    """The fitting plans of ``n_gpus`` GPUs, fastest predicted step first: a list of (Estimate, Plan).

    Rules: tp within a node (tp divides gpus_per_node), unless ``tp_degrees`` lists the degrees to try (then the
    cost model alone decides whether crossing nodes pays); sequence parallelism whenever tp > 1; interleaving
    (v > 1) only with a pipeline. Every ZeRO stage is tried with a pipeline too, at the pipelined costs that lesson 09
    measures (``dp_bytes(pipelined=True)``: torch.distributed.pipelining keeps the weights gathered and reduces the
    gradients once a step; ``Memory.gathered``: the unsharded stage it keeps meanwhile), as torchtitan runs FSDP
    with PP. ``cp_degrees`` and ``ep_degrees``: the context- and expert-parallel sizes to try (1 alone by default;
    plans they do not fit, e.g. ep on a dense model, are skipped)."""
    _positive(n_gpus=n_gpus, global_batch=global_batch)
    found = []
    if tp_degrees is None:
        tp_degrees = [t for t in range(1, cluster.gpus_per_node + 1) if cluster.gpus_per_node % t == 0]
    meshes = [(tp, cp) for tp in tp_degrees for cp in cp_degrees if n_gpus % (tp * cp) == 0]
    for tp, cp in meshes:
        for pp in (p for p in range(1, model.layers + 1) if (n_gpus // (tp * cp)) % p == 0):
            dp = n_gpus // (tp * pp * cp)
            for v, mb, zero, ckpt, ep in itertools.product((c for c in chunks if c == 1 or pp > 1), micro_batches,
                                                           zero_stages, checkpointing, ep_degrees):
                try:
                    plan = Plan(global_batch, mb, dp, tp, pp, v, zero, precision, ckpt, tp > 1, cp=cp, ep=ep)
                    est = estimate(model, plan, cluster)
                except ValueError:
                    continue
                if est.fits:
                    found.append((est, plan))
    return sorted(found, key=lambda pair: pair[0].step_time)[:top]
