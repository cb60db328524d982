"""The checker of lab 01b's first part: an all-gather by recursive doubling among p = 2^k of the ranks.

Used by ``labs/01b_doubling_all_gather_lab.ipynb``; the machinery is ``utils.checkers.halving_doubling``'s.
The answer ``fn(tensor, ranks)`` is called on the ranks ``ranks`` only (``halving_doubling.virtual_ranks(n)``:
all of them on a power of two, the ranks a fold leaves on any other size), with chunk v of
``tensor.view(-1).tensor_split(p)`` complete on rank ``ranks[v]`` and -1 everywhere else. It must leave the
whole tensor on each of them, sending only to ``ranks[v ^ d]`` for d = 1, 2, ..., p/2 in that order, one
message per step, the d chunks it holds.
"""

from .common import CheckResult, LabCheckFailed, raise_if_error
from .halving_doubling import HINTS as SHARED
from .halving_doubling import check_partners, collectives_and_errors, doubling_plan, pattern, run_sizes
from .halving_doubling import virtual_ranks, wrong_at
from .halving_doubling_tables import check_world_sizes_held

NAME = "doubling_all_gather"

HINTS = {
    **{k: hint for k, hint in SHARED.items() if k != "averaged"},  # a gather sums nothing: nothing to divide
    "not_in_place": "write the chunks you receive into the tensor you were given, at their place (slices of "
                    "flat = tensor.view(-1) are views); the caller ignores the return value.",
    "wrong_order": "double from the smallest distance up: d = 1, 2, ..., p/2, the halving's steps backwards. At "
                   "step d a rank holds d chunks that sit beside its partner's d chunks: together one range of 2d.",
    "wrong": "at step d rank ranks[v] holds chunks [a, a + d), a = v - v % d, and its partner ranks[v ^ d] the d "
             "chunks from (v ^ d) - (v ^ d) % d; send yours and receive theirs straight into their place (what "
             "arrives is final: nothing to add).",
    "not_virtual": "right on a power of two of ranks, wrong on the others, where only p = len(ranks) ranks take "
                   "part: your virtual rank is v = ranks.index(dist.get_rank()), your partner the real rank "
                   "ranks[v ^ d], and the chunks are those of tensor_split(flat, len(ranks)), not of the world size.",
}


def _partners(n, numel):
    """{rank: its partners, in order}: ranks[v ^ d] for the p ranks that take part, nobody for those that sit out."""
    plan = doubling_plan(numel, virtual_ranks(n))
    return {k: plan[k][0] if k in plan else [] for k in range(n)}


def _check_case(n, label, numel, ranks, every=()):
    """Raise LabCheckFailed for the first mistake this case shows."""
    __tracebackhide__ = True
    members = virtual_ranks(n)
    error = collectives_and_errors(n, label, ranks, HINTS)
    if len(ranks) == n and not error:
        wrong = [k for k in members if not (ranks[k]["got"] == ranks[k]["expected"]).all()]
        if wrong:
            k, p = wrong[0], len(members)
            returned = [ranks[m]["returned"] for m in members]
            if all(r is not None and (r == ranks[m]["expected"]).all() for r, m in zip(returned, members)):
                mistake = "not_in_place"
            elif p >= 4 and all(ranks[m]["sends"] and ranks[m]["sends"][0][0] == members[v ^ (p // 2)]
                                for v, m in enumerate(members)):
                mistake = "wrong_order"  # the first message went to the farthest partner
            else:
                check_partners(n, f"{label}: the values are wrong, and", ranks, _partners(n, numel), HINTS)
                mistake = "wrong"
            wrong_at(n, label, numel, mistake, HINTS, k, ranks[k]["got"], ranks[k]["expected"])
    raise_if_error(error, n, HINTS)
    plan = doubling_plan(numel, members)
    outside = {k: ([], 0) for k in range(n) if k not in plan}  # the ranks that sit out send nothing
    pattern(n, label, ranks, {k: v[0] for k, v in {**plan, **outside}.items()},
            {k: v[1] for k, v in {**plan, **outside}.items()}, HINTS)


def _other_size(n, err):
    __tracebackhide__ = True
    if err.mistake in ("wrong", "crash", "size_mismatch", "unpaired", "raised", "deadlock", "wrong_partner", "too_many_messages"):
        raise LabCheckFailed("not_virtual", f"right on the powers of two, but not on {n} ranks (ranks "
                             f"{virtual_ranks(n)} take part):\n{err}", HINTS["not_virtual"], n) from None


def check_doubling_all_gather(fn, world_sizes=(2, 3, 4), timeout=20.0):
    """Check ``fn(tensor, ranks) -> None``: an all-gather by recursive doubling among ``ranks``, in place.

    Powers of two first. On each world size n, runs every case of ``halving_doubling.cases(p)`` on the ranks
    ``virtual_ranks(n)`` (p of them) and demands: (1) no collective is called; (2) every one of them ends with
    the whole tensor; (3) each sends only to ``ranks[v ^ d]``, d = 1, 2, ..., p/2 in that order, one message
    per step; (4) exactly the elements ``doubling_plan`` says, (p-1)/p of the tensor. Once the powers of two
    have passed, a failure on another size is reported as virtual ranks that are missing (``not_virtual``).
    Returns a ``CheckResult``; raises ``LabCheckFailed`` with a hint.
    """
    __tracebackhide__ = True
    check_world_sizes_held(world_sizes)
    last = run_sizes(fn, "all_gather", world_sizes, timeout, NAME, _check_case, _other_size, _partners)
    lines = []
    for n, ranks in last.items():
        members = virtual_ranks(n)
        p, numel, size = len(members), ranks[0]["got"].numel(), ranks[0]["got"].element_size()
        lines.append(f"world_size={n}: ranks {members} take part; every case ends with the whole tensor on each; on "
                     f"{numel:,} elements each sent {max(len(ranks[m]['sends']) for m in members)} message(s) (a "
                     f"ring: {p - 1}), {sum(ranks[m]['sent'] for m in members) / (p * numel * size):.4f} of the "
                     f"tensor on average (formula (p-1)/p = {(p - 1) / p:.4f}), only to ranks[v ^ d], d = 1 first")
    return CheckResult(NAME, lines)
