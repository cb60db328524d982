"""Lab 02's checker (utils/checkers/ddp.py) rejects planted wrong answers, each with its hint.

A checker that accepts nonsense is worse than no checker: every classic mistake the lab names is
planted here, and the test asserts the checker recognises it (``LabCheckFailed.mistake``) and says
the key phrase of its hint. The lab's notebook runs in tests/test_notebooks.py; what every lab shares
(the reference passes, the stub raises its own error) in tests/test_every_lab.py.
"""

import sys

import pytest
import torch
import torch.distributed as dist

from lab_grading import expect_raised, expect_rejection, graded_in_sandbox
from utils.course.notebook_runner import ROOT
from utils.checkers.ddp import check_ddp, expected_buckets
from utils.models import ToyNet

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.ddp import BucketedDDP  # noqa: E402


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
            self.pending[i] = (flat, done_work(flat))  # something for finish() to wait on


def done_work(tensor):
    """A work already complete, made from a future: no collective, so only the held all-reduce can judge."""
    future = torch.futures.Future()
    future.set_result([tensor])
    return torch._C._distributed_c10d._create_work_from_future(future)


class BlocksFromTheSecondStep(BucketedDDP):
    """Overlaps in the first step, waits in the hook from the second on: the check holds the last step too."""

    steps_done = 0

    def _grad_ready(self, param):
        super()._grad_ready(param)
        i = self.bucket_of[id(param)]
        if self.steps_done and self.pending[i] is not None:
            self.pending[i][1].wait()

    def finish(self):
        super().finish()
        self.steps_done += 1


class AsyncButWaitedAtOnce(BucketedDDP):
    """async_op=True, the flag the checker once read, but waited on in the hook: it overlaps nothing."""

    def _grad_ready(self, param):
        super()._grad_ready(param)
        i = self.bucket_of[id(param)]
        if self.pending[i] is not None:
            self.pending[i][1].wait()  # backward stands still here until the bytes have travelled


def _buckets_by(model, cap, size_of, closed, restart=0):
    """The reference's buckets, sized by ``size_of(p)``, closed when ``closed(size, cap)``, a new one counted from
    ``restart``."""
    buckets, size = [[]], 0
    for p in [p for p in model.parameters() if p.requires_grad][::-1]:
        if closed(size, cap):
            buckets.append([])
            size = restart
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


class RestartedOneLow(ClosedOnlyPastTheCap):
    """Each bucket after the first counted from -1 byte: right until a later bucket fills its cap exactly."""

    def __init__(self, model, bucket_cap_bytes):
        BucketedDDP.__init__(self, model, bucket_cap_bytes)
        self._rebucket(_buckets_by(model, bucket_cap_bytes, lambda p: p.numel() * p.element_size(),
                                   lambda size, cap: size >= cap, restart=-1))


class RestartedOneHigh(ClosedOnlyPastTheCap):
    """Each bucket after the first counted from +1 byte: right until a later bucket stops one byte short of its cap."""

    def __init__(self, model, bucket_cap_bytes):
        BucketedDDP.__init__(self, model, bucket_cap_bytes)
        self._rebucket(_buckets_by(model, bucket_cap_bytes, lambda p: p.numel() * p.element_size(),
                                   lambda size, cap: size >= cap, restart=1))


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


class FrozenInBucket(BucketedDDP):
    """The frozen parameter in the last bucket, hooked and counted nowhere: packing the bucket meets its None .grad."""

    def __init__(self, model, bucket_cap_bytes):
        super().__init__(model, bucket_cap_bytes)
        self.buckets[-1] += [p for p in model.parameters() if not p.requires_grad]

    def _new_step(self):
        self.missing = [sum(p.requires_grad for p in bucket) for bucket in self.buckets]
        self.pending = [None] * len(self.buckets)


class AsyncOpForgotten(BucketedDDP):
    """dist.all_reduce(flat) from the hook, without async_op=True: it returns None, and finish() waits on it."""

    def _grad_ready(self, param):
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
            self.pending[i] = (flat, dist.all_reduce(flat))


class CountsTheFrozenOne(BucketedDDP):
    """The last bucket waits for one gradient more (the frozen one's, which never comes): it is never launched, and
    finish() unpacks the None it still holds."""

    def _new_step(self):
        super()._new_step()
        self.missing[-1] += 1

    def finish(self):
        for i, bucket in enumerate(self.buckets):
            flat, work = self.pending[i]
            work.wait()
            flat /= self.n
            for p, g in zip(bucket, flat.split([p.numel() for p in bucket])):
                p.grad.copy_(g.view_as(p))
        self._new_step()


# The collective bound before the check: `from torch.distributed import all_reduce` at the top of the answer's cell,
# or torch's own module. The checker sees calls where they reach the process group, so these are the same answer.
early_all_reduce = dist.all_reduce
c10d_all_reduce = torch.distributed.distributed_c10d.all_reduce


class EarlyBound(BucketedDDP):
    """The reference, with an all_reduce imported by name before the check began: right."""

    def _grad_ready(self, param, all_reduce=early_all_reduce):
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
            self.pending[i] = (flat, all_reduce(flat, async_op=True))


class ThroughC10d(EarlyBound):
    """The reference through torch.distributed.distributed_c10d.all_reduce, async_op passed by position: right."""

    def _grad_ready(self, param):
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
            self.pending[i] = (flat, c10d_all_reduce(flat, dist.ReduceOp.SUM, None, True))


class EarlyBoundWaitedAtOnce(EarlyBound):
    """Early-bound all_reduce with async_op=True, its work waited on in the hook: blocking, however it was named."""

    def _grad_ready(self, param):
        super()._grad_ready(param)
        i = self.bucket_of[id(param)]
        if self.pending[i] is not None:
            self.pending[i][1].wait()


class EarlyBoundBlocking(EarlyBound):
    """Early-bound all_reduce without async_op: blocking, and the work it returns is None."""

    def _grad_ready(self, param):
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
            early_all_reduce(flat)
            self.pending[i] = (flat, done_work(flat))


class WaitedThroughFuture(BucketedDDP):
    """async_op=True, then waited on in the hook through the work's future: blocking, whatever the waiting call."""

    def _grad_ready(self, param):
        super()._grad_ready(param)
        i = self.bucket_of[id(param)]
        if self.pending[i] is not None:
            self.pending[i][1].get_future().wait()


class WaitedAllAtOnce(BucketedDDP):
    """torch.futures.wait_all on the bucket's future, in the hook."""

    def _grad_ready(self, param):
        super()._grad_ready(param)
        i = self.bucket_of[id(param)]
        if self.pending[i] is not None:
            torch.futures.wait_all([self.pending[i][1].get_future()])


class PolledUntilDone(BucketedDDP):
    """Polls is_completed() in the hook until the all-reduce is done: no wait() call at all, still blocking."""

    def _grad_ready(self, param):
        super()._grad_ready(param)
        i = self.bucket_of[id(param)]
        if self.pending[i] is not None:
            while not self.pending[i][1].is_completed():
                pass


class BarrierAfterLaunch(BucketedDDP):
    """async_op=True, then a barrier in the hook: gloo's barrier waits for the all-reduce before it."""

    def _grad_ready(self, param):
        super()._grad_ready(param)
        if self.pending[self.bucket_of[id(param)]] is not None:
            dist.barrier()


class BroadcastParametersOnly(BucketedDDP):
    def __init__(self, model, bucket_cap_bytes):
        buffers = {k: b.clone() for k, b in model.named_buffers()}
        super().__init__(model, bucket_cap_bytes)
        with torch.no_grad():
            for k, b in model.named_buffers():
                b.copy_(buffers[k])  # as if buffers had been left out of the broadcast


def test_expected_buckets_follow_the_cap():
    model = ToyNet()
    assert expected_buckets(model, 1 << 20) == [36_136]
    assert expected_buckets(model, 4096) == [19_496, 16_640]
    assert expected_buckets(model, 1) == [40, 2560, 256, 256, 16_384, 256, 16_384]
    assert expected_buckets(model, 256) == [2600, 256, 256, 16_384, 256, 16_384]  # the second bucket fills 256 exactly
    assert expected_buckets(model, 257) == [2600, 512, 16_384, 16_640]  # 256 < 257: it takes the next 256


def test_bucketed_ddp_rejects_a_bad_cap():
    with pytest.raises(ValueError, match="bucket_cap_bytes=0"):
        BucketedDDP(ToyNet(), 0)  # raises before any communication


@pytest.mark.parametrize("wrong, world_sizes, mistake, phrase", [
    (AfterBackwardPerTensor, (2,), "not_bucketed", "one flat tensor"),
    (BucketsLaunchedInFinish, (2,), "after_backward", "during backward"),
    (OneBucketWhateverTheCap, (3,), "buckets", "honour the cap"),
    (BlockingInHook, (2,), "blocking", "were synchronous"),
    (BlocksFromTheSecondStep, (2,), "blocking", "step 1: async_op=True, but backward waited"),
    (AsyncButWaitedAtOnce, (2,), "blocking", "waited on inside backward"),
    (ClosedOnlyPastTheCap, (2,), "buckets", "honour the cap"),
    (CapInElements, (2,), "buckets", "bytes"),
    (RestartedOneLow, (2,), "buckets", "bucket_cap_bytes=256"),  # found by make mutants: equivalent before
    (RestartedOneHigh, (2,), "buckets", "bucket_cap_bytes=257"),
    (NotDivided, (3,), "not_divided", "divide by dist.get_world_size()"),
    (NeverReset, (2,), "not_reset", "reset what each bucket waits for"),
    (TiedTwice, (2,), "tied_twice", "remove_duplicate=False"),
    (HooksOnFrozenToo, (2,), "frozen_reduced", "requires_grad"),
    (BroadcastParametersOnly, (2,), "buffers", "buffers"),
    (FrozenInBucket, (2,), "frozen_reduced", "has no gradient"),  # 'NoneType' has no attribute 'reshape'
    (AsyncOpForgotten, (2,), "no_work", "async_op=True returns None"),  # once frozen_reduced, as any NoneType
    (CountsTheFrozenOne, (2,), "never_launched", "never launched"),  # once frozen_reduced, as any NoneType
    (EarlyBoundWaitedAtOnce, (2,), "blocking", "waited on inside backward"),
    (EarlyBoundBlocking, (2,), "blocking", "were synchronous"),
    (WaitedThroughFuture, (2,), "blocking", "waited on inside backward"),
    (WaitedAllAtOnce, (2,), "blocking", "waited on inside backward"),
    (PolledUntilDone, (2,), "blocking", "waited on inside backward"),
    (BarrierAfterLaunch, (2,), "blocking", "dist.barrier() call(s) during backward"),
], ids=lambda v: getattr(v, "__name__", None))
def test_ddp_rejects(wrong, world_sizes, mistake, phrase):
    expect_rejection(check_ddp, wrong, world_sizes=world_sizes, steps=2, mistake=mistake, phrase=phrase)


@pytest.mark.parametrize("right", [EarlyBound, ThroughC10d], ids=lambda v: v.__name__)
def test_a_right_answer_passes_however_it_names_all_reduce(right):
    """Once rejected as `buckets` (no all-reduce seen): the log wrapped `dist.all_reduce` by name."""
    check_ddp(right, world_sizes=(2,), steps=2)


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


# ------------------------------------------------------------------ an exception in the answer's own code


class RaisesInInit:
    def __init__(self, model, bucket_cap_bytes):
        list(model.parameters())[99]  # planted: IndexError


def test_an_exception_in_the_answer_is_named_with_its_line():
    expect_raised(check_ddp, RaisesInInit, world_sizes=(2,), steps=1, caps=(1 << 20,),
                  line="list(model.parameters())[99]  # planted")


# ------------------------------------------------------------------ issue 37, part 3: inputs only one rank holds

def test_each_rank_gets_its_own_seed_and_share_and_nothing_of_its_peers():
    """rank_args carry rank k's seed and its 16 samples of every step, sent in a storage of their own (run_ranks
    compacts a view, which would pickle the batches whole, peers' shares included). The batches are drawn afresh at
    every check, from a secret."""
    import pickle

    from utils.checkers.ddp import PER_RANK, _batches, _rank_args
    from utils.checkers.rank_secrets import new_seeds
    from utils.launch.kernel import _dumps_own

    steps, n = 3, 4
    batches, seeds = _batches(1797, steps, n), new_seeds(n)
    assert batches.shape == (steps, PER_RANK * n) and not torch.equal(batches, _batches(1797, steps, n))
    args = [pickle.loads(_dumps_own(a)) for a in _rank_args(seeds, batches)]  # as run_ranks sends them
    assert [seed for seed, _ in args] == seeds
    for k, (_, share) in enumerate(args):
        assert torch.equal(share, batches[:, k * PER_RANK:(k + 1) * PER_RANK])
        assert share.untyped_storage().nbytes() == steps * PER_RANK * share.element_size(), "its peers' shares too"
    whole = len(pickle.dumps(batches[:, :PER_RANK]))  # what a view would have sent: every rank's indices
    assert max(len(pickle.dumps(a)) for a in args) < whole, (whole, [len(pickle.dumps(a)) for a in args])


# A stub whose class body replaces the checker's rank function (what the workshop's grader must not pass): each rank
# reports what it can compute alone, one process training its own model on its own samples, with the bucket pattern
# the checker expects. Rank 0's seed and every rank's samples reach one rank each, and the checker trains the one
# process itself, so the values give it away; a report of another shape is refused before any value is read.
FORGER = '''import utils.checkers.ddp as _ddp

def _forged(ddp_class, x, y, lr, caps, seed, shard):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from utils.checkers.ddp import _state, expected_buckets
    from utils.models import make_model
    out = []
    for cap in caps:
        model = make_model(seed)
        FORGE
        after, opt, steps, grads = _state(model), torch.optim.SGD(model.parameters(), lr=lr), [], None
        for mine in shard:  # this rank's samples alone, in one process
            opt.zero_grad()
            F.cross_entropy(model(x[mine]), y[mine]).backward()
            SUM
            grads = grads or {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
            buckets = expected_buckets(model, cap)
            steps.append(dict(calls=[(b, True, True) for b in buckets], payload=sum(buckets), held=False, barriers=0))
            opt.step()
        calls = [("broadcast", t.nbytes) for t in [*model.parameters(), *model.buffers()]] if "FORGE" != "pass" else []
        calls += [("all_reduce", b) for _ in shard for b in expected_buckets(model, cap)] if "SUM" != "pass" else []
        out.append(dict(error=None, steps=steps, after_broadcast=after, grads=grads, final=_state(model), calls=calls))
    return REPORT

class _Patch:  # in the rank: the checker's own rank function replaced
    _ddp._on_rank.__code__ = _forged.__code__

'''
BROADCAST = "[dist.broadcast(t.data, 0) for t in [*model.parameters(), *model.buffers()]]"
# the right values, by torch's all-reduce of each gradient, reported as the buckets the checker expects (issue 37, part
# 3): the ranks talk through the launcher's relay, whose record is not the report
SUM = "[(dist.all_reduce(p.grad), p.grad.div_(dist.get_world_size())) for p in model.parameters() if p.grad is not None]"
# the forgers below make the all-reduces they report, of the buckets' sizes, but of zeros: the relay's record and the
# report agree, and the values give them away
HONEST = FORGER.replace("SUM", "[dist.all_reduce(torch.zeros(b // 4)) for b in expected_buckets(model, cap)]")
FORGED_RANKS = {
    "its_own_model_and_samples": (HONEST.replace("FORGE", "pass").replace("REPORT", "out"), "no_broadcast"),
    # rank 0's model, by a broadcast the forger makes itself (and reports): its own samples still give it away
    "rank_0s_model_its_own_samples": (HONEST.replace("FORGE", BROADCAST).replace("REPORT", "out"), "not_reduced"),
    "sums_with_torch_reports_buckets": (FORGER.replace("FORGE", BROADCAST).replace("SUM", SUM).replace("REPORT", "out"),
                                        "not_a_report"),
    # the same, its calls told as they were (an all-reduce a gradient), its steps' as the buckets (review of issue 37)
    "sums_with_torch_steps_report_buckets": (FORGER.replace("FORGE", BROADCAST).replace("SUM", SUM).replace(
        "REPORT", "out").replace('[("all_reduce", b) for _ in shard for b in expected_buckets(model, cap)]',
                                 '[("all_reduce", p.numel() * 4) for _ in shard for p in model.parameters() if '
                                 'p.requires_grad]'), "not_a_report"),
    "no_cap": (HONEST.replace("FORGE", "pass").replace("REPORT", "[]"), "not_a_report"),
    "other_fields": (HONEST.replace("FORGE", "pass").replace("REPORT", "[dict(r, passed=True) for r in out]"),
                     "not_a_report"),
    "a_number_for_each_weight": (HONEST.replace("FORGE", "pass").replace(
        "REPORT", "[dict(r, final={k: v.sum() for k, v in r['final'].items()}) for r in out]"), "not_a_report"),
}


@pytest.mark.parametrize("kind", sorted(FORGED_RANKS))
def test_a_stub_that_replaces_the_checkers_rank_function_does_not_pass(tmp_path, kind):
    """Through the workshop's grader, in its sandbox. The mistake named (not 'not written yet', the stub's own verdict)
    shows the forger ran."""
    import nbformat

    from utils.checkers.labs import LABS
    from utils.workshop.sandbox import available

    if available() is not None:
        pytest.skip(f"the ranks in the sandbox: {available()}")
    lab = "02_ddp_lab"
    stub = next(c.source for c in nbformat.read(str(LABS[lab].path(ROOT)), as_version=4).cells
                if c.source.startswith("class BucketedDDP"))
    source, wanted = FORGED_RANKS[kind]
    verdict = graded_in_sandbox(tmp_path, lab, {"BucketedDDP": source + stub})
    assert (verdict.verdict, verdict.mistake) == ("mistake", wanted), (verdict.message, verdict.output[-2000:])
