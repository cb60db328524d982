"""Lab 03's memory count of what a rank *holds*: every live tensor the answer keeps, not only ``p.grad``.

``utils.checkers.zero`` follows the full gradients (``p.grad``) during backward. An answer can pass
that count and still keep DDP's memory: its own padded flat copy of each bucket's gradient, kept in
``self`` after the reduce-scatter, with ``p.grad`` set to ``None``. So the checker also takes every
tensor the rank's process holds (``held_tensors``: each storage once, as ``utils.sharding.memory.live_tensor_bytes``
counts them) just before the answer is built, and again right after its first ``step()``. The new
storages, less the copies the checker itself made in between, are what the answer keeps. ZeRO-2 allows,
per bucket of ``numel`` numbers, with chunk = ceil(numel / n):

    4 B x chunk   this rank's chunk of the flat parameters (what Adam updates: the master weights)
    4 B x chunk   its chunk of the mean gradient (``grad_shards[i]``)
    8 B x chunk   Adam's two moments (``exp_avg``, ``exp_avg_sq``)

that is 16 bytes x sum over buckets of chunk, plus ``SCALAR_SLACK`` bytes per bucket for scalars
(a step counter kept as a tensor). The lab's reference holds exactly 16 bytes x its chunks plus 4 bytes
per chunk: ``torch.optim.Adam`` keeps each parameter's step as a 0-d float32 tensor (``torch/optim/adam.py:168``). A kept padded flat gradient adds 4 bytes x chunk x n per bucket, about
4Ψ: DDP's gradient memory again.
"""

import gc

import torch

from .common import fail

BYTES_PER_CHUNK_NUMBER = 4 + 4 + 8  # parameter chunk + mean-gradient chunk + Adam's m and v, all fp32
SCALAR_SLACK = 64  # bytes per bucket: a few 0-d tensors (a step counter), no copy of anything

HELD_HINT = ("keep nothing per bucket but this rank's chunks: after step() ZeRO-2 holds the parameter chunk, the "
             "mean-gradient chunk and Adam's two moments, 16 bytes x chunk. Do not keep the padded flat gradient "
             "(or a flat copy of the parameters) in self after the reduce-scatter: with p.grad = None or not, a copy "
             "of every bucket is DDP's 4Ψ bytes again.")


def held_tensors(device):
    """{storage address: tensor} of the live tensors on ``device`` (a torch.device) that a Python object refers to.

    Like ``utils.sharding.memory.live_tensor_bytes``, but a tensor counts only if some Python object (a list,
    a dict, an instance's ``__dict__``) holds it. What a collective's C++ side keeps is left out:
    measured on gloo, a tensor of a finished collective (chunk x n numbers: a bucket's padded
    gradient or its all-gathered parameters) was still alive 50 ms after ``step()`` returned, with no
    Python object referring to it, on some ranks and not others. The answer keeps its tensors in
    ``self``, so they count.
    """
    gc.collect()  # garbage waiting in reference cycles is not memory anyone holds
    out = {}
    for obj in gc.get_objects():
        for ref in gc.get_referents(obj):
            try:
                if not issubclass(type(ref), torch.Tensor) or ref.device.type != device.type or ref.is_meta:
                    continue
                storage = ref.untyped_storage()
            except Exception:  # noqa: BLE001, S112 - objects that raise on access; a DTensor's wrapper has no storage
                continue
            if storage.nbytes():
                out.setdefault(storage.data_ptr(), ref)
    return out


def added_bytes(baseline, device, checker_tensors):
    """Bytes of the storages held now that were not in ``baseline`` (a ``held_tensors``) nor are the checker's copies.

    ``baseline`` keeps its tensors alive until this call, so no new storage can reuse one's address.
    """
    own = {t.untyped_storage().data_ptr() for t in checker_tensors if t is not None}
    return sum(t.untyped_storage().nbytes() for address, t in held_tensors(device).items()
               if address not in baseline and address not in own)


def allowed_bytes(chunks):
    """ZeRO-2's bytes per rank after a step: 16 bytes x the rank's chunks, plus a few scalars per bucket."""
    return BYTES_PER_CHUNK_NUMBER * sum(chunks) + SCALAR_SLACK * len(chunks)


def judge_held(hints, held, chunks, n, label):
    """Fail with ``held_too_much`` when ``held`` (bytes the answer added) exceeds ``allowed_bytes(chunks)``."""
    __tracebackhide__ = True
    allowed = allowed_bytes(chunks)
    if held > allowed:
        fail(hints, "held_too_much", f"{label}: after its first step() your class holds {held:,} bytes of tensors on "
             f"this rank; ZeRO-2 holds {BYTES_PER_CHUNK_NUMBER} bytes x its chunks ({sum(chunks):,} numbers) = "
             f"{BYTES_PER_CHUNK_NUMBER * sum(chunks):,} (+ {SCALAR_SLACK} B of scalars per bucket): "
             f"{held - BYTES_PER_CHUNK_NUMBER * sum(chunks):,} bytes more.", n)


def judge_memory(hints, case, buckets, chunks, n, label, names):
    """Full gradients only for the buckets still open; chunks and Adam state of this rank's chunks only; then
    ``judge_held``. ``case``: one rank's record of a run (``utils.checkers.zero``); ``names``: the parameters'."""
    __tracebackhide__ = True
    step, sizes = case["steps"][0], case["sizes"]
    arrival = {i: k for k, (i, _, _) in enumerate(step["events"])}
    closes = {i: max(arrival[j] for j in bucket) for bucket in buckets for i in bucket}  # reduced after this
    for k, (i, _, live) in enumerate(step["events"]):
        allowed = 4 * sum(sizes[j] for j, a in arrival.items() if a <= k and closes[j] >= k)
        if live > allowed:
            fail(hints, "full_grads_kept", f"{label}: when gradient {k + 1} ({names[i]}) appeared, "
                 f"{live:,} bytes of full gradients (p.grad) were alive; the buckets still open hold {allowed:,}.", n)
    if step["live_after"]:
        fail(hints, "full_grads_kept", f"{label}: after backward {step['live_after']:,} bytes of full gradients "
             "(p.grad) are still alive; ZeRO-2 keeps none.", n)
    shapes = [tuple(s.shape) if s is not None else None for s in step["shards"]]
    if shapes != [(c,) for c in chunks]:
        fail(hints, "grad_shard_shape", f"{label}: self.grad_shards after backward have shapes {shapes}; "
             f"expected {[(c,) for c in chunks]}.", n)
    state, psi, own = case["state_bytes"], sum(sizes), 8 * sum(chunks)
    if n > 1 and state >= 8 * psi:
        fail(hints, "state_not_sharded", f"{label}: a rank holds {state:,} bytes of Adam state, DDP's 8Ψ = "
             f"{8 * psi:,}, not its chunks' {own:,}.", n)
    if state > own:
        fail(hints, "state_not_sharded", f"{label}: a rank holds {state:,} bytes of Adam state, more than 8 bytes "
             f"x its chunks ({own:,}).", n)
    judge_held(hints, case["held_bytes"], chunks, n, label)  # every tensor kept, not only p.grad and the state
