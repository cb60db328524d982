"""FSDP2's overlap and accumulation controls, counted: lesson 04c (notebooks/04c_fsdp2_overlap_and_accumulation.ipynb).

Three pieces the lesson puts beside its measurements:

- ``padded_bytes(params, shard)``: the bytes FSDP2 all-gathers for a group. FSDP2 splits every parameter on
  dim 0 into ``shard`` equal pieces of ``ceil(rows / shard)`` rows, padding the last ones, so the gathered
  tensor is the padded one (``FSDPParam._init_sharded_param`` in torch/distributed/fsdp/_fully_shard/_fsdp_param.py);
- ``step_wire_bytes(...)``: the bytes one rank sends per training step, per collective, under the ring's
  convention of ``utils.comm.ledger`` (all-gather and reduce-scatter (S-1)/S of the full tensor, all-reduce
  2(R-1)/R), for FSDP on S ranks or HSDP on R replicas of S shards, with or without resharding after forward,
  with or without gradient sync;
- ``fsdp2_timeline(prof)``: the FSDP2 steps a ``torch.profiler`` run recorded (``FSDP::pre_forward (embed)``,
  ``FSDP::all_gather (mix1, mix2)``, ``FSDP::forward_prefetch for head`` ...), in the order they started: FSDP2
  labels each with ``record_function`` (_fsdp_param_group.py).
"""

from __future__ import annotations

import math

__all__ = ["padded_bytes", "reshard_sizes", "step_wire_bytes", "fsdp2_timeline", "first_index"]

#: the FSDP2 labels a timeline keeps: when a group starts its forward or backward, its all-gathers, prefetches
#: and gradient reductions (FSDP2 also records copy-outs, casts and waits, left out to keep it readable)
TIMELINE_LABELS = ("FSDP::pre_forward (", "FSDP::all_gather (", "FSDP::forward_prefetch", "FSDP::pre_backward (",
                   "FSDP::backward_prefetch", "FSDP::post_backward_reduce (")


def padded_bytes(params, shard):
    """Bytes of ``params`` once each is padded on dim 0 to a multiple of ``shard`` rows: what FSDP2 gathers."""
    if shard < 1:
        raise ValueError(f"shard={shard}: a parameter is split over at least 1 rank")
    total = 0
    for p in params:
        rows = p.shape[0] if p.dim() else 1
        total += math.ceil(rows / shard) * shard * (p.numel() // max(rows, 1)) * p.element_size()
    return total


def reshard_sizes(shard):
    """The ints ``reshard_after_forward`` may be on a shard dim of ``shard`` ranks and mean something new:
    the divisors strictly between 1 and ``shard`` (torch refuses a non-divisor; 1 means False, ``shard``
    means True: ``_get_post_forward_mesh_info`` in _fsdp_init.py)."""
    return [k for k in range(2, shard) if shard % k == 0]


def step_wire_bytes(block_bytes, root_bytes, shard, replicate=1, reshard_after_forward=True, sync=True,
                    root_trainable=False):
    """{"all_gather", "reduce_scatter", "all_reduce"}: bytes ONE rank sends in one forward + backward.

    ``block_bytes``: padded bytes (``padded_bytes(..., shard)``) of the non-root groups, all trainable;
    ``root_bytes``: those of the root group (FSDP2 never reshards the root after forward, so it is gathered once);
    ``shard``: ranks in the shard dim (S); ``replicate``: replicas (R, HSDP when > 1).
    ``reshard_after_forward``: True (gathered again in backward, over S ranks), False (kept: not again) or an
    int k dividing S (kept as 1/k; gathered again over k ranks). ``sync=False``: a step under
    ``set_requires_gradient_sync(False)``, which neither reduce-scatters nor all-reduces.
    """
    if isinstance(reshard_after_forward, bool):
        backward = (shard - 1) / shard if reshard_after_forward else 0.0
    elif reshard_after_forward in (1, shard) or shard % reshard_after_forward:
        raise ValueError(f"reshard_after_forward={reshard_after_forward} on a shard dim of {shard}: use True, False "
                         f"or one of {reshard_sizes(shard)} (1 means False and {shard} means True to FSDP2)")
    else:
        k = reshard_after_forward
        backward = (k - 1) / k
    reduced = block_bytes + (root_bytes if root_trainable else 0)
    return {
        "all_gather": (shard - 1) / shard * (block_bytes + root_bytes) + backward * block_bytes,
        "reduce_scatter": (shard - 1) / shard * reduced if sync else 0.0,
        "all_reduce": 2 * (replicate - 1) / replicate * reduced / shard if sync else 0.0,  # the shard, over R
    }


def fsdp2_timeline(prof):
    """The FSDP2 labels of a ``torch.profiler.profile`` run, in the order they started (see TIMELINE_LABELS)."""
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    return [e.name for e in events if e.name.startswith(TIMELINE_LABELS)]


def first_index(timeline, label, after=0):
    """Index of the first entry of ``timeline`` at or after ``after`` that starts with ``label``; a clear error if none."""
    for i in range(after, len(timeline)):
        if timeline[i].startswith(label):
            return i
    raise ValueError(f"no {label!r} in the timeline after entry {after}: {timeline}")
