"""The pipeline lab's checker (utils/checkers/pipeline_schedule.py) accepts the reference and rejects planted wrong answers.

Each classic mistake of labs/06_pipeline_lab.ipynb is planted here, and the test asserts that the
checker names it (``LabCheckFailed.mistake``) and says the key phrase of its hint. The lab's
notebook itself runs in tests/test_notebooks.py.
"""

import sys

import pytest

from lab_grading import expect_rejection
from notebook_runner import ROOT
from utils.checkers.pipeline_schedule import check_one_f_one_b

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.pipeline_schedule import one_f_one_b  # noqa: E402


def _with_warmup(warmup):
    """1F1B's shape with another warm-up count per stage: warmup(stage, stages) forwards first."""
    def order(stage, stages, microbatches):
        w = min(warmup(stage, stages), microbatches)
        ops = [("F", mb) for mb in range(w)]
        for i in range(microbatches - w):
            ops += [("F", w + i), ("B", i)]
        return ops + [("B", mb) for mb in range(microbatches - w, microbatches)]
    return order


def all_forwards_first(stage, stages, microbatches):
    """GPipe: every forward, then every backward."""
    return [("F", mb) for mb in range(microbatches)] + [("B", mb) for mb in range(microbatches)]


def backward_first(stage, stages, microbatches):
    ops = one_f_one_b(stage, stages, microbatches)
    return [ops[1], ops[0]] + ops[2:] if ops[1][0] == "B" else [("B", 0)] + [op for op in ops if op != ("B", 0)]


reversed_warmup = _with_warmup(lambda stage, stages: stage)  # the last stage warms up the most: deadlock
same_warmup = _with_warmup(lambda stage, stages: stages - 1)  # every stage warms up p - 1: too many held
no_warmup = _with_warmup(lambda stage, stages: 0)  # correct, but waits for every backward: bubble


def reversed_microbatches(stage, stages, microbatches):
    """The last stage runs the micro-batches in reverse order: its receives cross the sends (deadlock)."""
    ops = one_f_one_b(stage, stages, microbatches)
    if stage == stages - 1:
        ops = [(kind, microbatches - 1 - mb) for kind, mb in ops]
    return ops


def strings(stage, stages, microbatches):
    return [f"F{mb}" for mb in range(microbatches)] + [f"B{mb}" for mb in range(microbatches)]


def forgets_last_backward(stage, stages, microbatches):
    return one_f_one_b(stage, stages, microbatches)[:-1]


def test_reference_passes():
    result = check_one_f_one_b(one_f_one_b, world_sizes=(2,))
    assert "run on 2 ranks" in str(result)


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (all_forwards_first, "gpipe", "GPipe"),
    (backward_first, "backward_before_forward", "after ('F', mb)"),
    (reversed_warmup, "deadlock", "p - s - 1 forwards"),
    (reversed_microbatches, "deadlock", "same order"),
    (same_warmup, "too_many_in_flight", "at most p - s"),
    (no_warmup, "bubble", "(p-1)/(m+p-1)"),
    (strings, "not_ops", "('F', mb)"),
    (forgets_last_backward, "missing_ops", "exactly once"),
], ids=lambda v: getattr(v, "__name__", None))
def test_rejects(wrong, mistake, phrase):
    expect_rejection(check_one_f_one_b, wrong, world_sizes=(2,), mistake=mistake, phrase=phrase)
