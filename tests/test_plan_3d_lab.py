"""The 3-D plan lab's checker (utils/checkers/plan_3d.py) accepts the reference and rejects planted wrong answers.

Lab 09 asks for ``choose_plan(model, cluster, n_gpus, global_batch, precision)``: the fastest plan by
``utils.planner.estimate`` among the valid ones that fit, found without ``best_plans``. Each wrong answer below
is a classic way to lay out a mesh; the test asserts that the checker names the mistake and says the key phrase
of its hint. The plan's run on ranks is checked once (2 ranks); the lab's notebook runs in test_notebooks.py.
"""

import dataclasses
import sys

import pytest

from lab_grading import expect_rejection
from notebook_runner import ROOT
from utils.checkers.plan_3d import CASES, TINY, TINY_BATCH, check_choose_plan, check_plan_run, tiny_cluster
from utils.planner import CHECKPOINTING, Plan, best_plans, estimate

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.plan_3d import choose_plan, divisors  # noqa: E402


def _search(model, cluster, n_gpus, global_batch, precision, *, zero_stages=(0, 1, 2, 3), keep=None, tps=None,
            fits=True, catch=True):
    """The reference's loops, with knobs that plant each mistake."""
    best = None
    for tp in tps or [t for t in divisors(cluster.gpus_per_node) if n_gpus % t == 0]:
        for pp in divisors(n_gpus // tp):
            for zero in (z for z in zero_stages if pp == 1 or z <= 1):
                for v in (1, 2) if pp > 1 else (1,):
                    for mb in (1, 2, 4):
                        for ckpt in CHECKPOINTING:
                            try:
                                plan = Plan(global_batch, mb, n_gpus // (tp * pp), tp, pp, v, zero, precision, ckpt,
                                            tp > 1)
                            except ValueError:
                                continue
                            if not catch:
                                est = estimate(model, plan, cluster)
                            else:
                                try:
                                    est = estimate(model, plan, cluster)
                                except ValueError:
                                    continue
                            if (est.fits or not fits) and (keep is None or keep(plan)) and (
                                    best is None or est.step_time < best[0]):
                                best = (est.step_time, plan)
    return best[1]


def calls_best_plans(model, cluster, n_gpus, global_batch, precision="bf16"):
    return best_plans(model, cluster, n_gpus, global_batch, precision=precision, micro_batches=(1, 2, 4))[0][1]


def tp_everywhere(model, cluster, n_gpus, global_batch, precision="bf16"):
    """'Tensor parallelism is the fastest': one tp group of every GPU, across the nodes."""
    return Plan(global_batch, 1, 1, n_gpus, 1, precision=precision, sequence_parallel=n_gpus > 1)


def one_big_microbatch(model, cluster, n_gpus, global_batch, precision="bf16"):
    """Megatron's layout (tp in the node, pp across nodes), but the whole batch as one micro-batch (m=1 < p),
    recomputed so that it fits."""
    tp = cluster.gpus_per_node
    return Plan(global_batch, global_batch, 1, tp, n_gpus // tp, precision=precision, checkpointing="full",
                sequence_parallel=tp > 1)


def megatron_layout(model, cluster, n_gpus, global_batch, precision="bf16"):
    """tp = GPUs per node whatever the model: 12 heads on 8 GPUs per node do not divide."""
    tp = cluster.gpus_per_node
    return Plan(global_batch, 1, 1, tp, n_gpus // tp, precision=precision, sequence_parallel=tp > 1)


def fsdp_everywhere(model, cluster, n_gpus, global_batch, precision="bf16"):
    """ZeRO-3 (FSDP) on every plan, 'to save memory', where ZeRO-1 fits."""
    return _search(model, cluster, n_gpus, global_batch, precision, zero_stages=(3,), keep=lambda p: p.pp == 1)


def ignores_memory(model, cluster, n_gpus, global_batch, precision="bf16"):
    return _search(model, cluster, n_gpus, global_batch, precision, fits=False)


def one_node(model, cluster, n_gpus, global_batch, precision="bf16"):
    """Plans for the GPUs of one node: the other nodes sit idle."""
    return choose_plan(model, cluster, cluster.gpus_per_node, global_batch, precision)


def uncaught(model, cluster, n_gpus, global_batch, precision="bf16"):
    """Every pp and v tried, the planner's ValueError (layers % (pp v)) not caught."""
    return _search(model, cluster, n_gpus, global_batch, precision, catch=False)


def data_parallel_only(model, cluster, n_gpus, global_batch, precision="bf16"):
    return _search(model, cluster, n_gpus, global_batch, precision, tps=[1], keep=lambda p: p.pp == 1)


def changes_precision(model, cluster, n_gpus, global_batch, precision="bf16"):
    return choose_plan(model, cluster, n_gpus, global_batch, "bf16")


def hard_coded(model, cluster, n_gpus, global_batch, precision="bf16"):
    """The lab's own answer, whatever the job."""
    return Plan(TINY_BATCH, 1, 1, 2, 2, precision="fp32", sequence_parallel=True)


def stub(model, cluster, n_gpus, global_batch, precision="bf16"):
    raise NotImplementedError("choose_plan is not written yet")


def test_reference_passes():
    result = check_choose_plan(choose_plan)
    assert len(result.lines) == len(CASES), result


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (calls_best_plans, "used_best_plans", "write the search yourself"),
    (tp_everywhere, "tp_across_nodes", "inside a node"),
    (one_big_microbatch, "pipeline_starved", "m >= p"),
    (megatron_layout, "divisibility", "whole heads"),
    (fsdp_everywhere, "zero_too_high", "lowest ZeRO stage that fits"),
    (ignores_memory, "does_not_fit", "the largest term is"),
    (one_node, "mesh_size", "dp * tp * pp must equal n_gpus"),
    (uncaught, "divisibility", "try/except ValueError"),
    (data_parallel_only, "not_fastest", "every tp dividing gpus_per_node"),
    (changes_precision, "job_changed", "precision=precision"),
    (hard_coded, "job_changed", "keep the job you were given"),
], ids=lambda v: getattr(v, "__name__", None))
def test_choose_plan_rejects(wrong, mistake, phrase):
    expect_rejection(check_choose_plan, wrong, mistake=mistake, phrase=phrase)


def test_stub_raises_its_own_error():
    with pytest.raises(NotImplementedError, match="not written yet"):
        check_choose_plan(stub)


def test_every_case_has_a_plan_and_the_tiny_one_fits_at_every_lab_size():
    for ws in (2, 4, 8):
        plan = choose_plan(TINY, tiny_cluster(ws), ws, TINY_BATCH, "fp32")
        assert plan.world_size == ws and estimate(TINY, plan, tiny_cluster(ws)).fits
        assert dataclasses.replace(plan, zero_stage=0).dp == 1  # the tiny job is a pipeline: see the lab


def test_run_rejects_a_mesh_of_the_wrong_size_before_launching():
    plan = Plan(TINY_BATCH, 1, 1, 2, 2, precision="fp32", sequence_parallel=True)
    expect_rejection(check_plan_run, plan, 2, mistake="mesh_size")


def test_run_of_the_reference_plan():
    plan = choose_plan(TINY, tiny_cluster(2), 2, TINY_BATCH, "fp32")
    result = check_plan_run(plan, 2, steps=1)
    assert "gradients equal" in str(result) and "rank 1 (stage 1)" in str(result), result
