"""The teacher's side of the checkers of labs 01a and 01b: the plans they judge an answer's messages by, computed, and
the diagnosis that tells the uneven cuts apart. Not an answer to copy, and not for learners: it lives here, in
``labs/solutions/``, which the student release leaves out and the grader's sandbox hides.

The shipped checkers (``utils/checkers/halving_reduce_scatter.py``, ``doubling_all_gather.py``,
``folded_all_reduce.py``) judge by results: each rank's values against the sum the checker computes from the
ranks' inputs, and its messages (to whom, in which order, how many elements) against stored tables of the outputs
of the plans below, for the world sizes the labs accept and the element counts the checkers run and the labs'
notebooks show (``utils/checkers/halving_doubling_tables.py``). This module is where those tables come from (``tables``;
tests/checkers/test_halving_doubling.py recomputes every row and fails on a difference), what computes a size the
tables do not hold, and, where the checker can load it (the teacher's checkout: ``make grade``'s judge, the tests,
the lab run by its teacher), what names the wrong cut of an answer that is right only when the tensor cuts evenly
(``uneven_mistake``: ``halved_elements``, ``dropped_element``, ``chunk_bounds``); without it (the student release)
that answer gets the generic ``uneven``.

    python -m labs.solutions.halving_doubling_plans   # prints the tables, to paste into halving_doubling_tables.py
"""

import torch

from utils.checkers.halving_doubling import cases
from utils.comm.subgroup import chunk_bounds

WORLD_SIZES = range(2, 9)  # every world size labs 01a (2, 4, 8) and 01b (2 to 8) accept: utils/checkers/labs.py
SHOWN = (120, 256, 840 * 120, 840 * 2400)  # element counts the labs' notebooks print and measure (SMOKE or not)


# ------------------------------------------------------------------ the plans


def virtual_ranks(n):
    """The ranks that run the p-rank algorithm after the fold, in virtual-rank order (p = 2^k <= n)."""
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    return [2 * u + 1 if u < rem else u + rem for u in range(p)]


def halving_plan(numel, p):
    """{v: (destinations in order, elements sent)} of the reduce-scatter by recursive halving on p ranks."""
    bounds, out = chunk_bounds(numel, p), {}
    for v in range(p):
        a, b, d, dests, elements = 0, p, p // 2, [], 0
        while d >= 1:
            c = (a + b) // 2
            keep, give = ((a, c), (c, b)) if v & d == 0 else ((c, b), (a, c))
            dests.append(v ^ d)
            elements += bounds[give[1]] - bounds[give[0]]
            (a, b), d = keep, d // 2
        out[v] = (dests, elements)
    return out


def doubling_plan(numel, ranks):
    """{real rank: (destinations in order, elements sent)} of the all-gather by recursive doubling among ``ranks``."""
    p, out = len(ranks), {}
    bounds = chunk_bounds(numel, p)
    for v, rank in enumerate(ranks):
        dests, elements, d = [], 0, 1
        while d < p:
            a = v - v % d
            dests.append(ranks[v ^ d])
            elements += bounds[a + d] - bounds[a]
            d *= 2
        out[rank] = (dests, elements)
    return out


def folded_plan(n, numel):
    """{rank: (destinations in order, elements sent)}, ranks in order: the fold, the all-gather among the p, the
    unfold."""
    members, folded = virtual_ranks(n), n - (1 << (n.bit_length() - 1))
    out = {k: ([k + 1], numel) for k in range(0, 2 * folded, 2)}  # even ranks below 2 rem: their whole tensor
    for k, (dests, elements) in doubling_plan(numel, members).items():
        out[k] = (dests + [k - 1], elements + numel) if k < 2 * folded else (dests, elements)  # + the unfold
    return dict(sorted(out.items()))


# ------------------------------------------------------------------ the uneven cuts, told apart


def _halves(lo, hi, cut):
    """The two halves of the element range [lo, hi) under ``cut``, the way each uneven mistake cuts it."""
    if cut == "floor":  # lo + (hi - lo) // 2, the lab's first trap
        mid = lo + (hi - lo) // 2
        return (lo, mid), (mid, hi)
    if cut == "ceil":  # the same, rounded up
        mid = lo + (hi - lo + 1) // 2
        return (lo, mid), (mid, hi)
    half = (hi - lo) // 2  # "drop": (hi - lo) // 2 elements a half; an odd range's last element in neither
    return (lo, lo + half), (lo + half, lo + 2 * half)


def uneven_plan(numel, p, cut):
    """{v: (non-empty sends as (partner, elements), element range v ends with)} of recursive halving that cuts
    the wrong way: ``cut`` "floor", "ceil" or "drop" halves the elements, "last" halves chunks whose offsets put
    the remainder in the last chunk (numel // p elements each), "spread" chunks at offsets k * numel // p. The
    right partners, the right rule: only the cuts differ, so the checker can recognise each by its messages and by
    where the sums land."""
    out = {}
    for v in range(p):
        lo, hi, a, b, d, sends = 0, numel, 0, p, p // 2, []
        while d >= 1:
            if cut in ("last", "spread"):
                bounds = ([k * (numel // p) for k in range(p)] + [numel] if cut == "last"
                          else [k * numel // p for k in range(p + 1)])
                c = (a + b) // 2
                low, high = (bounds[a], bounds[c]), (bounds[c], bounds[b])
            else:
                low, high = _halves(lo, hi, cut)
            keep, give = (low, high) if v & d == 0 else (high, low)
            if give[1] > give[0]:
                sends.append((v ^ d, give[1] - give[0]))
            (lo, hi), (a, b), d = keep, ((a, (a + b) // 2) if v & d == 0 else ((a + b) // 2, b)), d // 2
        out[v] = (sends, (lo, hi))
    return out


UNEVEN = {"floor": "halved_elements", "ceil": "halved_elements", "drop": "dropped_element", "last": "chunk_bounds",
          "spread": "chunk_bounds"}  # spread: offsets k * numel // p, on 2 and 4 ranks the same cut as "floor"


def uneven_mistake(n, every):
    """Which wrong cut explains every case the ranks ran (``every``: (numel, ranks) each), by the messages each rank
    sent and where the complete sums are: the mistakes that fit. One case may fit two cuts, the cases together
    rarely do; but on 2 ranks halving the elements and chunks with the remainder last are the same cut."""
    fit = set()
    for cut in UNEVEN:
        plans = {numel: uneven_plan(numel, n, cut) for numel, _ in every}
        if all([(peer, size // r["got"].element_size()) for peer, size in r["sends"] if size] == plans[numel][k][0]
               and torch.equal(r["got"][slice(*plans[numel][k][1])], r["expected"][slice(*plans[numel][k][1])])
               for numel, ranks in every if len(ranks) == n for k, r in enumerate(ranks)):
            fit.add(cut)
    if {"floor", "spread"} <= fit:  # the same cut up to 4 ranks: the lab's trap, whose hint names the other too
        fit.discard("spread")
    return sorted({UNEVEN[cut] for cut in fit})


# ------------------------------------------------------------------ the checkers' stored tables


def _numels(p, shown=SHOWN):
    """The element counts a table holds on p = 2^k ranks: the cases the checkers run, and those the labs show."""
    return sorted({numel for numel, _ in cases(p)} | set(shown))


def tables():
    """{name: table} of every table in utils/checkers/halving_doubling_tables.py, computed: the destinations of
    each plan (the same at every element count) and its elements per rank, at each size the checkers and the labs'
    notebooks use (the all-gather's are the checkers' only: no notebook calls ``doubling_plan``)."""
    powers = sorted({1 << (n.bit_length() - 1) for n in WORLD_SIZES})
    members = [tuple(virtual_ranks(n)) for n in WORLD_SIZES]

    def dests(plan):
        return tuple(tuple(d) for d, _ in plan.values())

    def elements(plan):
        return tuple(e for _, e in plan.values())

    return dict(
        VIRTUAL_RANKS={n: tuple(virtual_ranks(n)) for n in WORLD_SIZES},
        HALVING_PARTNERS={p: dests(halving_plan(p, p)) for p in powers},
        HALVING_ELEMENTS={(numel, p): elements(halving_plan(numel, p)) for p in powers for numel in _numels(p)},
        DOUBLING_PARTNERS={ranks: dests(doubling_plan(len(ranks), ranks)) for ranks in members},
        DOUBLING_ELEMENTS={(numel, p): elements(doubling_plan(numel, range(p))) for p in powers
                           for numel in _numels(p, ())},
        FOLDED_PARTNERS={n: dests(folded_plan(n, n)) for n in WORLD_SIZES},
        FOLDED_ELEMENTS={(n, numel): elements(folded_plan(n, numel)) for n in WORLD_SIZES
                         for numel in _numels(1 << (n.bit_length() - 1))},
    )


def differences(stored, found=None):
    """Where ``stored`` ({name: table}, as the checkers ship them) is not what ``tables()`` computes now (``found``),
    one line per row: a row stored wrong, a row missing, a row too many. [] when every row is the computation's."""
    found = tables() if found is None else found
    lines = []
    for name in sorted(set(stored) | set(found)):
        have, want = stored.get(name, {}), found.get(name, {})
        for key in sorted(set(have) | set(want), key=repr):
            if have.get(key) != want.get(key):
                lines.append(f"{name}[{key!r}]: stored {have.get(key)}, computed {want.get(key)}")
    return lines


def table_source(found=None, width=118):
    """The tables as the Python source of utils/checkers/halving_doubling_tables.py's: rows packed into lines of at
    most ``width`` characters."""
    found = tables() if found is None else found
    out = []
    for name, table in found.items():
        out.append(f"{name} = {{")
        line = "   "
        for key, row in table.items():
            item = f" {key!r}: {row!r},"
            if len(line) + len(item) > width:
                out.append(line)
                line = "   "
            line += item
        out += [line, "}"]
    return "\n".join(out)


if __name__ == "__main__":
    print(table_source())
