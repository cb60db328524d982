"""The plans labs 01a and 01b judge an answer's messages by, stored as numbers: to whom each rank sends, in which
order, and how many elements, in recursive halving (lab 01a), recursive doubling and the fold around it (lab 01b).

The checkers judge an answer by its results: each rank's values against the sum the checker computes itself from the
ranks' inputs, and the messages it sent (``halving_doubling.PeerLog``, ``CommLedger``) against these plans. The
release carries no code that plans the algorithm (issue 37, part 1): each function below looks its answer up in a
table of outputs, written by the teacher's side of these checkers (``labs.solutions.halving_doubling_plans``, in the
solutions folder, which the student release leaves out and the grader's sandbox hides: ``python -m
labs.solutions.halving_doubling_plans`` prints the tables), and tests/checkers/test_halving_doubling.py recomputes
every row and fails on a difference. The tables hold every world size the labs accept (2 to 8; p = 2, 4, 8 for the
plans among a power of two), the element counts of ``halving_doubling.cases(p)``, which the checkers run, and those
the labs' notebooks print and measure. A destination list is the same at every element count, so it is stored once per
world size (``*_PARTNERS``), the elements per world size and element count (``*_ELEMENTS``). A size the tables do not
hold is computed by the teacher's module where the course holds it (the teacher's checkout); in the release it raises
a ValueError naming the sizes held.
"""

from ..launch.scripts import ROOT
from .teacher_side import teacher_module

__all__ = ["virtual_ranks", "halving_plan", "doubling_plan", "folded_plan", "teacher_plans", "check_world_sizes_held"]

PLANS = ROOT / "labs" / "solutions" / "halving_doubling_plans.py"  # the teacher's side of these tables; not released


def teacher_plans():
    """The teacher's side of labs 01a and 01b's checkers (the plans computed, and ``uneven_mistake``, the diagnosis of
    an uneven cut), where the course holds it: the teacher's checkout. None in the student release and in the grader's
    sandbox."""
    return teacher_module(PLANS)


def _computed(name, args, held):
    """``name(*args)`` from the teacher's module, for a size the tables do not hold; in the release, a ValueError."""
    plans = teacher_plans()
    if plans is None:
        raise ValueError(f"{name}({', '.join(map(repr, args))}): not in the stored plans of labs 01a and 01b, which "
                         f"hold {held}. The student release computes no other size (the teacher's checkout does, "
                         "with labs.solutions.halving_doubling_plans): call it with one of those.")
    return getattr(plans, name)(*args)


def _held(table, size_at):
    """What an elements table holds, in words: the element counts on each world size."""
    sizes = sorted({key[size_at] for key in table})
    return "; ".join(f"on {n} ranks {', '.join(str(key[1 - size_at]) for key in sorted(table) if key[size_at] == n)}"
                     for n in sizes)


def virtual_ranks(n):
    """The ranks that run the p-rank algorithm after the fold, in virtual-rank order (p = 2^k <= n): the row of
    ``VIRTUAL_RANKS``."""
    if n in VIRTUAL_RANKS:
        return list(VIRTUAL_RANKS[n])
    return _computed("virtual_ranks", (n,), f"world sizes {sorted(VIRTUAL_RANKS)}")


def check_world_sizes_held(world_sizes):
    """Before launching: a ValueError for a world size whose plans the course does not hold (over 8, in the release),
    rather than ranks that stop in ``virtual_ranks``."""
    missing = [n for n in world_sizes if n not in VIRTUAL_RANKS]
    if missing and teacher_plans() is None:
        raise ValueError(f"world sizes {missing}: the stored plans of labs 01a and 01b hold world sizes "
                         f"{sorted(VIRTUAL_RANKS)}, and the student release computes no other; use those.")


def halving_plan(numel, p):
    """{v: (destinations in order, elements sent)} of the reduce-scatter by recursive halving on p ranks: the rows
    of ``HALVING_PARTNERS`` and ``HALVING_ELEMENTS``."""
    if p in HALVING_PARTNERS and (numel, p) in HALVING_ELEMENTS:
        return {v: (list(dests), elements)
                for v, (dests, elements) in enumerate(zip(HALVING_PARTNERS[p], HALVING_ELEMENTS[numel, p]))}
    return _computed("halving_plan", (numel, p), _held(HALVING_ELEMENTS, 1))


def doubling_plan(numel, ranks):
    """{real rank: (destinations in order, elements sent)} of the all-gather by recursive doubling among ``ranks``:
    the rows of ``DOUBLING_PARTNERS`` and ``DOUBLING_ELEMENTS`` (which holds each v's, in the order of ``ranks``)."""
    key = tuple(ranks)
    if key in DOUBLING_PARTNERS and (numel, len(key)) in DOUBLING_ELEMENTS:
        return {rank: (list(dests), elements)
                for rank, dests, elements in zip(key, DOUBLING_PARTNERS[key], DOUBLING_ELEMENTS[numel, len(key)])}
    return _computed("doubling_plan", (numel, list(ranks)),
                     f"the ranks {sorted(DOUBLING_PARTNERS, key=len)}, {_held(DOUBLING_ELEMENTS, 1)}")


def folded_plan(n, numel):
    """{rank: (destinations in order, elements sent)}, ranks in order: the fold, the all-gather among the p, the
    unfold (``folded_all_reduce.plan``): the rows of ``FOLDED_PARTNERS`` and ``FOLDED_ELEMENTS``."""
    if n in FOLDED_PARTNERS and (n, numel) in FOLDED_ELEMENTS:
        return {k: (list(dests), elements)
                for k, (dests, elements) in enumerate(zip(FOLDED_PARTNERS[n], FOLDED_ELEMENTS[n, numel]))}
    return _computed("folded_plan", (n, numel), _held(FOLDED_ELEMENTS, 0))


# The tables, as labs.solutions.halving_doubling_plans computes them (paste its output here):
# VIRTUAL_RANKS: {n: ranks}; *_PARTNERS: {world size (p, ranks or n): each rank's destinations, in order};
# *_ELEMENTS: {(numel, p) or (n, numel): each rank's elements sent}, in the argument order of the function above.
VIRTUAL_RANKS = {
    2: (0, 1), 3: (1, 2), 4: (0, 1, 2, 3), 5: (1, 2, 3, 4), 6: (1, 3, 4, 5), 7: (1, 3, 5, 6),
    8: (0, 1, 2, 3, 4, 5, 6, 7),
}
HALVING_PARTNERS = {
    2: ((1,), (0,)), 4: ((2, 1), (3, 0), (0, 3), (1, 2)),
    8: ((4, 2, 1), (5, 3, 0), (6, 0, 3), (7, 1, 2), (0, 6, 5), (1, 7, 4), (2, 4, 7), (3, 5, 6)),
}
HALVING_ELEMENTS = {
    (1, 2): (0, 1), (8, 2): (4, 4), (9, 2): (4, 5), (10, 2): (5, 5), (120, 2): (60, 60), (256, 2): (128, 128),
    (25003, 2): (12501, 12502), (100800, 2): (50400, 50400), (2016000, 2): (1008000, 1008000), (1, 4): (0, 1, 1, 1),
    (3, 4): (2, 2, 2, 3), (16, 4): (12, 12, 12, 12), (17, 4): (12, 13, 13, 13), (18, 4): (13, 13, 14, 14),
    (120, 4): (90, 90, 90, 90), (256, 4): (192, 192, 192, 192), (25003, 4): (18752, 18752, 18752, 18753),
    (100800, 4): (75600, 75600, 75600, 75600), (2016000, 4): (1512000, 1512000, 1512000, 1512000),
    (1, 8): (0, 1, 1, 1, 1, 1, 1, 1), (7, 8): (6, 6, 6, 6, 6, 6, 6, 7), (32, 8): (28, 28, 28, 28, 28, 28, 28, 28),
    (33, 8): (28, 29, 29, 29, 29, 29, 29, 29), (34, 8): (29, 29, 30, 30, 30, 30, 30, 30),
    (120, 8): (105, 105, 105, 105, 105, 105, 105, 105), (256, 8): (224, 224, 224, 224, 224, 224, 224, 224),
    (25003, 8): (21877, 21877, 21877, 21878, 21878, 21878, 21878, 21878),
    (100800, 8): (88200, 88200, 88200, 88200, 88200, 88200, 88200, 88200),
    (2016000, 8): (1764000, 1764000, 1764000, 1764000, 1764000, 1764000, 1764000, 1764000),
}
DOUBLING_PARTNERS = {
    (0, 1): ((1,), (0,)), (1, 2): ((2,), (1,)), (0, 1, 2, 3): ((1, 2), (0, 3), (3, 0), (2, 1)),
    (1, 2, 3, 4): ((2, 3), (1, 4), (4, 1), (3, 2)), (1, 3, 4, 5): ((3, 4), (1, 5), (5, 1), (4, 3)),
    (1, 3, 5, 6): ((3, 5), (1, 6), (6, 1), (5, 3)),
    (0, 1, 2, 3, 4, 5, 6, 7): ((1, 2, 4), (0, 3, 5), (3, 0, 6), (2, 1, 7), (5, 6, 0), (4, 7, 1), (7, 4, 2), (6, 5, 3)),
}
DOUBLING_ELEMENTS = {
    (1, 2): (1, 0), (8, 2): (4, 4), (9, 2): (5, 4), (10, 2): (5, 5), (25003, 2): (12502, 12501), (1, 4): (2, 1, 0, 0),
    (3, 4): (3, 3, 2, 1), (16, 4): (12, 12, 12, 12), (17, 4): (14, 13, 12, 12), (18, 4): (15, 15, 12, 12),
    (25003, 4): (18753, 18753, 18752, 18751), (1, 8): (3, 2, 1, 1, 0, 0, 0, 0), (7, 8): (7, 7, 7, 7, 6, 6, 5, 4),
    (32, 8): (28, 28, 28, 28, 28, 28, 28, 28), (33, 8): (31, 30, 29, 29, 28, 28, 28, 28),
    (34, 8): (33, 33, 30, 30, 28, 28, 28, 28), (25003, 8): (21881, 21881, 21880, 21879, 21875, 21875, 21875, 21875),
}
FOLDED_PARTNERS = {
    2: ((1,), (0,)), 3: ((1,), (2, 0), (1,)), 4: ((1, 2), (0, 3), (3, 0), (2, 1)),
    5: ((1,), (2, 3, 0), (1, 4), (4, 1), (3, 2)), 6: ((1,), (3, 4, 0), (3,), (1, 5, 2), (5, 1), (4, 3)),
    7: ((1,), (3, 5, 0), (3,), (1, 6, 2), (5,), (6, 1, 4), (5, 3)),
    8: ((1, 2, 4), (0, 3, 5), (3, 0, 6), (2, 1, 7), (5, 6, 0), (4, 7, 1), (7, 4, 2), (6, 5, 3)),
}
FOLDED_ELEMENTS = {
    (2, 1): (1, 0), (2, 8): (4, 4), (2, 9): (5, 4), (2, 10): (5, 5), (2, 120): (60, 60), (2, 256): (128, 128),
    (2, 25003): (12502, 12501), (2, 100800): (50400, 50400), (2, 2016000): (1008000, 1008000), (3, 1): (1, 2, 0),
    (3, 8): (8, 12, 4), (3, 9): (9, 14, 4), (3, 10): (10, 15, 5), (3, 120): (120, 180, 60), (3, 256): (256, 384, 128),
    (3, 25003): (25003, 37505, 12501), (3, 100800): (100800, 151200, 50400),
    (3, 2016000): (2016000, 3024000, 1008000), (4, 1): (2, 1, 0, 0), (4, 3): (3, 3, 2, 1), (4, 16): (12, 12, 12, 12),
    (4, 17): (14, 13, 12, 12), (4, 18): (15, 15, 12, 12), (4, 120): (90, 90, 90, 90), (4, 256): (192, 192, 192, 192),
    (4, 25003): (18753, 18753, 18752, 18751), (4, 100800): (75600, 75600, 75600, 75600),
    (4, 2016000): (1512000, 1512000, 1512000, 1512000), (5, 1): (1, 3, 1, 0, 0), (5, 3): (3, 6, 3, 2, 1),
    (5, 16): (16, 28, 12, 12, 12), (5, 17): (17, 31, 13, 12, 12), (5, 18): (18, 33, 15, 12, 12),
    (5, 120): (120, 210, 90, 90, 90), (5, 256): (256, 448, 192, 192, 192),
    (5, 25003): (25003, 43756, 18753, 18752, 18751), (5, 100800): (100800, 176400, 75600, 75600, 75600),
    (5, 2016000): (2016000, 3528000, 1512000, 1512000, 1512000), (6, 1): (1, 3, 1, 2, 0, 0),
    (6, 3): (3, 6, 3, 6, 2, 1), (6, 16): (16, 28, 16, 28, 12, 12), (6, 17): (17, 31, 17, 30, 12, 12),
    (6, 18): (18, 33, 18, 33, 12, 12), (6, 120): (120, 210, 120, 210, 90, 90),
    (6, 256): (256, 448, 256, 448, 192, 192), (6, 25003): (25003, 43756, 25003, 43756, 18752, 18751),
    (6, 100800): (100800, 176400, 100800, 176400, 75600, 75600),
    (6, 2016000): (2016000, 3528000, 2016000, 3528000, 1512000, 1512000), (7, 1): (1, 3, 1, 2, 1, 1, 0),
    (7, 3): (3, 6, 3, 6, 3, 5, 1), (7, 16): (16, 28, 16, 28, 16, 28, 12), (7, 17): (17, 31, 17, 30, 17, 29, 12),
    (7, 18): (18, 33, 18, 33, 18, 30, 12), (7, 120): (120, 210, 120, 210, 120, 210, 90),
    (7, 256): (256, 448, 256, 448, 256, 448, 192), (7, 25003): (25003, 43756, 25003, 43756, 25003, 43755, 18751),
    (7, 100800): (100800, 176400, 100800, 176400, 100800, 176400, 75600),
    (7, 2016000): (2016000, 3528000, 2016000, 3528000, 2016000, 3528000, 1512000), (8, 1): (3, 2, 1, 1, 0, 0, 0, 0),
    (8, 7): (7, 7, 7, 7, 6, 6, 5, 4), (8, 32): (28, 28, 28, 28, 28, 28, 28, 28),
    (8, 33): (31, 30, 29, 29, 28, 28, 28, 28), (8, 34): (33, 33, 30, 30, 28, 28, 28, 28),
    (8, 120): (105, 105, 105, 105, 105, 105, 105, 105), (8, 256): (224, 224, 224, 224, 224, 224, 224, 224),
    (8, 25003): (21881, 21881, 21880, 21879, 21875, 21875, 21875, 21875),
    (8, 100800): (88200, 88200, 88200, 88200, 88200, 88200, 88200, 88200),
    (8, 2016000): (1764000, 1764000, 1764000, 1764000, 1764000, 1764000, 1764000, 1764000),
}
