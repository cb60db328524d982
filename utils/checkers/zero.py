"""The checker of lab 03 (ZeRO): ZeRO-2 with gradient buckets reduce-scattered during backward.

Used by ``labs/03_zero_lab.ipynb``, which derives what is checked here. The learner writes
``make_buckets(params, bucket_numel) -> [[param, ...], ...]`` (DeepSpeed's rule, in the order
backward produces the gradients) and a class ``cls(params, bucket_numel, optimizer_class, **defaults)``,
built as torch's ``ZeroRedundancyOptimizer`` is, that registers gradient hooks, and whose ``step()`` runs
after backward. The lab's skeleton gives it ``buckets`` (per parameter group, in the groups' order);
its attributes ``grad_shards`` (after backward: this rank's mean-gradient chunk of each bucket) and
``optimizer`` (the inner ``optimizer_class`` over this rank's chunks, whose state is ZeRO's sharded
state) are where the checker counts. Same conventions as every lab (``utils.checkers.common``).

The checker judges the *technique*, not only the final numbers. On every rank it registers its
own gradient hook on each parameter *before* the learner's (hooks run in the order they were
registered), so for every gradient that backward produces it notes how many collectives the
learner has issued so far and how many bytes of full gradients (``p.grad``) are alive. From that:

- **which collective, when**: one reduce-scatter per bucket, issued right after the last gradient
  of that bucket appeared (not at the end of backward, not in ``step()``), with the padded bucket as
  payload; after backward, only all-gathers of the padded parameters; no all-reduce anywhere;
- **memory**: the full gradients of a bucket are gone once it is reduced (at most the open buckets'
  gradients are alive, none after backward); gradient chunks and Adam's state are 4 and 8 bytes x
  the rank's padded chunks, sum over buckets of ceil(numel / n), about Ψ/n numbers (DDP: Ψ); and
  every tensor the answer keeps after its first step, not only ``p.grad``, fits 16 bytes x those
  chunks (parameter, gradient, m and v chunks: ``zero_memory``), so no padded flat copy is kept;
- **values**: the gradient chunks equal DDP's mean gradient cut the same way (a missing division by
  n shows here, Adam would hide it), the first step moves each parameter by ``lr`` (Adam's first
  step is +-lr: an ignored ``lr`` shows), and after a few steps the parameters equal those of plain
  DDP with the *unsharded* optimizer of the same class and groups (``WEIGHT_TOL``: the sums of the
  reduce-scatter and of DDP's all-reduce may add in another order). Each rank gets a seed of its own
  (``rank_secrets``): every rank starts from rank 0's model (broadcast by the rank function) and trains on
  its own share of each batch, both made from the seeds, and the checker computes DDP itself, outside
  the ranks (``zero_reference``), so an answer that replaces the rank function below still has to move
  data between its ranks to report DDP's values. The rank function reports what it saw, never a reference, and
  the ranks talk through the launcher's relay (``utils.launch.relay``, sealed): the collectives a rank reports
  must be those the relay carried (``rank_secrets.carried_calls``), so an answer cannot hide an all-reduce
  (when each was made, and what the answer holds, the rank says: the relay sees which collectives, not when);
- **arguments**: two bucket sizes, an ``lr`` that is not the default (and an ``eps``, ``CHECK_EPS``), and a
  case with AdamW and two parameter groups of their own options (``zero_optim``), so a hard-coded bucket
  size, ``lr``, optimizer class, an ignored group or one argument left out (``eps``) fails, with the mistake named.
"""

import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..datasets import digits
from ..launch import rank_device
from ..comm.ledger import CommLedger
from .common import GRAD_TOL, WEIGHT_TOL, CheckResult, caught, close, fail, first_error, launch_answer, raise_if_error
from .rank_secrets import carried_calls, new_seeds, rank_args, refuse
from .zero_buckets import BUCKET_HINTS, bucket_indices, check_make_buckets, judge_buckets  # lab 03: check_make_buckets
from .zero_memory import HELD_HINT, added_bytes, held_tensors, judge_memory
from .zero_optim import OPTIM_HINTS, judge_first_step, model_params, optimizer_state
from .zero_reference import ddp_reference, flat, observed, shard, toy_model

CHECK_LR = 3e-3  # not torch.optim.Adam's default (1e-3) nor the lab's LR: an lr that is ignored shows
# Adam's first step moves a number by lr * g / (|g| + eps) (torch/optim/adam.py: step_size = lr / bias_correction1,
# denom = sqrt(exp_avg_sq) / bias_correction2_sqrt + eps), so a gradient number below eps, summed in another order
# (the reduce-scatter's, the checker's DDP), moves by up to lr * (its rounding) / eps. Each check draws new data
# (rank_secrets), and such a number turns up by chance: in a simulation of 1,500 checks on 3, 4 and 6 ranks with the
# ranks' sums reversed, torch's eps 1e-8 put 4 right answers outside WEIGHT_TOL (max diff 2.7e-5), 1e-6 none (1.6e-6).
CHECK_EPS = 1e-6
REDUCE_SCATTER = ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter")  # one collective, 3 names
ALL_GATHER = ("all_gather_single", "all_gather_into_tensor", "all_gather")
PARAM_NAMES = ("embed.weight", "embed.bias", "mix1.weight", "mix1.bias", "mix2.bias", "head.weight", "head.bias")

ZERO_HINTS = {**BUCKET_HINTS, **OPTIM_HINTS,  # make_buckets's four, the optimizer's four, then the class's
    "all_reduce": "ZeRO-2 does not all-reduce: reduce-scatter each padded bucket (compat.reduce_scatter_single), so "
                  "each rank receives only the sum of its own chunk, in half the bytes of an all-reduce.",
    "after_backward": "reduce each bucket during backward, from the hook of its last gradient "
                      "(p.register_post_accumulate_grad_hook), not in step(): that is what frees the full gradients "
                      "early and lets the communication overlap the rest of backward.",
    "late": "reduce a bucket as soon as its last gradient exists (count the gradients still missing per bucket), "
            "not when every gradient of the model is there: waiting keeps all the full gradients alive.",
    "bytes": "after backward, send only the all-gathers of the updated chunks (chunk * n numbers per bucket, padding "
             "included): no broadcast, no second reduction.",
    "full_grads_kept": "set q.grad = None for every parameter q of a bucket once its flat copy is made: ZeRO-2 keeps "
                       "only the reduce-scattered chunk, so the full gradients must not outlive their bucket.",
    "held_too_much": HELD_HINT,
    "grad_shard_shape": "self.grad_shards[i] must be this rank's chunk of bucket i's mean gradient: chunk = "
                        "ceil(numel / n) numbers (padding included), the output of the reduce-scatter.",
    "not_divided": "the reduce-scatter SUMS the gradients: divide the chunk by dist.get_world_size() to get the mean. "
                   "Adam almost hides the mistake (it is scale-invariant, up to eps), but clipping, weight decay or "
                   "SGD would not.",
    "wrong_grads": "chunk r of the padded bucket belongs to rank r: flatten the bucket's gradients in the bucket's "
                   "order, pad with zeros to chunk * n, reduce-scatter into `chunk` numbers.",
    "unequal_pieces": "reduce_scatter_single / all_gather_single need n equal pieces: pad each bucket's flat vector "
                      "with zeros to chunk * n numbers (chunk = ceil(numel / n)), even on a rank whose chunk is all "
                      "padding.",
    "deadlock": "some rank skips a collective that the others call: every rank must reduce-scatter and all-gather "
                "every bucket, in the same order.",
    "not_gathered": "after the update each rank holds new values only in its own chunks: all-gather every bucket's "
                    "updated chunks and copy them into the parameters, so every replica is whole and the same.",
    "state_not_sharded": "give the inner optimizer this rank's chunk of each bucket only (its slice of the flat "
                         "parameters), so Adam's state is 8 bytes x about Ψ/n numbers per rank, not DDP's 8Ψ.",
    "state_reset": "build self.optimizer once, in __init__, and call its step() every step: a new optimizer (or "
                   "emptied state) each step restarts Adam at step 1.",
    "stepped_twice": "call self.optimizer.step() once per step(), after the reduce-scatter: each extra call moves "
                     "the parameters again with the same gradient.",
    "wrong": "after each step the parameters must equal DDP's with the unsharded optimizer: mean gradient chunk, "
             "the optimizer on your chunks, all-gather.",
}
ERROR_PHRASES = [(phrase, "unequal_pieces") for phrase in (  # gloo's and NCCL's words for pieces that do not fit
    "invalid tensor size", "same size", "must be divisible", "output tensor size", "* worldSize", "times world")]


@dataclasses.dataclass
class ZeroCheckResult(CheckResult):
    """A passed check, with ``measured[(n, case)]`` (case: a bucket size for Adam over ``model.parameters()``, or
    "AdamW, 2 groups") = dict(psi, buckets (numbers per bucket), reduce_scatters, peak_grad_bytes, grad_shard_bytes,
    state_bytes, held_bytes, wire_bytes, max_diff) and ``timeline``: rank 0's first step at the first world size."""

    measured: dict = dataclasses.field(default_factory=dict)
    timeline: str = ""


def _cases(bucket_numels, lr):
    """(key, bucket_numel, optimizer_class, defaults, grouping): Adam at each bucket size, then AdamW with 2 groups."""
    adam = [(numel, numel, torch.optim.Adam, dict(lr=lr, eps=CHECK_EPS), "generator") for numel in bucket_numels]
    return adam + [("AdamW, 2 groups", bucket_numels[0], torch.optim.AdamW, dict(lr=lr, eps=CHECK_EPS), "groups")]


def _one_case(cls, model, x, y, share, case, steps):
    """``steps`` steps of the learner's class on ``model``, on this rank's ``share`` of each step's batch."""
    _, bucket_numel, optimizer_class, defaults, grouping = case
    params = [p for p in model.parameters() if p.requires_grad]  # each tensor once: the tied weight too
    probe = {"ledger": None, "events": []}

    def seen(i):  # runs before the learner's hook of the same parameter: registered first
        ledger = probe["ledger"]
        live = sum(q.grad.nbytes for q in params if q.grad is not None)
        probe["events"].append((i, len(ledger.records) if ledger else 0, live))

    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda p, i=i: seen(i))
    steps_out = []
    baseline = held_tensors(params[0].device)  # every tensor held before the answer exists
    given, _, _ = model_params(model, grouping, defaults["lr"])  # a generator, or groups holding one
    answer = cls(given, bucket_numel, optimizer_class=optimizer_class, **defaults)
    held = None
    for step in range(steps):
        mine = share[step]  # this rank's PER_RANK samples of the step's global batch
        probe["events"] = []
        with CommLedger() as ledger:
            probe["ledger"] = ledger
            F.cross_entropy(model(x[mine]), y[mine]).backward()
            after_backward = len(ledger.records)
            live_after = sum(q.grad.nbytes for q in params if q.grad is not None)
            shards = [g.detach().clone() if torch.is_tensor(g) else None for g in answer.grad_shards]
            answer.step()
        probe["ledger"] = None
        if held is None:  # what the answer holds after its first step: the checker's own copies left out
            held, baseline = added_bytes(baseline, params[0].device, shards), None
        steps_out.append({"events": probe["events"], "after_backward": after_backward, "live_after": live_after,
                          "records": [(r.op, r.payload_bytes, r.wire_bytes) for r in ledger.records],
                          "shards": shards, "after": flat(params)})
    has_optimizer, state_bytes, state_steps = optimizer_state(answer)
    return {"steps": steps_out, "state_bytes": state_bytes, "held_bytes": held, "state_steps": state_steps,
            "has_optimizer": has_optimizer}


def _zero2_on_rank(cls, x, y, cases, steps, seed):
    """Runs on every rank: each case from rank 0's model, on this rank's share of the batches (both from the seeds,
    ``zero_reference``); stops at the first error. Reports what it saw (``zero_reference.REPORT``); DDP's values are
    the checker's to compute."""
    device = rank_device()
    out, x, y, share = {"error": None, "cases": []}, x.to(device), y.to(device), shard(seed, len(x), steps)
    try:
        for case in cases:
            model = toy_model(seed).to(device)  # this rank's own model, until rank 0's arrives
            for tensor in model.state_dict().values():  # detached; the frozen one and the buffer too
                # rank 0's model on every rank (lab 02's broadcast, not this lab's), outside any ledger; and every
                # rank starts each case together
                dist.broadcast(tensor, 0)
            with CommLedger() as everything:  # every call of the case, in order (the class's constructor too)
                seen = _one_case(cls, model, x, y, share, case, steps)
            out["cases"].append(dict(seen, calls=[(r.op, int(r.payload_bytes)) for r in everything.records]))
    except Exception as exc:  # noqa: BLE001 - reported in the notebook, with every rank's view
        out["error"] = caught(exc, cls.__name__)
    return out


def _judge_comm(case, buckets, chunks, n, label):
    """One reduce-scatter per bucket, right after its last gradient; then all-gathers only."""
    __tracebackhide__ = True
    step = case["steps"][0]
    records, cut = step["records"], step["after_backward"]
    ops = [op for op, _, _ in records]
    every = {op for later in case["steps"] for op, _, _ in later["records"]}  # every step's, which the relay carried
    if "all_reduce" in every:
        fail(ZERO_HINTS, "all_reduce", f"{label}: your steps call {sorted(every)}.", n)
    during = [(j, payload) for j, (op, payload, _) in enumerate(records[:cut]) if op in REDUCE_SCATTER]
    after = [op for op in ops[cut:] if op in REDUCE_SCATTER]
    if after:
        fail(ZERO_HINTS, "after_backward", f"{label}: {len(after)} reduce-scatter(s) issued after backward had "
             f"finished, {len(during)} during it.", n)
    arrival = {i: k for k, (i, _, _) in enumerate(step["events"])}  # parameter index -> its place in backward
    order = sorted(range(len(buckets)), key=lambda b: max(arrival[i] for i in buckets[b]))  # as they complete
    want = [4 * chunks[b] * n for b in order]
    if [p for _, p in during] != want:
        fail(ZERO_HINTS, "bucket_size", f"{label}: during backward you reduce-scattered {[p for _, p in during]} "
             f"bytes; the {len(buckets)} buckets of make_buckets are {want} bytes (in the order backward completes "
             "them), padded to chunk * n numbers.", n)
    if len(during) != cut:
        others = [op for op in ops[:cut] if op not in REDUCE_SCATTER]
        fail(ZERO_HINTS, "bytes", f"{label}: during backward you also called {others}.", n)
    counts = [c for _, c, _ in step["events"]]
    for (j, _), b in zip(during, order):
        issued_after = max((k for k, c in enumerate(counts) if c <= j), default=-1)  # last gradient before it
        due = max(arrival[i] for i in buckets[b])  # the bucket's last gradient
        if issued_after != due:
            fail(ZERO_HINTS, "late", f"{label}: bucket {b} ({[PARAM_NAMES[i] for i in buckets[b]]}) was complete "
                 f"after gradient {due + 1} of {len(counts)}, but its reduce-scatter came after gradient "
                 f"{issued_after + 1}.", n)
    gathered = sum(p for op, p, _ in records[cut:] if op in ALL_GATHER)
    if not gathered:
        fail(ZERO_HINTS, "not_gathered", f"{label}: after backward you called {ops[cut:] or 'no collective'}: the "
             "updated chunks never reach the other ranks.", n)
    if any(op not in ALL_GATHER for op in ops[cut:]) or gathered != sum(want):
        fail(ZERO_HINTS, "bytes", f"{label}: after backward you called {ops[cut:] or 'nothing'} with "
             f"{gathered:,} bytes of all-gather; the padded buckets are {sum(want):,} bytes.", n)


def _judge_values(ranks, key, buckets, chunks, n, lr, label):
    __tracebackhide__ = True
    cases = [r[key] for r in ranks]
    for rank, case in enumerate(cases):  # the gradient chunks of the first step, against DDP's mean
        step = case["steps"][0]
        pieces = step["mean"].split(case["sizes"])
        for b, (bucket, chunk) in enumerate(zip(buckets, chunks)):
            want = F.pad(torch.cat([pieces[i] for i in bucket]), (0, chunk * n - sum(case["sizes"][i] for i in bucket)))
            want, got = want[rank * chunk:(rank + 1) * chunk], step["shards"][b]
            if not close(got, want, GRAD_TOL):
                if n > 1 and close(got, want * n, GRAD_TOL):
                    fail(ZERO_HINTS, "not_divided", f"{label}: rank {rank}'s chunk of bucket {b} is n = {n} times "
                         "DDP's mean gradient.", n)
                fail(ZERO_HINTS, "wrong_grads", f"{label}: rank {rank}'s chunk of bucket {b} differs from DDP's mean "
                     f"gradient (max diff {(got - want).abs().max().item():.2e}).", n)
    if any(not torch.equal(c["final"], cases[0]["final"]) for c in cases):
        fail(ZERO_HINTS, "not_gathered", f"{label}: the replicas differ after the steps.", n)
    case = cases[0]
    if not case["has_optimizer"] or (case["state_bytes"] == 0 and close(case["final"], case["ref"], WEIGHT_TOL)):
        fail(ZERO_HINTS, "state_hidden", f"{label}: self.optimizer is "
             + ("not a torch.optim.Optimizer." if not case["has_optimizer"] else "one that holds no state tensor."), n)
    if any(s > len(case["steps"]) for s in case["state_steps"]):
        fail(ZERO_HINTS, "stepped_twice", f"{label}: after {len(case['steps'])} steps the optimizer's step counters "
             f"are {case['state_steps']}.", n)
    if any(s != len(case["steps"]) for s in case["state_steps"]):
        fail(ZERO_HINTS, "state_reset", f"{label}: after {len(case['steps'])} steps the optimizer's step counters "
             f"are {case['state_steps']}.", n)
    step = case["steps"][0]
    moved = (step["after"] - step["before"]).abs()[step["mean"].abs() > 1e-6]
    if len(case["groups"]) == 1 and moved.numel() and not 0.9 * lr <= moved.median().item() <= 1.1 * lr:
        fail(ZERO_HINTS, "lr_ignored", f"{label}: Adam's first step moves each parameter by lr = {lr:g}; yours moved "
             f"them by {moved.median().item():.3g} (median).", n)
    judge_first_step(ZERO_HINTS, case, n, label)  # an optimizer class, a group's options or the defaults ignored
    if not close(case["final"], case["ref"], WEIGHT_TOL):
        bad = (~torch.isclose(case["final"], case["ref"], **WEIGHT_TOL)).nonzero().flatten()
        fail(ZERO_HINTS, "wrong", f"{label}: the parameters differ from DDP's at {bad.numel()} of "
             f"{case['final'].numel()} numbers, first at index {bad[0].item()}.", n)
    return max((c["final"] - c["ref"]).abs().max().item() for c in cases)


def _timeline(case, buckets):
    step = case["steps"][0]
    calls = {}
    for j, (op, payload, _) in enumerate(step["records"][: step["after_backward"]]):
        k = max((k for k, (_, c, _) in enumerate(step["events"]) if c <= j), default=0)
        calls.setdefault(k, []).append(f"{op} {payload:,} B")
    lines = []
    for k, (i, _, live) in enumerate(step["events"]):
        lines.append(f"  grad {PARAM_NAMES[i]:<12} full grads alive {live:>7,} B"
                     + "".join(f"\n    -> {call}" for call in calls.get(k, [])))
    lines.append(f"  end of backward: full grads alive {step['live_after']:,} B; then step(): "
                 + ", ".join(f"{op} {p:,} B" for op, p, _ in step["records"][step["after_backward"]:]))
    return "\n".join(lines)


def check_bucketed_zero2(cls, make_buckets, world_sizes=(2, 3), bucket_numels=(1_000, 5_000), steps=3, lr=CHECK_LR,
                         timeout=60.0):
    """Check ``cls(params, bucket_numel, optimizer_class, **defaults)`` (hooks, then ``.step()``) on ToyNet beside DDP.

    First ``check_make_buckets(make_buckets)``. Then on each world size n: Adam over ``model.parameters()`` at each
    bucket size, and AdamW over two parameter groups (``zero_optim``) at the first, ``steps`` steps of ``PER_RANK``
    samples per rank of ``digits``, each rank's own (``zero_reference``). Demands: one reduce-scatter per bucket,
    right after its last gradient; only all-gathers after backward; no full gradient outliving its bucket; gradient
    chunks = DDP's mean; 8 bytes of Adam state per number of the rank's chunks; the first step of size ``lr``;
    parameters equal to those of DDP with the unsharded optimizer of the same class and groups (``WEIGHT_TOL``), DDP
    computed by the checker, outside the ranks.
    """
    __tracebackhide__ = True
    if steps < 1 or not bucket_numels or min(bucket_numels) < 1:
        raise ValueError(f"steps={steps}, bucket_numels={bucket_numels}: need at least one step and bucket sizes >= 1.")
    x, y = digits()
    shard(0, len(x), steps)  # too many steps for the digits: a ValueError here, before any rank starts
    check_make_buckets(make_buckets)
    cases = _cases(tuple(bucket_numels), lr)
    sizes = [p.numel() for p in toy_model(0).parameters() if p.requires_grad]
    state = list(toy_model(0).state_dict().values())  # what the rank function broadcasts at each case's start
    lines, measured, timeline = [], {}, ""
    for n in world_sizes:
        seeds, traffic = new_seeds(n), []  # rank k's model (rank 0's for all) and share of the batches: seeds[k]
        per_rank = launch_answer(_zero2_on_rank, (cls, x, y, cases, steps), n, timeout, cls.__name__,
                                 ZERO_HINTS["deadlock"], rank_args=rank_args(seeds), traffic=traffic)
        observed(per_rank, len(cases), steps, sizes, n)
        if not any(r["error"] for r in per_rank):  # each rank's calls, the case's broadcasts first: the relay's?
            carried_calls([[call for case in r["cases"] for call in [("broadcast", t.nbytes) for t in state] +
                            [tuple(c) for c in case["calls"]]] for r in per_rank], traffic, n)
            for k, r in enumerate(per_rank):  # the steps' records, which the checker judges, must be those calls
                for case in r["cases"]:
                    stepped = [(op, int(size)) for step in case["steps"] for op, size, _ in step["records"]]
                    calls = [tuple(c) for c in case["calls"]]  # its construction's calls, then its steps'
                    before = calls[:len(calls) - len(stepped)]
                    if stepped != calls[len(before):] or any(op not in ("broadcast", "barrier") for op, _ in before):
                        refuse(f"rank {k}: its steps report the calls {stepped[:3]}..., and the relay carried "
                               f"{calls[:3]}...: the steps' must be the last, after broadcasts only", "the ranks", n)
        ranks = [{"error": r["error"], **{c[0]: seen for c, seen in zip(cases, r["cases"])}}  # case key -> report
                 for r in per_rank]
        raise_if_error(first_error(ranks), n, ZERO_HINTS, ERROR_PHRASES)
        for key, bucket_numel, optimizer_class, defaults, grouping in cases:
            ddp = ddp_reference(x, y, seeds, optimizer_class, defaults, grouping, steps)  # here, never in a rank
            for r in ranks:  # beside what each rank saw, the checker's own: the case, DDP's values (and the class
                # stays here: what a rank sends back is data, a grader reads nothing else)
                r[key].update(optimizer_class=optimizer_class, defaults=defaults, sizes=ddp["sizes"],
                              groups=ddp["groups"], options=ddp["options"], ref=ddp["final"],
                              final=r[key]["steps"][-1]["after"])
                r[key]["steps"][0].update(before=ddp["before"], mean=ddp["mean"])
            case = ranks[0][key]
            label = f"{optimizer_class.__name__}, {len(case['groups'])} group(s), bucket_numel={bucket_numel:,}"
            buckets = []  # yours, per group, judged: never recomputed
            for group in case["groups"]:
                local = bucket_indices(make_buckets, [torch.zeros(sizes[i]) for i in group], bucket_numel)
                judge_buckets([sizes[i] for i in group], local, bucket_numel, f"ToyNet, {label}")
                buckets += [[group[i] for i in b] for b in local]
            chunks = [-(-sum(sizes[i] for i in b) // n) for b in buckets]
            for r in ranks:
                _judge_comm(r[key], buckets, chunks, n, label)
                judge_memory(ZERO_HINTS, r[key], buckets, chunks, n, label, PARAM_NAMES)
            diff = _judge_values(ranks, key, buckets, chunks, n, lr, label)
            m = {"psi": sum(sizes), "buckets": [sum(sizes[i] for i in b) for b in buckets],
                 "reduce_scatters": len(buckets),
                 "peak_grad_bytes": max(e[2] for r in ranks for e in r[key]["steps"][0]["events"]),
                 "grad_shard_bytes": sum(g.nbytes for g in case["steps"][0]["shards"]),
                 "state_bytes": max(r[key]["state_bytes"] for r in ranks),
                 "held_bytes": max(r[key]["held_bytes"] for r in ranks),
                 "wire_bytes": max(sum(w for _, _, w in r[key]["steps"][0]["records"]) for r in ranks),
                 "max_diff": diff}
            measured[n, key] = m
            timeline = timeline or f"rank 0, world_size={n}, {label}, first step:\n" + _timeline(case, buckets)
            lines.append(f"world_size={n}, {label}: {len(buckets)} reduce-scatters during backward, each right "
                         f"after its bucket's last gradient; full gradients alive at most {m['peak_grad_bytes']:,} B "
                         f"(DDP: 4Ψ = {4 * m['psi']:,}); optimizer state {m['state_bytes']:,} B, all tensors kept "
                         f"{m['held_bytes']:,} B per rank; sent {m['wire_bytes']:,.0f} B; params = DDP's with the "
                         f"unsharded {optimizer_class.__name__} after {steps} steps (max diff {diff:.1e})")
    return ZeroCheckResult(cls.__name__, lines, measured, timeline)
