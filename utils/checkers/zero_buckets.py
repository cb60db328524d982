"""Lab 03's first task, checked: ``make_buckets(params, bucket_numel)``, DeepSpeed's bucket rule.

``utils.checkers.zero`` (the lab's checker) re-exports ``check_make_buckets``; its ZeRO-2 check judges the learner's
own buckets with ``judge_buckets`` and expects one reduce-scatter per bucket. The checker ships to learners, so it
never computes the buckets itself (that would be the answer to this task, one import away): it checks the four
properties that make DeepSpeed's buckets the only right ones. Taken last parameter first, the buckets (1) hold
every parameter once, (2) in reverse order; (3) none holds more than ``bucket_numel`` numbers unless it is one
parameter alone; (4) none was closed while the next parameter still fitted. (3) says a bucket ends no later than
DeepSpeed's, (4) no earlier, so from the first bucket on they are DeepSpeed's, bucket for bucket.
"""

import torch

from ..models import ToyNet
from .answer_side import answer_side
from .common import CheckResult, fail, learner_call

BUCKET_HINTS = {
    "bucket_order": "backward produces gradients from the last layer to the first: fill the buckets from "
                    "reversed(params), so the first bucket is complete first.",
    "lost_params": "every parameter must be in exactly one bucket: add each p of reversed(params) once.",
    "bucket_overflow": "close the bucket *before* adding a parameter that would take it past bucket_numel, as "
                       "DeepSpeed does; only a parameter larger than bucket_numel on its own may exceed it.",
    "bucket_size": "one reduce-scatter per bucket of make_buckets(params, bucket_numel), with the bucket_numel you "
                   "are given: close a bucket only when the next parameter would overflow it, never one bucket for "
                   "everything nor one per parameter.",
    "not_lists": "make_buckets returns a list of buckets, each a list of the parameters (the tensors themselves) "
                 "it holds: check what your function returns (a missing `return` gives None).",
}


def judge_buckets(sizes, buckets, bucket_numel, label):
    """Raise ``LabCheckFailed`` for the first property that ``buckets`` (lists of parameter indices, -1 for a tensor
    that is not one of the parameters) breaks, over parameters of ``sizes`` numbers each."""
    __tracebackhide__ = True
    numbers = [sum(sizes[i] for i in b if i >= 0) for b in buckets]
    what = f"{label}: your buckets hold parameters {buckets} (numbers {numbers}; parameters of {sizes} numbers)"
    flat = [i for b in buckets for i in b]
    if sorted(flat) != list(range(len(sizes))):
        fail(BUCKET_HINTS, "lost_params", what, None)
    if flat != list(reversed(range(len(sizes)))):
        fail(BUCKET_HINTS, "bucket_order", what, None)
    for b, total in zip(buckets, numbers):
        if len(b) > 1 and total > bucket_numel:
            fail(BUCKET_HINTS, "bucket_overflow", f"{what}: bucket {b} holds {total:,} > {bucket_numel:,}", None)
    for k, (b, total) in enumerate(zip(buckets, numbers)):
        if not b:
            fail(BUCKET_HINTS, "bucket_size", f"{what}: bucket {k} is empty", None)
        if k + 1 < len(buckets) and buckets[k + 1] and total + sizes[buckets[k + 1][0]] <= bucket_numel:
            fail(BUCKET_HINTS, "bucket_size", f"{what}: bucket {k} was closed at {total:,} numbers, yet the next "
                                              f"parameter ({sizes[buckets[k + 1][0]]:,}) fitted under {bucket_numel:,}",
                 None)


@answer_side
def bucket_indices(make_buckets, params, bucket_numel):
    """``make_buckets(params, bucket_numel)`` as lists of indices into ``params`` (-1: a tensor not among them)."""
    __tracebackhide__ = True
    index = {id(p): i for i, p in enumerate(params)}
    where = f"make_buckets({len(params)} tensors, bucket_numel={bucket_numel:,})"

    def as_lists(params, bucket_numel):  # iterating the answer's result runs its code too (a generator): inside
        got = make_buckets(params, bucket_numel)
        if isinstance(got, torch.Tensor) or not hasattr(got, "__iter__"):
            return got
        return [list(b) if hasattr(b, "__iter__") and not isinstance(b, torch.Tensor) else b for b in got]

    buckets = learner_call(as_lists, params, bucket_numel, hints=BUCKET_HINTS, where=where)
    if not isinstance(buckets, list) or not all(isinstance(b, list) for b in buckets):
        fail(BUCKET_HINTS, "not_lists", f"{where} returned {type(buckets).__name__} "
                                        f"{str(buckets)[:200]}, not a list of lists of parameters", None)
    return [[index.get(id(p), -1) for p in bucket] for bucket in buckets]


# The bucket_numel values tried, with the boundary each one is at under DeepSpeed's rule (a bucket closes before the
# parameter that would take it past bucket_numel). Written as numbers, not computed: computing them would be the rule,
# the answer to this task. tests/checkers/test_zero.py recomputes them with the rule and its off-by-ones (a bucket
# closed at ``>=``, a count started at +1 or -1, the first bucket's alone): each changes the buckets at one of them.
TOY_CAPS = (  # ToyNet's trainable parameters, last first: 10, 640, 64, 64, 4096, 64, 4096 numbers (9,034)
    (650, "fills_exactly_first"),    # 10 + 640
    (713, "one_short_first"),        # 10 + 640, which the next 64 would pass by one number
    (4160, "fills_exactly_later"),   # 4096 + 64, after 10 + 640 + 64 + 64
    (4159, "one_short_later"),       # a later bucket of 4096 that the next 64 would pass by one number
    (1000, "inside_a_tensor"),       # a cap that ends inside the next parameter
    (10_000, "one_for_all"),         # more than the 9,034 numbers
    (1, "one_per_tensor"),
)
SMALL = (3, 7, 2, 9, 1, 4)
SMALL_CAPS = ((5, "fills_exactly_first"), (4, "one_short_first"), (9, "fills_exactly_later"), (10, "one_short_later"),
              (100, "one_for_all"), (1, "one_per_tensor"))


def check_make_buckets(fn, toy_caps=TOY_CAPS, small_caps=SMALL_CAPS):
    """Check ``fn(params, bucket_numel)`` on ToyNet's parameters and on tensors of ``SMALL`` numbers, at each cap."""
    __tracebackhide__ = True
    toy = [p for p in ToyNet().parameters() if p.requires_grad]  # 7 tensors, 9,034 numbers
    small = [torch.zeros(k, requires_grad=True) for k in SMALL]
    lines = []
    for params, label, caps in ((toy, "ToyNet", toy_caps), (small, f"sizes {list(SMALL)}", small_caps)):
        sizes = [p.numel() for p in params]
        for bucket_numel, _ in caps:
            got = bucket_indices(fn, params, bucket_numel)
            judge_buckets(sizes, got, bucket_numel, f"{label}, bucket_numel={bucket_numel:,}")
            if params is toy:
                lines.append(f"ToyNet, bucket_numel={bucket_numel:,}: {len(got)} buckets of "
                             f"{[sum(sizes[i] for i in b) for b in got]} numbers")
    return CheckResult("make_buckets", lines)
