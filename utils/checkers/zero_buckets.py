"""Lab 03's first task, checked: ``make_buckets(params, bucket_numel)``, DeepSpeed's bucket rule.

``utils.checkers.zero`` (the lab's checker) re-exports ``check_make_buckets``; its ZeRO-2 check uses the same
``expected_buckets`` to know which reduce-scatters to expect.
"""

import torch

from ..data_parallel.buckets import reverse_buckets
from ..models import ToyNet
from .common import CheckResult, fail

BUCKET_HINTS = {
    "bucket_order": "backward produces gradients from the last layer to the first: fill the buckets from "
                    "reversed(params), so the first bucket is complete first.",
    "lost_params": "every parameter must be in exactly one bucket: add each p of reversed(params) once.",
    "bucket_overflow": "close the bucket *before* adding a parameter that would take it past bucket_numel "
                       "(if current and size + p.numel() > bucket_numel), as DeepSpeed does; only a parameter "
                       "larger than bucket_numel on its own may exceed it.",
    "bucket_size": "one reduce-scatter per bucket of make_buckets(params, bucket_numel), with the bucket_numel you "
                   "are given: close a bucket only when the next parameter would overflow it, never one bucket for "
                   "everything nor one per parameter.",
}


def expected_buckets(sizes, bucket_numel):
    """DeepSpeed's buckets over parameters of ``sizes`` (numbers each): lists of indices, reduce order
    (``utils.data_parallel.buckets``, DeepSpeed's rule)."""
    return reverse_buckets(sizes, bucket_numel, "deepspeed")


def check_make_buckets(fn, cases=((1000, 10), (1000, 1000), (5000, 100), (1, 1))):
    """Check ``fn(params, bucket_numel)`` on ToyNet's parameters and on a list of small tensors."""
    __tracebackhide__ = True
    toy = [p for p in ToyNet().parameters() if p.requires_grad]  # 7 tensors, 9,034 numbers
    small = [torch.zeros(k, requires_grad=True) for k in (3, 7, 2, 9, 1, 4)]
    lines = []
    for params, label in ((toy, "ToyNet"), (small, "sizes [3, 7, 2, 9, 1, 4]")):
        sizes = [p.numel() for p in params]
        for bucket_numel in sorted({c[0] if params is toy else c[1] for c in cases}):
            got = fn(params, bucket_numel)
            index = {id(p): i for i, p in enumerate(params)}
            got_ix = [[index.get(id(p), -1) for p in bucket] for bucket in got]
            want = expected_buckets(sizes, bucket_numel)
            what = (f"{label}, bucket_numel={bucket_numel:,}: your buckets hold parameters {got_ix} (numbers "
                    f"{[sum(sizes[i] for i in b if i >= 0) for b in got_ix]}); expected {want}")
            flat = [i for b in got_ix for i in b]
            if sorted(flat) != list(range(len(params))):
                fail(BUCKET_HINTS, "lost_params", what, None)
            if flat != list(reversed(range(len(params)))):
                fail(BUCKET_HINTS, "bucket_order", what, None)
            if any(len(b) > 1 and sum(sizes[i] for i in b) > bucket_numel for b in got_ix):
                fail(BUCKET_HINTS, "bucket_overflow", what, None)
            if got_ix != want:
                fail(BUCKET_HINTS, "bucket_size", what, None)
            if params is toy:
                lines.append(f"ToyNet, bucket_numel={bucket_numel:,}: {len(want)} buckets of "
                             f"{[sum(sizes[i] for i in b) for b in want]} numbers")
    return CheckResult("make_buckets", lines)
