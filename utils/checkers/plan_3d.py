"""Checker of labs/09_plan_3d_lab.ipynb: is the learner's dp x tp x pp plan valid, under the memory cap and the
fastest, and does its mesh train the tiny Llama of lesson 09 exactly like one process, as the plan says?

``check_choose_plan(choose_plan)`` calls the learner's search on jobs (model, cluster, GPUs, batch, precision,
memory cap per rank) and judges each answer by its results: valid, under the cap, and as fast as ``OPTIMA``, a
stored table of each job's optimum (its step time, memory and knobs, written as numbers). This module carries no
search of the lab's space (the planner's ``best_plans`` ships as source, and the lab refuses calls to it): the table
comes from the teacher's side of this
checker, ``labs.solutions.plan_3d_search`` (in the solutions folder, which the student release leaves out and the
grader's sandbox hides), and tests/checkers/test_plan_3d.py recomputes every row of it and fails on a difference.
Where that module is there (the teacher's checkout: ``make grade``'s judge, the tests), a slower answer is diagnosed
by the knobs that, held at its values, leave no faster plan (``blame``: the mistake names the knob); without it (the
release) a slower answer is ``not_fastest``, with the stored optimum and the knobs in which it differs. A learner's
call to ``utils.planner.best_plans``, or to the teacher's search where it is there, is refused (a guard that trips
those functions in place, ``utils.checkers.guard``, through any alias, and a profile hook that also refuses a copy of
their code made beforehand, unless the answer switched the hook off: that guard's docstring says what still passes).
An answer faster than the stored optimum means the table or the planner is wrong, and says so. ``check_plan_run``
trains the plan on CPU ranks with ``utils.mesh.parallelize3d.train`` (lesson 09's step, which takes the ``Plan``
itself: its mesh, micro-batches, schedule and checkpointing), and refuses, before launching, a plan with a knob that
step cannot run (``utils.mesh.plan3d.unrunnable``).
"""

import dataclasses
import re

from .. import planner
from ..launch.scripts import ROOT
from ..mesh import parallelize3d
from ..mesh.plan3d import BATCH, SHAPE, unrunnable
from ..sharding.memory import zero_bytes_per_rank
from .answer_side import answer_side
from .common import GRAD_TOL, CheckResult, LabCheckFailed, close, fail, launch_answer, watched_call
from .guard import Guard, code_key
from .teacher_side import teacher_module

SPACE = dict(micro_batch=(1, 2, 4), v=(1, 2), zero_stage=(0, 1, 2, 3), checkpointing=planner.CHECKPOINTING)
KNOBS = ("mesh", "micro_batch", "v", "zero_stage", "checkpointing")  # what a diagnosis holds, one (or two) at a time
HINTS = {
    "used_best_plans": "write the search yourself: the lab is the search (the cap, ZeRO-2/3 in a pipeline, the boundaries).",
    "not_a_plan": "return a utils.planner.Plan(global_batch, micro_batch, dp, tp, pp, ...).",
    "job_changed": "keep the job you were given: Plan(global_batch=global_batch, ..., precision=precision).",
    "cp_ep": "this lab's search space is dp x tp x pp: leave cp and ep at 1, Plan's defaults. cp (context parallel) "
             "is a fourth factor of the mesh, Plan.world_size = dp * tp * pp * cp, so a cp that dp, tp and pp do "
             "not make room for asks for more GPUs than the job has; ep (expert parallel) splits the experts of a "
             "mixture of experts, which these models do not have. Lessons 14 and 15 (and best_plans' cp_degrees "
             "and ep_degrees) price them.",
    "mesh_size": "dp * tp * pp must equal n_gpus: each GPU holds exactly one (dp, tp, pp) position, none idle.",
    "tp_across_nodes": "keep tensor parallelism inside a node: tp must divide cluster.gpus_per_node (its "
                       "all-reduces run every layer and micro-batch; between nodes they stall every layer).",
    "outside_space": "stay in the lab's search space (the table): micro_batch 1, 2 or 4; v 1, or 2 with a "
                     "pipeline; sequence_parallel = tp > 1; the default schedule and loss_parallel.",
    "divisibility": "Plan(...) and estimate(...) raise ValueError when something does not divide (heads % tp, "
                    "layers % (pp * v), global_batch % (dp * micro_batch)): wrap both in try/except ValueError.",
    "over_cap": "keep only plans whose estimate(...).memory.total <= memory_cap: the cap, not "
                "cluster.memory_bytes (estimate(...).fits), is the budget of this lab.",
    "cap_strict": "a plan that fills the cap exactly fits: compare memory.total <= memory_cap, not <.",
    "mesh": "try every mesh: every tp dividing gpus_per_node, every pp dividing n_gpus / tp.",
    "micro_batch": "try every micro_batch (1, 2, 4).",
    "pipeline_starved": "a pipeline of p stages needs m >= p micro-batches (m = global_batch / (dp * micro_batch)): "
                        "with m < p most stages wait, bubble (p-1)/(m+p-1).",
    "v": "try v = 2 (interleaved 1F1B) with a pipeline: it shrinks the bubble to (p-1)/(v m + p-1).",
    "zero_stage": "try every ZeRO stage, 0 to 3, with or without a pipeline: a stage too high pays bytes for "
                  "nothing; one too low holds memory that another knob needed.",
    "checkpointing": "try every checkpointing (none, selective, full): recompute costs FLOPs, and frees memory "
                     "that a faster mesh or ZeRO stage may need.",
    "several": "the fixes are listed above, one per knob: check which values of each your search skips.",
    "not_fastest": "a faster plan under the cap exists (the message names it): compare its knobs with yours, and "
                   "search every combination of the table's values.",
    "raised": "choose_plan must return a Plan for every job without raising; read the message and the line.",
    "none_found": "your search raised that nothing fits, but the job has plans under the cap: some knob value your "
                  "loops never try is needed here (every tp, pp, ZeRO stage, v, micro-batch and checkpointing).",
    "no_fit": "when no plan of the space is under memory_cap, raise ValueError naming the numbers, as the lab asks: "
              "not another exception, not None, not a plan over the cap.",
    "judge_wrong": "not your mistake: the checker's stored optima (OPTIMA) or the planner is wrong. Report it with "
                   "this message.",
    "cannot_run": "this lab's runner (lesson 09's step) cannot honour that knob; choose_plan's answer for the tiny "
                  "job must be runnable: see the lab's 'Step 2' for what runs.",
    "not_equal": "the run must match one process: check that the plan's mesh divides the batch and the model.",
    "memory": "the measured shards must be the planner's prediction: read the table above.",
}
TINY = SHAPE  # the tiny Llama of notebook 09, its shape read from the code that trains it
TINY_BATCH = BATCH  # sequences per step


def tiny_cluster(world_size):
    """Two nodes of world_size/2 'GPUs' of 400 kB: the tiny model's 16 Psi = 676 kB of fp32 model states must be split."""
    return dataclasses.replace(planner.H100_NODE, gpus_per_node=max(1, world_size // 2), memory_bytes=400e3)


GPT2_MEDIUM = dataclasses.replace(planner.GPT2_SMALL, heads=16, kv_heads=16, layers=24, hidden=1024)
NODE4, NODE4_16GB = (dataclasses.replace(planner.H100_NODE, gpus_per_node=4, memory_bytes=b) for b in (80e9, 16e9))
# 7B on 2 x 4 H100 with a cap that exactly one fastest plan fills to the byte (the boundary case)
EXACT = planner.estimate(planner.LLAMA2_7B, planner.Plan(64, 1, 2, 2, 2, 2, 1, "bf16", "none", True), NODE4).memory.total
# (name, model, cluster, n_gpus, global_batch, precision, memory_cap): jobs whose optimum needs a non-default knob
CASES = [
    ("tiny Llama, 2 nodes x 2, fp32, 400 kB", TINY, tiny_cluster(4), 4, TINY_BATCH, "fp32", 400e3),
    ("GPT-2 small, 2 nodes x 8 H100", planner.GPT2_SMALL, planner.H100_NODE, 16, 64, "bf16", 80e9),  # ZeRO-2 + pp
    ("GPT-2 medium, 2 nodes x 4, cap 3 GB", GPT2_MEDIUM, NODE4_16GB, 8, 64, "bf16", 3e9),  # selective, v = 2
    ("Llama-2-7B, 2 nodes x 4 H100, cap 16 GB", planner.LLAMA2_7B, NODE4, 8, 64, "bf16", 16e9),  # full recompute
    ("Llama-2-7B, 2 nodes x 4 H100, cap 32 GB", planner.LLAMA2_7B, NODE4, 8, 64, "bf16", 32e9),  # ZeRO-1
    (f"Llama-2-7B, 2 nodes x 4 H100, cap {EXACT:,.0f} B", planner.LLAMA2_7B, NODE4, 8, 64, "bf16", EXACT),
    ("Llama-2-7B, batch 24, 2 nodes x 4 H100, cap 24 GB", planner.LLAMA2_7B, NODE4, 8, 24, "bf16", 24e9),
    ("GPT-2 medium, 2 nodes x 4, cap 1.7 GB", GPT2_MEDIUM, NODE4_16GB, 8, 64, "bf16", 1.7e9),  # ZeRO-2 alone: ZeRO-1
    # is over the cap and ZeRO-3 slower (found by make mutants: a search without ZeRO-2 passed every job above)
    ("GPT-2 medium, 2 nodes x 4, cap 742 MB", GPT2_MEDIUM, NODE4_16GB, 8, 64, "bf16", 0.742e9),  # ZeRO-3 alone fits
]
# a job no plan of the lab's space fits (the smallest 7B plan needs 13.7 GB per rank): choose_plan must raise ValueError
NO_FIT = ("Llama-2-7B, 2 nodes x 4 H100, cap 1 GB", planner.LLAMA2_7B, NODE4, 8, 64, "bf16", 1e9)


RUN_SIZES = (2, 4, 8)  # the WORLD_SIZEs of the lab's Step 2 (its parameters cell refuses others)


def run_job(world_size):
    """Step 2's job on ``world_size`` CPU ranks: (name, model, cluster, n_gpus, global_batch, precision, memory_cap)."""
    cluster = tiny_cluster(world_size)
    return f"tiny Llama on {world_size} ranks", TINY, cluster, world_size, TINY_BATCH, "fp32", cluster.memory_bytes


JOBS = CASES + [run_job(n) for n in RUN_SIZES]  # every job the lab judges; OPTIMA has a row for each
# job -> its optimum (step_time s, memory B per rank, plan's knobs; strict: where the optimum fills the cap exactly,
# the fastest time strictly under it), written by the teacher's search (python -m labs.solutions.plan_3d_search);
# tests/checkers/test_plan_3d.py recomputes every row and fails on a difference
OPTIMA = {
    "tiny Llama, 2 nodes x 2, fp32, 400 kB": dict(step_time=6.357759352881698e-07, memory=239616.0,
        plan=dict(dp=1, tp=2, pp=2, micro_batch=1, v=1, zero_stage=0, checkpointing="none")),
    "GPT-2 small, 2 nodes x 8 H100": dict(step_time=0.010725500350468486, memory=937334400.0,
        plan=dict(dp=2, tp=2, pp=4, micro_batch=1, v=1, zero_stage=2, checkpointing="none")),
    "GPT-2 medium, 2 nodes x 4, cap 3 GB": dict(step_time=0.04388376091944007, memory=2539590656.0,
        plan=dict(dp=2, tp=1, pp=4, micro_batch=1, v=2, zero_stage=2, checkpointing="selective")),
    "Llama-2-7B, 2 nodes x 4 H100, cap 16 GB": dict(step_time=4.2613975061610585, memory=14739832832.0,
        plan=dict(dp=1, tp=2, pp=4, micro_batch=1, v=2, zero_stage=0, checkpointing="full")),
    "Llama-2-7B, 2 nodes x 4 H100, cap 32 GB": dict(step_time=3.474597064096169, memory=27626045440.0,
        plan=dict(dp=2, tp=2, pp=2, micro_batch=1, v=2, zero_stage=1, checkpointing="selective")),
    "Llama-2-7B, 2 nodes x 4 H100, cap 49,100,881,920 B": dict(step_time=3.330070763175158, memory=49100881920.0,
        plan=dict(dp=2, tp=2, pp=2, micro_batch=1, v=2, zero_stage=1, checkpointing="none"), strict=3.3778052411776476),
    "Llama-2-7B, batch 24, 2 nodes x 4 H100, cap 24 GB": dict(step_time=1.4139633495448978, memory=18868076544.0,
        plan=dict(dp=1, tp=4, pp=2, micro_batch=1, v=2, zero_stage=0, checkpointing="selective")),
    "GPT-2 medium, 2 nodes x 4, cap 1.7 GB": dict(step_time=0.04867334029948994, memory=1639334912.0,
        plan=dict(dp=2, tp=2, pp=2, micro_batch=1, v=2, zero_stage=2, checkpointing="selective")),
    "GPT-2 medium, 2 nodes x 4, cap 742 MB": dict(step_time=0.22048335928739332, memory=680174592.0,
        plan=dict(dp=2, tp=4, pp=1, micro_batch=1, v=1, zero_stage=3, checkpointing="full")),
    "tiny Llama on 2 ranks": dict(step_time=5.525417027300304e-07, memory=354304.0,
        plan=dict(dp=1, tp=1, pp=2, micro_batch=1, v=1, zero_stage=0, checkpointing="full")),
    "tiny Llama on 4 ranks": dict(step_time=6.357759352881698e-07, memory=239616.0,
        plan=dict(dp=1, tp=2, pp=2, micro_batch=1, v=1, zero_stage=0, checkpointing="none")),
    "tiny Llama on 8 ranks": dict(step_time=6.881279676440851e-07, memory=120832.0,
        plan=dict(dp=1, tp=4, pp=2, micro_batch=1, v=1, zero_stage=0, checkpointing="none")),
}


def plan_knobs(plan):
    """The knobs a diagnosis holds (KNOBS), by name: the mesh as (dp, tp, pp)."""
    return dict(mesh=(plan.dp, plan.tp, plan.pp), micro_batch=plan.micro_batch, v=plan.v,
                zero_stage=plan.zero_stage, checkpointing=plan.checkpointing)


SEARCH = ROOT / "labs" / "solutions" / "plan_3d_search.py"  # the teacher's side of this checker; not in the release


def teacher_search():
    """The teacher's side of this checker (its search, ``optimum``, and its diagnosis, ``blame``), where the course
    holds it: the teacher's checkout (make grade's judge, the tests, the lab run by its teacher). None in the student
    release, which leaves the solutions folder out, and in the grader's sandbox, which hides it."""
    return teacher_module(SEARCH)


def stored_optimum(job, model, cluster, n_gpus, global_batch, precision, cap):
    """(step time, memory per rank, Plan, strict step time or None) of the job's optimum: its row of OPTIMA; for a job
    not in the table, the teacher's search computes the row, where it is there."""
    row = OPTIMA.get(job)
    if row is None:
        search = teacher_search()
        if search is None:
            raise LookupError(f"{job}: no stored optimum for this job; OPTIMA holds the lab's {len(OPTIMA)} jobs "
                              f"(CASES, and Step 2 on {', '.join(map(str, RUN_SIZES))} ranks), and the teacher's "
                              "checkout computes any other")
        row = search.optimum_row(model, cluster, n_gpus, global_batch, precision, cap)
    plan = planner.Plan(global_batch, precision=precision, sequence_parallel=row["plan"]["tp"] > 1, **row["plan"])
    return row["step_time"], row["memory"], plan, row.get("strict")


@answer_side
def call_choose_plan(choose_plan, job, args, no_fit=False):
    """choose_plan(*args), any exception turned into a named mistake; a call to best_plans (or to the teacher's search,
    where it is there) refused. ``no_fit``: the job no plan fits, where a ValueError is the answer (let through) and
    any other exception the mistake no_fit."""
    __tracebackhide__ = True
    # the planner's search, and the judge's own where the course holds it: a search the lab asks you to write
    targets = {planner.best_plans: "utils.planner.best_plans"}
    search = teacher_search()
    if search is not None:
        targets.update({search.lab_plans: "the judge's own search (labs.solutions.plan_3d_search.lab_plans)",
                        search.optimum: "the judge's own search (labs.solutions.plan_3d_search.optimum)"})
    by_code = {code_key(f.__code__): label for f, label in targets.items()}  # a code.replace() copy matches too

    def forbidden(frame, event, arg):
        return by_code.get(code_key(frame.f_code)) if event == "call" else None

    def planner_refused(err):  # a ValueError raised in the planner (Plan, estimate): a plan that does not divide
        tb = err.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        if not isinstance(err, ValueError):
            return None
        # the answer's own ValueError on a job that has a plan under the cap: its search missed every such plan
        return "divisibility" if "/planner/" in tb.tb_frame.f_code.co_filename else "none_found"

    how = dict(let_through=(ValueError,), mistake_of=lambda err: "no_fit") if no_fit else dict(mistake_of=planner_refused)
    plan, seen = watched_call(choose_plan, args, forbidden, where=f"{job}: choose_plan", hints=HINTS,
                              guard=Guard(targets.items()), **how)
    if seen:
        fail(HINTS, "used_best_plans", f"{job}: choose_plan called {seen}")
    return plan


def judge(plan, model, cluster, n_gpus, global_batch, precision, cap, job):
    """Raise LabCheckFailed naming the mistake unless ``plan`` is valid, under the cap and (one of) the fastest."""
    __tracebackhide__ = True
    if not isinstance(plan, planner.Plan):
        fail(HINTS, "not_a_plan", f"{job}: choose_plan returned {plan!r}")
    if (plan.global_batch, plan.precision) != (global_batch, precision):
        fail(HINTS, "job_changed", f"{job}: the plan has global_batch={plan.global_batch}, precision="
                                   f"{plan.precision!r}; the job is {global_batch}, {precision!r}")
    if (plan.cp, plan.ep) != (1, 1):  # before the mesh's size: a cp > 1 multiplies it
        sized = (f"dp x tp x pp x cp = {plan.dp} x {plan.tp} x {plan.pp} x {plan.cp} = {plan.world_size} GPUs, "
                 f"{'the job' if plan.world_size == n_gpus else 'but the job has'} {n_gpus}")
        fail(HINTS, "cp_ep", f"{job}: the plan has cp={plan.cp}, ep={plan.ep} ({sized}; the model has "
                             f"{getattr(model, 'n_experts', 0) or 'no'} experts)")
    if plan.world_size != n_gpus:
        fail(HINTS, "mesh_size", f"{job}: dp={plan.dp} x tp={plan.tp} x pp={plan.pp} = {plan.world_size} GPUs, "
                                 f"but the job has {n_gpus}")
    if cluster.gpus_per_node % plan.tp:
        fail(HINTS, "tp_across_nodes", f"{job}: tp={plan.tp} on nodes of {cluster.gpus_per_node} GPUs")
    default = planner.Plan(global_batch)
    if (plan.micro_batch not in SPACE["micro_batch"] or plan.v not in SPACE["v"] or (plan.v > 1 and plan.pp == 1)
            or plan.sequence_parallel != (plan.tp > 1) or (plan.schedule, plan.loss_parallel)
            != (default.schedule, default.loss_parallel)):
        fail(HINTS, "outside_space", f"{job}: {plan}")
    try:
        est = planner.estimate(model, plan, cluster)
    except ValueError as err:
        fail(HINTS, "divisibility", f"{job}: {err}")
    if est.memory.total > cap:
        fail(HINTS, "over_cap", f"{job}: {est.memory.total:,.0f} B per rank > the cap {cap:,.0f} B (the GPU has "
                                f"{cluster.memory_bytes:,.0f} B; fits={est.fits})")
    best_time, best_memory, best, strict_time = stored_optimum(job, model, cluster, n_gpus, global_batch, precision,
                                                               cap)
    if est.step_time < best_time * (1 - 1e-9):
        fail(HINTS, "judge_wrong", f"{job}: your plan {plan} takes {est.step_time * 1e3:.4f} ms, under the stored "
                                   f"fastest {best_time * 1e3:.4f} ms ({best})")
    if est.step_time <= best_time * (1 + 1e-9):
        return est, best_time
    what = (f"{job}: your plan takes {est.step_time * 1e3:.3f} ms per step (bubble {est.bubble:.0%}); the fastest "
            f"under the cap takes {best_time * 1e3:.3f} ms: {best}")
    if best_memory == cap and strict_time is not None and est.step_time <= strict_time * (1 + 1e-9):
        fail(HINTS, "cap_strict", f"{what}; it fills the cap of {cap:,.0f} B exactly")
    search = teacher_search()
    if search is None and plan.pp > 1 and plan.microbatches < plan.pp:  # a formula on the learner's own plan
        fail(HINTS, "pipeline_starved", f"{what}; {plan.microbatches} micro-batches for {plan.pp} stages")
    if search is None:  # the release: the stored optimum, and how it differs from yours
        differ = [k for k, v in plan_knobs(best).items() if plan_knobs(plan)[k] != v]
        fail(HINTS, "not_fastest", f"{what}; it differs from yours in {', '.join(differ)}")
    # which knobs, held at the learner's values, explain the time: the search never varied them
    blamed = search.blame(plan, est, model, cluster, n_gpus, global_batch, precision, cap)
    if len(blamed) == 1:
        fail(HINTS, blamed[0], f"{what}; with your {blamed[0]} held, no plan is faster than yours")
    if blamed:
        raise LabCheckFailed("several", f"{what}; several mistakes share this symptom: holding any of "
                             f"{', '.join(blamed)} at your value gives your time:\n"
                             + "\n".join(f"- {k}: {HINTS[k]}" for k in blamed), HINTS["several"])
    fail(HINTS, "not_fastest", f"{what}; with any one or two of your knobs held, a faster plan remains: it differs "
                               "in several at once")


def check_choose_plan(choose_plan, cases=None):
    """Run choose_plan on every job of ``cases`` and judge each answer; a CheckResult says what was chosen. By default
    the lab's ``CASES``, and where the teacher's side is there (make grade) its ``HIDDEN_JOBS`` too, whose optima the
    release does not hold (twins of ``CASES``): an answer that looks plans up in ``OPTIMA`` is judged there on the
    search it falls back to."""
    __tracebackhide__ = True
    if cases is None:
        search = teacher_search()
        cases = CASES + (search.HIDDEN_JOBS if search is not None else [])
    lines = []
    for job, model, cluster, n_gpus, batch, precision, cap in cases:
        plan = call_choose_plan(choose_plan, job, (model, cluster, n_gpus, batch, precision, cap))
        est, best_time = judge(plan, model, cluster, n_gpus, batch, precision, cap, job)
        lines.append(f"{job}: dp={plan.dp} tp={plan.tp} pp={plan.pp} v={plan.v} micro_batch={plan.micro_batch} "
                     f"ZeRO-{plan.zero_stage} {plan.checkpointing}: {est.memory.total / 1e9:.4g} GB, "
                     f"{est.step_time * 1e3:.3f} ms (fastest {best_time * 1e3:.3f} ms)")
    lines.append(_no_fit(choose_plan, NO_FIT))
    return CheckResult("choose_plan: valid, under the cap, fastest by the planner", lines)


def _no_fit(choose_plan, case):
    """The job no plan fits: choose_plan must raise its own ValueError (one the planner raised is ``divisibility``),
    whose message names a number (a heuristic: any digit passes; the lab asks for the cap and the numbers); anything
    else is the mistake ``no_fit``."""
    __tracebackhide__ = True
    job, *args = case
    outcome = _no_fit_outcome(choose_plan, job, args)
    if isinstance(outcome, tuple) and outcome[0] == "raised":
        _, message, in_planner = outcome
        if in_planner:  # the planner refused a plan the search built
            fail(HINTS, "divisibility", f"{job}: the ValueError came from the planner, not from your search: "
                 f"{message[:160]}")
        if not re.search(r"\d", message):
            fail(HINTS, "no_fit", f"{job}: no plan fits and choose_plan raised ValueError({message[:120]!r}), "
                 "which names no number: say the cap and what the smallest plan needs.")
        return f"{job}: no plan fits; raised ValueError: {message[:120]}"
    plan = outcome[1] if isinstance(outcome, tuple) else outcome
    fail(HINTS, "no_fit", f"{job}: no plan of the lab's space is under the cap, but choose_plan returned {plan!r}")


@answer_side
def _no_fit_outcome(choose_plan, job, args):
    """Where the answer runs: ("returned", its plan), or ("raised", the ValueError's message, raised in the planner?)."""
    __tracebackhide__ = True
    try:
        return "returned", call_choose_plan(choose_plan, job, args, no_fit=True)
    except ValueError as err:
        tb = err.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        return "raised", str(err), "/planner/" in tb.tb_frame.f_code.co_filename.replace("\\", "/")


# ---------------------------------------------------------------- the plan's mesh on CPU ranks (notebook 09's step)

def check_plan_run(choose_plan, world_size, steps=2, timeout=300):
    """Ask ``choose_plan`` (or take a Plan) for the tiny Llama on ``world_size`` CPU ranks under 400 kB; run it as it
    says (schedule, checkpointing; refuse what cannot run); check equality with one process and memory per rank.

    The ranks run none of the answer's code (issue 37, part 3): they get the plan, plain data judged against
    ``OPTIMA`` before they start, and no ``AnswerRef``, so the references may stay public (``parallelize3d.reference``,
    the planner's bytes): a class body that replaces the training step never reaches them (a test plants one)."""
    __tracebackhide__ = True
    job, *args = run_job(world_size)
    plan = choose_plan if isinstance(choose_plan, planner.Plan) else call_choose_plan(choose_plan, job, args)
    judge(plan, *args, job)
    why = unrunnable(plan)
    if why:
        fail(HINTS, "cannot_run", f"{job}: {plan}: {why}", world_size)
    ranks = launch_answer(parallelize3d.train, (plan, steps), world_size, timeout, "the plan's mesh",
                          "a rank waits for a message that never comes: see the stacks.")
    ref_losses, ref_grads = parallelize3d.reference(steps)
    got = {}
    for r in ranks:
        got.update({k: v for k, v in r["grads"].items() if k not in got})
    loss_diff = max(abs(a - b) for r in ranks for a, b in zip(r["losses"], ref_losses))
    if sorted(got) != sorted(ref_grads) or loss_diff > 1e-5 or not all(close(got[k], ref_grads[k], GRAD_TOL)
                                                                       for k in ref_grads):
        fail(HINTS, "not_equal", f"{job}: losses {ranks[0]['losses']} vs one process {ref_losses}", world_size)
    # FSDP2 on dp shards parameters, gradients and fp32 Adam state (ZeRO-3): 4 + 4 + 8 bytes per parameter, / dp
    zero3 = dataclasses.replace(plan, zero_stage=3)
    lines = [f"{job}: dp={plan.dp} tp={plan.tp} pp={plan.pp}, m={plan.microbatches}, {plan.schedule}, "
             f"checkpointing {plan.checkpointing}, {steps} steps: max |loss - one process| {loss_diff:.1e}, "
             f"gradients equal (rtol {GRAD_TOL['rtol']:g})"]
    for rank, r in enumerate(ranks):
        psi = planner.stage_parameters(TINY, zero3, r["coords"][1])
        want = {k: v for k, v in zero_bytes_per_rank(psi, plan.dp, 3, 4, 4, 8).items() if k != "total"}
        want["optim"] += 4 * r["tensors"]  # + Adam's step counter, one fp32 scalar per tensor (not in the planner)
        if any(abs(r["memory"][k] - want[k]) > 1e-6 for k in want):
            fail(HINTS, "memory", f"{job}, rank {rank} (stage {r['coords'][1]}): measured {r['memory']}, "
                                  f"predicted {want}", world_size)
        lines.append(f"rank {rank} (stage {r['coords'][1]}): {sum(r['memory'].values()):,} B of parameters, gradients "
                     f"and Adam state = planner's {sum(want.values()):,.0f} B (Psi_stage = {psi:,})")
    return CheckResult("the plan trains like one process, as it says, and holds what the planner predicts", lines)
