"""Checker of labs/09_plan_3d_lab.ipynb: is the learner's dp x tp x pp plan valid, fitting and the fastest, and
does its mesh train the tiny Llama of lesson 09 exactly like one process, holding what the planner predicts?

``check_choose_plan(choose_plan)`` calls the learner's search on several jobs (model, cluster, GPUs, batch) and
compares each answer with ``utils.planner.best_plans`` (the grader may use it; the learner may not: a profile
hook watches for a call to it). ``check_plan_run(plan, world_size)`` runs the plan's mesh on CPU ranks:
FSDP2 on dp, tensor + sequence parallelism on tp, GPipe on pp: notebook 09's training step itself
(``utils.parallelize3d.train``, the lesson shows its source) with ``m = plan.microbatches`` micro-batches.
"""

import dataclasses
import sys

from .. import parallelize3d, planner
from ..parallelize3d import BATCH, HEADS, HIDDEN, LAYERS, SEQ, VOCAB
from ..memory import zero_bytes_per_rank
from .common import GRAD_TOL, CheckResult, LabCheckFailed, close, fail, launch_answer

HINTS = {
    "used_best_plans": "write the search yourself: loop over the meshes (tp, pp, dp), the micro-batch, the ZeRO "
                       "stage and checkpointing, call estimate() on each Plan and keep the fastest that fits; "
                       "best_plans is the answer key, not a tool for this lab.",
    "not_a_plan": "return a utils.planner.Plan(global_batch, micro_batch, dp, tp, pp, ...).",
    "job_changed": "keep the job you were given: Plan(global_batch=global_batch, ..., precision=precision).",
    "mesh_size": "dp * tp * pp must equal n_gpus, the GPUs of every node (nodes x gpus_per_node): each GPU holds "
                 "exactly one (dp, tp, pp) position, none idle, none counted twice.",
    "tp_across_nodes": "keep tensor parallelism inside a node: tp must divide cluster.gpus_per_node. Its all-reduces "
                       "run 4 times per layer and micro-batch; over InfiniBand (~50 GB/s instead of NVLink's "
                       "~450 GB/s) they stall every layer. Cross nodes with pp or dp instead.",
    "divisibility": "tp must divide the heads, KV heads and MLP inner size (each rank keeps whole heads), pp * v "
                    "the layers (whole layers per stage), dp * micro_batch the global batch: build each Plan and "
                    "estimate it inside try/except ValueError, and skip the ones refused.",
    "does_not_fit": "keep only plans whose estimate(...).fits is True; the reason names the largest term and "
                    "what shrinks it.",
    "pipeline_starved": "a pipeline of p stages needs m >= p micro-batches per step (m = global_batch / (dp * "
                        "micro_batch)); with m < p most stages wait: bubble (p-1)/(m+p-1). Use smaller "
                        "micro-batches or fewer stages, and compare step_time, which counts the bubble.",
    "zero_too_high": "use the lowest ZeRO stage that fits: ZeRO-3 gathers the weights again for every "
                     "micro-batch's forward and backward (3 Psi values per micro-batch instead of 2 Psi per step), "
                     "bytes for nothing when ZeRO-1 or -2 already fits. Try every stage and keep the fastest.",
    "not_fastest": "compare estimate(...).step_time of every valid plan (every tp dividing gpus_per_node, every pp, "
                   "micro_batch in (1, 2, 4), ZeRO 0-3 (0-1 with a pipeline), checkpointing, v in (1, 2) with a "
                   "pipeline) and keep the smallest among those that fit.",
    "crash": "choose_plan must return a Plan for every job without raising; read the message.",
    "not_equal": "the run must match one process: check that the plan's mesh divides the batch and the model.",
    "memory": "the measured shards must be the planner's prediction: read the table above.",
}

SEARCH = dict(micro_batches=(1, 2, 4), chunks=(1, 2))  # the lab's search space, as best_plans takes it
# the tiny Llama of notebook 09, its shape read from the code that trains it
TINY = planner.ModelShape(layers=LAYERS, hidden=HIDDEN, heads=HEADS, vocab=VOCAB, seq_len=SEQ, ffn_hidden=2 * HIDDEN,
                          tied_embeddings=True, gated_mlp=True, norm="rmsnorm", biases=False, positions="rope",
                          dropout=False)
TINY_BATCH = BATCH  # sequences per step


def tiny_cluster(world_size):
    """Two nodes of world_size/2 'GPUs' of 400 kB: the tiny model's 16 Psi = 676 kB of fp32 model states must be split."""
    return dataclasses.replace(planner.H100_NODE, gpus_per_node=max(1, world_size // 2), memory_bytes=400e3)


GPT2_BIG = dataclasses.replace(planner.GPT2_SMALL, heads=16, kv_heads=16, layers=24, hidden=1024)  # GPT-2 medium, 16 heads
# (name, model, cluster, n_gpus, global_batch, precision): jobs the learner never sees, where the mistakes show.
CASES = [
    ("tiny Llama, 2 nodes x 2, fp32", TINY, tiny_cluster(4), 4, TINY_BATCH, "fp32"),
    ("GPT-2 small, 2 nodes x 8 H100", planner.GPT2_SMALL, planner.H100_NODE, 16, 64, "bf16"),
    ("GPT-2 medium, 2 nodes x 4 GPUs of 16 GB", GPT2_BIG, dataclasses.replace(planner.H100_NODE, gpus_per_node=4,
                                                                              memory_bytes=16e9), 8, 32, "bf16"),
    ("Llama-2-7B, 2 nodes x 4 H100", planner.LLAMA2_7B, dataclasses.replace(planner.H100_NODE, gpus_per_node=4), 8,
     64, "bf16"),
]


def optimum(model, cluster, n_gpus, global_batch, precision):
    """(Estimate, Plan) of the fastest fitting plan of the lab's search space."""
    found = planner.best_plans(model, cluster, n_gpus, global_batch, precision=precision, top=1, **SEARCH)
    if not found:
        raise ValueError(f"no plan fits: {model} on {n_gpus} x {cluster}")
    return found[0]


def _call_watched(choose_plan, args):
    """choose_plan(*args), and whether it called planner.best_plans (seen by a profile hook, whatever its name)."""
    target, seen = planner.best_plans.__code__, []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code is target:
            seen.append(True)

    old = sys.getprofile()
    sys.setprofile(watch)
    try:
        return choose_plan(*args), bool(seen)
    finally:
        sys.setprofile(old)


def judge(plan, model, cluster, n_gpus, global_batch, precision, job):
    """Raise LabCheckFailed naming the mistake unless ``plan`` is valid, fits and is (one of) the fastest."""
    __tracebackhide__ = True
    if not isinstance(plan, planner.Plan):
        fail(HINTS, "not_a_plan", f"{job}: choose_plan returned {plan!r}")
    if (plan.global_batch, plan.precision) != (global_batch, precision):
        fail(HINTS, "job_changed", f"{job}: the plan has global_batch={plan.global_batch}, precision="
                                   f"{plan.precision!r}; the job is {global_batch}, {precision!r}")
    if plan.world_size != n_gpus:
        fail(HINTS, "mesh_size", f"{job}: dp={plan.dp} x tp={plan.tp} x pp={plan.pp} = {plan.world_size} GPUs, "
                                 f"but the cluster has {n_gpus}")
    if cluster.gpus_per_node % plan.tp:
        fail(HINTS, "tp_across_nodes", f"{job}: tp={plan.tp} on nodes of {cluster.gpus_per_node} GPUs")
    try:
        est = planner.estimate(model, plan, cluster)
    except ValueError as err:
        fail(HINTS, "divisibility", f"{job}: {err}")
    if not est.fits:
        fail(HINTS, "does_not_fit", f"{job}: {plan} {est.reason}")
    best_est, best = optimum(model, cluster, n_gpus, global_batch, precision)
    if est.step_time <= best_est.step_time * (1 + 1e-9):
        return est, best_est
    what = (f"{job}: your plan takes {est.step_time * 1e3:.3f} ms per step (bubble {est.bubble:.0%}); the fastest "
            f"that fits takes {best_est.step_time * 1e3:.3f} ms: {best}")
    if plan.pp > 1 and plan.microbatches < plan.pp:
        fail(HINTS, "pipeline_starved", f"{what}; you run m={plan.microbatches} micro-batches on pp={plan.pp} stages")
    lower = [planner.estimate(model, dataclasses.replace(plan, zero_stage=z), cluster) for z in range(plan.zero_stage)]
    if any(e.fits and e.step_time < est.step_time for e in lower):
        fail(HINTS, "zero_too_high", f"{what}; ZeRO-{min(z for z, e in enumerate(lower) if e.fits)} fits with "
                                     f"{est.bytes_per_step['dp'] - lower[-1].bytes_per_step['dp']:,.0f} fewer dp bytes")
    fail(HINTS, "not_fastest", what)


def check_choose_plan(choose_plan, cases=CASES):
    """Run choose_plan on every job of ``cases`` and judge each answer; a CheckResult says what was chosen."""
    __tracebackhide__ = True
    lines = []
    for job, model, cluster, n_gpus, batch, precision in cases:
        try:
            plan, used = _call_watched(choose_plan, (model, cluster, n_gpus, batch, precision))
        except NotImplementedError:
            raise
        except Exception as err:  # the learner's own code raised: say what, in the notebook
            mistake = "divisibility" if "not divisible" in str(err) else "crash"
            raise LabCheckFailed(mistake, f"{job}: choose_plan raised {type(err).__name__}: {err}",
                                 HINTS[mistake]) from None
        if used:
            fail(HINTS, "used_best_plans", f"{job}: choose_plan called utils.planner.best_plans")
        est, best = judge(plan, model, cluster, n_gpus, batch, precision, job)
        lines.append(f"{job}: dp={plan.dp} tp={plan.tp} pp={plan.pp} v={plan.v} micro_batch={plan.micro_batch} "
                     f"ZeRO-{plan.zero_stage} {plan.checkpointing}: {est.memory.total / 1e9:.3g} GB, "
                     f"{est.step_time * 1e3:.3f} ms (fastest {best.step_time * 1e3:.3f} ms)")
    return CheckResult("choose_plan: valid, fits, fastest by the planner", lines)


# ---------------------------------------------------------------- the plan's mesh on CPU ranks (notebook 09's step)

def check_plan_run(plan, world_size, steps=2, timeout=300):
    """Run ``plan``'s mesh on ``world_size`` CPU ranks for the tiny Llama; check equality and memory per rank."""
    __tracebackhide__ = True
    cluster, job = tiny_cluster(world_size), f"tiny Llama on {world_size} ranks"
    judge(plan, TINY, cluster, world_size, TINY_BATCH, "fp32", job)
    ranks = launch_answer(parallelize3d.train, (plan.dp, plan.pp, plan.tp, steps, plan.microbatches), world_size,
                          timeout, "the plan's mesh", "a rank waits for a message that never comes: see the stacks.")
    ref_losses, ref_grads = parallelize3d.reference(steps)
    got = {}
    for r in ranks:
        got.update({k: v for k, v in r["grads"].items() if k not in got})
    loss_diff = max(abs(a - b) for r in ranks for a, b in zip(r["losses"], ref_losses))
    if sorted(got) != sorted(ref_grads) or loss_diff > 1e-5 or not all(close(got[k], ref_grads[k], GRAD_TOL)
                                                                       for k in ref_grads):
        fail(HINTS, "not_equal", f"{job}: losses {ranks[0]['losses']} vs one process {ref_losses}", world_size)
    # the run shards like FSDP2 (ZeRO-3) on dp, fp32 Adam: 4 + 4 + 8 bytes per parameter of the stage, / dp
    zero3 = dataclasses.replace(plan, zero_stage=3)
    lines = [f"{job}: dp={plan.dp} tp={plan.tp} pp={plan.pp}, m={plan.microbatches} micro-batches, {steps} steps: "
             f"max |loss - one process| {loss_diff:.1e}, gradients equal (rtol {GRAD_TOL['rtol']:g})"]
    for rank, r in enumerate(ranks):
        psi = planner.stage_parameters(TINY, zero3, r["coords"][1])
        want = {k: v for k, v in zero_bytes_per_rank(psi, plan.dp, 3, 4, 4, 8).items() if k != "total"}
        want["optim"] += 4 * r["tensors"]  # + Adam's step counter, one fp32 scalar per tensor (not in the planner)
        if any(abs(r["memory"][k] - want[k]) > 1e-6 for k in want):
            fail(HINTS, "memory", f"{job}, rank {rank} (stage {r['coords'][1]}): measured {r['memory']}, "
                                  f"predicted {want}", world_size)
        lines.append(f"rank {rank} (stage {r['coords'][1]}): {sum(r['memory'].values()):,} B of parameters, gradients "
                     f"and Adam state = planner's {sum(want.values()):,.0f} B (Psi_stage = {psi:,})")
    return CheckResult("the plan trains like one process and holds what the planner predicts", lines)
