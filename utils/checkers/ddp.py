"""The checker of lab 02 (bucketed DDP): gradient buckets all-reduced from hooks during backward, checked on ranks.

Used by ``labs/02_ddp_lab.ipynb``, which derives what is checked here. Same conventions as every lab
(``utils.checkers.common``). The right numbers are not enough: lesson 02's DDP, which all-reduces every
gradient after backward, gets them too. So three kinds of evidence:

- **the pattern**, from ``AllReduceLog`` below: how many all-reduces each step, of how many bytes each
  (the buckets ``expected_buckets`` computes from the cap), whether they were issued *during* backward
  (from the hooks) and asynchronously, and the same again at every step;
- **bytes**, from ``CommLedger``: a frozen or tied tensor reduced anyway shows as its exact size in extra bytes;
- **values**, compared with one process training on the global batch (n times the mean gradient means a
  forgotten division). Each rank gets its own seed and its own samples of every batch, and nothing of its peers'
  (``rank_secrets``): the checker alone holds rank 0's seed and the whole batches, and computes that one process
  itself, so an answer that replaces this module's rank function still has to move data between its ranks.

``AllReduceLog`` and ``CommLedger`` run in the rank, beside the answer's code, which could change what they report; so
the ranks talk through the launcher's relay (``utils.launch.relay``, sealed), and each rank's calls, as its ledger saw
them from its model's construction on, must be those the relay carried (``rank_secrets.carried_calls``), and the
all-reduces its steps report must be those calls (``_steps_carried``): an answer that sums every gradient with its
own all-reduce and reports the buckets is refused (planted in the lab's tests). Whether a bucket's all-reduce was
issued during backward, and asynchronously, the rank says: the relay sees which collectives, not when.
"""

import threading
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..data_parallel.buckets import reverse_buckets
from ..datasets import digits
from ..launch import rank_device
from ..comm.ledger import CommLedger
from ..comm.process_group_calls import observe, payload_bytes
from ..models import ToyNet, make_model
from .boundaries import bucket_caps
from .common import GRAD_TOL, WEIGHT_TOL, CheckResult, LabCheckFailed, caught, close, first_error, launch_answer, raise_if_error
from .rank_secrets import HINTS as SECRET_HINTS
from .rank_secrets import carried_calls, fields, generator, new_seeds, reports, tensors_like

# bytes (utils.checkers.boundaries.bucket_caps on ToyNet's trainable gradients, last first: 40, 2,560, 256, 256,
# 16,384, 256, 16,384 B): one bucket for all (1 MB); a cap reached inside a tensor (4 KB: a parameter is never
# split); the first bucket filled exactly (2,600: a bucket closed only past the cap, or a cap counted in elements,
# makes others); a later one filled exactly (256) and left one byte short (257): a count restarted at -1 or +1 byte
# after the first bucket differs only there (found by make mutants); one per gradient (1)
CAPS = tuple(cap for cap, _ in bucket_caps([p.numel() * p.element_size() for p in ToyNet().parameters()
                                            if p.requires_grad][::-1], round_caps=(1 << 20, 4096)))

HINTS = {
    "deadlock": "some rank makes a collective call that the others skip (a bucket launched on one rank only?), or "
                "waits on a work that was never launched.",
    "no_broadcast": "each rank built its model from its own random seed: in __init__, dist.broadcast(tensor, src=0) "
                    "every parameter, so all replicas start from rank 0's weights.",
    "frozen_not_broadcast": "a frozen parameter (requires_grad=False, here input_scale) gets no gradient but is "
                            "still state: broadcast every parameter, trainable or not.",
    "buffers": "buffers (model.buffers(): running statistics, here input_shift) are state too: broadcast them as "
               "well as the parameters.",
    "frozen_reduced": "your code used a gradient that is None. Two mistakes give this symptom: a frozen parameter "
                      "(requires_grad=False) has no gradient, so put only parameters with requires_grad in buckets "
                      "and hook only those (torch refuses a hook on the others); or p.grad was read in a hook that "
                      "runs before the gradient is accumulated into it (Tensor.register_hook; after zero_grad p.grad "
                      "is None there): hook with register_post_accumulate_grad_hook, as the lab does.",
    "no_work": "your code called .wait() on None. Two mistakes give this symptom and the checker cannot tell them "
               "apart from here: dist.all_reduce without async_op=True returns None, not a work to wait on; or "
               "the bucket's all-reduce was never launched, so what you keep for it is still None (see "
               "never_launched: its count of gradients never reached zero).",
    "never_launched": "finish() found None where a launched bucket keeps its flat tensor and work: that bucket's "
                      "all-reduce was never launched, because its hook never saw its last gradient. Several mistakes "
                      "give this symptom: the count a bucket waits for includes a frozen parameter (no gradient, "
                      "no hook) or the tied weight twice (its hook runs once per backward), a hook that is not "
                      "registered on every trainable parameter, or counts that were not reset for this step.",
    "tied_twice": "a tied weight (mix2.weight is mix1.weight) is ONE tensor: build the buckets from "
                  "model.parameters(), which lists it once, not named_parameters(remove_duplicate=False).",
    "not_bucketed": "one all-reduce per gradient pays the fixed cost of a call once per tensor: pack the gradients "
                    "of a bucket into one flat tensor (torch.cat of p.grad.reshape(-1)) and all-reduce that, once "
                    "per bucket.",
    "buckets": "fill buckets with the trainable parameters in reverse order of model.parameters(), and start a new "
               "bucket when the current one already holds bucket_cap_bytes or more: honour the cap you are given. "
               "Several mistakes give this symptom: the cap is in bytes (p.numel() * p.element_size(), not "
               "p.numel()); a bucket that holds exactly the cap is full; a parameter is never split between buckets.",
    "not_reset": "the first step was right, a later one was not: in finish(), reset what each bucket waits for "
                 "(its count of missing gradients, its pending work), ready for the next backward.",
    "after_backward": "launch a bucket's all-reduce from the hook that completes it (register_post_accumulate_grad_"
                      "hook), during backward, so that it overlaps the rest of backward; finish() only waits.",
    "blocking": "dist.all_reduce(flat) blocks backward until the bytes have travelled, and so does a work waited on "
                "in the hook: pass async_op=True, keep the work it returns, and work.wait() only in finish().",
    "not_divided": "all_reduce sums the gradients; divide by dist.get_world_size() to get the mean, which is the "
                   "gradient of the loss on the global batch.",
    "not_reduced": "the gradients still differ between ranks: after waiting, copy each bucket's averaged slices back "
                   "into p.grad (flat.split([p.numel() ...]), then p.grad.copy_(slice.view_as(p))).",
    "wrong_gradients": "after finish() every gradient must equal the mean of the ranks' gradients: check which "
                       "slice of the flat bucket goes back into which p.grad.",
    "diverged": "the weights drift from single-process training: check that nothing else changes the weights.",
}


# Messages of a None met in the steps, by what the code did with it (the first phrase found names the mistake).
# After backward every trainable parameter has a gradient, so a None used as a tensor is the frozen one's .grad,
# or a .grad read too early (in a Tensor.register_hook hook, before accumulation): frozen_reduced's hint names both.
_TENSOR_USES = ("reshape", "view", "flatten", "numel", "copy_", "div_", "mul_", "add_", "detach", "clone",
                "contiguous", "data", "to", "element_size", "view_as")
STEP_PHRASES = [("has no attribute 'wait'", "no_work"), ("has no attribute 'is_completed'", "no_work"),
                ("cannot unpack non-iterable NoneType", "never_launched"),
                ("'NoneType' object is not subscriptable", "never_launched"),
                ("'NoneType' object is not iterable", "never_launched"),
                ("got NoneType", "frozen_reduced"),  # torch.cat / torch.stack of gradients, one of them None
                ("'NoneType' and", "frozen_reduced"),  # p.grad /= n on a None gradient (or a never-launched
                #                                        bucket's flat /= n before its wait: the message shows where)
                *((f"'NoneType' object has no attribute '{use}'", "frozen_reduced") for use in _TENSOR_USES)]


HOLD = 0.5  # seconds a held all-reduce completes after the real one: far longer than the rest of ToyNet's backward


class AllReduceLog:
    """Inside a rank: note every all-reduce the answer makes as (bytes, async_op, issued during backward?), and
    judge by behaviour whether backward stood still while one travelled.

    The calls are seen where every path to a process group meets (``utils.comm.process_group_calls.observe``), so
    ``dist.all_reduce``, an ``all_reduce`` imported by name before the check and ``distributed_c10d.all_reduce``
    count alike. With ``hold=True`` (the check holds the first and the last step: an answer whose hook waits only
    from its second step on, state kept across steps, shows in the last) the first all-reduce issued during backward
    is *held*: the answer gets, instead
    of gloo's work, one made from a future (``_create_work_from_future``) that completes ``HOLD`` seconds after the
    real one, however the answer waits for it (``wait()``, ``get_future().wait()``, ``torch.futures.wait_all``,
    polling ``is_completed()``, a synchronous call, which waits on the work it gets). If it completes while
    backward is still running, backward waited for it (``held_in_backward``); an answer that overlaps finishes
    backward within milliseconds and waits in ``finish()``. (A synchronous all-reduce run by a thread of the
    answer's own does not hold backward and is not judged blocking; but the call is dated when the thread makes
    it, so a bucket its thread sends after backward returned is judged ``after_backward``.) A ``barrier`` during backward is counted apart
    (``barriers_in_backward``): gloo's barrier waits for every earlier collective of its group (ProcessGroupGloo),
    which the held work, completing after the real one, does not show. The rank function sets ``in_backward``
    around ``loss.backward()``.
    """

    in_backward = False

    def __init__(self, hold=False):
        self.calls, self.barriers_in_backward, self.held_in_backward = [], 0, None
        self._hold, self._threads = hold, []

    def _seen(self, call):
        if call.op == "barrier" and self.in_backward:
            self.barriers_in_backward += 1
        if call.op != "all_reduce":
            return None
        self.calls.append((payload_bytes(call), call.async_op is not False, self.in_backward))
        if not (self._hold and self.in_backward and call.work is not None and self.held_in_backward is None):
            return None
        self.held_in_backward, held = False, torch.futures.Future()

        def complete(real=call.work):
            try:
                real.wait()
                time.sleep(HOLD)
                self.held_in_backward = self.in_backward  # still in backward: it waited for this work
                held.set_result(real.get_future().value())
            except Exception as exc:  # noqa: BLE001 - the real all-reduce failed: the answer's wait raises it
                held.set_exception(exc)

        self._threads.append(threading.Thread(target=complete, daemon=True))
        self._threads[-1].start()
        return torch._C._distributed_c10d._create_work_from_future(held)

    def __enter__(self):
        self._observing = observe(self._seen)
        self._observing.__enter__()
        return self

    def __exit__(self, *exc):
        for thread in self._threads:
            thread.join(timeout=HOLD + 30)
        return self._observing.__exit__(*exc)


def expected_buckets(model, cap):
    """Bytes of each bucket: trainable parameters in reverse order, a bucket closed once it holds >= cap bytes
    (torch DDP's rule, ``utils.data_parallel.buckets``)."""
    sizes = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
    return [sum(sizes[i] for i in bucket) for bucket in reverse_buckets(sizes, cap, "ddp")] or [0]


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a, b):
    return max((a[k].double() - b[k].double()).abs().max().item() for k in b)


PER_RANK = 16  # samples of each step's global batch on each rank
REPORT = dict(error=(tuple, type(None)), steps=list, after_broadcast=(dict, type(None)), grads=(dict, type(None)),
              final=(dict, type(None)), calls=[[str, int]])  # what _on_rank reports a cap: observations, no reference
STEP = dict(calls=list, payload=(int, float), held=(bool, type(None)), barriers=int)  # and a step of it


def _on_rank(ddp_class, x, y, lr, caps, seed, shard):
    """Runs on every rank, once per cap: the model from this rank's own ``seed``, wrapped in ddp_class, then SGD on
    ``shard``, this rank's samples of every step's global batch ((steps, PER_RANK) indices into the public ``x``,
    ``y``). Seed and shard reach this rank alone (``rank_secrets``): no rank can compute one process's training on
    the global batch without its peers. Reports what it saw (``REPORT``); the checker computes the references."""
    device = rank_device()
    x, y, out = x.to(device), y.to(device), []
    for cap in caps:
        model = make_model(seed).to(device)  # every rank starts different, so a missing broadcast shows
        run = dict(error=None, steps=[], after_broadcast=None, grads=None, final=None, calls=[])
        stage = f"{ddp_class.__name__}(model, {cap})"
        out.append(run)
        everything = CommLedger()  # every call of the run, in order (the constructor's, a forward's): the relay's?
        try:
            everything.__enter__()
            ddp = ddp_class(model, cap)
            run["after_broadcast"], stage = _state(model), f"{ddp_class.__name__}.finish"
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            for step, mine in enumerate(shard):  # this rank's share of step's global batch
                opt.zero_grad()
                loss = F.cross_entropy(model(x[mine]), y[mine])
                held = step in (0, len(shard) - 1)  # the first step, and the last: a hook that waits only from
                with CommLedger() as ledger, AllReduceLog(hold=held) as log:  # its second step on shows there
                    log.in_backward = True
                    loss.backward()  # the hooks should launch every bucket in here
                    log.in_backward = False
                    ddp.finish()
                run["steps"].append(dict(calls=log.calls, payload=ledger.total("payload_bytes"),
                                         held=log.held_in_backward, barriers=log.barriers_in_backward))
                if step == 0:
                    run["grads"] = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
                opt.step()
            run["final"] = _state(model)
        except Exception as exc:  # noqa: BLE001 - reported to the learner in the kernel
            run["error"] = caught(exc, stage)
            break
        finally:
            everything.__exit__(None, None, None)
            run["calls"] = [(r.op, int(r.payload_bytes)) for r in everything.records]
    return out


def _initial(seed):
    """The state a rank's model starts from with this ``seed``, made here as the rank makes it; the kernel's own
    random state left as it was."""
    with torch.random.fork_rng(devices=[]):
        return _state(make_model(seed))


def _single_process(x, y, batches, lr, seed):
    """The truth: one process, rank 0's init (its ``seed``), the whole global batch at every step."""
    with torch.random.fork_rng(devices=[]):
        model = make_model(seed)
    opt, grads = torch.optim.SGD(model.parameters(), lr=lr), None
    for idx in batches:
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        grads = grads or {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        opt.step()
    return grads, _state(model)


def _batches(samples, steps, world_size):
    """Every step's global batch: (steps, PER_RANK * world_size) indices into the digits, in an order drawn from a
    fresh secret (``rank_secrets``), so that no rank can tell its peers' samples from its own."""
    size = PER_RANK * world_size
    order = torch.randperm(samples, generator=generator(*new_seeds(1)))
    return order.repeat(1 + steps * size // samples)[: steps * size].view(steps, size)


def _rank_args(seeds, batches):
    """``run_ranks``'s ``rank_args``: rank k gets its seed and its share of every step's batch, the k-th PER_RANK
    indices (a view: run_ranks sends it as a tensor of its own, not with the whole batches it views)."""
    shares = batches.view(len(batches), len(seeds), PER_RANK)  # (steps, n, PER_RANK)
    return [(seed, shares[:, k]) for k, seed in enumerate(seeds)]


def _observed(per_rank, caps, steps, n, start, ref_grads):
    """The ranks' reports, checked for the shape ``_on_rank`` gives them (a run a cap, as ``REPORT``; its steps as
    ``STEP``; the model's tensors by name) before the checker reads a value: anything else is ``not_a_report``."""
    __tracebackhide__ = True
    reports(per_rank, REPORT, len(caps), n)
    for k, runs in enumerate(per_rank):
        for cap, run in zip(caps, runs):
            label = f"rank {k}, bucket_cap_bytes={cap}"
            done = [run[name] is not None for name in ("after_broadcast", "grads", "final")]
            if len(run["steps"]) > steps or not run["error"] and (len(run["steps"]) < steps or not all(done)):
                raise LabCheckFailed("not_a_report", f"{label}: {len(run['steps'])} of {steps} steps, "
                                     f"{sum(done)} of 3 states, and no error", SECRET_HINTS["not_a_report"], n)
            for step in run["steps"]:
                fields(step, STEP, label, n)
                if not all(isinstance(c, tuple) and len(c) == 3 and isinstance(c[0], int) for c in step["calls"]):
                    raise LabCheckFailed("not_a_report", f"{label}: a call is not (bytes, async, during backward)",
                                         SECRET_HINTS["not_a_report"], n)
            for name in ("after_broadcast", "final"):
                if run[name] is not None:
                    tensors_like(run[name], start, f"{label}, {name}", n)
            if run["grads"] is not None:  # a gradient missing is the answer's (not_reduced), not the report's
                tensors_like(run["grads"], ref_grads, f"{label}, grads", n, every=False)
    return per_rank


def _steps_carried(per_rank, n):
    """The all-reduces each run's steps report (``AllReduceLog``: their bytes, judged by ``_check_pattern``) must be the
    all-reduces of the run's calls, which the relay carried (``carried_calls``), in order; and a run sends no
    message (this lab's answers never do): else ``not_a_report``. Whether a call was asynchronous and issued during
    backward is the rank's to say: the relay sees which collectives, not when."""
    __tracebackhide__ = True
    for k, runs in enumerate(per_rank):
        for run in runs:
            calls = [(op, int(size)) for op, size in run["calls"] if op not in ("barrier", "recv", "irecv")]
            stepped = [int(size) for step in run["steps"] for size, _, _ in step["calls"]]
            first = next((i for i, (op, _) in enumerate(calls) if op == "all_reduce"), len(calls))
            # before the first all-reduce, the constructor's calls (judged by the values: a model not rank 0's); from
            # it on, the steps' all-reduces and nothing else: a message, or a broadcast or all-gather in a step,
            # would move gradients the pattern does not see
            tail = calls[first:]
            sizes = [size for _, size in tail]
            mine = sizes[len(sizes) - len(stepped):] == stepped  # the steps' all-reduces are the last ones
            if not mine or any(op != "all_reduce" for op, _ in tail) or any(op in ("send", "isend") for op, _ in calls):
                raise LabCheckFailed("not_a_report", f"rank {k}: its steps report all-reduces of {stepped} bytes, "
                                     f"and from its first all-reduce on the relay carried {tail}",
                                     SECRET_HINTS["not_a_report"], n)


def _check_pattern(n, runs, probe, cap):
    """The collectives of every step of one cap: sizes = the buckets, during backward, async, every step alike."""
    __tracebackhide__ = True
    size = {k: p.numel() * p.element_size() for k, p in probe.named_parameters()}
    frozen = sum(size[k] for k, p in probe.named_parameters() if not p.requires_grad)
    trainable, tied = sum(size.values()) - frozen, size["mix1.weight"]
    want = expected_buckets(probe, cap)
    steps = runs[0]["steps"]
    extra = steps[0]["payload"] - trainable
    for mistake, waste in (("tied_twice", tied), ("frozen_reduced", frozen), ("tied_twice", tied + frozen)):
        if extra == waste:
            raise LabCheckFailed(mistake, f"bucket_cap_bytes={cap}: the values may be right, but a step all-reduced "
                                 f"{extra:,} bytes more than the {trainable:,} bytes of trainable gradients.",
                                 HINTS[mistake], n)
    got = sorted(b for b, _, _ in steps[0]["calls"])
    if got != sorted(want):
        per_tensor = len(got) == len(size) - 1 and len(want) < len(got)  # one call per trainable tensor
        raise LabCheckFailed("not_bucketed" if per_tensor else "buckets", f"bucket_cap_bytes={cap}: a step made "
                             f"{len(got)} all-reduces of {got} bytes; buckets closed at {cap:,} bytes make "
                             f"{len(want)} of {sorted(want)}." + (" No all-reduce reached a process group: the buckets must be "
                             "all-reduced with dist.all_reduce." if not got else ""),
                             HINTS["not_bucketed" if per_tensor else "buckets"], n)
    for k, step in enumerate(steps[1:], 1):
        if sorted(b for b, _, _ in step["calls"]) != got:
            raise LabCheckFailed("not_reset", f"bucket_cap_bytes={cap}: step 0 made {len(got)} all-reduces of "
                                 f"{got} bytes, step {k} {len(step['calls'])} of "
                                 f"{sorted(b for b, _, _ in step['calls'])}.", HINTS["not_reset"], n)
    late = [b for step in steps for b, _, during in step["calls"] if not during]
    if late:
        raise LabCheckFailed("after_backward", f"bucket_cap_bytes={cap}: {len(late)} of the {len(got) * len(steps)} "
                             f"all-reduces ({sorted(set(late))} bytes) were issued after backward had returned.",
                             HINTS["after_backward"], n)
    barriers = sum(step["barriers"] for step in steps)
    if barriers:
        raise LabCheckFailed("blocking", f"bucket_cap_bytes={cap}: {barriers} dist.barrier() call(s) during backward: "
                             "a barrier waits for every collective issued before it, so backward stood still while "
                             "each all-reduce travelled.", HINTS["blocking"], n)
    held = [k for k, step in enumerate(steps) if step["held"]]
    if held:
        sync = [b for b, is_async, during in steps[held[0]]["calls"] if during and not is_async]
        raise LabCheckFailed("blocking", f"bucket_cap_bytes={cap}, step {held[0]}: " + (
            f"{len(sync)} all-reduces were synchronous (no async_op=True): backward stood still while each travelled."
            if sync else "async_op=True, but backward waited for the first bucket's all-reduce before it went on "
            "(its work was waited on inside backward): it overlaps nothing, as with a synchronous call."),
            HINTS["blocking"], n)
    return want


def check_ddp(ddp_class, world_sizes=(2, 3), steps=3, caps=CAPS, lr=0.2, timeout=60.0):
    """Check a bucketed DDP: ``ddp = ddp_class(model, bucket_cap_bytes)``, then ``ddp.finish()`` after each backward.

    On each world size n and each cap, every rank builds ``ToyNet`` from its own random seed, wraps it, then
    trains ``steps`` SGD steps on its 16 samples of a 16n-sample global batch of ``digits()``, drawn at random;
    seed and samples reach that rank alone, and the checker, which holds them all, trains the one process
    itself (``rank_secrets``). Demands:
    (1) after construction every rank holds rank 0's parameters, frozen ones and buffers; (2) every
    step all-reduces the trainable gradients once, as the buckets of ``expected_buckets(model, cap)``,
    one call per bucket, each issued during backward with ``async_op=True``, the same at every step;
    (3) after ``finish()`` the gradients equal one process's on the global batch (n times them: not
    divided); (4) the weights after ``steps`` steps equal single-process training (GRAD_TOL, WEIGHT_TOL).
    """
    __tracebackhide__ = True
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r}: the check compares gradients after the first SGD step; use 1 or more "
                         "(the lab uses 2, or 3 with SMOKE off).")
    x, y = digits()
    probe = ToyNet()
    buffers = {k for k, _ in probe.named_buffers()}
    frozen = {k for k, p in probe.named_parameters() if not p.requires_grad}
    lines = []
    for n in world_sizes:
        seeds, batches = new_seeds(n), _batches(len(x), steps, n)  # (steps, 16n) indices
        traffic = []
        per_rank = launch_answer(_on_rank, (ddp_class, x, y, lr, caps), n, timeout, f"{ddp_class.__name__}",
                                 HINTS["deadlock"], rank_args=_rank_args(seeds, batches), traffic=traffic)
        start = _initial(seeds[0])  # rank 0's model before the broadcast: what every replica must hold after it
        ref_grads, ref_final = _single_process(x, y, batches, lr, seeds[0])
        per_rank = _observed(per_rank, caps, steps, n, start, ref_grads)
        if not any(run["error"] for runs in per_rank for run in runs):  # each rank's calls: what the relay carried?
            carried_calls([[tuple(call) for run in runs for call in run["calls"]] for runs in per_rank], traffic, n)
            _steps_carried(per_rank, n)
        made = []
        for i, cap in enumerate(caps):
            runs = [r[i] for r in per_rank if i < len(r)]
            error = first_error(runs)
            if any(r["after_broadcast"] is None for r in runs):  # raised while building: a hook, a broadcast
                raise_if_error(error, n, HINTS, phrases=[("does not require grad", "frozen_reduced"),
                                                         ("doesn't require grad", "frozen_reduced")])
            differ = {k for r in runs for k in start if not torch.equal(r["after_broadcast"][k], start[k])}
            for mistake, keys in (("no_broadcast", differ - buffers - frozen), ("buffers", differ & buffers),
                                  ("frozen_not_broadcast", differ & frozen)):
                if keys:
                    raise LabCheckFailed(mistake, f"after {ddp_class.__name__}(model, {cap}), {sorted(keys)} differ "
                                         "from rank 0's initial values on some rank.", HINTS[mistake], n)
            if error and runs[0]["steps"]:  # a later step failed: was the first one already different?
                _check_pattern(n, [dict(r, steps=r["steps"][:1]) for r in runs], probe, cap)
                if len(runs[0]["steps"]) < steps:
                    raise LabCheckFailed("not_reset", f"step 0 ran, then rank {error[0]} raised {error[1]} "
                                         f"{error[2]}", HINTS["not_reset"], n)
            raise_if_error(error, n, HINTS, phrases=STEP_PHRASES)  # any other None: a crash, its message shown
            want = _check_pattern(n, runs, probe, cap)
            grads = runs[0]["grads"]
            named = all(r["grads"].keys() == ref_grads.keys() for r in runs)  # on every rank: _max_diff indexes them
            if not named or any(_max_diff(r["grads"], grads) > 0 for r in runs):
                raise LabCheckFailed("not_reduced", f"bucket_cap_bytes={cap}: after finish() the gradients of "
                                     f"{sorted(grads)} " + ("differ between ranks." if named else "are not the "
                                     f"trainable parameters' ({sorted(ref_grads)}) on every rank."),
                                     HINTS["not_reduced"], n)
            diff = _max_diff(grads, ref_grads)
            if not close(grads, ref_grads, GRAD_TOL):
                mistake = "not_divided" if _max_diff(grads, {k: n * g for k, g in ref_grads.items()}) < 1e-4 else \
                    "wrong_gradients"
                raise LabCheckFailed(mistake, f"bucket_cap_bytes={cap}: the gradients after finish() differ from one "
                                     f"process on the global batch by up to {diff:.3g}.", HINTS[mistake], n)
            drift = max(_max_diff(r["final"], ref_final) for r in runs)
            if not all(close(r["final"], ref_final, WEIGHT_TOL) for r in runs):
                raise LabCheckFailed("diverged", f"after {steps} steps the weights differ from single-process "
                                     f"training by up to {drift:.3g}.", HINTS["diverged"], n)
            made.append(f"cap {cap:,} B: {len(want)} bucket(s)")
        lines.append(f"world_size={n}: replicas = rank 0 after construction; per step {'; '.join(made)}, each "
                     f"all-reduced once, async, during backward; gradients and weights after {steps} steps = one "
                     f"process (max diff {diff:.1e}, {drift:.1e})")
    return CheckResult("BucketedDDP", lines)
