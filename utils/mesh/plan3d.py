"""The capstone's runs as the planner describes a run (lessons 09 and 14, lab 09): one ``utils.planner.Plan``.

``parallelize3d`` trains the tiny Llama whose sizes are here (``SHAPE``: the model as the planner describes one);
``build`` and ``train`` take a ``Plan`` and check it once, with the planner's ``check_plan(SHAPE, plan)``
(tp divides the heads, pp the layers, cp the sequence; ``Plan`` itself refuses a batch that does not split):

- ``mesh_plan(dp, pp, tp)``: the lesson's run on a mesh, the one plan the step trains and the planner prices;
- ``unrunnable(plan)``: why the step cannot run a plan as it says (a knob it does not have), or '';
- ``plan_4d(world_size)``: a plan with context parallelism that fits, and why the others do not (lesson 14).
"""

from ..perf.configs import llama_shape
from ..planner.shapes import Plan, check_plan
from .mesh3d import meshes

__all__ = ["VOCAB", "HIDDEN", "HEADS", "LAYERS", "SEQ", "BATCH", "LR", "SHAPE", "microbatches", "mesh_plan",
           "unrunnable", "plan_4d"]

VOCAB, HIDDEN, HEADS, LAYERS, SEQ, BATCH = 32, 32, 4, 4, 16, 8  # BATCH: sequences per global batch
LR = 1e-2  # Adam learning rate
SHAPE = llama_shape(LAYERS, HIDDEN, HEADS, VOCAB, SEQ, ffn_hidden=2 * HIDDEN)  # parallelize3d.make_model as the
# planner describes a model (lessons 09b and 14, lab 09): tied embedding, gated MLP of 2h, RMSNorm, RoPE, no biases


def microbatches(pp):
    """The lesson's default m = p micro-batches: bubble (p-1)/(2p-1); m = 1 without a pipeline."""
    return pp


def mesh_plan(dp=1, pp=1, tp=1, cp=1, checkpointing="none"):
    """The run of this lesson's step on a (dp, pp, [cp,] tp) mesh, as the planner describes a run (``Plan``): the
    batch of BATCH sequences in m = ``microbatches(pp)`` micro-batches per dp rank, GPipe, fp32, FSDP2 (ZeRO-3) on
    dp [x cp], tensor + sequence parallelism on tp, the logits gathered over tp (no vocab-parallel loss).
    ``Plan`` refuses a batch that does not split; ``check_plan(SHAPE, plan)`` a mesh that does not fit the model."""
    return Plan(global_batch=BATCH, micro_batch=max(1, BATCH // (dp * microbatches(pp))), dp=dp, tp=tp, pp=pp, cp=cp,
                zero_stage=3, precision="fp32", checkpointing=checkpointing, sequence_parallel=tp > 1,
                schedule="GPipe", loss_parallel=False)


def unrunnable(plan):
    """Why this step cannot run ``plan`` as it says ('' when it can): a knob it does not have. It reads the mesh, the
    micro-batches, the schedule and full recompute; ``loss_parallel`` changes only the planner's bytes (the step
    gathers the logits: the same loss)."""
    if plan.global_batch != BATCH or plan.precision != "fp32":
        return (f"global_batch={plan.global_batch}, precision={plan.precision!r}: the step trains make_batch's "
                f"{BATCH} sequences in fp32")
    if plan.v > 1:
        return f"v={plan.v}: the step holds one stage per rank (no interleaved schedule)"
    if plan.checkpointing == "selective":
        return "checkpointing='selective': the step recomputes whole blocks (full) or nothing"
    if plan.dp * plan.cp > 1 and plan.zero_stage != 3:
        return (f"ZeRO-{plan.zero_stage} with dp={plan.dp}{f' x cp={plan.cp}' if plan.cp > 1 else ''}: the step "
                "shards dp with FSDP2, i.e. ZeRO-3")
    if plan.tp > 1 and not plan.sequence_parallel:
        return f"tp={plan.tp} without sequence_parallel: the step's tensor parallelism is Megatron's with it"
    if plan.pp > 1 and plan.schedule == "1F1B" and plan.microbatches < plan.pp:
        return f"1F1B with m={plan.microbatches} < p={plan.pp}: torch's Schedule1F1B refuses it"
    return ""


def plan_4d(world_size, cp=2):
    """A plan with this cp (lesson 14) that fits the model on ``world_size`` ranks (the most tp, then pp), and the
    reasons the other meshes do not: ``(plan or None, [reason, ...])``."""
    reasons = []
    for dp, pp, tp in sorted(meshes(world_size // cp), key=lambda m: (-m[2], -m[1])) if world_size % cp == 0 else []:
        try:
            return check_plan(SHAPE, mesh_plan(dp, pp, tp, cp)), reasons
        except ValueError as err:
            reasons.append(f"(dp, pp, tp) = {(dp, pp, tp)}: {err}")
    return None, reasons or [f"{world_size} ranks do not split into cp = {cp} and the rest"]
