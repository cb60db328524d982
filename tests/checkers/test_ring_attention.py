"""The ring-attention lab's checker (utils/checkers/ring_attention.py) accepts the reference and rejects planted
wrong answers.

labs/14_ring_attention_lab.ipynb asks for ``block_backward``: one key block's gradients, recomputed from the output
and the log-sum-exp, as the fused ring of ``utils.context_parallel.fused_ring`` needs them. Each classic mistake is
planted here, and the test asserts that the checker names it (``LabCheckFailed.mistake``) and says a phrase of its
hint. The lab's notebook itself runs in tests/test_notebooks.py.
"""

import functools
import inspect
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from lab_grading import expect_raised, expect_rejection, graded_in_sandbox
from utils.checkers.ring_attention import CASES, RING_HINTS, _case, check_block_backward, check_ring_attention
from utils.checkers.rank_secrets import generator
from utils.course.notebook_runner import ROOT
from utils.workshop.sandbox import available

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.ring_attention import block_backward  # noqa: E402


def test_large_scores_overflow_a_naive_exp():
    """The checker's large case is large enough: e^lse is inf in float32 there, so an answer must never form it."""
    calls, _, lse = _case("large scores", generator(7, 3))
    assert lse.max() > 89 and not torch.isfinite(torch.exp(calls[0]["lse"])).all()


def test_the_reference_passes_on_many_draws():
    """No right answer rejected by float32's rounding: 40 draws of every case (the check draws new ones each time;
    2,000 draws were measured when the tolerance was set: ANSWER_TOL's comment). Each call of the answer turns the
    guard on and off (about 30 ms), so more draws cost minutes."""
    for seed in range(40):
        assert len(check_block_backward(block_backward, seed=seed)) == len(CASES)


def test_hints_point_without_giving_the_answer():
    """A hint names the mistake and points to the idea: none gives the gradients' formulas."""
    answers = ("rowsum", "row sum", "dout * o", "o * dout", "exp(s - lse)", "exp(scores - lse)", "p * (", "P * (",
               "dp - ", "transpose(-2, -1) @ dout", "P^T", "dS", "times dout", "sum of dout", "dout times",
               "product of dout and o", "minus")
    for mistake, hint in RING_HINTS.items():
        assert not [a for a in answers if a in hint], (mistake, hint)


# ------------------------------------------------------------------ wrong answers, one per kind


def _scores(q, k, diagonal):
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if diagonal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return s


def _grads(p, q, k, v, dout, d, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    ds = p * (dout @ v.transpose(-2, -1) - d)
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, p.transpose(-2, -1) @ dout


def without_the_row_term(q, k, v, o, lse, dout, diagonal=False):
    """dS = P * dP: the softmax's own gradient left out (what autograd gives through exp(s - lse) with lse fixed)."""
    return _grads(torch.exp(_scores(q, k, diagonal) - lse), q, k, v, dout, 0)


def with_the_blocks_own_lse(q, k, v, o, lse, dout, diagonal=False):
    """A softmax over the block alone: right when one block holds every key."""
    s = _scores(q, k, diagonal)
    p = torch.exp(s - torch.logsumexp(s, -1, keepdim=True))
    return _grads(p, q, k, v, dout, (dout * o).sum(-1, keepdim=True))


def with_the_blocks_own_row_term(q, k, v, o, lse, dout, diagonal=False):
    """D summed over the block's keys: right when one block holds every key."""
    p = torch.exp(_scores(q, k, diagonal) - lse)
    return _grads(p, q, k, v, dout, (p * (dout @ v.transpose(-2, -1))).sum(-1, keepdim=True))


def without_the_mask(q, k, v, o, lse, dout, diagonal=False):
    return block_backward(q, k, v, o, lse, dout, diagonal=False)


def without_the_scale_in_the_scores(q, k, v, o, lse, dout, diagonal=False):
    p = torch.exp(_scores(q, k, diagonal) * q.shape[-1] ** 0.5 - lse)
    return _grads(p, q, k, v, dout, (dout * o).sum(-1, keepdim=True))


def without_the_scale_in_the_chain(q, k, v, o, lse, dout, diagonal=False):
    p = torch.exp(_scores(q, k, diagonal) - lse)
    return _grads(p, q, k, v, dout, (dout * o).sum(-1, keepdim=True), scale=1.0)


def dividing_by_e_to_the_lse(q, k, v, o, lse, dout, diagonal=False):
    """Right at moderate scores; e^lse overflows float32 at large ones."""
    p = torch.exp(_scores(q, k, diagonal)) / torch.exp(lse)
    return _grads(p, q, k, v, dout, (dout * o).sum(-1, keepdim=True))


def masked_by_multiplying(q, k, v, o, lse, dout, diagonal=False):
    """The mask as scores * keep + (-inf) * ~keep: -inf * 0 is nan, on the kept entries too."""
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if diagonal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        s = s * keep + float("-inf") * ~keep
    return _grads(torch.exp(s - lse), q, k, v, dout, (dout * o).sum(-1, keepdim=True))


def imprecise_at_large_scores(q, k, v, o, lse, dout, diagonal=False):
    """Planted directly: finite everywhere, right at moderate scores, 1% off where e^lse would overflow float32 (the
    kind a difference or a ratio of huge numbers gives)."""
    p = torch.exp(_scores(q, k, diagonal) - lse) * (1.01 if lse.max() > 88.7 else 1.0)
    return _grads(p, q, k, v, dout, (dout * o).sum(-1, keepdim=True))


def dq_through_the_wrong_side(q, k, v, o, lse, dout, diagonal=False):
    """dq from dS^T: a shape error unless the block is as long as the queries; the checker's blocks are not."""
    dq, dk, dv = block_backward(q, k, v, o, lse, dout, diagonal)
    return dk, dq, dv


def dk_and_dv_swapped(q, k, v, o, lse, dout, diagonal=False):
    dq, dk, dv = block_backward(q, k, v, o, lse, dout, diagonal)
    return dq, dv, dk


def scaling_dout_in_place(q, k, v, o, lse, dout, diagonal=False):
    """Right on this block, but the next block gets a scaled dout: the ring hands every block the same tensors."""
    scale = q.shape[-1] ** -0.5
    dout.mul_(scale)
    dq, dk, dv = block_backward(q, k, v, o, lse, dout / scale, diagonal)
    return dq, dk, dv


def torchs_own_backward(q, k, v, o, lse, dout, diagonal=False):
    """Torch's CPU flash-attention backward, given the saved output and log-sum-exp: the answer, refused."""
    aten = torch.ops.aten
    aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, o, lse.squeeze(-1), 0.0, False)
    return block_backward(q, k, v, o, lse, dout, diagonal)


def _flash_backward(q, k, v, o, lse, dout, diagonal):
    """Torch's CPU flash backward, reached without torch.ops: an operator kept from the JIT's registry."""
    op = torch._C._jit_get_operation("aten::_scaled_dot_product_flash_attention_for_cpu_backward")[0]
    return functools.partial(op, dout, q, k, v, o, lse.squeeze(-1), 0.0, diagonal)()


def torchs_backward_kept_by_jit(q, k, v, o, lse, dout, diagonal=False):
    """Past every Python attribute: only the dispatcher sees it (Guard's operators)."""
    _flash_backward(q, k, v, o, lse, dout, diagonal)
    return block_backward(q, k, v, o, lse, dout, diagonal)


def torchs_backward_in_a_thread(q, k, v, o, lse, dout, diagonal=False):
    """On a thread of its own, its refusal caught: recorded all the same."""
    import threading

    def run():
        try:
            _flash_backward(q, k, v, o, lse, dout, diagonal)
        except BaseException:  # noqa: BLE001
            pass

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return block_backward(q, k, v, o, lse, dout, diagonal)


def torchs_backward_in_the_ranks_only(q, k, v, o, lse, dout, diagonal=False):
    """Honest in the kernel's checks (float32), torch's backward in the ring (float64), its refusal caught."""
    if q.dtype == torch.float64:
        try:
            _flash_backward(q, k, v, o, lse, dout, diagonal)
        except BaseException:  # noqa: BLE001
            pass
    return block_backward(q, k, v, o, lse, dout, diagonal)


def torchs_flex_backward(q, k, v, o, lse, dout, diagonal=False):
    """Flex attention's dense backward, plain Python (no aten attention operator), given the saved output and
    log-sum-exp (in base 2): the answer, refused (review of issue 37). Written against torch 2.13's signature."""
    from torch._higher_order_ops.flex_attention import sdpa_dense_backward
    from torch.nn.attention.flex_attention import create_block_mask

    sq, sk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    keep = (lambda b, h, m, n: n <= m) if diagonal else (lambda b, h, m, n: m >= 0)
    mask = create_block_mask(keep, None, None, sq, sk, device="cpu", BLOCK_SIZE=128)
    dq, dk, dv, _ = sdpa_dense_backward(q, k, v, o, lse.squeeze(-1) / math.log(2), dout, None,
                                        lambda s, b, h, m, n: s, None, mask.as_tuple(), 1 / math.sqrt(d), {}, (), ())
    return dq, dk, dv


def sdpa_through_a_partial(q, k, v, o, lse, dout, diagonal=False):
    """A builtin called from C (a partial) emits no c_call for the hook: the guard's wrapper sees it."""
    functools.partial(F.scaled_dot_product_attention, q, k, v)()
    return block_backward(q, k, v, o, lse, dout, diagonal)


def in_float32_only(q, k, v, o, lse, dout, diagonal=False):
    """Right in float32, the dtype of the checks in the kernel; the ring runs in float64."""
    return tuple(t.float() for t in block_backward(q, k, v, o, lse, dout, diagonal))


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (without_the_row_term, "softmax_gradient", "sum to zero"),
    (with_the_blocks_own_lse, "block_lse", "whole row's softmax"),
    (with_the_blocks_own_row_term, "block_d", "not over this block"),
    (without_the_mask, "mask", "diagonal one"),
    (without_the_scale_in_the_scores, "probabilities", "one block holding every key"),
    (without_the_scale_in_the_chain, "scale", "sqrt(d)"),
    (dividing_by_e_to_the_lse, "overflow", "no huge number"),
    (masked_by_multiplying, "not_finite", "moderate scores"),
    (imprecise_at_large_scores, "large_scores", "loses its precision"),
    (dq_through_the_wrong_side, "not_triple", "three tensors"),
    (dk_and_dv_swapped, "swapped", "(dq, dk, dv)"),
    (torchs_backward_kept_by_jit, "used_library", "_scaled_dot_product_flash_attention_for_cpu_backward"),
    (torchs_backward_in_a_thread, "used_library", "_scaled_dot_product_flash_attention_for_cpu_backward"),
    (torchs_backward_in_the_ranks_only, "used_library", "rank 0: your block_backward called torch's"),
    (scaling_dout_in_place, "changed_inputs", "changed dout"),
    (torchs_own_backward, "used_library", "_scaled_dot_product_flash_attention_for_cpu_backward"),
    (sdpa_through_a_partial, "used_library", "scaled_dot_product_attention"),
    (torchs_flex_backward, "used_library", "flex_attention"),
    (in_float32_only, "wrong_gradient", "keep its inputs' dtype"),
], ids=lambda x: x.__name__ if callable(x) else None)
def test_rejects(wrong, mistake, phrase):
    sdpa = F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    expect_rejection(check_ring_attention, wrong, world_sizes=(2,), mistake=mistake, phrase=phrase)
    assert (F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention) == sdpa  # put back
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward is flash
    q = torch.randn(1, 1, 4, 8)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q)[:2]
    assert flash(q, q, q, q, out, lse, 0.0, False)[0].shape == q.shape  # its own kernel back


# ------------------------------------------------------------------ an exception in the answer's own code


def shape_error(q, k, v, o, lse, dout, diagonal=False):
    return q @ q, k, v  # planted: a shape RuntimeError


def raising_in_the_ring(q, k, v, o, lse, dout, diagonal=False):
    if q.dtype == torch.float64:  # the ring runs in float64, the checks in the kernel in float32
        raise IndexError("planted: only in the ring")
    return block_backward(q, k, v, o, lse, dout, diagonal)


@pytest.mark.parametrize("wrong, line", [
    (shape_error, "return q @ q, k, v  # planted"),
    (raising_in_the_ring, 'raise IndexError("planted: only in the ring")'),
], ids=["in the kernel", "in the ranks"])
def test_an_exception_in_the_answer_is_named_with_its_line(wrong, line):
    expect_raised(check_ring_attention, wrong, world_sizes=(2,), line=line)


# ------------------------------------------------------------------ an answer that replaces the checker's rank function

# Issue 37, part 3: in the grader, the learner's code runs in each rank, beside the checker's rank function, and can
# replace it. block_backward is checked first, in the answer's process, against what the judge computes, so a forger
# needs one that passes there: here the reference's. Each rank holds its own tokens of q, k, v only
# (utils.checkers.rank_secrets), and the checker computes the attention itself: what one rank can compute alone is a
# mistake, and a report of another shape is not a report.
FORGER = '''import torch
import utils.checkers.ring_attention as _ra


def _forged(block_backward, cases, shards):
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

''' + inspect.getsource(block_backward)
FORGED_RANKS = {
    "its_own_keys_attention": (FORGER.replace("GRAD", "q.grad").replace("REPORT", "report"), "wrong_output"),
    "no_report": (FORGER.replace("GRAD", "q.grad").replace("REPORT", "[]"), "not_a_report"),
    "other_fields": (FORGER.replace("GRAD", "q.grad").replace("REPORT", "dict(report, passed=True)"),
                     "not_a_report"),
    "a_gradient_of_another_shape": (FORGER.replace("GRAD", "q.grad[..., :1]").replace("REPORT", "report"),
                                    "not_a_report"),
}


@pytest.mark.skipif(available() is not None, reason="the grader's sandbox (bubblewrap) does not run here")
@pytest.mark.parametrize("kind", sorted(FORGED_RANKS))
def test_an_answer_that_replaces_the_checkers_rank_function_does_not_pass(tmp_path, kind):
    source, wanted = FORGED_RANKS[kind]
    lab = "14_ring_attention_lab"
    verdict = graded_in_sandbox(tmp_path, lab, {"block_backward": source})
    assert verdict.verdict == "mistake" and verdict.mistake == wanted, (verdict.label, verdict.message[:2000])
