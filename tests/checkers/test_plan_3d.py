"""The 3-D plan lab's checker (utils/checkers/plan_3d.py) accepts the reference and rejects planted wrong answers.

Lab 09 asks for ``choose_plan(model, cluster, n_gpus, global_batch, precision, memory_cap)``: the fastest plan
by ``utils.planner.estimate`` among the valid ones of the lab's space holding at most ``memory_cap`` bytes per
rank, found without ``best_plans``. Each planted answer stands for a kind of checker weakness: a search on fewer
knobs (the jobs' optima need every knob), an exception from the learner's code, a mistake whose symptom several
mistakes share, a boundary size (a plan that exactly fills the cap, batches that do not divide), a judge whose
own search is wrong, a plan the run cannot honour. The checker judges by a stored table of optima (``OPTIMA``): here
it is recomputed with the teacher's search (labs/solutions/plan_3d_search.py), and the checker is run as the student
release runs it, without that module. The lab's notebook runs in test_notebooks.py.
"""

import copy
import dataclasses
import functools
import sys
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

from lab_grading import expect_raised, expect_rejection, graded_in_sandbox
from utils.course.notebook_runner import ROOT
from utils.checkers import plan_3d
from utils.checkers.plan_3d import CASES, TINY, TINY_BATCH, check_choose_plan, check_plan_run, tiny_cluster
from utils.planner import CHECKPOINTING, Plan, best_plans, estimate
from utils.workshop.sandbox import available
from utils.workshop.submissions import reference_source

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.plan_3d import choose_plan, divisors  # noqa: E402

search = plan_3d.teacher_search()  # the teacher's side of the checker: its search and its diagnosis


def _search(model, cluster, n_gpus, global_batch, precision, cap, *, zero_stages=(0, 1, 2, 3), ckpts=CHECKPOINTING,
            chunks=(1, 2), mbs=(1, 2, 4), tps=None, pps=None, keep=lambda plan: True, under=lambda total, cap: total <= cap,
            catch=True):
    """The reference's loops, with knobs that plant each mistake."""
    best = None
    for tp in tps or [t for t in divisors(cluster.gpus_per_node) if n_gpus % t == 0]:
        for pp in pps or divisors(n_gpus // tp):
            for zero in zero_stages:
                for v in (c for c in chunks if c == 1 or pp > 1):
                    for mb in mbs:
                        for ckpt in ckpts:
                            if catch:
                                try:
                                    plan = Plan(global_batch, mb, n_gpus // (tp * pp), tp, pp, v, zero, precision,
                                                ckpt, tp > 1)
                                    est = estimate(model, plan, cluster)
                                except ValueError:
                                    continue
                            else:
                                plan = Plan(global_batch, mb, n_gpus // (tp * pp), tp, pp, v, zero, precision, ckpt,
                                            tp > 1)
                                est = estimate(model, plan, cluster)
                            if under(est.memory.total, cap) and keep(plan) and (best is None or est.step_time < best[0]):
                                best = (est.step_time, plan)
    if best is None:
        raise ValueError(f"no plan of {n_gpus} GPUs fits under {cap:,.0f} B")
    return best[1]


def planted(**knobs):
    def answer(model, cluster, n_gpus, global_batch, precision, cap):
        return _search(model, cluster, n_gpus, global_batch, precision, cap, **knobs)
    return answer


# kind: a search on fewer knobs (each passes only if the jobs were optimal at that knob's default)
old_rule = planted(keep=lambda p: p.pp == 1 or p.zero_stage <= 1)  # "ZeRO-2/3 with a pipeline reduce every micro-batch"
no_zero = planted(zero_stages=(0,))
no_recompute = planted(ckpts=("none",))
no_interleaving = planted(chunks=(1,))
no_tp = planted(tps=[1])
no_pipeline = planted(pps=[1])
no_small_micro_batches = planted(mbs=(2, 4))  # "larger micro-batches fill the GPU": m shrinks, the bubble grows
# kind: a named mistake whose symptom several mistakes share
fsdp_and_full_recompute = planted(zero_stages=(3,), ckpts=("full",))
# kind: boundary sizes
strict_cap = planted(under=lambda total, cap: total < cap)  # a plan that fills the cap exactly is refused
uncaught = planted(catch=False)  # Plan(...) raises when dp * micro_batch does not divide the batch of 24
ignores_cap = planted(under=lambda total, cap: total <= 80e9 if cap > 1e6 else total <= cap)  # the GPU's memory


no_zero_2 = planted(zero_stages=(0, 1, 3))  # found by make mutants: passed every job until a job needed ZeRO-2
no_zero_3 = planted(zero_stages=(0, 1, 2))  # the same for ZeRO-3


def none_when_nothing_fits(model, cluster, n_gpus, global_batch, precision, cap):
    """The search, but None where the lab asks for a ValueError (the reference's raise dropped)."""
    try:
        return _search(model, cluster, n_gpus, global_batch, precision, cap)
    except ValueError:
        return None


def index_error_when_nothing_fits(model, cluster, n_gpus, global_batch, precision, cap):
    plans = [] if cap == 1e9 else [_search(model, cluster, n_gpus, global_batch, precision, cap)]  # the no-fit job
    return plans[0]  # an IndexError, not the ValueError the lab asks for


def unnamed_when_nothing_fits(model, cluster, n_gpus, global_batch, precision, cap):
    try:
        return _search(model, cluster, n_gpus, global_batch, precision, cap)
    except ValueError:
        raise ValueError("nothing fits") from None  # the lab asks for the numbers


def planner_error_when_nothing_fits(model, cluster, n_gpus, global_batch, precision, cap):
    """On the no-fit job, the planner's own ValueError escapes (a plan whose micro-batches do not divide the batch),
    not a search's verdict: once accepted as the ValueError the lab asks for."""
    if cap == 1e9:
        return estimate(model, Plan(global_batch, 7, n_gpus, 1, 1, 1, 0, precision, "none", False), cluster)
    return _search(model, cluster, n_gpus, global_batch, precision, cap)


def calls_best_plans(model, cluster, n_gpus, global_batch, precision, cap):
    return best_plans(model, dataclasses.replace(cluster, memory_bytes=cap), n_gpus, global_batch,
                      precision=precision)[0][1]


def calls_the_judges_search(model, cluster, n_gpus, global_batch, precision, cap):
    return search.optimum(model, cluster, n_gpus, global_batch, precision, cap)[1]  # where a course holds it


_POOL = ThreadPoolExecutor(1)  # a pool started "in an earlier cell": its thread never had the checker's hook
_POOL.submit(int).result()
_BEST_PLANS_COPY = types.FunctionType(best_plans.__code__.replace(co_firstlineno=1), best_plans.__globals__,
                                      "my_search", best_plans.__defaults__)  # a copy: unequal to best_plans' code
_BEST_PLANS_COPY.__kwdefaults__ = best_plans.__kwdefaults__


def best_plans_in_an_old_pool(model, cluster, n_gpus, global_batch, precision, cap):
    return _POOL.submit(calls_best_plans, model, cluster, n_gpus, global_batch, precision, cap).result()


def best_plans_copied(model, cluster, n_gpus, global_batch, precision, cap):
    return _BEST_PLANS_COPY(model, dataclasses.replace(cluster, memory_bytes=cap), n_gpus, global_batch,
                            precision=precision)[0][1]


def best_plans_refusal_caught(model, cluster, n_gpus, global_batch, precision, cap):
    """The hook switched off unseen (a partial: no c_call event) and the refusal caught: only the guard's record
    can name it."""
    hook = functools.partial(sys.getprofile)()
    functools.partial(sys.setprofile, None)()
    try:
        return calls_best_plans(model, cluster, n_gpus, global_batch, precision, cap)
    except BaseException:  # noqa: BLE001 - planted: the answer hides the refusal and answers anyway
        return choose_plan(model, cluster, n_gpus, global_batch, precision, cap)
    finally:
        functools.partial(sys.setprofile, hook)()


def one_big_microbatch(model, cluster, n_gpus, global_batch, precision, cap):
    """The largest micro-batch 'to fill the GPU' in a pipeline: on the batch of 24, m = 24 / (2 * 4) = 3 < p = 4."""
    if global_batch == 24:
        return Plan(global_batch, 4, 2, 1, 4, 1, 1, precision, "full")
    return choose_plan(model, cluster, n_gpus, global_batch, precision, cap)


def tp_everywhere(model, cluster, n_gpus, global_batch, precision, cap):
    return Plan(global_batch, 1, 1, n_gpus, 1, precision=precision, sequence_parallel=n_gpus > 1)


def one_node(model, cluster, n_gpus, global_batch, precision, cap):
    return choose_plan(model, cluster, cluster.gpus_per_node, global_batch, precision, cap)


def changes_precision(model, cluster, n_gpus, global_batch, precision, cap):
    return choose_plan(model, cluster, n_gpus, global_batch, "bf16", cap)


def cp_outside_the_mesh(model, cluster, n_gpus, global_batch, precision, cap):
    """cp = 2 added to the best dp x tp x pp plan: the mesh is twice the job (once named mesh_size, whose hint says
    dp * tp * pp must equal n_gpus: it does)."""
    return dataclasses.replace(choose_plan(model, cluster, n_gpus, global_batch, precision, cap), cp=2)


def experts_split_on_dense(model, cluster, n_gpus, global_batch, precision, cap):
    """ep = 2 borrowed from dp wherever dp is even: the world is the job's, but there are no experts to split."""
    plan = choose_plan(model, cluster, n_gpus, global_batch, precision, cap)
    return dataclasses.replace(plan, ep=2) if plan.dp % 2 == 0 else plan


def own_bug(model, cluster, n_gpus, global_batch, precision, cap):
    """kind: an exception from the learner's own code (not the planner's)."""
    budget = {"fp32": cap}
    return choose_plan(model, cluster, n_gpus, global_batch, precision, budget[precision])


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (old_rule, "zero_stage", "with or without a pipeline"),
    (no_zero, "zero_stage", "try every ZeRO stage"),
    (no_zero_2, "zero_stage", "cap 1.7 GB"),
    (no_zero_3, "none_found", "cap 742 MB"),  # without ZeRO-3 nothing fits there
    (none_when_nothing_fits, "no_fit", "returned None"),
    (index_error_when_nothing_fits, "no_fit", "IndexError"),
    (unnamed_when_nothing_fits, "no_fit", "names no number"),
    (planner_error_when_nothing_fits, "divisibility", "came from the planner"),
    (no_recompute, "several", "several mistakes share this symptom"),  # mesh or checkpointing held
    (no_interleaving, "v", "interleaved"),
    (no_tp, "mesh", "every tp dividing"),
    (no_pipeline, "mesh", "every pp dividing"),
    (no_small_micro_batches, "micro_batch", "try every micro_batch"),
    (fsdp_and_full_recompute, "checkpointing", "with your checkpointing held"),  # ZeRO-3 costs nothing at dp=1
    (strict_cap, "cap_strict", "fills the cap exactly"),
    (uncaught, "divisibility", "try/except ValueError"),
    (ignores_cap, "over_cap", "memory.total <= memory_cap"),
    (calls_best_plans, "used_best_plans", "write the search yourself"),
    (calls_the_judges_search, "used_best_plans", "the judge's own search"),
    (best_plans_in_an_old_pool, "used_best_plans", "utils.planner.best_plans"),
    (best_plans_copied, "used_best_plans", "utils.planner.best_plans"),
    (best_plans_refusal_caught, "used_best_plans", "utils.planner.best_plans"),
    (one_big_microbatch, "pipeline_starved", "m >= p"),
    (tp_everywhere, "tp_across_nodes", "inside a node"),
    (one_node, "mesh_size", "dp * tp * pp must equal n_gpus"),
    (changes_precision, "job_changed", "precision=precision"),
    (own_bug, "raised", "KeyError"),
    (cp_outside_the_mesh, "cp_ep", "cp=2, ep=1 (dp x tp x pp x cp"),
    (experts_split_on_dense, "cp_ep", "cp=1, ep=2"),
], ids=lambda v: getattr(v, "__name__", None))
def test_choose_plan_rejects(wrong, mistake, phrase):
    codes = [f.__code__ for f in (best_plans, search.lab_plans, search.optimum)]
    expect_rejection(check_choose_plan, wrong, mistake=mistake, phrase=phrase)
    assert [f.__code__ for f in (best_plans, search.lab_plans, search.optimum)] == codes  # put back


def test_a_judge_that_misses_plans_says_so(monkeypatch):
    """kind: a judge that trusts its own optimum. With GPT-2 small's row written by a search with the old rule (no
    ZeRO-2/3 inside a pipeline), the reference (ZeRO-2 inside a pipeline) is faster than the stored 'fastest': the
    checker blames itself."""
    full = search.lab_plans
    monkeypatch.setattr(search, "lab_plans", lambda *a: ((p, e) for p, e in full(*a) if p.pp == 1 or p.zero_stage <= 1))
    job, *args = CASES[1]
    monkeypatch.setitem(plan_3d.OPTIMA, job, search.optimum_row(*args))
    expect_rejection(check_choose_plan, choose_plan, mistake="judge_wrong", phrase="not your mistake")


def test_the_stored_optima_are_the_searchs():
    """OPTIMA, the numbers the shipped checker judges by, is what the teacher's search finds for every job, to the last
    bit; a planted change of one stored number (a byte of one job's memory) is found."""
    found = search.optima()
    stale = search.differences(plan_3d.OPTIMA, found)
    assert stale == [], ("OPTIMA in utils/checkers/plan_3d.py is not what the search finds: paste the output of "
                         "`python -m labs.solutions.plan_3d_search` there.\n" + "\n".join(stale))
    assert sorted(found) == sorted(job for job, *_ in plan_3d.JOBS)
    planted = copy.deepcopy(plan_3d.OPTIMA)
    job = CASES[3][0]
    planted[job]["memory"] += 1
    assert [line.split(":")[0] for line in search.differences(planted, found)] == [job]


def test_every_fastest_plan_of_step_2_is_runnable():
    """Step 2 judges, then runs, the tiny job's plan: at every lab size lesson 09's step can run every fastest plan
    under the cap (ties included: ZeRO stages at dp = 1), so a right answer is never refused as cannot_run."""
    for world_size in plan_3d.RUN_SIZES:
        job, model, cluster, n_gpus, batch, precision, cap = plan_3d.run_job(world_size)
        best = plan_3d.OPTIMA[job]["step_time"]
        fastest = [p for p, e in search.lab_plans(model, cluster, n_gpus, batch, precision)
                   if e.memory.total <= cap and e.step_time <= best * (1 + 1e-9)]
        assert fastest and all(plan_3d.unrunnable(p) == "" for p in fastest), (job, fastest)


@pytest.fixture
def as_released(monkeypatch, tmp_path):
    """The checker as the student release runs it: the teacher's search is not there to import."""
    monkeypatch.setattr(plan_3d, "SEARCH", tmp_path / "plan_3d_search.py")
    assert plan_3d.teacher_search() is None


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (no_interleaving, "not_fastest", "it differs from yours in v"),  # "v" with the teacher's diagnosis
    (old_rule, "not_fastest", "it differs from yours in zero_stage"),  # "zero_stage" there, by name
    (strict_cap, "cap_strict", "fills the cap exactly"),  # judged from the stored strict optimum
    (ignores_cap, "over_cap", "memory.total <= memory_cap"),
    (calls_best_plans, "used_best_plans", "write the search yourself"),
], ids=lambda v: getattr(v, "__name__", None))
def test_as_released_a_slower_plan_is_not_fastest(as_released, wrong, mistake, phrase):
    expect_rejection(check_choose_plan, wrong, mistake=mistake, phrase=phrase)


def test_as_released_the_reference_passes(as_released):
    result = check_choose_plan(choose_plan)
    assert str(result).count("(fastest ") == len(CASES), result


def test_the_tiny_job_has_a_runnable_plan_at_every_lab_size():
    for ws in (2, 4, 8):
        plan = choose_plan(TINY, tiny_cluster(ws), ws, TINY_BATCH, "fp32", 400e3)
        assert plan.world_size == ws and estimate(TINY, plan, tiny_cluster(ws)).memory.total <= 400e3
        assert plan_3d.unrunnable(plan) == "", plan


@pytest.mark.parametrize("plan, phrase", [
    (Plan(TINY_BATCH, 1, 1, 1, 2, 2, 0, "fp32", "none"), "v=2"),
    (Plan(TINY_BATCH, 1, 1, 1, 2, 1, 0, "fp32", "selective"), "selective"),
    (Plan(TINY_BATCH, 1, 2, 1, 1, 1, 1, "fp32", "full"), "ZeRO-1 with dp=2"),
])
def test_run_refuses_what_it_cannot_honour(plan, phrase):
    """kind: a knob the run would ignore. Refused before launching (the plan need not be the fastest to be refused:
    unrunnable() is what check_plan_run asks after the judge)."""
    assert phrase in plan_3d.unrunnable(plan)


def test_run_rejects_a_mesh_of_the_wrong_size_before_launching():
    plan = Plan(TINY_BATCH, 1, 1, 2, 2, precision="fp32", sequence_parallel=True)
    expect_rejection(check_plan_run, plan, 2, mistake="mesh_size")


@pytest.mark.slow
def test_run_of_the_reference_plan():
    result = check_plan_run(choose_plan, 2, steps=1)
    assert "gradients equal" in str(result) and "rank 1 (stage 1)" in str(result) and "1F1B" in str(result), result


# Issue 37, part 3: a class body that replaces a checker's rank function, here the step that trains the plan
# (utils.mesh.parallelize3d.train), with one that reports the single-process result anyone can compute (its inputs are
# public: make_model's seed, make_batch's). It cannot matter here: check_plan_run's ranks get the plan (plain data,
# judged against OPTIMA before any rank starts) and no handle on the answer, so no answer's code runs beside them.
RUN_FORGER = '''
import utils.mesh.parallelize3d as _p3d

def _forged(plan, steps, measure_step=1, lr=None, compile_backend=None):
    from utils.mesh.parallelize3d import reference
    losses, grads = reference(steps, lr)
    return REPORT

class _Patch:  # wherever the notebook's definitions run: the course's training step replaced
    _p3d.train.__code__ = _forged.__code__
'''
STUB = ('def choose_plan(model, cluster, n_gpus, global_batch, precision, memory_cap):\n'
        '    raise NotImplementedError("a stub")\n')
FORGED_RUNS = {  # name: (source, verdict)
    # a stub: its plan is asked for before any rank starts, so the forged step never runs
    "a_stub_with_the_reference_run": (STUB + RUN_FORGER.replace("REPORT", "dict(coords=(0, 0, 0), losses=losses, "
                                                                "grads=grads, memory={}, tensors=0)"), "not written"),
    # the right plan, and a step that reports nothing: were it run, the check would fail; it passes
    "the_right_plan_and_an_empty_run": (None, "pass"),
}


@pytest.mark.slow
@pytest.mark.skipif(available() is not None, reason="the ranks in the sandbox: bubblewrap does not run here")
@pytest.mark.parametrize("kind", sorted(FORGED_RUNS))
def test_a_class_body_that_replaces_the_runs_training_step_changes_nothing(tmp_path, kind):
    """Graded as the workshop grades (the judge outside the sandbox, the ranks inside)."""
    source, wanted = FORGED_RUNS[kind]
    lab = "09_plan_3d_lab"
    source = source or reference_source(lab) + RUN_FORGER.replace("REPORT", "[]")
    verdict = graded_in_sandbox(tmp_path, lab, {"choose_plan": source}, part=1, timeout=360)
    assert verdict.verdict == wanted, (verdict.label, verdict.message[:2000], verdict.output[-2000:])


@pytest.mark.slow
def test_micro_batch_one_is_the_optimum_of_every_job():
    """Why no planted answer is a search that keeps micro_batch at 1: that search is right on every job. The planner
    prices no per-kernel efficiency or per-message latency that a larger micro-batch would win back, so at equal
    other knobs a micro-batch of 1 has the smaller bubble and activations; it loses only where ZeRO-3 without a
    pipeline gathers the weights once per micro-batch, and no job's optimum is such a plan. If a job or the planner
    changes so that one is, this test fails, and a planted 'micro_batch = 1 only' answer belongs in the list above."""
    for job, *args in CASES:  # the stored optima: test_the_stored_optima_are_the_searchs holds them to the search
        best = plan_3d.stored_optimum(job, *args)[2]
        assert best.micro_batch == 1, f"{job}: the fastest plan uses micro_batch={best.micro_batch}: {best}"
    check_choose_plan(planted(mbs=(1,)))  # passes, as it should


def test_an_exception_in_the_answer_is_named_with_its_line():
    """own_bug's KeyError, raised in the answer's own line (not the planner's): that line is quoted."""
    expect_raised(check_choose_plan, own_bug, line="budget[precision])")


def test_an_answer_that_looks_up_the_stored_optima_fails_make_grade(monkeypatch):
    """OPTIMA ships with the release (numbers, not a search): a choose_plan that returns its rows passes the lab's
    own jobs in a learner's notebook, and the teacher's checkout rejects it on HIDDEN_JOBS, which the release holds
    no optimum of (issue 37, part 1)."""
    def looks_up(model, cluster, n_gpus, global_batch, precision, memory_cap):
        for job, *args in plan_3d.JOBS:
            if args == [model, cluster, n_gpus, global_batch, precision, memory_cap]:
                row = plan_3d.OPTIMA[job]["plan"]
                return Plan(global_batch, precision=precision, sequence_parallel=row["tp"] > 1, **row)
        raise ValueError(f"no plan under {memory_cap:,.0f} B")

    from utils.checkers.common import LabCheckFailed

    assert plan_3d.teacher_search() is not None
    with pytest.raises(LabCheckFailed, match="hidden twin"):
        plan_3d.check_choose_plan(looks_up)
    monkeypatch.setattr(plan_3d, "teacher_search", lambda: None)  # as in the release
    plan_3d.check_choose_plan(looks_up)


def _kind(row):
    p = row["plan"]
    return p["zero_stage"], p["checkpointing"], p["v"], p["micro_batch"], p["pp"] > 1, p["tp"] > 1


def test_each_hidden_job_is_a_twin_of_a_shipped_one():
    """Each of the teacher's HIDDEN_JOBS needs the knobs its CASES job needs, so it catches the same mistakes; the
    twin of the cap filled to the byte fills its own cap, with a strictly-under optimum for cap_strict."""
    assert len(search.HIDDEN_JOBS) == len(CASES)
    for (name, *job), (twin, *hidden) in zip(CASES, search.HIDDEN_JOBS):
        shipped, found = plan_3d.OPTIMA[name], search.optimum_row(*hidden)
        assert _kind(found) == _kind(shipped), (twin, found, shipped)
        assert hidden != job, twin  # a lookup keyed by the shipped jobs misses it
        if "strict" in shipped:
            assert found["memory"] == hidden[-1] and found.get("strict") is not None, (twin, found)


@pytest.mark.parametrize("wrong", [old_rule, no_zero, no_zero_2, no_zero_3, no_recompute, no_interleaving, no_tp,
                                   no_pipeline, no_small_micro_batches, fsdp_and_full_recompute, strict_cap,
                                   one_big_microbatch, ignores_cap], ids=lambda f: f.__name__)
def test_a_lookup_that_falls_back_to_a_wrong_search_fails_make_grade(wrong):
    """Review of issue 37, part 1: an answer that returns OPTIMA's rows for the shipped jobs and searches wrongly for
    any other passes a learner's notebook; on the teacher's HIDDEN_JOBS its search is judged, and rejected."""
    from utils.checkers.common import LabCheckFailed

    def looks_up(model, cluster, n_gpus, global_batch, precision, memory_cap):
        for job, *args in plan_3d.JOBS:
            if args == [model, cluster, n_gpus, global_batch, precision, memory_cap]:
                row = plan_3d.OPTIMA[job]["plan"]
                return Plan(global_batch, precision=precision, sequence_parallel=row["tp"] > 1, **row)
        return wrong(model, cluster, n_gpus, global_batch, precision, memory_cap)

    with pytest.raises(LabCheckFailed):
        plan_3d.check_choose_plan(looks_up, cases=search.HIDDEN_JOBS)
