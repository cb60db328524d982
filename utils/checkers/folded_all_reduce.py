"""The checker of lab 01b's second part: the all-reduce on any n ranks, folded onto p = 2^k of them.

Used by ``labs/01b_doubling_all_gather_lab.ipynb``; the machinery is ``utils.checkers.halving_doubling``'s.
The answer ``fn(tensor, reduce_scatter)`` folds the ranks beyond p in, calls the ``reduce_scatter(tensor,
ranks)`` it is given (torch's, ``utils.comm.subgroup.reduce_scatter_chunks``; the checker passes one that
notes each call), gathers with its recursive doubling and unfolds. Besides the values, the checker
demands that the given reduce-scatter is the only collective, called once on each of the p ranks with
``ranks = virtual_ranks(n)``, and that the point-to-point messages are the fold's, the all-gather's and
the unfold's, to the right ranks, with the right bytes: ``plan(n, numel)``, a stored table
(``utils.checkers.halving_doubling_tables.folded_plan``).
"""

import torch

from .common import CheckResult, LabCheckFailed, raise_if_error
from .halving_doubling import HINTS as SHARED
from .halving_doubling import check_partners, collectives_and_errors, pattern, run_sizes
from .halving_doubling import value_mistake
from .halving_doubling import virtual_ranks, wrong_at
from .halving_doubling_tables import check_world_sizes_held
from .halving_doubling_tables import folded_plan as plan  # {rank: (destinations, elements)}: fold, all-gather, unfold
from .doubling_all_gather import HINTS as GATHER_HINTS

NAME = "halving_doubling_all_reduce"
HINTS = {
    **SHARED,
    "fold_dropped": "the ranks that sit out must not lose their data: each odd rank below 2*rem receives its even "
                    "partner's whole tensor and ADDS it into its own before the reduce-scatter.",
    "not_unfolded": "the ranks that ran the algorithm are right; the folded ones (the even ranks below 2*rem) are "
                    "not: at the end each odd rank below 2*rem must send the complete sum back to the even rank "
                    "before it, which receives it into its tensor.",
    "not_power_of_two": "on a world size that is not a power of two, fold the extra ranks first: with p the "
                        "largest power of two <= n and rem = n - p, each even rank below 2*rem sends its whole "
                        "tensor to the odd rank after it and sits out; the odd ranks and the ranks from 2*rem on "
                        "(ranks[v] = 2v + 1 if v < rem else v + rem) run the algorithm as virtual ranks 0..p-1; "
                        "at the end each odd rank sends the result back.",
    "reduce_scatter_calls": "call the reduce_scatter you were given exactly once, on every rank that takes part, "
                            "with ranks = the p ranks that run the algorithm, in virtual-rank order.",
    "wrong_partner": SHARED["wrong_partner"] + " Outside the all-gather, a rank talks only to its fold partner: "
                                               "the even rank below 2*rem and the odd rank after it.",
    "wrong_order": GATHER_HINTS["wrong_order"],
    "wrong": "the p ranks must all call reduce_scatter(tensor, ranks), which leaves chunk v on ranks[v], then your "
             "doubling_all_gather(tensor, ranks); check the all-gather on its own first (the cell above).",
}


def _partners(n, numel):
    """{rank: the ranks it sends to, in order}: the fold's, the all-gather's, the unfold's."""
    return {k: dests for k, (dests, _) in plan(n, numel).items()}


def _check_case(n, label, numel, ranks, every=()):
    """Raise LabCheckFailed for the first mistake this case shows."""
    __tracebackhide__ = True
    members = virtual_ranks(n)
    error = collectives_and_errors(n, label, ranks, HINTS, allowed=True)
    if len(ranks) == n and not error:
        got, exp, orig = ([r[key] for r in ranks] for key in ("got", "expected", "original"))
        wrong = [k for k in range(n) if not torch.equal(got[k], exp[k])]
        if wrong:
            folded = set(range(n)) - set(members)  # the even ranks below 2 rem, which sit out
            dropped = sum(orig[k] for k in range(n) if k not in folded)  # the checker's own inputs (run_sizes)
            mistake = value_mistake(n, got, exp, orig, ranks)
            if mistake is None:
                check_partners(n, f"{label}: the values are wrong, and", ranks, _partners(n, numel), HINTS)
            mistake = mistake or (
                "fold_dropped" if folded and all(torch.equal(got[k].cpu(), dropped) for k in wrong) else
                "not_unfolded" if set(wrong) <= folded else "wrong")
            wrong_at(n, label, numel, mistake, HINTS, wrong[0], got[wrong[0]], exp[wrong[0]])
    raise_if_error(error, n, HINTS)
    calls = {k: r["calls"] for k, r in enumerate(ranks)}
    want = {k: [members] if k in members else [] for k in range(n)}
    if calls != want:
        k = next(k for k in range(n) if calls[k] != want[k])
        raise LabCheckFailed("reduce_scatter_calls", f"{label}: the values are right, but rank {k} called "
                             f"reduce_scatter with {calls[k] or 'nothing'}; it must call it "
                             f"{'once, with ranks=' + str(members) if want[k] else 'never (it sits out)'}.",
                             HINTS["reduce_scatter_calls"], n)
    wanted = plan(n, numel)
    pattern(n, label, ranks, {k: v[0] for k, v in wanted.items()}, {k: v[1] for k, v in wanted.items()}, HINTS)


def _other_size(n, err):
    __tracebackhide__ = True
    # not wrong_partner: the fold's messages are in the plan, so a rank named there folded to the wrong rank
    if err.mistake in ("wrong", "crash", "size_mismatch", "unpaired", "raised", "deadlock", "too_many_messages", "reduce_scatter_calls"):
        raise LabCheckFailed("not_power_of_two", f"right on the powers of two, but not on {n} ranks:\n{err}",
                             HINTS["not_power_of_two"], n) from None


def check_halving_doubling_all_reduce(fn, world_sizes=(2, 3, 4), timeout=20.0):
    """Check ``fn(tensor, reduce_scatter) -> None``, an in-place SUM all-reduce on any number of ranks.

    Powers of two first. On each world size n, runs every case of ``halving_doubling.cases(p)`` and demands:
    (1) no collective but the given reduce-scatter, called once by each of ``virtual_ranks(n)`` with those
    ranks; (2) every rank's tensor equals the sum of the ranks' inputs, which the checker computes itself; (3) the point-to-point messages of ``plan(n,
    numel)``, in order, to those ranks, with exactly those elements. Once the powers of two have passed, a
    failure on another size is reported as the fold that is missing. Returns a ``CheckResult``; raises
    ``LabCheckFailed`` with a hint.
    """
    __tracebackhide__ = True
    check_world_sizes_held(world_sizes)
    last = run_sizes(fn, "all_reduce", world_sizes, timeout, NAME, _check_case, _other_size, _partners)
    lines = []
    for n, ranks in last.items():
        numel, size = ranks[0]["got"].numel(), ranks[0]["got"].element_size()
        p = len(virtual_ranks(n))
        lines.append(f"world_size={n}: every case equals the sum of the inputs on every rank; on {numel:,} elements "
                     f"{p} ranks called the reduce-scatter, the ranks sent {sum(len(r['sends']) for r in ranks)} "
                     f"message(s) in all, {sum(r['sent'] for r in ranks) / (numel * size):.4f} tensors point to point "
                     f"(formula: the all-gather's p - 1 = {p - 1}, + 2 per folded pair: {p - 1 + 2 * (n - p)})")
    return CheckResult(NAME, lines)
