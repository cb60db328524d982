"""Is an accepted mutant equivalent? One-process comparisons on the checker's inputs and on larger ones.

Each lab's oracle returns None when the mutant gives the same results as the expected ones, else the first
difference, in words. Two ingredients, whichever a lab has:

- ``SAME``: a comparison in this one process. Where the checker (or its teacher's side) exposes its own
  single-process answer it is the expected result (``labs.solutions.plan_3d_search.optimum``,
  ``zero_buckets.judge_buckets``); for the labs whose answer is a plain function (06, 14) the expected result is the
  unmutated reference, which the test suite holds to the checker's.
- ``LARGER``: the lab's own check again, every part, at a larger WORLD_SIZE and without ``smoke``: the checkers compare
  every rank's result with a single-process computation (``dist.all_reduce``'s sum, one-process DDP and Adam, the
  full cross-entropy, the reference of each hang program), so a mutant that passes there gives the same results on
  more ranks, more steps and, where the checker scales them, larger tensors.
"""

import random

import torch

from utils.checkers import plan_3d, zero_buckets

__all__ = ["SAME", "LARGER", "differences"]


def _same_value(a, b):
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-5, atol=1e-7, equal_nan=True)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return a == b


def _outcome(fn, *args):
    """What ``fn(*args)`` gives: ("value", v), or ("raises", the exception's type name)."""
    try:
        return "value", fn(*args)
    except Exception as err:  # a mutant may raise anything
        return "raises", type(err).__name__


def _compare(mutant, reference, calls):
    for args in calls:
        got, want = _outcome(mutant, *args), _outcome(reference, *args)
        if got[0] != want[0] or not _same_value(got[1], want[1]):
            return f"{reference.__name__}{tuple(args)!r:.120}: {got!r:.200} instead of {want!r:.200}"
    return None


def _pipeline(answers, reference):
    from utils.checkers.pipeline_schedule import CASES
    larger = [(p, m, v) for p in range(1, 9) for v in (1, 2, 3, 4) for m in (p, 2 * p, 3 * p, p + 1)]
    calls = [(r, p, m, v) for p, m, v in [*CASES, *larger] for r in range(p)]
    return _compare(answers["interleaved_one_f_one_b"], reference["interleaved_one_f_one_b"], calls)


def _ring_attention(answers, reference):
    """block_backward on the checker's own cases (ring_attention.CASES), several draws, in float32 and float64."""
    from utils.checkers.ring_attention import CASES, _case
    from utils.checkers.rank_secrets import generator

    calls = []
    for seed in range(3):
        for c, name in enumerate(CASES):
            for call in _case(name, generator(seed, c))[0]:
                for dtype in (torch.float32, torch.float64):
                    calls.append(tuple(t.to(dtype) if isinstance(t, torch.Tensor) else t for t in call.values()))
    return _compare(answers["block_backward"], reference["block_backward"], calls)


def _plan_cases():
    """The checker's jobs, then larger ones: more GPUs, other caps."""
    node4 = plan_3d.NODE4
    return [case[1:] for case in plan_3d.CASES] + [
        (plan_3d.GPT2_MEDIUM, plan_3d.planner.H100_NODE, 32, 128, "bf16", 20e9),
        (plan_3d.planner.LLAMA2_7B, node4, 16, 128, "bf16", 12e9),
        (plan_3d.planner.LLAMA2_7B, node4, 16, 32, "bf16", 40e9),
        (plan_3d.TINY, plan_3d.tiny_cluster(8), 8, plan_3d.TINY_BATCH, "fp32", 250e3),
    ]


def _plan_3d(answers, reference):
    for model, cluster, n, batch, precision, cap in _plan_cases():
        best, _ = plan_3d.teacher_search().optimum(model, cluster, n, batch, precision, cap)
        try:
            plan = answers["choose_plan"](model, cluster, n, batch, precision, cap)
            est = plan_3d.planner.estimate(model, plan, cluster)
        except Exception as err:  # a mutant may raise anything
            return f"{n} GPUs, cap {cap:.3g}: choose_plan raised {type(err).__name__}: {err}"
        if est.memory.total > cap or est.step_time != best.step_time:
            return (f"{n} GPUs, cap {cap:.3g}: {plan} takes {est.step_time:.4g} s and {est.memory.total:.4g} B; "
                    f"the optimum {best.step_time:.4g} s")
    return None


def _make_buckets(answers, reference):
    rng = random.Random(0)
    jobs = [([rng.randint(1, 5000) for _ in range(rng.randint(1, 60))], rng.choice((1, 7, 100, 1000, 5000, 10**6)))
            for _ in range(200)]
    for sizes, bucket_numel in jobs:
        params = [torch.zeros(size) for size in sizes]
        try:
            buckets = zero_buckets.bucket_indices(answers["make_buckets"], params, bucket_numel)
            zero_buckets.judge_buckets(sizes, buckets, bucket_numel, f"{len(sizes)} parameters, {bucket_numel}")
        except Exception as err:  # LabCheckFailed, or whatever the mutant raised
            return f"make_buckets on {len(sizes)} parameters, bucket_numel={bucket_numel}: {type(err).__name__}: " \
                   f"{str(err).splitlines()[0]:.200}"
    return None


SAME = {"06_pipeline_lab": _pipeline, "14_ring_attention_lab": _ring_attention, "09_plan_3d_lab": _plan_3d,
        "03_zero_lab": _make_buckets}
# The WORLD_SIZE each lab's parts run at again (their check cells add the sizes below it): beyond the suite's.
LARGER = {"01a_halving_reduce_scatter_lab": 8, "01b_doubling_all_gather_lab": 6, "02_ddp_lab": 4, "03_zero_lab": 4,
          "05_tensor_parallel_lab": 4, "11a_collective_hangs_lab": 4, "11b_send_and_ddp_hangs_lab": 4,
          "14_ring_attention_lab": 6}


def differences(lab, answers, reference):
    """None when the mutant's ``answers`` give the expected results everywhere the oracle looks, else the first
    difference. Raises nothing for a wrong mutant: a LabCheckFailed at the larger size is a difference."""
    if lab.name in SAME and (found := SAME[lab.name](answers, reference)):
        return found
    if lab.name in LARGER:
        n = LARGER[lab.name]
        for part in lab.parts:
            try:
                part.run(answers, world_size=n, smoke=False)
            except Exception as err:  # a mutant may raise anything
                return f"{part.name} at WORLD_SIZE={n}: {type(err).__name__}: {str(err).splitlines()[0]:.300}"
    return None
