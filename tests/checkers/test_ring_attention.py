"""The ring-attention lab's checker (utils/checkers/ring_attention.py) accepts the reference and rejects planted
wrong answers.

labs/14_ring_attention_lab.ipynb asks for the online-softmax ``merge`` and the causal ``causal_block`` rule of
ring attention. Each classic mistake is planted here, and the test asserts that the checker names it
(``LabCheckFailed.mistake``) and says a phrase of its hint. The lab's notebook itself runs in
tests/test_notebooks.py.
"""

import functools
import inspect
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lab_grading import expect_raised, expect_rejection, graded_in_sandbox
from utils.course.notebook_runner import ROOT
from utils.checkers.guard import module_functions
from utils.checkers.ring_attention import RING_HINTS, _partials, check_ring_attention
from utils.context_parallel import ring as ring_module
from utils.context_parallel.ring import merge as the_lesson_merge
from utils.workshop.sandbox import available

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.ring_attention import causal_block, merge  # noqa: E402


def test_large_scores_overflow_a_naive_exp():
    """The checker's large case is large enough: e^l is inf in float32 there, so a merge must never form it."""
    ((_, l1), (_, l2)), _ = _partials(40.0, seed=40)
    assert l1.max() > 89 and l2.max() > 89
    assert not torch.isfinite(torch.exp(l1)).all() and not torch.isfinite(torch.exp(l2)).all()


def test_hints_point_without_giving_the_answer():
    """A hint names the mistake and points to the idea: none gives the merge's formulas or the zig-zag chunk map."""
    answers = ("exp(l1 - l)", "exp(l2 - l)", "log(e^l1", "e^(l1-m)", "logaddexp", "2n-1-r", "2n - 1 - r", "i > j",
               "i == j", "chunk r", "subtract the max", "all before", "all after")
    for mistake, hint in RING_HINTS.items():
        assert not [a for a in answers if a in hint], (mistake, hint)


# ------------------------------------------------------------------ wrong answers

def naive_merge(o1, l1, o2, l2):
    """Right at moderate scores; e^l overflows at large ones."""
    e1, e2 = torch.exp(l1), torch.exp(l2)
    return (o1 * e1 + o2 * e2) / (e1 + e2), torch.log(e1 + e2)


def subtracted_lse_merge(o1, l1, o2, l2):
    """The denominators subtracted, not added: the log of a negative number, nan, wherever l2 > l1."""
    l = l1 + torch.log1p(-torch.exp(l2 - l1))  # noqa: E741
    return o1 * torch.exp(l1 - l) + o2 * torch.exp(l2 - l), l


def averaged_merge(o1, l1, o2, l2):
    return (o1 + o2) / 2, torch.logaddexp(l1, l2)


def max_lse_merge(o1, l1, o2, l2):
    l = torch.logaddexp(l1, l2)  # noqa: E741
    return o1 * torch.exp(l1 - l) + o2 * torch.exp(l2 - l), torch.maximum(l1, l2)


def lesson_merge(o1, l1, o2, l2):
    from utils.context_parallel import merge as lesson

    return lesson((o1, l1), (o2, l2))


def sdpa_merge(o1, l1, o2, l2):
    """Asks torch's attention for something on the side: refused, whatever it does with it."""
    F.scaled_dot_product_attention(o1, o1, o1)
    return merge(o1, l1, o2, l2)


def sdpa_through_a_partial(o1, l1, o2, l2):
    """Bypass 5: a builtin called from C (a partial) emits no c_call for the hook."""
    functools.partial(F.scaled_dot_product_attention, o1, o1, o1)()
    return merge(o1, l1, o2, l2)


def lesson_merge_as_a_thread_target(o1, l1, o2, l2):
    """Bypass 3: in the ranks only (the kernel's check sees any call into the module), the lesson's merge itself the
    thread's target: its caller is threading's, not the answer's (only the guard sees it)."""
    if dist.is_initialized():
        worker = threading.Thread(target=ring_module.merge, args=((o1, l1), (o2, l2)))
        worker.start()
        worker.join()
    return merge(o1, l1, o2, l2)


def lesson_merge_as_a_pool_task(o1, l1, o2, l2):
    if dist.is_initialized():
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(ring_module.merge, (o1, l1), (o2, l2)).result()
    return merge(o1, l1, o2, l2)


def off_by_one_chunk(q_rank, q_part, k_rank, k_part, world_size, layout):
    """The diagonal one chunk late: chunk i sees chunk i - 1 as a triangle."""
    def chunk(rank, part):
        return rank if layout == "contiguous" else (rank if part == 0 else 2 * world_size - 1 - rank)

    i, j = chunk(q_rank, q_part), chunk(k_rank, k_part)
    return "full" if i > j + 1 else "diagonal" if i == j + 1 else "skip"


def library_pair(q_rank, q_part, k_rank, k_part, world_size, layout):
    """The library's own rule on the library's chunk map: right, and refused."""
    from utils.context_parallel import ring

    return ring._pair(ring.chunk_ids(q_rank, world_size, layout)[q_part],
                      ring.chunk_ids(k_rank, world_size, layout)[k_part], True)


def logaddexp_merge(o1, l1, o2, l2):
    """Finite at any scores without an explicit maximum: accepted (the checker asks for no overflow, not a recipe)."""
    l = torch.logaddexp(l1, l2)  # noqa: E741
    return o1 * torch.exp(l1 - l) + o2 * torch.exp(l2 - l), l


def zigzag_second_as_first(q_rank, q_part, k_rank, k_part, world_size, layout):
    """Compares ranks: right for contiguous, wrong for the zig-zag's second chunk (2n-1-r)."""
    return "full" if q_rank > k_rank else "diagonal" if q_rank == k_rank else "skip"


@pytest.mark.parametrize("wrong_merge, wrong_rule, mistake, phrase", [
    (naive_merge, causal_block, "overflow", "no huge number"),
    (subtracted_lse_merge, causal_block, "not_finite", "moderate scores"),  # once overflow, at any scores
    (averaged_merge, causal_block, "averaged", "not averaged"),
    (max_lse_merge, causal_block, "lse_max", "not max(l1, l2)"),
    (lesson_merge, causal_block, "used_library", "off limits"),
    (the_lesson_merge, causal_block, "used_library", "off limits"),
    (sdpa_merge, causal_block, "used_library", "scaled_dot_product_attention"),
    (sdpa_through_a_partial, causal_block, "used_library", "scaled_dot_product_attention"),
    (lesson_merge_as_a_thread_target, causal_block, "used_library", "called the lesson's merge (utils"),
    (lesson_merge_as_a_pool_task, causal_block, "used_library", "called the lesson's merge (utils"),
    (merge, library_pair, "used_library", "chunk_ids (utils.context_parallel.ring)"),
    (merge, off_by_one_chunk, "off_by_one_chunk", "off by one chunk"),
    (merge, zigzag_second_as_first, "zigzag_second_chunk", "not the ranks"),
], ids=["naive_merge", "subtracted_lse_merge", "averaged_merge", "max_lse_merge", "lesson_merge",
        "the_lesson_merge_itself", "sdpa_merge", "sdpa_through_a_partial", "thread_target_in_ranks",
        "pool_task_in_ranks", "library_pair", "off_by_one_chunk", "zigzag_second_as_first"])
def test_rejects(wrong_merge, wrong_rule, mistake, phrase):
    targets = [(f, f.__code__) for f in module_functions(ring_module)]
    sdpa = F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention
    expect_rejection(check_ring_attention, wrong_merge, wrong_rule, world_sizes=(2,), mistake=mistake, phrase=phrase)
    assert [f for f, code in targets if f.__code__ is not code] == []  # every target put back
    assert (F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention) == sdpa


def test_detached_merge_gives_wrong_gradients():
    """A merge that drops the graph passes the merge checks and fails on the ring's gradients."""
    def detached(o1, l1, o2, l2):
        o, l = merge(o1, l1, o2, l2)
        return o.detach(), l.detach()

    expect_rejection(check_ring_attention, detached, causal_block, world_sizes=(2,), mistake="wrong_gradient")


def test_a_merge_without_overflow_passes_the_merge_checks():
    """The large case tests that no exponential overflows, whatever the merge's recipe (here torch.logaddexp)."""
    from utils.checkers.ring_attention import check_merge

    assert len(check_merge(logaddexp_merge)) == 2


# ------------------------------------------------------------------ an exception in the answer's own code


def merge_shape_error(o1, l1, o2, l2):
    return o1 @ o2, l1  # planted: a shape RuntimeError


def merge_raising_in_the_ring(o1, l1, o2, l2):
    if o1.dtype == torch.float64:  # the ring runs in float64, the merge checks in float32
        raise IndexError("planted: only in the ring")
    return merge(o1, l1, o2, l2)


@pytest.mark.parametrize("wrong, line", [
    (merge_shape_error, "return o1 @ o2, l1  # planted"),
    (merge_raising_in_the_ring, 'raise IndexError("planted: only in the ring")'),
], ids=["in the kernel", "in the ranks"])
def test_an_exception_in_the_answer_is_named_with_its_line(wrong, line):
    expect_raised(check_ring_attention, wrong, causal_block, world_sizes=(2,), line=line)


# ------------------------------------------------------------------ an answer that replaces the checker's rank function

# Issue 37, part 3: in the grader, the learner's code runs in each rank, beside the checker's rank function, and can
# replace it. The merge and the rule are checked first, in the answer's process, against what the judge computes, so a
# forger needs pieces that pass there: here a merge of the right values cut off the graph (the ring's gradients would
# show it: wrong_gradient). Each rank holds its own tokens of q, k, v only (utils.checkers.rank_secrets), and the
# checker computes the attention itself: what one rank can compute alone is a mistake, and a report of another shape
# is not a report.
FORGER = '''import torch
import utils.checkers.ring_attention as _ra


def _forged(merge, causal_block, cases, shards):
    import torch.distributed as dist
    from utils.context_parallel.ring import positions
    rank, n, results = dist.get_rank(), dist.get_world_size(), []
    for (causal, layout), (q, k, v, dout) in zip(cases, shards):
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        if causal:
            where = positions(rank, n, 4 * n, layout)
            scores = scores.masked_fill(where[:, None] < where[None, :], float("-inf"))
        o = torch.softmax(scores, -1) @ v  # over its own keys: all that one rank holds
        o.backward(dout)
        results.append([o.detach(), GRAD, k.grad, v.grad])
    report = dict(error=None, results=results, seen=None, tampered=[])
    return REPORT


class _Patch:  # in the rank: the checker's own rank function replaced
    _ra._ring.__code__ = _forged.__code__


def merge(o1, l1, o2, l2):
    l = torch.logaddexp(l1, l2)
    return (o1 * torch.exp(l1 - l) + o2 * torch.exp(l2 - l)).detach(), l.detach()
'''
FORGED_RANKS = {
    "its_own_keys_attention": (FORGER.replace("GRAD", "q.grad").replace("REPORT", "report"), "wrong_output"),
    "no_report": (FORGER.replace("GRAD", "q.grad").replace("REPORT", "[]"), "not_a_report"),
    "other_fields": (FORGER.replace("GRAD", "q.grad").replace("REPORT", "dict(report, passed=True)"),
                     "not_a_report"),
    "a_gradient_of_another_shape": (FORGER.replace("GRAD", "q.grad[..., :1]").replace("REPORT", "report"),
                                    "not_a_report"),
}
RULE = inspect.getsource(causal_block)  # the reference's rule: it passes, as the forger needs


@pytest.mark.skipif(available() is not None, reason="the grader's sandbox (bubblewrap) does not run here")
@pytest.mark.parametrize("kind", sorted(FORGED_RANKS))
def test_an_answer_that_replaces_the_checkers_rank_function_does_not_pass(tmp_path, kind):
    source, wanted = FORGED_RANKS[kind]
    lab = "14_ring_attention_lab"
    verdict = graded_in_sandbox(tmp_path, lab, {"merge": source, "causal_block": RULE})
    # not wrong_gradient, what its merge gives in the checker's own rank function: the forged function ran instead
    assert verdict.verdict == "mistake" and verdict.mistake == wanted, (verdict.label, verdict.message[:2000])
