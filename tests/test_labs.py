"""The lab checkers accept the reference solutions and reject planted wrong answers, each with its hint.

A checker that accepts nonsense is worse than no checker: every classic mistake a lab names is
planted here, and the test asserts the checker recognises it (``LabCheckFailed.mistake``) and says
the key phrase of its hint. The labs' notebooks themselves run in tests/test_notebooks.py.
"""

import sys

import pytest
import torch
import torch.distributed as dist

from lab_grading import expect_rejection
from notebook_runner import ROOT
from utils.checkers.ddp import check_ddp, expected_buckets
from utils.checkers.halving_doubling import check_halving_doubling, plan
from utils.models import ToyNet

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.ddp import BucketedDDP  # noqa: E402
from solutions.halving_doubling import halving_doubling_all_reduce  # noqa: E402


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


def stub(tensor):
    raise NotImplementedError("halving_doubling_all_reduce: not written yet")


@pytest.mark.slow
def test_halving_doubling_reference_passes():
    result = check_halving_doubling(halving_doubling_all_reduce, world_sizes=(2, 3, 4, 5, 6))
    assert "world_size=6" in str(result) and "(formula 10.0000)" in str(result), result  # 2(p-1) + 2 rem, p=4


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


def test_halving_doubling_stub_raises_its_own_error():
    with pytest.raises(NotImplementedError, match="not written yet"):
        check_halving_doubling(stub, world_sizes=(2,))


# ------------------------------------------------------------------ lab 02, bucketed DDP: wrong answers
# Variations of the reference, each with one mistake; most get the right gradients the wrong way.

class AfterBackwardPerTensor(BucketedDDP):
    """Lesson 02's DDP in a class: no hooks, every gradient all-reduced on its own after backward."""

    def __init__(self, model, bucket_cap_bytes):
        self.model, self.n = model, dist.get_world_size()
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t, 0)

    def finish(self):
        for p in self.model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= self.n


class BucketsLaunchedInFinish(BucketedDDP):
    """The right buckets, but all launched after backward (a hook that only counts)."""

    def _grad_ready(self, param):
        pass

    def finish(self):
        for i, bucket in enumerate(self.buckets):
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            self.pending[i] = (flat, dist.all_reduce(flat, async_op=True))
        super().finish()


class OneBucketWhateverTheCap(BucketedDDP):
    def __init__(self, model, bucket_cap_bytes):
        super().__init__(model, 1 << 30)


class BlockingInHook(BucketedDDP):
    def _grad_ready(self, param):
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
            dist.all_reduce(flat)  # waits here, inside backward
            self.pending[i] = (flat, dist.barrier(async_op=True))  # something to wait on


class AsyncButWaitedAtOnce(BucketedDDP):
    """async_op=True, the flag the checker once read, but waited on in the hook: it overlaps nothing."""

    def _grad_ready(self, param):
        super()._grad_ready(param)
        i = self.bucket_of[id(param)]
        if self.pending[i] is not None:
            self.pending[i][1].wait()  # backward stands still here until the bytes have travelled


def _buckets_by(model, cap, size_of, closed):
    """The reference's buckets, sized by ``size_of(p)`` and closed when ``closed(size, cap)``."""
    buckets, size = [[]], 0
    for p in [p for p in model.parameters() if p.requires_grad][::-1]:
        if closed(size, cap):
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += size_of(p)
    return buckets


class ClosedOnlyPastTheCap(BucketedDDP):
    """A bucket filled exactly to its cap is left open (> in place of >=)."""

    def __init__(self, model, bucket_cap_bytes):
        super().__init__(model, bucket_cap_bytes)
        self._rebucket(_buckets_by(model, bucket_cap_bytes, lambda p: p.numel() * p.element_size(),
                                   lambda size, cap: size > cap))

    def _rebucket(self, buckets):
        self.buckets = buckets
        self.bucket_of = {id(p): i for i, bucket in enumerate(buckets) for p in bucket}
        self._new_step()


class CapInElements(ClosedOnlyPastTheCap):
    """The cap compared with a count of elements, not of bytes."""

    def __init__(self, model, bucket_cap_bytes):
        BucketedDDP.__init__(self, model, bucket_cap_bytes)
        self._rebucket(_buckets_by(model, bucket_cap_bytes, lambda p: p.numel(), lambda size, cap: size >= cap))


class NotDivided(BucketedDDP):
    def __init__(self, model, bucket_cap_bytes):
        super().__init__(model, bucket_cap_bytes)
        self.n = 1


class NeverReset(BucketedDDP):
    def finish(self):
        new_step, self._new_step = self._new_step, lambda: None  # forgets to reset after the first step
        super().finish()
        self._new_step = new_step


class TiedTwice(BucketedDDP):
    """Buckets from named_parameters(remove_duplicate=False): the tied weight in a bucket twice, hooked twice."""

    def __init__(self, model, bucket_cap_bytes):
        self.n = dist.get_world_size()
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t, 0)
        params = [p for _, p in model.named_parameters(remove_duplicate=False) if p.requires_grad][::-1]
        self.buckets = [params]  # one bucket: ignores the cap too, but the bytes show first
        self.bucket_of = {id(p): 0 for p in params}
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)
        self._new_step()


class HooksOnFrozenToo(BucketedDDP):
    def __init__(self, model, bucket_cap_bytes):
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(lambda p: None)  # torch refuses on input_scale
        super().__init__(model, bucket_cap_bytes)


class BroadcastParametersOnly(BucketedDDP):
    def __init__(self, model, bucket_cap_bytes):
        buffers = {k: b.clone() for k, b in model.named_buffers()}
        super().__init__(model, bucket_cap_bytes)
        with torch.no_grad():
            for k, b in model.named_buffers():
                b.copy_(buffers[k])  # as if buffers had been left out of the broadcast


class Stub:
    def __init__(self, model, bucket_cap_bytes):
        raise NotImplementedError("BucketedDDP: not written yet")


@pytest.mark.slow
def test_ddp_reference_passes():
    result = check_ddp(BucketedDDP, world_sizes=(2, 3, 4, 5, 6), steps=2)
    assert "cap 4,096 B: 2 bucket(s)" in str(result) and "world_size=6" in str(result), result


def test_expected_buckets_follow_the_cap():
    model = ToyNet()
    assert expected_buckets(model, 1 << 20) == [36_136]
    assert expected_buckets(model, 4096) == [19_496, 16_640]
    assert expected_buckets(model, 1) == [40, 2560, 256, 256, 16_384, 256, 16_384]


def test_bucketed_ddp_rejects_a_bad_cap():
    with pytest.raises(ValueError, match="bucket_cap_bytes=0"):
        BucketedDDP(ToyNet(), 0)  # raises before any communication


@pytest.mark.parametrize("wrong, world_sizes, mistake, phrase", [
    (AfterBackwardPerTensor, (2,), "not_bucketed", "one flat tensor"),
    (BucketsLaunchedInFinish, (2,), "after_backward", "during backward"),
    (OneBucketWhateverTheCap, (3,), "buckets", "honour the cap"),
    (BlockingInHook, (2,), "blocking", "async_op=True"),
    (AsyncButWaitedAtOnce, (2,), "blocking", "waited on inside backward"),
    (ClosedOnlyPastTheCap, (2,), "buckets", "honour the cap"),
    (CapInElements, (2,), "buckets", "bytes"),
    (NotDivided, (3,), "not_divided", "divide by dist.get_world_size()"),
    (NeverReset, (2,), "not_reset", "reset what each bucket waits for"),
    (TiedTwice, (2,), "tied_twice", "remove_duplicate=False"),
    (HooksOnFrozenToo, (2,), "frozen_reduced", "requires_grad"),
    (BroadcastParametersOnly, (2,), "buffers", "buffers"),
], ids=lambda v: getattr(v, "__name__", None))
def test_ddp_rejects(wrong, world_sizes, mistake, phrase):
    expect_rejection(check_ddp, wrong, world_sizes=world_sizes, steps=2, mistake=mistake, phrase=phrase)


def test_ddp_stub_raises_its_own_error():
    with pytest.raises(NotImplementedError, match="not written yet"):
        check_ddp(Stub, world_sizes=(2,), steps=1)


def test_the_two_bucket_rules_differ_only_at_the_cap():
    """utils.data_parallel.buckets: torch DDP closes a bucket once it reaches the cap; DeepSpeed's rule (lab 03's task,
    so no code in utils) closes it before it would pass: its judge accepts DeepSpeed's buckets and refuses DDP's."""
    from utils.checkers.zero_buckets import judge_buckets
    from utils.data_parallel.buckets import reverse_buckets

    sizes = [3, 7, 2, 9, 1, 4]  # taken last first: 4, 1, 9, 2, 7, 3
    assert reverse_buckets(sizes, 10, "ddp") == [[5, 4, 3], [2, 1, 0]]  # 4 + 1 + 9 = 14 >= 10; 2 + 7 + 3 = 12
    judge_buckets(sizes, [[5, 4], [3], [2, 1], [0]], 10, "DeepSpeed's")  # 5 + 9 > 10 flushes first
    expect_rejection(judge_buckets, sizes, [[5, 4, 3], [2, 1, 0]], 10, "DDP's", mistake="bucket_overflow")
    expect_rejection(judge_buckets, sizes, [[5], [4], [3], [2, 1], [0]], 10, "too early", mistake="bucket_size")
    assert reverse_buckets(sizes, 100) == [[5, 4, 3, 2, 1, 0]]
    judge_buckets(sizes, [[5, 4, 3, 2, 1, 0]], 100, "one bucket")
    with pytest.raises(ValueError, match="torch DDP's"):
        reverse_buckets(sizes, 10, "deepspeed")
