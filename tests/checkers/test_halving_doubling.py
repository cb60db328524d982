"""Lab 01's checker (utils/checkers/halving_doubling.py) rejects planted wrong answers, each with its hint.

A checker that accepts nonsense is worse than no checker: every classic mistake the lab names is
planted here, and the test asserts the checker recognises it (``LabCheckFailed.mistake``) and says
the key phrase of its hint. The lab's notebook runs in tests/test_notebooks.py; what every lab shares
(the reference passes, the stub raises its own error) in tests/test_every_lab.py.
"""

import pytest
import torch
import torch.distributed as dist

from lab_grading import expect_rejection
from utils.checkers.halving_doubling import check_halving_doubling, plan

# ------------------------------------------------------------------ lab 01, halving and doubling: wrong answers
# Each gets the right sums (or nearly), the wrong way; the world sizes are those where the mistake shows.

def _swap(send, peer, recv, blocking=False):
    if blocking:  # both partners send first: each waits for a recv the other has not posted
        dist.send(send, peer)
        dist.recv(recv, peer)
        return
    works = ([dist.isend(send, peer)] if send.numel() else []) + ([dist.irecv(recv, peer)] if recv.numel() else [])
    for work in works:
        work.wait()


def _rhd(tensor, doubling=True, blocking=False, average=False, lose_odd=False):
    """Recursive halving and doubling on a power of two of ranks (no fold), with one mistake switched on."""
    rank, n = dist.get_rank(), dist.get_world_size()
    flat, lo, hi, parents, d = tensor.view(-1), 0, tensor.numel(), [], n // 2
    while d >= 1:
        half = (hi - lo) // 2 if lose_odd else (hi - lo + 1) // 2  # lose_odd: an odd segment's last element
        mid, end = lo + half, (lo + 2 * half if lose_odd else hi)  # belongs to neither half
        parents.append((lo, end))
        keep, give = ((lo, mid), (mid, end)) if rank & d == 0 else ((mid, end), (lo, mid))
        incoming = torch.empty(keep[1] - keep[0], dtype=flat.dtype)
        _swap(flat[give[0]:give[1]], rank ^ d, incoming, blocking)
        flat[keep[0]:keep[1]] += incoming
        lo, hi, d = keep[0], keep[1], d // 2
    d = 1
    while doubling and d < n:
        plo, phi = parents.pop()
        other = (hi, phi) if lo == plo else (plo, lo)
        _swap(flat[lo:hi].clone(), rank ^ d, flat[other[0]:other[1]])
        lo, hi, d = plo, phi, d * 2
    if average:  # integer tensors: floor division, what a learner's `//` would do
        tensor.copy_(tensor / n if tensor.is_floating_point() else tensor // n)


def halving_only(tensor):
    _rhd(tensor, doubling=False)


def blocking_exchange(tensor):
    _rhd(tensor, blocking=True)


def averaging(tensor):
    _rhd(tensor, average=True)


def halves_losing_odd_elements(tensor):
    _rhd(tensor, lose_odd=True)


def without_fold(tensor):  # right on 2 and 4 ranks; on 3, rank 2's partner 2 ^ 1 = 3 does not exist
    _rhd(tensor)


def fold_never_sent_back(tensor):  # folds the extra ranks in, but never sends them the result: they keep their input
    rank, n = dist.get_rank(), dist.get_world_size()
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    if rank < 2 * rem and rank % 2 == 0:
        dist.send(tensor, rank + 1)
        return
    if rank < 2 * rem:
        incoming = torch.empty_like(tensor)
        dist.recv(incoming, rank - 1)
        tensor += incoming
    real = [2 * u + 1 if u < rem else u + rem for u in range(p)]
    group_rank = real.index(rank)
    d, flat = 1, tensor.view(-1)
    while d < p:  # whole tensors among the p (fewer bytes than the fold's symptom needs to show)
        incoming = torch.empty_like(flat)
        _swap(flat.clone(), real[group_rank ^ d], incoming)
        flat += incoming
        d *= 2


def whole_tensor_doubling(tensor):
    """Right sums in log2 n steps, the right partners, but the whole tensor every step: log2(n) tensors per rank."""
    rank, n, d = dist.get_rank(), dist.get_world_size(), 1
    while d < n:
        incoming = torch.empty_like(tensor)
        _swap(tensor.clone(), rank ^ d, incoming)
        tensor += incoming
        d *= 2


def ring(tensor):
    """Lesson 01b's ring: right sums and bytes, 2(n-1) messages to rank + 1."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks, right, left = torch.tensor_split(tensor.view(-1), n), (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        send, recv = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        incoming = torch.empty_like(recv)
        works = [dist.isend(send, right), dist.irecv(incoming, left)]
        [w.wait() for w in works]
        recv += incoming
    for step in range(n - 1):
        works = [dist.isend(chunks[(rank + 1 - step) % n], right), dist.irecv(chunks[(rank - step) % n], left)]
        [w.wait() for w in works]


def gather_to_root(tensor):
    """Right sums: everyone sends to rank 0, which adds and sends the sum back to each."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)
        return
    incoming = torch.empty_like(tensor)
    for src in range(1, n):
        dist.recv(incoming, src)
        tensor += incoming
    for dst in range(1, n):
        dist.send(tensor, dst)


def calling_all_reduce(tensor):
    dist.all_reduce(tensor)


def test_plan_counts_messages_and_partners():
    assert plan(4) == {0: ({1, 2}, 4, 1.5), 1: ({0, 3}, 4, 1.5), 2: ({3, 0}, 4, 1.5), 3: ({2, 1}, 4, 1.5)}
    assert plan(3) == {0: ({1}, 1, 1.0), 1: ({0, 2}, 3, 2.0), 2: ({1}, 2, 1.0)}


@pytest.mark.parametrize("wrong, world_sizes, mistake, phrase", [
    (ring, (4,), "too_many_messages", "2 log2 p"),
    (ring, (3,), "too_many_messages", "2 log2 p"),
    (gather_to_root, (4,), "wrong_partner", "v XOR d"),
    (gather_to_root, (3,), "too_many_messages", "2 log2 p"),
    (whole_tensor_doubling, (4,), "too_many_bytes", "HALF of the segment"),
    (halving_only, (4,), "doubling_missing", "recursive-doubling"),
    (halves_losing_odd_elements, (2,), "uncovered", "never summed"),
    (averaging, (2,), "averaged", "do not divide"),
    (calling_all_reduce, (2,), "used_collective", "point-to-point"),
    (without_fold, (2, 3), "not_power_of_two", "fold the extra ranks"),
    (fold_never_sent_back, (2, 3), "not_unfolded", "send the complete sum back"),
], ids=lambda v: getattr(v, "__name__", None))
def test_halving_doubling_rejects(wrong, world_sizes, mistake, phrase):
    expect_rejection(check_halving_doubling, wrong, world_sizes=world_sizes, timeout=10, mistake=mistake,
                     phrase=phrase)


@pytest.mark.slow
def test_halving_doubling_rejects_deadlock():
    expect_rejection(check_halving_doubling, blocking_exchange, world_sizes=(2,), timeout=5, mistake="deadlock",
                     phrase="waits for the matching recv")


