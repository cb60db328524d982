"""The tensor-parallel lab's checker (utils/checkers/tensor_parallel.py) accepts the reference and rejects planted wrong answers.

labs/05_tensor_parallel_lab.ipynb asks for Megatron's vocabulary-parallel cross-entropy. Each classic
mistake is planted here as a variant of one answer, and the test asserts that the checker names it
(``LabCheckFailed.mistake``) and says the key phrase of its hint. Some variants reach the right loss
*the wrong way* (all-gathering the logits, all-reducing them zero-padded, an all-reduce in backward
that a scaled-down gradient would hide): the checker must reject them by their communication. Each
runs at the world size where its mistake shows (a per-rank max is the global one on 1 rank; every
mistake shows on 2 and on 3). Also: ``utils.tensor_parallel.check_tp_degree``'s message. The lab's
notebook itself runs in tests/test_notebooks.py.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lab_grading import expect_raised, expect_rejection, graded_in_sandbox
from utils.checkers.tensor_parallel import check_vocab_parallel_cross_entropy
from utils.workshop.sandbox import available
from utils.tensor_parallel import check_tp_degree, nearest_tp_degrees, valid_tp_degrees



# ------------------------------------------------------------------ the degree check

def test_check_tp_degree_names_numbers_and_nearest_degrees():
    with pytest.raises(ValueError, match=r"hidden size 1000 is not divisible by tensor-parallel degree 3; use 2, 4 "
                                         r"or 5\."):
        check_tp_degree(3, hidden=1000)
    with pytest.raises(ValueError, match=r"number of heads 6 .* degree 4; use 2, 3 or 6"):
        check_tp_degree(4, hidden=96, heads=6)
    assert check_tp_degree(4, hidden=64, heads=8) == 4
    assert valid_tp_degrees(64, 8) == [2, 4, 8] and nearest_tp_degrees(6, 1000) == [4, 5, 8]


# ------------------------------------------------------------------ the reference passes

# ------------------------------------------------------------------ wrong answers, one flag each

def variant(gather=False, pad=False, local_max=False, no_max=False, unmasked=False, in_place=False,
            backward_all_reduce=False, ignore_grad=False, no_one_hot=False, mean=False, one_gradient=False,
            owner_only=False, log_of_softmax=False, mask_edge=None, gather_max=False, minus_inf_mask=False):
    """The reference with one mistake switched on."""

    class Answer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, target):
            rank, n, width = dist.get_rank(), dist.get_world_size(), logits.shape[-1]
            start = rank * width
            if gather or pad:  # the whole logits on every rank: right numbers, b·s·v values moved
                if gather:
                    blocks = [torch.empty_like(logits) for _ in range(n)]
                    dist.all_gather(blocks, logits.contiguous())
                    full = torch.cat(blocks, -1)
                else:
                    full = logits.new_zeros(logits.shape[0], width * n)
                    full[:, start:start + width] = logits
                    dist.all_reduce(full)
                softmax = torch.softmax(full, -1)[:, start:start + width]
                mine = (target >= start) & (target < start + width)
                ctx.save_for_backward(softmax, (target - start).clamp(0, width - 1), mine)
                return F.cross_entropy(full, target, reduction="none")
            top = logits.max(-1).values
            if not local_max and not no_max:
                if owner_only and rank != 0:
                    pass  # rank 0 alone calls it: the others never reach it
                elif gather_max:  # every rank's (tokens,) maxes gathered, then the max taken: right, not an all-reduce
                    tops = [torch.empty_like(top) for _ in range(n)]
                    dist.all_gather(tops, top)
                    top = torch.stack(tops).max(0).values
                else:
                    dist.all_reduce(top, op=dist.ReduceOp.MAX)
            if no_max:
                top = torch.zeros_like(top)
            if in_place:
                logits.sub_(top.unsqueeze(-1))
                shifted = logits
            else:
                shifted = logits - top.unsqueeze(-1)
            mine = (target >= start) & (target < start + width)
            if mask_edge == "first_left_out":
                mine = (target > start) & (target < start + width)
            elif mask_edge == "next_let_in":
                mine = (target >= start) & (target <= start + width)
            local = (target - start).clamp(0, width - 1)
            picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1)
            picked = picked if unmasked else picked * mine
            if minus_inf_mask:  # the attention habit: -inf where the word is not mine, then a SUM over the ranks
                picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, float("-inf"))
            if log_of_softmax:  # exp(x_target - M), summed over ranks: 0 in float32 when it is far below the max
                picked = picked.exp() * mine
            dist.all_reduce(picked)
            exp = shifted.exp()
            total = exp.sum(-1)
            dist.all_reduce(total)
            ctx.save_for_backward(exp / total.unsqueeze(-1), local, mine)
            loss = (total.log() - picked.log()) if log_of_softmax else total.log() - picked
            return loss.mean() if mean else loss

        @staticmethod
        def backward(ctx, grad):
            softmax, local, mine = ctx.saved_tensors
            one_hot = torch.zeros_like(softmax)
            if not no_one_hot:
                one_hot.scatter_(-1, local.unsqueeze(-1), mine.to(softmax.dtype).unsqueeze(-1))
            weight = torch.ones_like(grad) if ignore_grad else grad
            if mean:
                weight = grad.expand(len(softmax)) / len(softmax)
            out = (softmax - one_hot) * weight.unsqueeze(-1)
            if backward_all_reduce:  # summed over ranks, then divided back: right numbers, needless traffic
                out = out.clone()
                dist.all_reduce(out)
                out = out / dist.get_world_size()
            return out if one_gradient else (out, None)

    return Answer


@pytest.mark.parametrize("flag, mistake, phrase, world_sizes", [
    ("gather", "gathered_logits", "three numbers per token", (2,)),
    ("pad", "gathered_logits", "three numbers per token", (3,)),
    ("local_max", "local_max", "WHOLE vocabulary", (2,)),
    ("no_max", "overflow", "exp(200)", (2,)),
    ("unmasked", "target_not_masked", "only the rank that holds the target", (3,)),
    ("in_place", "in_place", "shifted = logits - max", (2,)),
    ("backward_all_reduce", "backward_comm", "no communication", (2,)),
    ("ignore_grad", "grad_output_ignored", "grad.unsqueeze(-1)", (2,)),
    ("no_one_hot", "no_one_hot", "one-hot", (2,)),
    ("mean", "not_per_token", "one loss per token", (2,)),
    ("one_gradient", "backward_returns", "None", (2,)),
    ("log_of_softmax", "underflow", "far below", (3,)),
    ("minus_inf_mask", "not_finite", "a mask of -inf", (2,)),  # once overflow, at any logits
    ("gather_max", "not_all_reduce", "['all_gather'] moved less than the logits", (2,)),  # once gathered_logits
])
def test_rejects(flag, mistake, phrase, world_sizes):
    expect_rejection(check_vocab_parallel_cross_entropy, variant(**{flag: True}), world_sizes=world_sizes,
                     mistake=mistake, phrase=phrase)


@pytest.mark.parametrize("edge", ["first_left_out", "next_let_in"])
def test_rejects_a_mask_off_by_one_at_a_block_edge(edge):
    """A boundary kind: the owner's mask wrong only for a target that is the first (or the next block's first) word."""
    expect_rejection(check_vocab_parallel_cross_entropy, variant(mask_edge=edge), world_sizes=(2,),
                     mistake="mask_edges", phrase="off by one")


def test_a_collective_only_one_rank_calls_is_a_deadlock():
    expect_rejection(check_vocab_parallel_cross_entropy, variant(owner_only=True), world_sizes=(2,), timeout=8,
                     mistake="deadlock", phrase="same all-reduces in the same order")


# ------------------------------------------------------------------ an exception in the answer's own code


class ShapeError(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target):
        return logits @ logits  # planted: (tokens, v/t) @ (tokens, v/t)

    @staticmethod
    def backward(ctx, grad):
        return None, None


def test_an_exception_in_the_answer_is_named_with_its_line():
    expect_raised(check_vocab_parallel_cross_entropy, ShapeError, world_sizes=(2,),
                  line="return logits @ logits  # planted")


# ------------------------------------------------------------------ a stub that replaces the checker's rank function

# Issue 37, part 3: in the grader, the learner's class body runs in each rank, beside the checker's rank function, and
# can replace it. Each rank holds its own block of the logits only (utils.checkers.rank_secrets), and the checker
# computes the losses from the whole logits itself: what one rank can compute alone is a mistake, and a report of
# another shape is not a report.
FORGER = '''import torch
import utils.checkers.tensor_parallel as _tp


def _forged(cls, public, blocks):
    import torch.distributed as dist
    import torch.nn.functional as F
    out = []
    for case in ("tame", "spread", "large", "apart"):
        target, weights = public[case]
        block = blocks[case].clone().requires_grad_()
        width = block.shape[-1]
        local = (target - dist.get_rank() * width).clamp(0, width - 1)
        loss = F.cross_entropy(block, local, reduction="none")  # over its own words: all that one rank knows
        loss.backward(weights)
        out.append(dict(loss=loss.detach(), grad=GRAD, changed=False, forward=[("all_reduce", 48)] * 3,
                        backward=[], error=None))
    return REPORT


class _Patch:  # in the rank: the checker's own rank function replaced
    _tp._cross_entropy_on_rank.__code__ = _forged.__code__


class VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target):
        raise NotImplementedError("a stub")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("a stub")
'''
VALUE_MISTAKES = {"wrong_values", "local_max", "target_not_masked", "mask_edges", "wrong_grad"}
FORGED_RANKS = {
    "its_own_words_loss": (FORGER.replace("GRAD", "block.grad").replace("REPORT", "out"), VALUE_MISTAKES),
    "no_case": (FORGER.replace("GRAD", "block.grad").replace("REPORT", "[]"), {"not_a_report"}),
    "other_fields": (FORGER.replace("GRAD", "block.grad").replace("REPORT", "[dict(c, passed=True) for c in out]"),
                     {"not_a_report"}),
    "a_gradient_of_another_shape": (FORGER.replace("GRAD", "block.grad[:, :1]").replace("REPORT", "out"),
                                    {"not_a_report"}),
}


@pytest.mark.skipif(available() is not None, reason="the grader's sandbox (bubblewrap) does not run here")
@pytest.mark.parametrize("kind", sorted(FORGED_RANKS))
def test_a_stub_that_replaces_the_checkers_rank_function_does_not_pass(tmp_path, kind):
    source, wanted = FORGED_RANKS[kind]
    lab = "05_tensor_parallel_lab"
    verdict = graded_in_sandbox(tmp_path, lab, {"VocabParallelCrossEntropy": source})
    # "mistake", not "not written yet": the forged function ran in place of the checker's, whose stub would raise
    assert verdict.verdict == "mistake" and verdict.mistake in wanted, (verdict.label, verdict.message[:2000])
