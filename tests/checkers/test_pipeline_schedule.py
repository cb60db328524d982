"""The pipeline lab's checker (utils/checkers/pipeline_schedule.py) accepts the reference and rejects planted wrong answers.

labs/06_pipeline_lab.ipynb asks for Megatron's interleaved 1F1B order. Each classic mistake is planted
here, and the test asserts that the checker names it (``LabCheckFailed.mistake``) and says the key
phrase of its hint. Several wrong orders compute the right gradients (interleaved GPipe, a warm-up
one forward too long, two forwards swapped): the checker rejects them by their schedule, what they
hold in memory and what they leave idle. The reference order is also checked against torch's own
``ScheduleInterleaved1F1B`` on every world size lab 06 supports, and the simulator on chunked
orders. The lab's notebook itself runs in tests/test_notebooks.py.
"""

import sys

import pytest

from lab_grading import expect_raised, expect_rejection
from utils.course.notebook_runner import ROOT
from utils.checkers.pipeline_schedule import check_interleaved
from utils.pipeline import bubble_fraction, idle_fraction, peak_in_flight, simulate

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.pipeline_schedule import interleaved_one_f_one_b  # noqa: E402


def test_interleaved_order_matches_megatron():
    # the order torch's ScheduleInterleaved1F1B computes for rank 0 of 2, 4 micro-batches, 2 chunks
    assert interleaved_one_f_one_b(0, 2, 4, 2) == [
        ("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1), ("F", 2, 0), ("B", 0, 1), ("F", 3, 0), ("B", 1, 1),
        ("F", 2, 1), ("B", 0, 0), ("F", 3, 1), ("B", 1, 0), ("B", 2, 1), ("B", 3, 1), ("B", 2, 0), ("B", 3, 0)]


@pytest.mark.parametrize("p, m, v", [(2, 2, 2), (2, 4, 2), (2, 8, 3), (4, 4, 2), (4, 8, 2), (4, 8, 3), (3, 9, 2)])
@pytest.mark.parametrize("costs", [(1.0, 1.0), (1.0, 2.0), (3.0, 1.0)])
def test_simulated_interleaved_bubble(p, m, v, costs):
    """The simulator on chunked orders: interleaving's bubble is (p-1)/(vm+p-1), below 1F1B's."""
    timeline = simulate([interleaved_one_f_one_b(r, p, m, v) for r in range(p)], *costs, chunks=v)
    assert idle_fraction(timeline) == pytest.approx(bubble_fraction(p, m, v), abs=1e-12)
    assert bubble_fraction(p, m, v) < bubble_fraction(p, m)


# ------------------------------------------------------------------ wrong answers

def _megatron(warmup, reverse_backward_chunks=True, check=True):
    """The reference's shape with another warm-up count warmup(rank, p, m, v) (or the chunks of B not reversed)."""
    def order(rank, ranks, microbatches, chunks):
        if check and microbatches % ranks:
            raise ValueError(f"{microbatches} micro-batches is not a multiple of {ranks}")
        total = microbatches * chunks

        def unit(k, backward):
            group, within = divmod(k, ranks * chunks)
            chunk = within // ranks
            return group * ranks + within % ranks, (chunks - 1 - chunk) if backward and reverse_backward_chunks else chunk

        w = min(total, max(0, warmup(rank, ranks, microbatches, chunks)))
        ops = [("F", *unit(k, False)) for k in range(w)]
        for i in range(total - w):
            ops += [("F", *unit(w + i, False)), ("B", *unit(i, True))]
        return ops + [("B", *unit(k, True)) for k in range(total - w, total)]
    return order


def _megatron_warmup(rank, p, m, v):
    return (p - rank - 1) * 2 + (v - 1) * p


all_forwards_first = _megatron(lambda rank, p, m, v: v * m)  # interleaved GPipe: v m chunks held
one_forward_too_many = _megatron(lambda rank, p, m, v: _megatron_warmup(rank, p, m, v) + 1)
one_f_one_b_warmup = _megatron(lambda rank, p, m, v: p - rank - 1)  # 1F1B's warm-up: B before its own F
warmup_counted_from_the_end = _megatron(lambda rank, p, m, v: rank * 2 + (v - 1) * p)  # the last rank warms up most
chunks_not_reversed = _megatron(_megatron_warmup, reverse_backward_chunks=False)
half_the_warmup = _megatron(lambda rank, p, m, v: (p - rank - 1) + (v - 1) * p)  # valid, not Megatron's
# kind "only sizes that avoid the boundaries": right at m = 2p, wrong at m = p only (every rank warms up fully
# there; torch's rank r > 0 does not), which a comparison with torch at m = 2p alone never saw
full_warmup_at_m_equal_p = _megatron(lambda rank, p, m, v: v * m if m == p else _megatron_warmup(rank, p, m, v))
# the same kind, found only by the comparison with torch at m = p: a shorter (valid) warm-up there alone
short_warmup_at_m_equal_p = _megatron(lambda rank, p, m, v: (p - rank - 1) + (v - 1) * p if m == p
                                      else _megatron_warmup(rank, p, m, v))
no_check = _megatron(_megatron_warmup, check=False)


def two_forwards_swapped(rank, ranks, microbatches, chunks):
    """Rank 0 starts with micro-batch 1: correct, but every later op waits."""
    ops = interleaved_one_f_one_b(rank, ranks, microbatches, chunks)
    return [ops[1], ops[0]] + ops[2:] if rank == 0 else ops


def one_f_one_b_format(rank, ranks, microbatches, chunks):
    """The lesson's 1F1B tuples, without the chunk."""
    return [op[:2] for op in interleaved_one_f_one_b(rank, ranks, microbatches, chunks)]


def forgets_last_backward(rank, ranks, microbatches, chunks):
    return interleaved_one_f_one_b(rank, ranks, microbatches, chunks)[:-1]


def asks_torch(rank, ranks, microbatches, chunks):
    """The order torch computes, through the checker that ships with the lab: right, and not the learner's."""
    from utils.checkers import pipeline_schedule

    if microbatches % ranks:
        raise ValueError(f"{microbatches} micro-batches on {ranks} ranks")
    return pipeline_schedule._torch_rank_orders(ranks, microbatches, chunks)[rank]


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (all_forwards_first, "all_forwards_first", "interleaved GPipe"),
    (one_forward_too_many, "too_many_in_flight", "longer than Megatron's"),
    (one_f_one_b_warmup, "backward_before_forward", "after ('F', mb, c)"),
    (warmup_counted_from_the_end, "deadlock", "groups of p"),
    (chunks_not_reversed, "deadlock", "chunks reversed"),
    (two_forwards_swapped, "bubble", "(p-1)/(vm+p-1)"),
    (half_the_warmup, "not_megatron", "ScheduleInterleaved1F1B"),
    (full_warmup_at_m_equal_p, "all_forwards_first", "interleaved GPipe"),
    (short_warmup_at_m_equal_p, "not_megatron", "at m = p as at m > p"),
    (no_check, "no_divisibility_check", "raise ValueError at once"),
    (one_f_one_b_format, "not_ops", "(kind, mb, chunk)"),
    (forgets_last_backward, "missing_ops", "exactly once"),
    (asks_torch, "used_torch", "write the order yourself"),
], ids=lambda v: getattr(v, "__name__", None))
def test_rejects(wrong, mistake, phrase):
    expect_rejection(check_interleaved, wrong, world_sizes=(2,), mistake=mistake, phrase=phrase)


def test_interleaved_gpipe_computes_but_holds_every_chunk():
    """The planted interleaved GPipe is a real schedule (no deadlock, same bubble): only its memory gives it away."""
    p, m, v = 2, 4, 2
    orders = [all_forwards_first(r, p, m, v) for r in range(p)]
    assert idle_fraction(simulate(orders, chunks=v)) == pytest.approx(bubble_fraction(p, m, v))
    assert [peak_in_flight(ops) for ops in orders] == [v * m] * p


# ------------------------------------------------------------------ an exception in the answer's own code


def index_error(rank, ranks, microbatches, chunks):
    if microbatches % ranks:
        raise ValueError(f"{microbatches} micro-batches on {ranks} ranks: use a multiple of {ranks}")
    return [][rank]  # planted: IndexError


def test_an_exception_in_the_answer_is_named_with_its_line():
    expect_raised(check_interleaved, index_error, line="return [][rank]  # planted")
