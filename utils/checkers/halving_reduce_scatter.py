"""The checker of lab 01a: a reduce-scatter by recursive halving on p = 2^k ranks, run on ranks and explained.

Used by ``labs/01a_halving_reduce_scatter_lab.ipynb``, which derives what is checked here; the machinery
(cases, the peer log, the pattern check) is ``utils.checkers.halving_doubling``'s, shared with lab 01b.
The answer ``fn(tensor)`` must leave chunk v of ``tensor.view(-1).tensor_split(p)`` summed over all
ranks on rank v (its other elements may hold anything), send only to v XOR d for d = p/2, ..., 1 in
that order, one message per step, and exactly the half of its range the partner keeps: ``halving_plan``, a stored
table (``utils.checkers.halving_doubling_tables``). An answer right only when the tensor cuts evenly into p chunks is
named by its wrong cut (``halved_elements``, ``dropped_element``, ``chunk_bounds``) where the teacher's side of the
checker is there to tell the cuts apart (the teacher's checkout: ``make grade``, the tests); in the student release
it is ``uneven``, whose hint lists those mistakes.
"""

import torch

from .common import CheckResult, LabCheckFailed, raise_if_error
from .halving_doubling import HINTS as SHARED
from .halving_doubling import check_partners, collectives_and_errors, pattern, run_sizes, value_mistake, wrong_at
from .halving_doubling_tables import check_world_sizes_held, halving_plan, teacher_plans

NAME = "halving_reduce_scatter"

HINTS = {
    **SHARED,
    "wrong_order": "halve from the largest distance down: d = p/2, p/4, ..., 1. Starting at d = 1 leaves rank v "
                   "with chunk bit-reversed(v) (on 4 ranks, ranks 1 and 2 swap chunks): the first step decides "
                   "the top bit of the chunk a rank ends with.",
    "mirrored": "the rank whose bit d is CLEAR (v & d == 0) keeps the LOWER half of the range and sends the upper "
                "one; with the rule the other way round, rank v ends with chunk p - 1 - v.",
    "halved_elements": "the lab's first trap: you halve the range of ELEMENTS [lo, hi) at its middle element, and "
                       "that middle is often not a chunk boundary when the tensor does not cut evenly into p chunks "
                       "(your answer is right when it does). torch.tensor_split makes the first numel % p chunks one "
                       "element longer, so the halves of the elements and the halves of the chunks differ: halve the "
                       "range of chunk indices "
                       "and look its elements up in chunk_bounds(numel, p). (Chunk offsets k * numel // p cut "
                       "exactly like this on 2 and 4 ranks: if that is what you wrote, the fix is the same.)",
    "dropped_element": "each half of your range has (hi - lo) // 2 elements, so when the range is odd its last "
                       "element belongs to neither half and is never summed (the lab's first trap): halve the range "
                       "of chunk indices and look its elements up in chunk_bounds(numel, p), which covers every "
                       "element.",
    "chunk_bounds": "your chunks are not torch.tensor_split's: with offsets of your own (numel // p elements per "
                    "chunk and the remainder in the last one, or k * numel // p), rank v ends with other elements "
                    "than chunk v of tensor_split. tensor_split "
                    "makes the FIRST numel % p chunks one element longer: take the offsets from "
                    "chunk_bounds(numel, p).",
    "uneven": "right when the tensor cuts evenly into p chunks, wrong otherwise, in a way the checker could not tell "
              "apart. Several mistakes give this symptom: halving the elements of the range instead of its chunks "
              "(the middle element is not a chunk boundary); (hi - lo) // 2 elements per half, which drops an odd "
              "one; chunk offsets other than torch.tensor_split's (it makes the FIRST numel % p chunks one longer). "
              "Halve the range of CHUNKS and find its elements with chunk_bounds(numel, p).",
    "wrong": "each step halves the range of chunks [a, b) a rank holds: the rank whose bit d is clear keeps "
             "[a, c), its partner [c, b), c = (a + b) // 2, and each ADDS the half it receives (receive into a "
             "scratch buffer first: the half you keep still holds your own contribution).",
}


def _bit_reversed(v, p):
    return int(f"{v:0{p.bit_length() - 1}b}"[::-1], 2) if p > 1 else 0


def _check_case(n, label, numel, ranks, every=()):
    """Raise LabCheckFailed for the first mistake this case shows."""
    __tracebackhide__ = True
    error = collectives_and_errors(n, label, ranks, HINTS)
    if len(ranks) == n and not error:
        chunk = lambda k, key, c=None: ranks[k][key].tensor_split(n)[k if c is None else c]  # noqa: E731
        wrong = [k for k in range(n) if not torch.equal(chunk(k, "got"), chunk(k, "expected"))]
        if wrong:
            parts = [[chunk(k, key) for k in range(n)] for key in ("got", "expected", "original")]
            mistake, fits = value_mistake(n, *parts, ranks), []
            if mistake is None:
                plan = halving_plan(numel, n)
                check_partners(n, f"{label}: the values are wrong, and", ranks, {v: plan[v][0] for v in plan}, HINTS)

                def holds(which):  # every rank k holds chunk which(k), complete
                    return all(torch.equal(chunk(k, "got", which(k)), chunk(k, "expected", which(k))) for k in range(n))
                # the first case cuts evenly: an answer that fails only on the others has the right rule and
                # the right order, so a chunk that only looks mirrored (an empty one) is a wrong cut; which cut, the
                # teacher's side tells where the course holds it (not the release: there, uneven)
                teacher = teacher_plans() if numel % n else None
                fits = teacher.uneven_mistake(n, every) if teacher else []
                mistake = (fits[0] if len(fits) == 1 else "uneven" if numel % n else
                           "wrong_order" if holds(lambda k: _bit_reversed(k, n)) else
                           "mirrored" if holds(lambda k: n - 1 - k) else "wrong")
            k = wrong[0]
            if len(fits) > 1:
                err = LabCheckFailed("uneven", f"{label}: chunk {k} on rank {k} is wrong, and several mistakes give "
                                     f"exactly these messages and sums on {n} ranks; the checker cannot tell them "
                                     "apart:\n" + "\n".join(f"- {m}: {HINTS[m]}" for m in fits),
                                     HINTS["uneven"], n)
                err.fits = fits  # check_halving_reduce_scatter asks a larger world size to tell them apart
                raise err
            wrong_at(n, label, numel, mistake, HINTS, k, chunk(k, "got"), chunk(k, "expected"),
                     f"chunk {k} of the sum, which rank {k} must hold")
    raise_if_error(error, n, HINTS)
    plan = halving_plan(numel, n)
    pattern(n, label, ranks, {v: plan[v][0] for v in plan}, {v: plan[v][1] for v in plan}, HINTS)


def check_halving_reduce_scatter(fn, world_sizes=(2, 4), timeout=20.0):
    """Check ``fn(tensor) -> None``: a SUM reduce-scatter by recursive halving, in place, on p = 2^k ranks.

    On each world size p, runs every case of ``halving_doubling.cases(p)`` and demands: (1) no collective
    is called; (2) chunk v of every rank v equals chunk v of the sum of the ranks' inputs, which the checker
    computes itself; (3) each rank sends only to v XOR d, for d = p/2, ..., 1 in that order, one message per
    step; (4) exactly the elements
    ``halving_plan`` says: (p-1)/p of the tensor per rank, give or take the uneven chunks. Returns a
    ``CheckResult``; raises ``LabCheckFailed`` with a hint.
    """
    __tracebackhide__ = True
    odd = [n for n in world_sizes if n < 2 or n & (n - 1)]
    if odd:
        raise ValueError(f"world sizes {odd}: recursive halving alone runs on a power of two of ranks; use 2, 4 or 8 "
                         "(lab 01b folds the other sizes in).")
    check_world_sizes_held(world_sizes)
    partners = lambda n, numel: {v: dests for v, (dests, _) in halving_plan(numel, n).items()}  # noqa: E731
    try:
        last = run_sizes(fn, "reduce_scatter", world_sizes, timeout, NAME, _check_case, None, partners)
    except LabCheckFailed as err:
        larger = [m for m in world_sizes if m > (err.world_size or 0)]
        if not getattr(err, "fits", None) or not larger:
            raise
        try:  # on 2 ranks two cuts are one; on 4 they differ: name the one this answer makes
            run_sizes(fn, "reduce_scatter", larger[:1], timeout, NAME, _check_case, None, partners)
        except LabCheckFailed as there:
            if there.mistake in err.fits:
                detail = str(there).split("\n")[0].split(": ", 1)[-1]
                raise LabCheckFailed(there.mistake, f"on {err.world_size} ranks {' and '.join(err.fits)} look "
                                     f"alike; on {there.world_size} ranks only {there.mistake} fits: {detail}",
                                     there.hint, there.world_size, there.evidence) from None
        raise
    lines = []
    for n, ranks in last.items():
        numel, size = ranks[0]["got"].numel(), ranks[0]["got"].element_size()
        lines.append(f"world_size={n}: every case's chunk v on rank v equals the sum's; on {numel:,} "
                     f"elements each rank sent {max(len(r['sends']) for r in ranks)} message(s) (a ring: {n - 1}), "
                     f"{sum(r['sent'] for r in ranks) / (n * numel * size):.4f} of the tensor on average "
                     f"(formula (p-1)/p = {(n - 1) / n:.4f}), only to v XOR d, d = {n // 2} first")
    return CheckResult(NAME, lines)
