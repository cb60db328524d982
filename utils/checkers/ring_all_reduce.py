"""The checker of lab 01 (ring all-reduce): run the learner's ring on several ranks and explain what is wrong.

Used by ``labs/01_ring_all_reduce_lab.ipynb``, which derives what is checked here. Same conventions as every
lab (``utils.checkers.common``). Two kinds of evidence, because values alone miss half the mistakes:

- **values**, compared with ``dist.all_reduce``. Inputs are small positive integers, so sums are exact in
  float32, and a wrong answer often *looks like* a known mistake: the sum divided by n (averaged), the
  input untouched (an element no chunk covered);
- **bytes**, from ``CommLedger``: a ring that sends whole tensors gives the right values and the wrong bill.
"""

import torch
import torch.distributed as dist

from ..launch import rank_device
from ..ledger import RING_WIRE_FACTOR, CommLedger
from .common import CheckResult, LabCheckFailed, caught, first_error, launch_answer, raise_if_error

COLLECTIVES = set(RING_WIRE_FACTOR) - {"send", "isend", "recv", "irecv", "barrier"}  # all but point-to-point

RING_HINTS = {
    "deadlock": "every rank probably waits in a blocking dist.send (or isend(...).wait()) for a receive its "
                "neighbour has not posted yet: gloo's send waits for the matching recv, at any size. Post both "
                "halves first (reqs = [dist.isend(...), dist.irecv(...)]), then wait on both.",
    "averaged": "all-reduce with SUM must leave the plain sum, as dist.all_reduce does; do not divide by the "
                "world size (DDP divides afterwards, lab 02).",
    "not_in_place": "write the result into the tensor you were given (tensor.copy_(result), or add_ into views "
                    "of it); the caller ignores the return value.",
    "reduce_scatter_only": "after the reduce-scatter phase each rank owns ONE complete chunk. The all-gather "
                           "phase must pass the complete chunks round the ring for n-1 more steps.",
    "uncovered": "some elements were never summed: the chunks do not cover the tensor exactly once. Let torch cut "
                 "it, torch.tensor_split(tensor.view(-1), world_size), or give chunk i numel // n + (i < numel % n) "
                 "elements.",
    "wrong": "compare your chunk indices with the table in the lab: at step s of reduce-scatter rank r sends "
             "chunk (r - s) % n and adds into chunk (r - s - 1) % n.",
    "too_many_bytes": "each step must send ONE chunk of about numel/n elements, not the whole tensor: that is the "
                      "point of the ring (2(n-1)/n of the tensor per rank, whatever n).",
    "too_few_bytes": "call dist.isend / dist.irecv (or send / recv) through the dist module, so CommLedger sees them.",
    "used_collective": "build it from point-to-point calls only (dist.isend / dist.irecv, or send / recv): "
                       "calling a collective hides the algorithm this lab is about.",
}


def ring_cases(world_size):
    """(numel, dtype) cases: 1 element, fewer elements than ranks, divisible, not, and a large one."""
    sizes = sorted({1, max(1, world_size - 1), 4 * world_size, 4 * world_size + 1, 25_003})
    return [(numel, dtype) for dtype in (torch.float32, torch.int64) for numel in sizes]


def _ring_on_rank(fn, cases):
    """Runs on every rank: each case on a fresh tensor, inside a ledger; stops at the first error."""
    rank, device, out = dist.get_rank(), rank_device(), []
    for numel, dtype in cases:
        original = ((rank + 1) * 100 + torch.arange(numel, device=device) % 13 + 1).to(dtype)  # > 0, exact
        expected = original.clone()
        dist.all_reduce(expected)  # torch's answer, outside the ledger
        tensor, returned, error = original.clone(), None, None
        with CommLedger() as ledger:
            try:
                returned = fn(tensor)
            except Exception as exc:  # noqa: BLE001 - reported to the learner in the kernel
                error = caught(exc, "ring_all_reduce")
        out.append(dict(numel=numel, dtype=dtype, original=original, expected=expected, got=tensor, error=error,
                        returned=returned if isinstance(returned, torch.Tensor) else None,
                        sent=ledger.total("wire_bytes"), ops=sorted({r.op for r in ledger.records} & COLLECTIVES)))
        if error:
            break
    return out


def _ring_values(n, ranks):
    """Which mistake the values of one case look like, on all ranks (None when they are right)."""
    got, exp, orig = ([r[k] for r in ranks] for k in ("got", "expected", "original"))
    if all(torch.equal(g, e) for g, e in zip(got, exp)):
        return None
    if all(torch.allclose(g, e / n) if g.is_floating_point() else torch.equal(g, e // n) for g, e in zip(got, exp)):
        return "averaged"
    if all(torch.equal(g, o) and r["returned"] is not None and torch.equal(r["returned"], e)
           for g, o, e, r in zip(got, orig, exp, ranks)):
        return "not_in_place"
    if all(torch.equal(g[g != e], o[g != e]) for g, e, o in zip(got, exp, orig)):
        return "uncovered"  # every wrong element still holds this rank's input: no chunk contained it
    return "wrong"


def check_ring_all_reduce(fn, world_sizes=(2, 3, 4), timeout=20.0):
    """Check ``fn(tensor) -> None``, an in-place SUM all-reduce over the default group.

    On each world size n, runs every case of ``ring_cases(n)`` and demands: (1) no collective is
    called; (2) every rank's tensor equals ``dist.all_reduce``'s; (3) the bytes the ranks send add
    up to exactly 2(n-1) x the tensor's bytes (each chunk travels n-1 hops in each phase) and no
    rank sends more than 2(n-1) x the largest chunk. Values wrong with exactly half those bytes
    means the all-gather phase is missing. A hang longer than ``timeout`` seconds is reported as a
    deadlock. Returns a ``CheckResult``; raises ``LabCheckFailed`` with a hint.
    """
    __tracebackhide__ = True
    lines = []
    for n in world_sizes:
        per_rank = launch_answer(_ring_on_rank, (fn, ring_cases(n)), n, timeout, "ring_all_reduce", RING_HINTS["deadlock"])
        for i, case in enumerate(per_rank[0]):
            ranks = [r[i] for r in per_rank if i < len(r)]
            label = f"a {case['numel']:,}-element {str(case['dtype']).replace('torch.', '')} tensor"
            used = sorted({op for r in ranks for op in r["ops"]})
            if used:
                raise LabCheckFailed("used_collective", f"{label}: called {used}.", RING_HINTS["used_collective"], n)
            error = first_error(ranks)
            mistake = _ring_values(n, ranks) if len(ranks) == n and not error else None
            bytes_each = case["numel"] * case["got"].element_size()
            ideal, sent = 2 * (n - 1) * bytes_each, sum(r["sent"] for r in ranks)
            if mistake in ("wrong", "uncovered") and sent == ideal // 2:
                mistake = "reduce_scatter_only"  # half the ring's bytes: the all-gather phase is missing
            if mistake:
                r = next(k for k, rk in enumerate(ranks) if not torch.equal(rk["got"], rk["expected"]))
                got, exp = ranks[r]["got"], ranks[r]["expected"]
                bad = (got != exp).nonzero().flatten()
                raise LabCheckFailed(mistake, f"{label}: rank {r} is wrong at {bad.numel()} of {case['numel']} "
                                     f"elements, first at index {bad[0].item()}: got {got[bad[0]].item()}, expected "
                                     f"{exp[bad[0]].item()} (the sum of the ranks' inputs).", RING_HINTS[mistake], n)
            raise_if_error(error, n, RING_HINTS)
            largest = -(-case["numel"] // n) * case["got"].element_size()  # ceil(numel / n) elements
            if sent != ideal or max(r["sent"] for r in ranks) > 2 * (n - 1) * largest:
                mistake = "too_many_bytes" if sent >= ideal else "too_few_bytes"
                raise LabCheckFailed(mistake, f"{label}: the values are right, but the ranks sent {sent:,.0f} bytes "
                                     f"in all, {sent / ideal:.2f}x the ring's 2(n-1) x {bytes_each:,} = {ideal:,} "
                                     f"bytes (or one rank sent more than 2(n-1) chunks).", RING_HINTS[mistake], n)
        ratios = [r[-1]["sent"] / (r[-1]["numel"] * r[-1]["got"].element_size()) for r in per_rank]
        lines.append(f"world_size={n}: {len(per_rank[0])} cases equal dist.all_reduce; on {per_rank[0][-1]['numel']:,} "
                     f"elements each rank sent {min(ratios):.4f}-{max(ratios):.4f} x the tensor's bytes, formula "
                     f"2(n-1)/n = {2 * (n - 1) / n:.4f}")
    return CheckResult("ring_all_reduce", lines)
