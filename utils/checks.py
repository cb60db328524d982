"""The checkers of the labs: run the learner's answer on several ranks and explain what is wrong.

Used by ``labs/01_ring_all_reduce_lab.ipynb`` and ``labs/02_ddp_lab.ipynb``; each lab derives what
its checker looks for. A checker returns a ``CheckResult`` or raises ``LabCheckFailed`` with the
classic mistake it recognised and a hint (the grading machinery every lab shares is ``utils.grading``).

Two kinds of evidence, because values alone miss half the mistakes:

- **values**, compared with what torch computes (``dist.all_reduce``, or one process training on
  the global batch). Inputs are small positive integers, so sums are exact in float32, and a wrong
  answer often *looks like* a known mistake: the sum divided by n (averaged), the input untouched
  (an element no chunk covered), n times the mean gradient (forgot to divide);
- **bytes**, from ``CommLedger``: a ring that sends whole tensors, or a gradient reduced twice,
  gives the right values and the wrong bill.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .datasets import digits
from .grading import CheckResult, LabCheckFailed, caught, close, first_error, launch_answer, raise_if_error
from .launch import rank_device
from .ledger import RING_WIRE_FACTOR, CommLedger
from .models import ToyNet

COLLECTIVES = set(RING_WIRE_FACTOR) - {"send", "isend", "recv", "irecv", "barrier"}  # all but point-to-point


# ------------------------------------------------------------------------------------------------
# Lab 01: ring all-reduce
# ------------------------------------------------------------------------------------------------

RING_HINTS = {
    "deadlock": "every rank probably waits in a blocking dist.send (or isend(...).wait()) for a receive its "
                "neighbour has not posted yet: gloo's send waits for the matching recv, at any size. Post both "
                "halves first (reqs = [dist.isend(...), dist.irecv(...)]), then wait on both.",
    "averaged": "all-reduce with SUM must leave the plain sum, as dist.all_reduce does; do not divide by the "
                "world size (DDP divides afterwards, lab 02).",
    "not_in_place": "write the result into the tensor you were given (tensor.copy_(result), or add_ into views "
                    "of it); the caller ignores the return value.",
    "reduce_scatter_only": "after the reduce-scatter phase each rank owns ONE complete chunk. The all-gather "
                           "phase must pass the complete chunks round the ring for n-1 more steps.",
    "uncovered": "some elements were never summed: the chunks do not cover the tensor exactly once. Let torch cut "
                 "it, torch.tensor_split(tensor.view(-1), world_size), or give chunk i numel // n + (i < numel % n) "
                 "elements.",
    "wrong": "compare your chunk indices with the table in the lab: at step s of reduce-scatter rank r sends "
             "chunk (r - s) % n and adds into chunk (r - s - 1) % n.",
    "too_many_bytes": "each step must send ONE chunk of about numel/n elements, not the whole tensor: that is the "
                      "point of the ring (2(n-1)/n of the tensor per rank, whatever n).",
    "too_few_bytes": "call dist.isend / dist.irecv (or send / recv) through the dist module, so CommLedger sees them.",
    "used_collective": "build it from point-to-point calls only (dist.isend / dist.irecv, or send / recv): "
                       "calling a collective hides the algorithm this lab is about.",
}


def ring_cases(world_size):
    """(numel, dtype) cases: 1 element, fewer elements than ranks, divisible, not, and a large one."""
    sizes = sorted({1, max(1, world_size - 1), 4 * world_size, 4 * world_size + 1, 25_003})
    return [(numel, dtype) for dtype in (torch.float32, torch.int64) for numel in sizes]


def _ring_on_rank(fn, cases):
    """Runs on every rank: each case on a fresh tensor, inside a ledger; stops at the first error."""
    rank, device, out = dist.get_rank(), rank_device(), []
    for numel, dtype in cases:
        original = ((rank + 1) * 100 + torch.arange(numel, device=device) % 13 + 1).to(dtype)  # > 0, exact
        expected = original.clone()
        dist.all_reduce(expected)  # torch's answer, outside the ledger
        tensor, returned, error = original.clone(), None, None
        with CommLedger() as ledger:
            try:
                returned = fn(tensor)
            except Exception as exc:  # noqa: BLE001 - reported to the learner in the kernel
                error = caught(exc, "ring_all_reduce")
        out.append(dict(numel=numel, dtype=dtype, original=original, expected=expected, got=tensor, error=error,
                        returned=returned if isinstance(returned, torch.Tensor) else None,
                        sent=ledger.total("wire_bytes"), ops=sorted({r.op for r in ledger.records} & COLLECTIVES)))
        if error:
            break
    return out


def _ring_values(n, ranks):
    """Which mistake the values of one case look like, on all ranks (None when they are right)."""
    got, exp, orig = ([r[k] for r in ranks] for k in ("got", "expected", "original"))
    if all(torch.equal(g, e) for g, e in zip(got, exp)):
        return None
    if all(torch.allclose(g, e / n) if g.is_floating_point() else torch.equal(g, e // n) for g, e in zip(got, exp)):
        return "averaged"
    if all(torch.equal(g, o) and r["returned"] is not None and torch.equal(r["returned"], e)
           for g, o, e, r in zip(got, orig, exp, ranks)):
        return "not_in_place"
    if all(torch.equal(g[g != e], o[g != e]) for g, e, o in zip(got, exp, orig)):
        return "uncovered"  # every wrong element still holds this rank's input: no chunk contained it
    return "wrong"


def check_ring_all_reduce(fn, world_sizes=(2, 3, 4), timeout=20.0):
    """Check ``fn(tensor) -> None``, an in-place SUM all-reduce over the default group.

    On each world size n, runs every case of ``ring_cases(n)`` and demands: (1) no collective is
    called; (2) every rank's tensor equals ``dist.all_reduce``'s; (3) the bytes the ranks send add
    up to exactly 2(n-1) x the tensor's bytes (each chunk travels n-1 hops in each phase) and no
    rank sends more than 2(n-1) x the largest chunk. Values wrong with exactly half those bytes
    means the all-gather phase is missing. A hang longer than ``timeout`` seconds is reported as a
    deadlock. Returns a ``CheckResult``; raises ``LabCheckFailed`` with a hint.
    """
    __tracebackhide__ = True
    lines = []
    for n in world_sizes:
        per_rank = launch_answer(_ring_on_rank, (fn, ring_cases(n)), n, timeout, "ring_all_reduce", RING_HINTS["deadlock"])
        for i, case in enumerate(per_rank[0]):
            ranks = [r[i] for r in per_rank if i < len(r)]
            label = f"a {case['numel']:,}-element {str(case['dtype']).replace('torch.', '')} tensor"
            used = sorted({op for r in ranks for op in r["ops"]})
            if used:
                raise LabCheckFailed("used_collective", f"{label}: called {used}.", RING_HINTS["used_collective"], n)
            error = first_error(ranks)
            mistake = _ring_values(n, ranks) if len(ranks) == n and not error else None
            bytes_each = case["numel"] * case["got"].element_size()
            ideal, sent = 2 * (n - 1) * bytes_each, sum(r["sent"] for r in ranks)
            if mistake in ("wrong", "uncovered") and sent == ideal // 2:
                mistake = "reduce_scatter_only"  # half the ring's bytes: the all-gather phase is missing
            if mistake:
                r = next(k for k, rk in enumerate(ranks) if not torch.equal(rk["got"], rk["expected"]))
                got, exp = ranks[r]["got"], ranks[r]["expected"]
                bad = (got != exp).nonzero().flatten()
                raise LabCheckFailed(mistake, f"{label}: rank {r} is wrong at {bad.numel()} of {case['numel']} "
                                     f"elements, first at index {bad[0].item()}: got {got[bad[0]].item()}, expected "
                                     f"{exp[bad[0]].item()} (the sum of the ranks' inputs).", RING_HINTS[mistake], n)
            raise_if_error(error, n, RING_HINTS)
            largest = -(-case["numel"] // n) * case["got"].element_size()  # ceil(numel / n) elements
            if sent != ideal or max(r["sent"] for r in ranks) > 2 * (n - 1) * largest:
                mistake = "too_many_bytes" if sent >= ideal else "too_few_bytes"
                raise LabCheckFailed(mistake, f"{label}: the values are right, but the ranks sent {sent:,.0f} bytes "
                                     f"in all, {sent / ideal:.2f}x the ring's 2(n-1) x {bytes_each:,} = {ideal:,} "
                                     f"bytes (or one rank sent more than 2(n-1) chunks).", RING_HINTS[mistake], n)
        ratios = [r[-1]["sent"] / (r[-1]["numel"] * r[-1]["got"].element_size()) for r in per_rank]
        lines.append(f"world_size={n}: {len(per_rank[0])} cases equal dist.all_reduce; on {per_rank[0][-1]['numel']:,} "
                     f"elements each rank sent {min(ratios):.4f}-{max(ratios):.4f} x the tensor's bytes, formula "
                     f"2(n-1)/n = {2 * (n - 1) / n:.4f}")
    return CheckResult("ring_all_reduce", lines)


# ------------------------------------------------------------------------------------------------
# Lab 02: data parallelism from scratch
# ------------------------------------------------------------------------------------------------

DDP_HINTS = {
    "deadlock": "some rank makes a collective call that the others skip (a condition that differs between ranks?).",
    "no_broadcast": "each rank built its model from its own random seed: call dist.broadcast(tensor, src=0) on "
                    "every parameter in broadcast_parameters, so all replicas start from rank 0's weights.",
    "frozen_not_broadcast": "a frozen parameter (requires_grad=False, here input_scale) gets no gradient but is "
                            "still state: broadcast every parameter, trainable or not.",
    "buffers": "buffers (model.buffers(): running statistics, here input_shift) are state too: broadcast them as "
               "well as the parameters.",
    "frozen_reduced": "a frozen parameter (requires_grad=False) has .grad None: skip it (if p.grad is None: "
                      "continue) instead of all-reducing it or a zero tensor.",
    "tied_twice": "a tied weight (mix2.weight is mix1.weight) is ONE tensor: iterate model.parameters(), which "
                  "lists it once, not named_parameters(remove_duplicate=False).",
    "not_divided": "all_reduce sums the gradients; divide by dist.get_world_size() to get the mean, which is the "
                   "gradient of the loss on the global batch.",
    "not_reduced": "the gradients still differ between ranks: all-reduce every gradient (dist.all_reduce(p.grad)).",
    "wrong_gradients": "after average_gradients every gradient must equal the mean of the ranks' gradients.",
    "bytes": "reduce each trainable gradient once, through dist.all_reduce (so that CommLedger sees it).",
    "diverged": "the weights drift from single-process training: check that nothing else changes the weights.",
}
GRAD_TOL = dict(rtol=1e-4, atol=1e-6)  # float32 sums in another order (shard means, then over ranks): ~1e-8 seen
WEIGHT_TOL = dict(rtol=1e-4, atol=1e-5)  # the same, accumulated over a few SGD steps: ~1e-7 seen


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a, b):
    return max((a[k].double() - b[k].double()).abs().max().item() for k in b)


def _ddp_on_rank(broadcast_parameters, average_gradients, x, y, batches, lr, seed):
    """Runs on every rank: a different random init per rank, broadcast, then SGD on a shard."""
    rank, n, device = dist.get_rank(), dist.get_world_size(), rank_device()
    torch.manual_seed(seed + rank)  # every rank starts different, so a missing broadcast shows
    model = ToyNet().to(device)
    out, stage = dict(initial=_state(model), error=None), "broadcast_parameters"
    try:
        with CommLedger() as ledger:
            broadcast_parameters(model)
        out.update(after_broadcast=_state(model), broadcast_bytes=ledger.total("payload_bytes"))
        stage, opt = "average_gradients", torch.optim.SGD(model.parameters(), lr=lr)
        x, y = x.to(device), y.to(device)
        for step, idx in enumerate(batches):
            mine = idx.view(n, -1)[rank]  # this rank's equal share of the global batch
            opt.zero_grad()
            F.cross_entropy(model(x[mine]), y[mine]).backward()
            with CommLedger() as ledger:
                average_gradients(model)
            if step == 0:
                out.update(reduce_bytes=ledger.total("payload_bytes"), grads={
                    k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
            opt.step()
        out["final"] = _state(model)
    except Exception as exc:  # noqa: BLE001 - reported to the learner in the kernel
        out["error"] = caught(exc, stage)
    return out


def _single_process(x, y, batches, lr, seed):
    """The truth: one process, rank 0's init, the whole global batch at every step."""
    torch.manual_seed(seed)
    model = ToyNet()
    opt, grads = torch.optim.SGD(model.parameters(), lr=lr), None
    for idx in batches:
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        grads = grads or {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        opt.step()
    return grads, _state(model)


def check_ddp(broadcast_parameters, average_gradients, world_sizes=(2, 4), steps=5, lr=0.2, timeout=60.0):
    """Check a from-scratch DDP: ``broadcast_parameters(model)`` and ``average_gradients(model)``.

    On each world size n, every rank builds ``ToyNet`` from its own seed, calls
    ``broadcast_parameters``, then trains ``steps`` SGD steps on its 16 samples of a 16n-sample
    global batch of ``digits()``, calling ``average_gradients`` after each backward. Demands:
    (1) after the broadcast every rank holds rank 0's parameters, frozen ones and buffers;
    (2) the all-reduced payload is exactly the trainable gradients' bytes, each tensor once (a
    frozen or tied tensor reduced anyway shows as its exact size in extra bytes); (3) the first
    gradients equal one process's on the global batch (n times them: not divided); (4) the weights
    after ``steps`` steps equal single-process training (tolerances: GRAD_TOL, WEIGHT_TOL).
    """
    __tracebackhide__ = True
    x, y = digits()
    probe = ToyNet()
    buffers = {k for k, _ in probe.named_buffers()}
    frozen = {k for k, p in probe.named_parameters() if not p.requires_grad}
    size = {k: p.numel() * p.element_size() for k, p in probe.named_parameters()}
    trainable, frozen_bytes = sum(size[k] for k in size if k not in frozen), sum(size[k] for k in frozen)
    lines = []
    for n in world_sizes:
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(n))
        batches = order.repeat(1 + steps * 16 * n // len(x))[: steps * 16 * n].view(steps, 16 * n)  # (steps, 16n)
        ranks = launch_answer(_ddp_on_rank, (broadcast_parameters, average_gradients, x, y, batches, lr, 1000), n, timeout,
                        "broadcast_parameters / average_gradients", DDP_HINTS["deadlock"])
        error = first_error(ranks)
        if error and error[2].startswith("in broadcast_parameters"):
            raise_if_error(error, n, DDP_HINTS)
        start = ranks[0]["initial"]
        differ = {k for r in ranks for k in start if not torch.equal(r["after_broadcast"][k], start[k])}
        for mistake, keys in (("no_broadcast", differ - buffers - frozen), ("buffers", differ & buffers),
                              ("frozen_not_broadcast", differ & frozen)):
            if keys:
                raise LabCheckFailed(mistake, f"after broadcast_parameters, {sorted(keys)} differ from rank 0's "
                                     "initial values on some rank.", DDP_HINTS[mistake], n)
        raise_if_error(error, n, DDP_HINTS, phrases=[("NoneType", "frozen_reduced")])
        extra, tied = ranks[0]["reduce_bytes"] - trainable, size["mix1.weight"]  # a known tensor's exact size?
        for mistake, waste in (("tied_twice", tied), ("frozen_reduced", frozen_bytes),
                               ("tied_twice", tied + frozen_bytes)):
            if extra == waste:
                raise LabCheckFailed(mistake, f"the values may be right, but average_gradients reduced {extra:,} "
                                     f"bytes more than the {trainable:,} bytes of trainable gradients.",
                                     DDP_HINTS[mistake], n)
        ref_grads, ref_final = _single_process(x, y, batches, lr, 1000)
        grads = ranks[0]["grads"]
        if grads.keys() != ref_grads.keys() or any(_max_diff(r["grads"], grads) > 0 for r in ranks):
            raise LabCheckFailed("not_reduced", f"the gradients of {sorted(grads)} differ between ranks (one process "
                                 f"has gradients for {sorted(ref_grads)}).", DDP_HINTS["not_reduced"], n)
        diff = _max_diff(grads, ref_grads)
        if not close(grads, ref_grads, GRAD_TOL):
            mistake = "not_divided" if _max_diff(grads, {k: n * g for k, g in ref_grads.items()}) < 1e-4 else \
                "wrong_gradients"
            raise LabCheckFailed(mistake, f"the gradients after average_gradients differ from one process on the "
                                 f"global batch by up to {diff:.3g}.", DDP_HINTS[mistake], n)
        if extra:
            raise LabCheckFailed("bytes", f"average_gradients reduced {ranks[0]['reduce_bytes']:,} bytes, not the "
                                 f"{trainable:,} bytes of trainable gradients.", DDP_HINTS["bytes"], n)
        drift = max(_max_diff(r["final"], ref_final) for r in ranks)
        if not all(close(r["final"], ref_final, WEIGHT_TOL) for r in ranks):
            raise LabCheckFailed("diverged", f"after {steps} steps the weights differ from single-process training "
                                 f"by up to {drift:.3g}.", DDP_HINTS["diverged"], n)
        lines.append(f"world_size={n}: replicas = rank 0 after broadcast ({ranks[0]['broadcast_bytes']:,} bytes); "
                     f"gradients = one process (max diff {diff:.1e}); all-reduced {trainable:,} bytes per step = the "
                     f"trainable gradients, once; weights after {steps} steps = one process (max diff {drift:.1e})")
    return CheckResult("broadcast_parameters + average_gradients", lines)
