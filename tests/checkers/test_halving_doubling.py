"""The checkers of labs 01a and 01b accept the reference solutions and reject planted wrong answers, each with its hint.

Lab 01a asks for a reduce-scatter by recursive halving (utils/checkers/halving_reduce_scatter.py), lab 01b for an
all-gather by recursive doubling (doubling_all_gather.py) and the all-reduce on any number of ranks that folds the
extra ranks in around torch's reduce-scatter (folded_all_reduce.py). Each wrong answer below reaches the right
numbers, or nearly, the *wrong way*; the test asserts that the checker names the mistake
(``LabCheckFailed.mistake``) and says the key phrase of its hint, at a world size where the mistake shows. The
labs' notebooks run in tests/test_notebooks.py; what every lab shares (the reference passes at the world sizes
the notebook runs at, the stubs raise their own error) in tests/test_every_lab.py, through utils.checkers.labs.
"""

import copy
import json
import re
import sys

import pytest
import torch
import torch.distributed as dist

from torch.distributed import irecv as early_irecv, isend as early_isend  # before any ledger

from lab_grading import expect_panel, expect_raised, expect_rejection
from utils.course.notebook_runner import ROOT
from utils.comm.p2p import sendrecv
from utils.comm.subgroup import chunk_bounds
from utils.checkers import halving_doubling_tables as tables
from utils.checkers.doubling_all_gather import check_doubling_all_gather
from utils.checkers.folded_all_reduce import check_halving_doubling_all_reduce, plan
from utils.checkers.halving_doubling import virtual_ranks
from utils.checkers.halving_reduce_scatter import _check_case as halving_case
from utils.checkers.halving_reduce_scatter import check_halving_reduce_scatter, halving_plan

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.halving_doubling import (  # noqa: E402
    doubling_all_gather, halving_doubling_all_reduce, halving_reduce_scatter)

plans = tables.teacher_plans()  # the teacher's side of the checkers: the plans computed, the uneven cuts told apart


# ------------------------------------------------------------------ lab 01a, reduce-scatter by recursive halving

def _halving(tensor, descending=True, mirrored=False, split=None, blocking=False, per_chunk=False, bounds=None,
             partner=lambda v, d, p: v ^ d):
    """Recursive halving on the world's ranks, with one mistake switched on."""
    v, p = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    bounds = (bounds or chunk_bounds)(flat.numel(), p)
    lo, hi = 0, flat.numel()
    a, b = 0, p
    for d in ([p >> (j + 1) for j in range(p.bit_length() - 1)] if descending else
              [1 << j for j in range(p.bit_length() - 1)]):
        if split is None:  # by chunks, as the lab asks
            c = (a + b) // 2
            low, high = (a, c), (c, b)
            keep_r, give_r = (low, high) if (v & d == 0) != mirrored else (high, low)
            keep, give = (bounds[keep_r[0]], bounds[keep_r[1]]), (bounds[give_r[0]], bounds[give_r[1]])
            a, b = keep_r
        else:  # by elements: split(lo, hi) -> (mid, end); [end, hi) belongs to neither half
            mid, end = split(lo, hi)
            keep, give = ((lo, mid), (mid, end)) if v & d == 0 else ((mid, end), (lo, mid))
        incoming = torch.empty(keep[1] - keep[0], dtype=flat.dtype, device=flat.device)
        out = flat[give[0]:give[1]]
        if partner(v, d, p) != v ^ d:
            sendrecv(out, partner(v, d, p), incoming, partner(v, d, p))
        elif blocking:  # both partners send first: each waits for a recv the other has not posted
            dist.send(out, v ^ d)
            dist.recv(incoming, v ^ d)
        elif per_chunk:  # the right bytes to the right partner, but one message per chunk
            pieces = [flat[bounds[c]:bounds[c + 1]] for c in range(*give_r)]
            into = incoming.split([bounds[c + 1] - bounds[c] for c in range(*keep_r)])
            works = [dist.isend(piece, v ^ d) for piece in pieces if piece.numel()]
            works += [dist.irecv(piece, v ^ d) for piece in into if piece.numel()]
            for work in works:
                work.wait()
        else:
            sendrecv(out, v ^ d, incoming, v ^ d)
        flat[keep[0]:keep[1]] += incoming
        lo, hi = keep


def halving_ascending(tensor):  # d = 1, 2, ...: rank v ends with chunk bit-reversed(v)
    _halving(tensor, descending=False)


def halving_mirrored(tensor):  # bit d clear keeps the upper half: rank v ends with chunk p - 1 - v
    _halving(tensor, mirrored=True)


def halving_elements(tensor):  # lab 01a's first trap, as its text writes it: mid = lo + (hi - lo) // 2
    _halving(tensor, split=lambda lo, hi: (lo + (hi - lo) // 2, hi))


def halving_elements_rounded_up(tensor):  # the same trap, mid = lo + (hi - lo + 1) // 2
    _halving(tensor, split=lambda lo, hi: (lo + (hi - lo + 1) // 2, hi))


def halving_losing_odd(tensor):  # (hi - lo) // 2 elements a half: an odd segment's last element is never summed
    _halving(tensor, split=lambda lo, hi: (lo + (hi - lo) // 2, lo + 2 * ((hi - lo) // 2)))


def halving_remainder_last(tensor):  # chunks of numel // p elements, the remainder in the last one
    _halving(tensor, bounds=lambda numel, p: [c * (numel // p) for c in range(p)] + [numel])


def halving_spread_bounds(tensor):  # chunk c starts at c * numel // p: on 2 and 4 ranks the cut of the first trap
    _halving(tensor, bounds=lambda numel, p: [c * numel // p for c in range(p + 1)])


def halving_rounded_bounds(tensor):  # chunk c starts at round(c * numel / p): a cut the checker does not know
    _halving(tensor, bounds=lambda numel, p: [round(c * numel / p) for c in range(p + 1)])


def halving_partner_added(tensor):  # v + d, or v - d past the end: rank 1's partner at d = 1 is 2, who waits for 3
    _halving(tensor, partner=lambda v, d, p: v + d if v + d < p else v - d)


def halving_chunk_by_chunk(tensor):
    _halving(tensor, per_chunk=True)


def halving_blocking(tensor):
    _halving(tensor, blocking=True)


def halving_averaged(tensor):
    halving_reduce_scatter(tensor)
    tensor.copy_(tensor / dist.get_world_size() if tensor.is_floating_point() else tensor // dist.get_world_size())


def halving_not_in_place(tensor):
    out = tensor.clone()
    halving_reduce_scatter(out)
    return out


def whole_tensor_exchange(tensor):
    """Right chunks, the right partners in the right order, but the whole tensor at every step: log2 p tensors."""
    v, d = dist.get_rank(), dist.get_world_size() // 2
    while d >= 1:
        incoming = torch.empty_like(tensor)
        sendrecv(tensor.clone(), v ^ d, incoming, v ^ d)
        tensor += incoming
        d //= 2


def ring_reduce_scatter(tensor):
    """Lesson 01b's ring, first half: right sums, p - 1 messages to rank + 1; rank r ends with chunk r."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks, right, left = tensor.view(-1).tensor_split(n), (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        send, recv = chunks[(rank - step - 1) % n], chunks[(rank - step - 2) % n]
        incoming = torch.empty_like(recv)
        sendrecv(send, right, incoming, left)
        recv += incoming


def gather_to_root(tensor):
    """Right sums: everyone sends its whole tensor to rank 0, which adds and sends each rank its chunk."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = tensor.view(-1).tensor_split(n)
    if rank:
        dist.send(tensor, 0)
        if chunks[rank].numel():
            dist.recv(chunks[rank], 0)
        return
    incoming = torch.empty_like(tensor)
    for src in range(1, n):
        dist.recv(incoming, src)
        tensor += incoming
    for dst in range(1, n):
        if chunks[dst].numel():
            dist.send(chunks[dst], dst)


def calling_reduce_scatter(tensor):
    chunks = tensor.view(-1).tensor_split(dist.get_world_size())
    dist.reduce_scatter(chunks[dist.get_rank()], [c.clone() for c in chunks])


def calling_all_reduce(tensor, *given):
    dist.all_reduce(tensor)


def test_halving_plan_sends_half_the_range():  # sizes the tables do not hold: the teacher's module computes them
    assert halving_plan(8, 4) == {0: ([2, 1], 6), 1: ([3, 0], 6), 2: ([0, 3], 6), 3: ([1, 2], 6)}
    assert halving_plan(5, 4) == {0: ([2, 1], 3), 1: ([3, 0], 4), 2: ([0, 3], 4), 3: ([1, 2], 4)}  # chunks 2 1 1 1


@pytest.mark.parametrize("wrong, world_sizes, mistake, phrase", [
    (calling_reduce_scatter, (2,), "used_collective", "point-to-point"),
    (calling_all_reduce, (2,), "used_collective", "point-to-point"),
    (halving_ascending, (4,), "wrong_order", "d = p/2, p/4, ..., 1"),
    (halving_mirrored, (2,), "mirrored", "keeps the LOWER half"),
    (halving_elements, (4,), "halved_elements", "the lab's first trap"),  # once named mirrored (1 element)
    (halving_elements, (2,), "uneven", "- halved_elements: the lab's first trap"),  # on 2 ranks the same cut as ...
    (halving_remainder_last, (2,), "uneven", "- chunk_bounds: your chunks are not"),  # ... this one: both listed
    (halving_elements, (2, 4), "halved_elements", "on 4 ranks only halved_elements fits"),  # the notebook's sizes
    (halving_elements_rounded_up, (4,), "halved_elements", "halve the range of chunk indices"),
    (halving_spread_bounds, (2, 4), "halved_elements", "k * numel // p cut exactly like this"),  # its hint says
    (halving_losing_odd, (2,), "dropped_element", "never summed"),
    (halving_remainder_last, (4,), "chunk_bounds", "FIRST numel % p chunks"),
    (halving_rounded_bounds, (4,), "uneven", "Several mistakes give this symptom"),
    (halving_averaged, (2,), "averaged", "do not divide"),
    (halving_not_in_place, (2,), "not_in_place", "tensor you were given"),
    (whole_tensor_exchange, (4,), "too_many_bytes", "not the whole tensor"),
    (halving_chunk_by_chunk, (4,), "too_many_messages", "ONE message to ONE partner"),
    (ring_reduce_scatter, (4,), "too_many_messages", "a ring takes"),
    (gather_to_root, (4,), "wrong_partner", "v XOR d"),
], ids=lambda v: getattr(v, "__name__", None))
def test_halving_rejects(wrong, world_sizes, mistake, phrase):
    expect_rejection(check_halving_reduce_scatter, wrong, world_sizes=world_sizes, timeout=10, mistake=mistake,
                     phrase=phrase)


@pytest.mark.slow
def test_halving_rejects_deadlock():
    expect_rejection(check_halving_reduce_scatter, halving_blocking, world_sizes=(2,), timeout=5, mistake="deadlock",
                     phrase="waits for the matching recv")


def test_wrong_values_are_checked_against_the_partners_first():
    """A wrong partner whose messages happen to pair up (no hang) leaves wrong sums: the peer log names it before any
    guess from the values. The ranks' reports are made up here, as on_rank returns them: no processes."""
    n, numel = 4, 16
    ranks = [dict(got=torch.zeros(numel), expected=torch.ones(numel), original=torch.zeros(numel), returned=None,
                  sends=[(n - 1 - k, 32)], ops=[], calls=[], error=None, sent=32) for k in range(n)]  # v <-> p-1-v
    expect_rejection(halving_case, n, "a case", numel, ranks, mistake="wrong_partner",
                     phrase="the values are wrong, and rank 0 sent to ranks [3]")


def test_halving_needs_a_power_of_two():
    with pytest.raises(ValueError, match=r"world sizes \[3\]"):
        check_halving_reduce_scatter(halving_reduce_scatter, world_sizes=(2, 3))


# ------------------------------------------------------------------ lab 01b, all-gather by recursive doubling

def _doubling(tensor, ranks, descending=False, whole=False, world=False, partner=None):
    """Recursive doubling among ``ranks``, with one mistake switched on."""
    if world:  # the global rank and the world size, as if every rank took part
        ranks = list(range(dist.get_world_size()))
    p, v = len(ranks), ranks.index(dist.get_rank())
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), p)
    held = {v}
    for d in ([p >> (j + 1) for j in range(p.bit_length() - 1)] if descending else
              [1 << j for j in range(p.bit_length() - 1)]):
        a, b = v - v % d, (v ^ d) - (v ^ d) % d
        if partner:  # the right ranges, to and from the wrong rank
            peer = ranks[partner(v, d, p)]
            sendrecv(flat[bounds[a]:bounds[a + d]], peer, flat[bounds[b]:bounds[b + d]], peer)
        elif whole:  # the whole tensor out, the whole tensor in, then the partner's range copied from it
            incoming = torch.empty_like(flat)
            sendrecv(flat.clone(), ranks[v ^ d], incoming, ranks[v ^ d])
            flat[bounds[b]:bounds[b + d]] = incoming[bounds[b]:bounds[b + d]]
        else:
            sendrecv(flat[bounds[a]:bounds[a + d]], ranks[v ^ d], flat[bounds[b]:bounds[b + d]], ranks[v ^ d])
        held |= {u ^ d for u in held}


def doubling_descending(tensor, ranks):  # d = p/2 first: a rank sends chunks it does not hold yet
    _doubling(tensor, ranks, descending=True)


def doubling_whole_tensor(tensor, ranks):
    _doubling(tensor, ranks, whole=True)


def doubling_world_ranks(tensor, ranks):  # right on a power of two; on 3 ranks, rank 1's partner is rank 0
    _doubling(tensor, ranks, world=True)


def doubling_partner_added(tensor, ranks):  # v + d, or v - d past the end, as halving_partner_added
    _doubling(tensor, ranks, partner=lambda v, d, p: v + d if v + d < p else v - d)


def doubling_not_in_place(tensor, ranks):
    out = tensor.clone()
    doubling_all_gather(out, ranks)
    return out


def ring_all_gather(tensor, ranks):
    """Lesson 01b's ring, second half: the whole tensor on every rank, in p - 1 messages to the next rank."""
    p, v = len(ranks), ranks.index(dist.get_rank())
    chunks = tensor.view(-1).tensor_split(p)
    for step in range(p - 1):
        sendrecv(chunks[(v - step) % p], ranks[(v + 1) % p], chunks[(v - step - 1) % p], ranks[(v - 1) % p])


def broadcasting_chunks(tensor, ranks):
    for v, chunk in enumerate(tensor.view(-1).tensor_split(len(ranks))):
        dist.broadcast(chunk, ranks[v])


def test_doubling_plan_and_virtual_ranks():
    assert virtual_ranks(3) == [1, 2] and virtual_ranks(6) == [1, 3, 4, 5] and virtual_ranks(4) == [0, 1, 2, 3]
    assert plan(3, 10) == {0: ([1], 10), 1: ([2, 0], 15), 2: ([1], 5)}  # rank 1: half the tensor, then all of it back
    assert plan(4, 8)[3] == ([2, 1], 6)  # d = 1, then 2: chunk 3, then chunks 2-3


@pytest.mark.parametrize("wrong, world_sizes, mistake, phrase", [
    (broadcasting_chunks, (2,), "used_collective", "point-to-point"),
    (doubling_descending, (4,), "wrong_order", "d = 1, 2, ..., p/2"),
    pytest.param(doubling_world_ranks, (2, 3), "not_virtual", "ranks[v ^ d]", marks=pytest.mark.slow),  # hangs 10 s
    (doubling_whole_tensor, (4,), "too_many_bytes", "not the whole tensor"),
    (doubling_not_in_place, (2,), "not_in_place", "at their place"),
    (ring_all_gather, (4,), "too_many_messages", "a ring takes"),
], ids=lambda v: getattr(v, "__name__", None))
def test_doubling_rejects(wrong, world_sizes, mistake, phrase):
    expect_rejection(check_doubling_all_gather, wrong, world_sizes=world_sizes, timeout=10, mistake=mistake,
                     phrase=phrase)


@pytest.mark.slow
@pytest.mark.parametrize("check, wrong", [(check_halving_reduce_scatter, halving_partner_added),
                                          (check_doubling_all_gather, doubling_partner_added)],
                         ids=lambda v: getattr(v, "__name__", None))
def test_names_the_wrong_partner_of_ranks_that_hang(check, wrong):
    """Rank 1 sends to 2 at d = 1, which never receives from it: the ranks hang, and the sends each logged to a file
    before that name the partner (once reported as a deadlock, the blocking send's mistake)."""
    expect_rejection(check, wrong, world_sizes=(4,), timeout=5, mistake="wrong_partner",
                     phrase="the ranks hung and were stopped after the timeout; before that, rank 1 sent to ranks [2]")


# ------------------------------------------------------------------ lab 01b, the all-reduce on any n, folded

def _folded(tensor, reduce_scatter, add=True, unfold=True, fold=True, own_halving=False, torch_rs=False,
            fold_to=lambda rank, n: rank + 1):
    """The reference's all-reduce, with one mistake switched on."""
    rank, n = dist.get_rank(), dist.get_world_size()
    p = 1 << (n.bit_length() - 1)
    rem = n - p if fold else 0
    flat = tensor.view(-1)
    if rank < 2 * rem and rank % 2 == 0:
        dist.send(flat, fold_to(rank, n))
        if unfold:
            dist.recv(flat, fold_to(rank, n))
        return
    if rank < 2 * rem:
        incoming = torch.empty_like(flat)
        dist.recv(incoming, rank - 1)
        if add:
            flat += incoming
    ranks = [2 * u + 1 if u < rem else u + rem for u in range(p if fold else n)]
    if own_halving:
        halving_reduce_scatter(tensor)  # lab 01a's, on the world: right on a power of two, but not the one given
    elif torch_rs:
        chunks = flat.tensor_split(len(ranks))
        dist.reduce_scatter(chunks[ranks.index(rank)], [c.clone() for c in chunks])
    else:
        reduce_scatter(tensor, ranks)
    doubling_all_gather(tensor, ranks)
    if rank < 2 * rem and unfold:
        dist.send(flat, rank - 1)


def fold_drops_extra_data(tensor, reduce_scatter):  # receives the even rank's tensor, never adds it
    _folded(tensor, reduce_scatter, add=False)


def fold_never_sent_back(tensor, reduce_scatter):
    _folded(tensor, reduce_scatter, unfold=False)


def without_fold(tensor, reduce_scatter):  # right on 2 and 4; on 3, virtual rank 2's partner 2 ^ 1 = 3 does not exist
    _folded(tensor, reduce_scatter, fold=False)


def fold_to_the_last_rank(tensor, reduce_scatter):  # rank 0 folds into rank n - 1, which never receives: a hang
    _folded(tensor, reduce_scatter, fold_to=lambda rank, n: n - 1)


def own_reduce_scatter(tensor, reduce_scatter):
    _folded(tensor, reduce_scatter, own_halving=True)


def torch_reduce_scatter_called_directly(tensor, reduce_scatter):
    _folded(tensor, reduce_scatter, torch_rs=True)


def all_reduce_averaged(tensor, reduce_scatter):
    halving_doubling_all_reduce(tensor, reduce_scatter)
    tensor.copy_(tensor / dist.get_world_size() if tensor.is_floating_point() else tensor // dist.get_world_size())


@pytest.mark.parametrize("wrong, world_sizes, mistake, phrase", [
    (calling_all_reduce, (2,), "used_collective", "the reduce_scatter you were given"),
    (torch_reduce_scatter_called_directly, (2,), "used_collective", "through its argument"),
    (own_reduce_scatter, (2,), "reduce_scatter_calls", "exactly once"),
    (all_reduce_averaged, (2,), "averaged", "do not divide"),
    (fold_drops_extra_data, (2, 3), "fold_dropped", "ADDS it"),
    (fold_never_sent_back, (2, 3), "not_unfolded", "send the complete sum back"),
    (without_fold, (2, 3), "not_power_of_two", "fold the extra ranks"),
    pytest.param(fold_to_the_last_rank, (2, 3), "wrong_partner", "rank 0 sent to ranks [2]",
                 marks=pytest.mark.slow),  # hangs 10 s; once not_power_of_two, as if there were no fold
], ids=lambda v: getattr(v, "__name__", None))
def test_all_reduce_rejects(wrong, world_sizes, mistake, phrase):
    expect_rejection(check_halving_doubling_all_reduce, wrong, world_sizes=world_sizes, timeout=10, mistake=mistake,
                     phrase=phrase)


# ------------------------------------------------------------------ the stored plans, and the checkers as released

TABLES = ("VIRTUAL_RANKS", "HALVING_PARTNERS", "HALVING_ELEMENTS", "DOUBLING_PARTNERS", "DOUBLING_ELEMENTS",
          "FOLDED_PARTNERS", "FOLDED_ELEMENTS")


def test_the_stored_plans_are_the_teachers():
    """The tables the shipped checkers judge by are what the teacher's module computes, row for row; each function
    that looks them up gives the teacher's function's output at every size held; a planted change of one element
    of one row is found."""
    found = plans.tables()
    assert sorted(found) == sorted(TABLES)
    stored = {name: getattr(tables, name) for name in TABLES}
    stale = plans.differences(stored, found)
    assert stale == [], ("the tables in utils/checkers/halving_doubling_tables.py are not what the teacher's module "
                         "computes: paste the output of `python -m labs.solutions.halving_doubling_plans` there.\n"
                         + "\n".join(stale))
    for n in tables.VIRTUAL_RANKS:
        assert tables.virtual_ranks(n) == plans.virtual_ranks(n), n
    for numel, p in tables.HALVING_ELEMENTS:
        assert tables.halving_plan(numel, p) == plans.halving_plan(numel, p), (numel, p)
    for numel, p in tables.DOUBLING_ELEMENTS:
        for ranks in (r for r in tables.DOUBLING_PARTNERS if len(r) == p):
            assert tables.doubling_plan(numel, ranks) == plans.doubling_plan(numel, ranks), (numel, ranks)
    for n, numel in tables.FOLDED_ELEMENTS:
        assert list(tables.folded_plan(n, numel).items()) == list(plans.folded_plan(n, numel).items()), (n, numel)
    planted = copy.deepcopy(stored)
    row = list(planted["FOLDED_ELEMENTS"][5, 25003])
    row[3] += 1  # one element more for rank 3 of 5
    planted["FOLDED_ELEMENTS"][5, 25003] = tuple(row)
    assert [line.split(":")[0] for line in plans.differences(planted, found)] == ["FOLDED_ELEMENTS[(5, 25003)]"]


def test_the_tables_hold_every_size_the_checkers_and_the_labs_run():
    """Every case of halving_doubling.cases(p) on every world size the labs accept, and every element count the labs'
    notebooks pass to halving_plan and plan (their loops, SMOKE or not, and their literal calls): the release has no
    other."""
    from utils.checkers.halving_doubling import cases
    from utils.checkers.labs import LABS

    run = set()  # every world size a check cell runs, at any WORLD_SIZE it accepts
    for lab in ("01a_halving_reduce_scatter_lab", "01b_doubling_all_gather_lab"):
        for part in LABS[lab].parts:
            run |= {size for n in range(1, 17) for size in _sizes_run(part, n)}
        cells = json.loads((ROOT / "labs" / f"{lab}.ipynb").read_text())["cells"]
        source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        shown = {int(numel) for numel in re.findall(r"\bplan\(\w+, (\d+)\)", source)}
        for loop in re.findall(r"for numel in (\(.+\)):", source):
            shown |= {numel for smoke in (True, False) for numel in eval(loop, {"SMOKE": smoke})}
        assert shown, f"{lab}: no element count found in its cells"
        assert shown <= set(plans.SHOWN), f"{lab} shows {sorted(shown - set(plans.SHOWN))}: add them to SHOWN"
    assert run == set(plans.WORLD_SIZES) == set(tables.VIRTUAL_RANKS)
    for n in plans.WORLD_SIZES:
        p = 1 << (n.bit_length() - 1)
        for numel, _ in cases(p):
            assert {(numel, p)} <= set(tables.HALVING_ELEMENTS) & set(tables.DOUBLING_ELEMENTS), (numel, p)
        for numel in {numel for numel, _ in cases(p)} | set(plans.SHOWN):
            assert (n, numel) in tables.FOLDED_ELEMENTS and (numel, p) in tables.HALVING_ELEMENTS, (n, numel)


def _sizes_run(part, world_size):
    """The world sizes the lab's check cell (``Part.call``) runs at the notebook's ``world_size``, SMOKE or not; none
    where it refuses that WORLD_SIZE."""
    sizes = []
    for smoke in (True, False):
        try:
            part.call(lambda fn, world_sizes, timeout: sizes.extend(world_sizes), dict.fromkeys(part.needs), world_size,
                      smoke)
        except ValueError:
            return []
    return sizes


@pytest.fixture
def as_released(monkeypatch, tmp_path):
    """The checkers as the student release runs them: the teacher's module is not there to load."""
    monkeypatch.setattr(tables, "PLANS", tmp_path / "halving_doubling_plans.py")
    assert tables.teacher_plans() is None


def test_as_released_the_references_pass(as_released):
    assert "world_size=4" in str(check_halving_reduce_scatter(halving_reduce_scatter, world_sizes=(2, 4)))
    assert "world_size=3" in str(check_halving_doubling_all_reduce(halving_doubling_all_reduce, world_sizes=(2, 3)))


@pytest.mark.parametrize("wrong, world_sizes", [(halving_elements, (2, 4)), (halving_losing_odd, (2,)),
                                                (halving_remainder_last, (4,))],
                         ids=lambda v: getattr(v, "__name__", None))
def test_as_released_an_uneven_cut_is_uneven(as_released, wrong, world_sizes):
    """Without the teacher's module nothing tells the wrong cuts apart: the generic verdict, whose hint names them."""
    expect_rejection(check_halving_reduce_scatter, wrong, world_sizes=world_sizes, timeout=10, mistake="uneven",
                     phrase="Several mistakes give this symptom")


def test_as_released_a_size_not_held_is_an_error_naming_those_held(as_released):
    with pytest.raises(ValueError, match=r"halving_plan\(5, 4\): not in the stored plans .* on 4 ranks 1, 3, 16, 17"):
        halving_plan(5, 4)
    with pytest.raises(ValueError, match=r"plan\(3, 11\): .* on 3 ranks 1, 8, 9, 10, 120"):
        plan(3, 11)
    with pytest.raises(ValueError, match=r"world sizes \[16\]: .* hold world sizes \[2, 3, 4, 5, 6, 7, 8\]"):
        check_halving_reduce_scatter(halving_reduce_scatter, world_sizes=(2, 16))
    assert plan(3, 10) == {0: ([1], 10), 1: ([2, 0], 15), 2: ([1], 5)}  # a size held: from the table


# ------------------------------------------------------------------ an exception in the answer's own code


def halving_index_error(tensor):
    flat = tensor.view(-1)
    return flat[flat.numel()]  # planted: one past the end


def doubling_assertion(tensor, ranks):
    assert len(ranks) == 3, "planted: an assertion of the answer's own"


def folded_shape_error(tensor, reduce_scatter):
    tensor.view(-1) @ torch.ones(3, 3)  # planted: shapes that cannot be multiplied


@pytest.mark.parametrize("check, wrong, line", [
    (check_halving_reduce_scatter, halving_index_error, "return flat[flat.numel()]  # planted"),
    (check_doubling_all_gather, doubling_assertion, 'assert len(ranks) == 3, "planted'),
    (check_halving_doubling_all_reduce, folded_shape_error, "tensor.view(-1) @ torch.ones(3, 3)  # planted"),
], ids=["halving IndexError", "doubling AssertionError", "folded shape RuntimeError"])
def test_an_exception_in_the_answer_is_named_with_its_line(check, wrong, line):
    expect_raised(check, wrong, world_sizes=(2,), line=line)


def halving_with_early_names(tensor):
    """The reference's algorithm, right, with isend / irecv imported at the top of the module, before any ledger."""
    v, p = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), p)
    a, b, d = 0, p, p // 2
    while d >= 1:
        c = (a + b) // 2
        keep, give = ((a, c), (c, b)) if v & d == 0 else ((c, b), (a, c))
        mine, theirs = flat[bounds[keep[0]]:bounds[keep[1]]], flat[bounds[give[0]]:bounds[give[1]]]
        incoming = torch.empty_like(mine)
        works = ([early_isend(theirs, v ^ d)] if theirs.numel() else []) + \
            ([early_irecv(incoming, v ^ d)] if incoming.numel() else [])
        for work in works:
            work.wait()
        mine.add_(incoming)
        (a, b), d = keep, d // 2


def test_a_right_answer_with_names_imported_before_the_checker_passes():
    """The ledger and the peer log count at the process group, where an early-imported isend arrives too."""
    check_halving_reduce_scatter(halving_with_early_names, world_sizes=(2,))


# ------------------------------------------------------------------ a crash and a hang, as the panel shows them

def halving_exits_on_rank_1(tensor):
    if dist.get_rank() == 1:
        sys.exit(3)  # planted: the rank ends without a Python error the checker can catch
    return halving_reduce_scatter(tensor)


def halving_one_side_waits(tensor):
    if dist.get_rank() == 0:
        dist.recv(tensor, src=1)  # planted: rank 1 never sends; it leaves the answer and waits in the checker
    return tensor


def test_a_rank_that_exits_is_a_crash_shown_with_the_answers_line_only():
    rejected = expect_rejection(check_halving_reduce_scatter, halving_exits_on_rank_1, world_sizes=(2,), timeout=30,
                                mistake="crash", phrase="rank 1 crashed")
    shown = expect_panel(rejected)
    assert "sys.exit(3)  # planted" in rejected.what and "utils/checkers" not in rejected.what, rejected.what
    assert "on_rank, line" not in shown and "halving_doubling.py" not in shown, shown


def halving_short_receive(tensor):
    """Rank 1 receives its partner's half into one element too few: gloo aborts that rank (SIGABRT), no exception."""
    v, flat = dist.get_rank(), tensor.view(-1)
    half = flat.numel() // 2
    give, keep = (flat[half:], flat[:half]) if v == 0 else (flat[:half], flat[half:])
    incoming = torch.empty(keep.numel() - (v == 1), dtype=flat.dtype)  # planted: one element short on rank 1
    sendrecv(give, 1 - v, incoming, 1 - v)
    keep[:incoming.numel()] += incoming
    return tensor


def test_a_rank_aborted_by_a_short_receive_is_named_size_mismatch():
    """Issue 36: a rank that dies of gloo's abort is named, with the torch call and the answer's line, not `crash`."""
    rejected = expect_rejection(check_halving_reduce_scatter, halving_short_receive, world_sizes=(2,), timeout=30,
                                mistake="size_mismatch", phrase="rank 1 was aborted (SIGABRT) ")
    assert "sendrecv(give, 1 - v, incoming, 1 - v)" in rejected.what, rejected.what
    assert "utils/checkers" not in rejected.what, rejected.what
    expect_panel(rejected)


def test_a_hang_names_the_answers_line_and_a_rank_waiting_outside_it():
    rejected = expect_rejection(check_halving_reduce_scatter, halving_one_side_waits, world_sizes=(2,), timeout=10,
                                mistake="deadlock", phrase="were stopped")
    what = rejected.what.splitlines()
    assert "rank 0: halving_one_side_waits, line" in rejected.what, rejected.what
    assert "dist.recv(tensor, src=1)  # planted" in rejected.what, rejected.what
    rank_1 = next(line for line in what if line.startswith("rank 1: "))
    assert rank_1.startswith("rank 1: outside your code, waiting in torch's "), rejected.what
    assert "File" not in rank_1 and "utils/" not in rank_1, rank_1


def doubling_start_past_the_block(tensor, ranks):
    """The all-gather with its block's start written v + v % d (make mutants, lab 01b #16): the ranks send and receive
    different blocks, some finish while their partners still wait."""
    p, v = len(ranks), list(ranks).index(dist.get_rank())
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), p)
    d = 1
    while d < p:
        a = v + v % d  # planted: v - v % d
        b = a ^ d
        mine, theirs = flat[bounds[a]:bounds[a + d]], flat[bounds[b]:bounds[b + d]]
        sendrecv(mine, ranks[v ^ d], theirs, ranks[v ^ d])
        d *= 2


def test_ranks_that_leave_their_partners_waiting_are_named_unpaired():
    """Once an unnamed crash: every failed rank's report was the echo of its partner leaving ("connection closed"),
    the partner had returned normally."""
    rejected = expect_rejection(check_doubling_all_gather, doubling_start_past_the_block, world_sizes=(4,),
                                timeout=30, mistake="unpaired", phrase="did not pair up")
    assert "finished while ranks" in rejected.what, rejected.what


def test_unpaired_is_said_only_when_every_failure_is_an_echo():
    from utils.checkers.common import unpaired_message
    from utils.launch.errors import RankError

    echo = dict(type="RuntimeError", message="Connection closed by peer", secondary=True)
    assert "ranks [1, 3] finished while ranks [0, 2]" in unpaired_message(RankError("", 0, {0: echo, 2: echo}, [1, 3]))
    own = dict(type="IndexError", message="list index out of range", secondary=False)
    assert unpaired_message(RankError("", 0, {0: echo, 2: own}, [1, 3])) is None  # a real error: a crash, shown
    assert unpaired_message(RankError("", 0, {0: echo}, [])) is None  # nobody finished: not this


# ------------------------------------------------------------------ no rank holds the reference (issue 37, part 3)

def _peek_on_rank(kind, seed):
    """The checker's own rank function, with an answer that records every tensor of the answer's size it finds in
    the variables of its callers (``sys._getframe``), as an answer's code may; returns what it found."""
    from utils.checkers.halving_doubling import cases, on_rank

    seen = []

    def peek(tensor, *rest):
        frame = sys._getframe(1)
        while frame is not None:
            seen.extend(v.clone() for v in list(frame.f_locals.values())
                        if isinstance(v, torch.Tensor) and v is not tensor and v.numel() == tensor.numel())
            frame = frame.f_back

    on_rank(peek, kind, cases(1 << (dist.get_world_size().bit_length() - 1)), "peek", seed)
    return seen


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_gather", "all_reduce"])
def test_no_rank_holds_the_expected_result_for_an_answer_to_read(kind):
    """Each rank gets a seed of its own and the checker computes the expected result itself: in a rank, an answer that
    reads its callers' variables finds its own input, never the sum (nor, for the all-gather, another rank's chunk)."""
    from utils.checkers.halving_doubling import cases, inputs
    from utils.checkers.rank_secrets import new_seeds, rank_args
    from utils.launch import run_ranks

    n = 3
    seeds = new_seeds(n)
    found = run_ranks(_peek_on_rank, kind, world_size=n, rank_args=rank_args(seeds), verbose=False)
    members = virtual_ranks(n)
    called = members if kind == "all_gather" else range(n)  # on 3 ranks the all-gather leaves rank 0 out
    assert all(found[k] for k in called), "the answer found no tensor: the peek looks nowhere"  # its own input, at least
    for k, tensors in enumerate(found):
        for t in tensors:
            numel, dtype = next((c for c in cases(2) if c[0] == t.numel() and c[1] == t.dtype))
            own = [inputs(r, numel, dtype, seeds[r], "cpu") for r in range(n)]
            assert not torch.equal(t, torch.stack(own).sum(0)), f"rank {k} held the sum"
            b = chunk_bounds(numel, len(members))
            assert not any(torch.equal(t[b[v]:b[v + 1]], own[m][b[v]:b[v + 1]]) for v, m in enumerate(members)
                           if m != k and b[v + 1] > b[v]), f"rank {k} held another rank's chunk"
