"""The ZeRO lab's checker (utils/checkers/zero.py) accepts the reference and rejects planted wrong answers.

Lab 03 asks for ZeRO-2 as DeepSpeed runs it: gradient buckets reduce-scattered from hooks during
backward, full gradients freed bucket by bucket, the given torch optimizer (with its arguments and the
parameter groups' options) on this rank's chunks, an all-gather. Each
wrong answer below reaches (or nearly reaches) the right parameters the *wrong way*, and the test
asserts that the checker names the mistake (``LabCheckFailed.mistake``) and says the key phrase of
its hint. Each runs at a world size where its mistake shows (3 where padding matters). The lab's
notebook itself runs in tests/test_notebooks.py.
"""

import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lab_grading import expect_raised, expect_rejection
from utils.course.notebook_runner import ROOT
from utils.comm import compat
from utils.checkers.zero import check_bucketed_zero2, check_make_buckets
from utils.models import ToyNet

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.zero import BucketedZeRO2, make_buckets  # noqa: E402


# ------------------------------------------------------------------ make_buckets: wrong answers

def buckets_forward_order(params, bucket_numel):
    """Filled from the first parameter: the first bucket completes last in backward."""
    return make_buckets(list(reversed(params)), bucket_numel)  # make_buckets reverses: forward order


def buckets_close_after(params, bucket_numel):
    """Lesson 02's torch-DDP rule (close once >= the cap): a bucket may overflow by a whole parameter."""
    buckets, current = [], []
    for p in reversed(params):
        current.append(p)
        if sum(q.numel() for q in current) >= bucket_numel:
            buckets.append(current)
            current = []
    return buckets + [current] if current else buckets


def buckets_one_per_param(params, bucket_numel):
    return [[p] for p in reversed(params)]


def buckets_lose_last(params, bucket_numel):
    """Forgets the bucket still open when the loop ends."""
    return make_buckets(params, bucket_numel)[:-1]


def buckets_no_return(params, bucket_numel):
    """Builds the buckets and forgets to return them."""
    make_buckets(params, bucket_numel)


def buckets_flat(params, bucket_numel):
    """One flat list of parameters, not a list of buckets."""
    return [p for bucket in make_buckets(params, bucket_numel) for p in bucket]


def buckets_generator(params, bucket_numel):
    """A generator whose own code fails while the checker iterates it: still the answer's exception."""
    for k, bucket in enumerate(make_buckets(params, bucket_numel)):
        yield [bucket[0], params[len(params) + k]]


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (buckets_forward_order, "bucket_order", "reversed(params)"),
    (buckets_close_after, "bucket_overflow", "*before*"),
    (buckets_one_per_param, "bucket_size", "never one bucket for everything nor one per parameter"),
    (buckets_lose_last, "lost_params", "exactly one bucket"),
    (buckets_no_return, "not_lists", "returned NoneType"),
    (buckets_flat, "not_lists", "not a list of lists"),
    (buckets_generator, "raised", "IndexError"),
], ids=lambda v: getattr(v, "__name__", None))
def test_make_buckets_rejects(wrong, mistake, phrase):
    expect_rejection(check_make_buckets, wrong, mistake=mistake, phrase=phrase)


def _buckets_rule(sizes, cap, closes_at_cap=False, start=0, first=None):
    """DeepSpeed's rule on parameter sizes, as indices, with the off-by-ones make mutants wrote: a bucket closed
    when it would reach the cap (``>=``), a count started at ``start`` (the first bucket's at ``first``)."""
    out, current, size = [], [], start if first is None else first
    for i in reversed(range(len(sizes))):
        if current and (size + sizes[i] >= cap if closes_at_cap else size + sizes[i] > cap):
            out.append(current)
            current, size = [], start
        current.append(i)
        size += sizes[i]
    return out + [current]


OFF_BY_ONE = {"closed at the cap": dict(closes_at_cap=True), "counted from 1": dict(start=1),
              "counted from -1": dict(start=-1), "first counted from -1": dict(first=-1)}
OFF_BY_ONE_MISTAKE = {"closed at the cap": "bucket_size", "counted from 1": "bucket_size",  # closed too early
                      "counted from -1": "bucket_overflow",  # one number past the cap let in
                      "first counted from -1": "bucket_overflow"}  # lab 03 #18: equivalent until one_short_first


def _planted_off_by_one(how):
    def answer(params, bucket_numel):
        indices = _buckets_rule([p.numel() for p in params], bucket_numel, **OFF_BY_ONE[how])
        return [[params[i] for i in bucket] for bucket in indices]
    answer.__name__ = how.replace(" ", "_")
    return answer


def test_make_buckets_cases_sit_on_the_boundaries():
    """Each case is the kind its table says, under the rule; and each off-by-one of the rule changes the buckets at
    one of them (make mutants found the three equivalent when no bucket filled exactly)."""
    from utils.checkers.zero_buckets import SMALL, SMALL_CAPS, TOY_CAPS

    toy = [p.numel() for p in ToyNet().parameters() if p.requires_grad]
    for sizes, caps in ((toy, TOY_CAPS), (list(SMALL), SMALL_CAPS)):
        for cap, kind in caps:
            buckets = _buckets_rule(sizes, cap)
            made = [sum(sizes[i] for i in b) for b in buckets]
            first, later = made[0], made[1:-1]
            holds = {"fills_exactly_first": lambda: first == cap and len(buckets[0]) > 1,
                     "one_short_first": lambda: made[0] + sizes[buckets[1][0]] == cap + 1,
                     "fills_exactly_later": lambda: cap in later and first != cap,
                     "one_short_later": lambda: any(made[k] + sizes[buckets[k + 1][0]] == cap + 1  # the next: 1 over
                                                    for k in range(1, len(buckets) - 1)),
                     "inside_a_tensor": lambda: cap not in made and len(made) > 1,
                     "one_for_all": lambda: len(made) == 1,
                     "one_per_tensor": lambda: len(made) == len(sizes)}[kind]
            assert holds(), (sizes, cap, kind, made)
        for how, knobs in OFF_BY_ONE.items():
            assert any(_buckets_rule(sizes, cap, **knobs) != _buckets_rule(sizes, cap) for cap, _ in caps), \
                f"no case of {sizes} tells the rule from a bucket {how}"


@pytest.mark.parametrize("how", sorted(OFF_BY_ONE))
def test_make_buckets_rejects_each_off_by_one(how):
    expect_rejection(check_make_buckets, _planted_off_by_one(how), mistake=OFF_BY_ONE_MISTAKE[how])


def test_make_buckets_names_the_numbers():
    with pytest.raises(ValueError, match="bucket_numel=0"):
        make_buckets([torch.zeros(3)], 0)


# ------------------------------------------------------------------ the class: wrong answers, right numbers

def _completed_bucket(self, p):
    """The reference's bookkeeping: the index of p's bucket if p was its last gradient to arrive, else None."""
    i = self.bucket_of[id(p)]
    self.missing[i] -= 1
    if self.missing[i] > 0:
        return None
    self.missing[i] = len(self.buckets[i])
    return i


def _padded_flat_grad(self, i):
    bucket = self.buckets[i]
    return F.pad(torch.cat([q.grad.reshape(-1) for q in bucket]), (0, self.chunks[i] * self.n - self.numels[i]))


class AllReduce(BucketedZeRO2):
    """Right values, DDP's collective: the whole bucket all-reduced, then this rank's chunk kept."""

    def _grad_ready(self, p):
        i = _completed_bucket(self, p)
        if i is None:
            return
        full = _padded_flat_grad(self, i)
        for q in self.buckets[i]:
            q.grad = None
        dist.all_reduce(full)
        chunk = self.chunks[i]
        self.grad_shards[i] = full[self.rank * chunk:(self.rank + 1) * chunk].clone() / self.n


class ReduceInStep(BucketedZeRO2):
    """ZeRO-2's collectives, but every bucket reduced in step(), after backward."""

    def _grad_ready(self, p):
        pass

    def step(self):
        for i in range(len(self.buckets)):
            self.missing[i] = 1
            super()._grad_ready(self.buckets[i][0])
        super().step()


class ReduceAtLastGradient(BucketedZeRO2):
    """Reduced from a hook, but only when every gradient of the model exists: all full gradients live at once."""

    def _grad_ready(self, p):
        self.seen = getattr(self, "seen", 0) + 1
        if self.seen < sum(len(b) for b in self.buckets):
            return
        self.seen = 0
        for i in range(len(self.buckets)):
            self.missing[i] = 1
            super()._grad_ready(self.buckets[i][0])


class KeepsFullGrads(BucketedZeRO2):
    """Reduce-scatters on time, but never drops p.grad: the full gradient stays, as in DDP."""

    def _grad_ready(self, p):
        i = _completed_bucket(self, p)
        if i is None:
            return
        shard = p.new_empty(self.chunks[i]).detach()
        compat.reduce_scatter_single(shard, _padded_flat_grad(self, i))
        self.grad_shards[i] = shard / self.n

    def step(self):
        super().step()
        for bucket in self.buckets:
            for q in bucket:
                q.grad = None  # so that the next backward is right: only the memory during backward is wrong


class KeepsPaddedCopies(BucketedZeRO2):
    """Frees p.grad on time, but keeps each bucket's padded flat gradient in self: DDP's 4Ψ bytes under another name.

    The full gradients (p.grad) are never alive longer than the reference's: only a count of every tensor tells."""

    def _grad_ready(self, p):
        i = _completed_bucket(self, p)
        if i is None:
            return
        self.flats = getattr(self, "flats", {})
        self.flats[i] = _padded_flat_grad(self, i)  # (chunk * n,), kept "for later"
        for q in self.buckets[i]:
            q.grad = None
        shard = self.flats[i].new_empty(self.chunks[i])
        compat.reduce_scatter_single(shard, self.flats[i])
        self.grad_shards[i] = shard.div_(self.n)


class OneBucket(BucketedZeRO2):
    """bucket_numel ignored: everything in one bucket, reduced when backward is nearly over."""

    def __init__(self, params, bucket_numel, optimizer_class=torch.optim.Adam, **defaults):
        super().__init__(params, 10 ** 9, optimizer_class, **defaults)


class HardCodedBucket(BucketedZeRO2):
    """The notebook's bucket size written in, whatever the argument says."""

    def __init__(self, params, bucket_numel, optimizer_class=torch.optim.Adam, **defaults):
        super().__init__(params, 1_000, optimizer_class, **defaults)


class FullAdamState(BucketedZeRO2):
    """Every rank gathers the mean gradient and runs the optimizer on the whole model: DDP's 8Ψ bytes of state.

    Its all-gather (of gradients, not parameters) has the same bytes as the right one: only the memory tells."""

    def __init__(self, params, bucket_numel, optimizer_class=torch.optim.Adam, **defaults):
        super().__init__(params, bucket_numel, optimizer_class, **defaults)
        self.full = [torch.cat([p.detach().reshape(-1) for p in b]) for b in self.buckets]
        self.optimizer = optimizer_class([{**group, "params": [f for f, g in zip(self.full, self.group_of) if g == k]}
                                          for k, group in enumerate(self.param_groups)], **defaults)

    @torch.no_grad()
    def step(self):
        for i in range(len(self.buckets)):
            mean = self.grad_shards[i].new_empty(self.chunks[i] * self.n)
            compat.all_gather_single(mean, self.grad_shards[i])
            self.full[i].grad = mean[: self.numels[i]]
        self.optimizer.step()
        for i, bucket in enumerate(self.buckets):
            for p, piece in zip(bucket, self.full[i].split([p.numel() for p in bucket])):
                p.copy_(piece.view_as(p))


class NotDivided(BucketedZeRO2):
    def _grad_ready(self, p):
        super()._grad_ready(p)
        i = self.bucket_of[id(p)]
        if self.missing[i] == len(self.buckets[i]) and self.grad_shards[i] is not None:
            self.grad_shards[i] *= self.n  # undo the division


class Unpadded(BucketedZeRO2):
    """Reduce-scatters the bucket without padding: the pieces do not add up when n does not divide it."""

    def _grad_ready(self, p):
        i = _completed_bucket(self, p)
        if i is None:
            return
        full = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
        for q in self.buckets[i]:
            q.grad = None
        shard = full.new_empty(self.chunks[i])
        compat.reduce_scatter_single(shard, full)
        self.grad_shards[i] = shard / self.n


class NoGather(BucketedZeRO2):
    """Updates its chunks and copies them into its own parameters, but never tells the other ranks."""

    @torch.no_grad()
    def step(self):
        for shard, grad in zip(self.param_shards, self.grad_shards):
            shard.grad = grad
        self.optimizer.step()
        for i, bucket in enumerate(self.buckets):
            flat = F.pad(torch.cat([p.reshape(-1) for p in bucket]), (0, self.chunks[i] * self.n - self.numels[i]))
            chunk = self.chunks[i]
            flat[self.rank * chunk:(self.rank + 1) * chunk] = self.param_shards[i]
            for p, piece in zip(bucket, flat[: self.numels[i]].split([p.numel() for p in bucket])):
                p.copy_(piece.view_as(p))


def _chunk_groups(self):
    """The reference's inner param groups: this rank's chunks of each group's buckets, with the group's options."""
    return [{**group, "params": [s for s, g in zip(self.param_shards, self.group_of) if g == k]}
            for k, group in enumerate(self.param_groups)]


class IgnoresLr(BucketedZeRO2):
    """The caller's arguments dropped: optimizer_class(groups), at the class's default lr (Adam: 1e-3)."""

    def __init__(self, params, bucket_numel, optimizer_class=torch.optim.Adam, **defaults):
        super().__init__(params, bucket_numel, optimizer_class, **defaults)
        self.optimizer = optimizer_class(_chunk_groups(self))


class DropsEps(BucketedZeRO2):
    """The lr passed on, the caller's eps left out: optimizer_class(groups, lr=...), at the class's eps (1e-8)."""

    def __init__(self, params, bucket_numel, optimizer_class=torch.optim.Adam, **defaults):
        super().__init__(params, bucket_numel, optimizer_class, **defaults)
        self.optimizer = optimizer_class(_chunk_groups(self), lr=defaults["lr"])


class IgnoresOptimizerClass(BucketedZeRO2):
    """torch.optim.Adam whatever the caller asks for: right for Adam, wrong for AdamW's decoupled weight decay."""

    def __init__(self, params, bucket_numel, optimizer_class=torch.optim.Adam, **defaults):
        super().__init__(params, bucket_numel, torch.optim.Adam, **defaults)


class IgnoresGroupOptions(BucketedZeRO2):
    """One inner group with the defaults: the biases' own lr and weight decay are lost."""

    def __init__(self, params, bucket_numel, optimizer_class=torch.optim.Adam, **defaults):
        super().__init__(params, bucket_numel, optimizer_class, **defaults)
        self.optimizer = optimizer_class(self.param_shards, **defaults)


class FreshState(BucketedZeRO2):
    """A new inner optimizer every step: Adam restarts at step 1 each time."""

    def step(self):
        self.optimizer = type(self.optimizer)([dict(g) for g in self.optimizer.param_groups])  # each with its options
        super().step()


class StepsTwice(BucketedZeRO2):
    """The inner optimizer's step() called twice a step: the same gradient applied twice."""

    def step(self):
        super().step()
        self.optimizer.step()


HIDDEN = {}


class HiddenState(BucketedZeRO2):
    """Right values, but the inner optimizer lives in a global, where nobody can count (or checkpoint) it."""

    def __init__(self, params, bucket_numel, optimizer_class=torch.optim.Adam, **defaults):
        super().__init__(params, bucket_numel, optimizer_class, **defaults)
        HIDDEN[id(self)], self.optimizer = self.optimizer, None

    def step(self):
        self.optimizer = HIDDEN[id(self)]
        super().step()
        self.optimizer = None


@pytest.mark.slow
def test_reference_measures_the_formulas():
    """At the world sizes lab 03 checks (2, 3; 3 pads): the bytes the checker measures are the formulas'."""
    result = check_bucketed_zero2(BucketedZeRO2, make_buckets, world_sizes=(2, 3), steps=2)
    for n in (2, 3):
        m = result.measured[n, 1_000]
        psi, chunks = m["psi"], [-(-b // n) for b in m["buckets"]]
        assert psi == 9_034 and m["buckets"] == [778, 4_096, 64, 4_096] and m["reduce_scatters"] == 4
        assert m["state_bytes"] == 8 * sum(chunks) < 8 * (psi / n + len(chunks))  # 8Ψ/n, rounded up for padding
        assert m["grad_shard_bytes"] == 4 * sum(chunks)
        # every tensor kept: parameter, gradient and m, v chunks, and torch Adam's 0-d float32 step per chunk
        assert m["held_bytes"] == 16 * sum(chunks) + 4 * len(chunks)
        assert m["peak_grad_bytes"] <= 4 * (778 + 4_096) < 4 * psi  # never the full gradient
        assert m["wire_bytes"] == pytest.approx(2 * (n - 1) / n * 4 * n * sum(chunks))  # 2Ψ(n-1)/n values + padding
    assert "-> reduce_scatter_single" in result.timeline


@pytest.mark.parametrize("wrong, world_sizes, mistake, phrase", [
    (AllReduce, (2,), "all_reduce", "half the bytes"),
    (ReduceInStep, (2,), "after_backward", "not in step()"),
    (ReduceAtLastGradient, (2,), "late", "as soon as its last gradient"),
    (KeepsFullGrads, (2,), "full_grads_kept", "q.grad = None"),
    (KeepsPaddedCopies, (2,), "held_too_much", "padded flat gradient"),
    (OneBucket, (2,), "bucket_size", "bucket_numel you are given"),
    (HardCodedBucket, (2,), "bucket_size", "bucket_numel=5,000"),
    (FullAdamState, (2,), "state_not_sharded", "chunk of each bucket only"),
    (NotDivided, (3,), "not_divided", "dist.get_world_size()"),
    (Unpadded, (3,), "unequal_pieces", "pad each bucket"),
    (NoGather, (2,), "not_gathered", "all-gather every bucket"),
    (IgnoresLr, (2,), "lr_ignored", "**defaults"),
    (DropsEps, (2,), "lr_ignored", "without eps="),
    (IgnoresOptimizerClass, (2,), "optimizer_class_ignored", "not torch.optim.Adam"),
    (IgnoresGroupOptions, (2,), "group_options_ignored", "one parameter group per entry"),
    (FreshState, (2,), "state_reset", "restarts Adam"),
    (StepsTwice, (2,), "stepped_twice", "once per step()"),
    (HiddenState, (2,), "state_hidden", "self.optimizer"),
], ids=lambda v: getattr(v, "__name__", None))
def test_class_rejects(wrong, world_sizes, mistake, phrase):
    expect_rejection(check_bucketed_zero2, wrong, make_buckets, world_sizes=world_sizes, steps=2, mistake=mistake,
                     phrase=phrase)


def test_wrong_make_buckets_is_reported_before_the_class():
    expect_rejection(check_bucketed_zero2, BucketedZeRO2, buckets_close_after, world_sizes=(2,), steps=2,
                     mistake="bucket_overflow")


# ------------------------------------------------------------------ an exception in the answer's own code


def buckets_assert(params, bucket_numel):
    assert bucket_numel > 10_000, "planted: an assertion of the answer's own"


class ShapeErrorInStep(BucketedZeRO2):
    def step(self):
        torch.zeros(3) + torch.zeros(4)  # planted: a shape RuntimeError


def test_an_exception_in_make_buckets_is_named_with_its_line():
    expect_raised(check_make_buckets, buckets_assert, line='assert bucket_numel > 10_000, "planted')


def test_an_exception_in_the_class_is_named_with_its_line():
    expect_raised(check_bucketed_zero2, ShapeErrorInStep, make_buckets, world_sizes=(2,), bucket_numels=(1_000,),
                  steps=1, line="torch.zeros(3) + torch.zeros(4)  # planted")


# ------------------------------------------------------------------ a stub that replaces the checker's rank function
# (issue 37, part 3). Each rank gets a seed of its own (utils.checkers.rank_secrets): every rank starts from the model
# only rank 0's seed builds and trains on a share of the batch only its seed draws, and the checker computes DDP
# itself (utils.checkers.zero_reference). So what one rank computes alone is not DDP's values, and a report of another
# shape is not a report.

FORGER = '''import utils.checkers.zero as _z

def _forged(cls, x, y, cases, steps, seed):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from utils.checkers.zero_optim import model_params
    from utils.checkers.zero_reference import flat, shard, toy_model
    rank, n, out = dist.get_rank(), dist.get_world_size(), {"error": None, "cases": []}
    share = shard(seed, len(x), steps)  # this rank's own share of each step's batch
    for _, bucket_numel, optimizer_class, defaults, grouping in cases:
        model = toy_model(seed)  # this rank's own model, then rank 0's, as the checker's rank function broadcasts it
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, 0)
        params = [p for p in model.parameters() if p.requires_grad]
        given, groups, _ = model_params(model, grouping, defaults["lr"])
        optimizer = optimizer_class(given, **defaults)  # the unsharded optimizer, on this rank alone
        arrived = []
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: arrived.append(i))
        buckets = []  # DeepSpeed's rule on each group, as indices
        for group in groups:
            current, size = [], 0
            for i in reversed(group):
                if current and size + params[i].numel() > bucket_numel:
                    buckets.append(current)
                    current, size = [], 0
                current.append(i)
                size += params[i].numel()
            buckets.append(current)
        numels = [sum(params[i].numel() for i in b) for b in buckets]
        chunks = [-(-numel // n) for numel in numels]
        report = []
        for step in range(steps):
            arrived.clear()
            optimizer.zero_grad()
            F.cross_entropy(model(x[share[step]]), y[share[step]]).backward()  # this rank's share: no other's
            due = [max(arrived.index(i) for i in b) for b in buckets]  # when each bucket completes
            done = sorted(range(len(buckets)), key=due.__getitem__)
            shards = [F.pad(flat(params[i].grad for i in b), (0, c * n - numel))[rank * c:(rank + 1) * c]
                      for b, c, numel in zip(buckets, chunks, numels)]
            optimizer.step()
            for b in done:  # the collectives a right answer makes, made, of zeros: the relay carries what is reported
                dist.reduce_scatter_tensor(torch.zeros(chunks[b]), torch.zeros(chunks[b] * n))
            for c in chunks:
                dist.all_gather_into_tensor(torch.zeros(c * n), torch.zeros(c))
            # the messages a right answer sends, its hooks' timing and memory: what no value depends on
            records = [("reduce_scatter_single", 4 * chunks[b] * n, 4.0 * chunks[b] * (n - 1)) for b in done]
            records += [("all_gather_single", 4 * c * n, 4.0 * c * (n - 1)) for c in chunks]
            report.append(dict(events=[(i, sum(d < k for d in due), 0) for k, i in enumerate(arrived)],
                               after_backward=len(buckets), live_after=0, records=records, shards=shards,
                               after=flat(params)))
        out["cases"].append(dict(steps=report, state_bytes=8 * sum(chunks),
                                 held_bytes=16 * sum(chunks) + 4 * len(chunks),
                                 state_steps=[float(steps)] * len(chunks), has_optimizer=True,
                                 calls=[(op, size) for step in report for op, size, _ in step["records"]]))
    return REPORT

'''
FORGED_RANKS = {  # the rank function's report -> the verdict (a value mistake) or the mistake (not a report)
    "one_ranks_own_training": ("out", "wrong_grads"),  # its calls are the relay's; its values, one rank's own
    "no_report": ("[]", "not_a_report"),
    "other_fields": ('dict(out, passed=True)', "not_a_report"),
}


def _forger_answers(report):
    """Lab 03's answers: a right make_buckets and the notebook's own stub of BucketedZeRO2, whose class body replaces the
    checker's rank function (in every rank, where the notebook's definitions run) with ``_forged``, returning
    ``report``."""
    import inspect

    from utils.workshop.submissions import notebook_with

    stub = next(c.source for c in notebook_with("03_zero_lab").cells if c.source.startswith("class BucketedZeRO2"))
    assert "raise NotImplementedError" in stub
    patched = stub.replace("class BucketedZeRO2:\n", "class BucketedZeRO2:\n    _z._zero2_on_rank.__code__ = "
                           "_forged.__code__  # the checker's own rank function replaced\n", 1)
    assert patched != stub
    return {"make_buckets": inspect.getsource(make_buckets), "BucketedZeRO2": FORGER.replace("REPORT", report) + patched}


def _forged_verdict(tmp_path, report):
    """The grader's verdict on the forger, its code in the sandbox as every answer's (tests/test_workshop_judge.py)."""
    from lab_grading import graded_in_sandbox

    return graded_in_sandbox(tmp_path, "03_zero_lab", _forger_answers(report), part=1)


def _sandbox_missing():
    from utils.workshop.sandbox import available
    return available()


@pytest.mark.skipif(_sandbox_missing() is not None, reason="the ranks in the grader's sandbox")
@pytest.mark.parametrize("kind", sorted(FORGED_RANKS))
def test_a_stub_that_replaces_the_checkers_rank_function_does_not_pass(tmp_path, kind):
    report, wanted = FORGED_RANKS[kind]
    verdict = _forged_verdict(tmp_path, report)
    assert verdict.verdict == "mistake" and verdict.mistake == wanted, (verdict.verdict, verdict.mistake,
                                                                         verdict.message[:2000])


def _a_report(n=2, steps=1):
    """What _zero2_on_rank returns on ``n`` ranks for one case of ``steps`` steps, in shape (the values made up)."""
    from utils.checkers.zero_reference import toy_model

    sizes = [p.numel() for p in toy_model(0).parameters() if p.requires_grad]
    step = dict(events=[(i, 0, 0) for i in reversed(range(len(sizes)))], after_backward=1, live_after=0,
                records=[("reduce_scatter_single", 8, 4.0)], shards=[torch.zeros(2), None],
                after=torch.zeros(sum(sizes)))
    case = dict(steps=[dict(step) for _ in range(steps)], state_bytes=0, held_bytes=0, state_steps=[1.0],
                has_optimizer=True, calls=[("reduce_scatter_single", 8)] * steps)
    return [{"error": None, "cases": [case]} for _ in range(n)], sizes


@pytest.mark.parametrize("change, phrase", [
    (lambda r: r.pop(), "1 reports from 2 ranks"),
    (lambda r: r[1].update(cases=[]), "rank 1 ran 0 of 1 cases without an error"),
    (lambda r: r[0].update(error=("0", "ValueError", "x")), "['error'][0] is a str"),
    (lambda r: r[0]["cases"][0]["steps"][0].update(events=[(0, 0)]), "['events'][0] is a tuple of 2, not a tuple of 3"),
    (lambda r: r[0]["cases"][0]["steps"][0].update(events=[(0, 0, 0)] * 7), "gradients of tensors [0, 0, 0"),
    (lambda r: r[0]["cases"][0]["steps"][0].update(shards=[[0.0]]), "['shards'][0] is a list, not a NoneType"),
    (lambda r: r[1]["cases"][0]["steps"][0].update(after=torch.zeros(3)), "parameters of shape (3,)"),
    (lambda r: r[1]["cases"][0]["steps"][0].update(after=torch.zeros(9_034, dtype=torch.int64)), "torch.int64"),
    (lambda r: r[1]["cases"][0]["steps"].append(r[1]["cases"][0]["steps"][0]), "2 steps, not 1"),
    (lambda r: r[0]["cases"][0].update(passed=True), "fields ['calls', 'has_optimizer', 'held_bytes', 'passed',"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_report_of_another_shape_is_not_a_report(change, phrase):
    """What the checker indexes is refused before it does (rank_secrets.shaped, zero_reference.observed)."""
    from utils.checkers.common import LabCheckFailed
    from utils.checkers.zero_reference import observed

    per_rank, sizes = _a_report()
    assert observed(per_rank, 1, 1, sizes, 2) is per_rank  # in shape, as made
    change(per_rank)
    with pytest.raises(LabCheckFailed) as err:
        observed(per_rank, 1, 1, sizes, 2)
    assert err.value.mistake == "not_a_report" and phrase in str(err.value), str(err.value)


def test_check_eps_keeps_a_sum_order_inside_weight_tol():
    """Adam's first step moves a number by lr * g / (|g| + eps): a gradient number below torch's eps 1e-8, summed in
    another order, moves outside WEIGHT_TOL; at the checker's CHECK_EPS it stays inside (utils/checkers/zero.py)."""
    from utils.checkers.common import WEIGHT_TOL, close
    from utils.checkers.zero import CHECK_EPS, CHECK_LR

    for eps, inside in ((1e-8, False), (CHECK_EPS, True)):
        moved = []
        for g in (-7.37e-10, -6.21e-10):  # one sum rounded two ways: 6 ranks' gradients summed in reverse (measured)
            p = torch.zeros(1, requires_grad=True)
            p.grad = torch.tensor([g])
            torch.optim.Adam([p], lr=CHECK_LR, eps=eps).step()
            moved.append(p.detach())
        assert close(*moved, WEIGHT_TOL) == inside, (eps, moved)
