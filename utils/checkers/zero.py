"""The checker of lab 03 (ZeRO): ZeRO-2 with gradient buckets reduce-scattered during backward.

Used by ``labs/03_zero_lab.ipynb``, which derives what is checked here. The learner writes
``make_buckets(params, bucket_numel) -> [[param, ...], ...]`` (DeepSpeed's rule, in the order
backward produces the gradients) and a class ``cls(params, bucket_numel, lr)`` that registers
gradient hooks, and whose ``step()`` runs after backward. Its attributes ``states`` (one Adam state
dict per bucket) and ``grad_shards`` (after backward: this rank's mean-gradient chunk of each
bucket) are where the checker counts. Same conventions as every lab (``utils.checkers.common``).

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
  step is +-lr: an ignored ``lr`` shows), and after a few steps the parameters equal plain DDP's;
- **arguments**: two bucket sizes and an ``lr`` that is not the default, so a hard-coded one fails.
"""

import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..sharding.adam import adam_update
from ..datasets import digits
from ..launch import rank_device
from ..comm.ledger import CommLedger
from ..models import ToyNet
from .common import GRAD_TOL, WEIGHT_TOL, CheckResult, caught, close, fail, first_error, launch_answer, raise_if_error
from .zero_buckets import BUCKET_HINTS, bucket_indices, check_make_buckets, judge_buckets  # lab 03: check_make_buckets
from .zero_memory import HELD_HINT, added_bytes, held_tensors, judge_memory

CHECK_LR = 3e-3  # not utils.sharding.adam.LR nor adam_update's default: an lr that is ignored shows
REDUCE_SCATTER = ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter")  # one collective, 3 names
ALL_GATHER = ("all_gather_single", "all_gather_into_tensor", "all_gather")
PARAM_NAMES = ("embed.weight", "embed.bias", "mix1.weight", "mix1.bias", "mix2.bias", "head.weight", "head.bias")

ZERO_HINTS = {**BUCKET_HINTS,  # make_buckets's four, then the ZeRO-2 class's
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
    "state_not_sharded": "call adam_update on this rank's chunk of each bucket only (its slice of the flat "
                         "parameters), so the state is 8 bytes x about Ψ/n numbers per rank, not DDP's 8Ψ.",
    "state_hidden": "keep Adam's state in self.states[i] (adam_update(..., self.states[i], ...)): it survives between "
                    "steps there, and the checker counts it there.",
    "state_reset": "pass the same self.states[i] to adam_update every step: a new (or emptied) dict each step "
                   "restarts Adam at step 1.",
    "lr_ignored": "use the lr given to the constructor (adam_update(..., lr=self.lr)), not a constant.",
    "wrong": "after each step the parameters must equal DDP's: mean gradient chunk, Adam on your chunk, all-gather.",
}
ERROR_PHRASES = [(phrase, "unequal_pieces") for phrase in (  # gloo's and NCCL's words for pieces that do not fit
    "invalid tensor size", "same size", "must be divisible", "output tensor size", "* worldSize", "times world")]


@dataclasses.dataclass
class ZeroCheckResult(CheckResult):
    """A passed check, with ``measured[(n, bucket_numel)]`` = dict(psi, buckets (numbers per bucket),
    reduce_scatters, peak_grad_bytes, grad_shard_bytes, state_bytes, wire_bytes, max_diff) and
    ``timeline``: rank 0's first step at the first world size, one line per event."""

    measured: dict = dataclasses.field(default_factory=dict)
    timeline: str = ""


def _flat(params):
    return torch.cat([p.detach().reshape(-1) for p in params])


def _one_case(cls, model, ref, x, y, batches, bucket_numel, lr, steps):
    """``steps`` steps of the learner's class on ``model`` beside plain DDP on ``ref``; what the judge needs."""
    rank, n = dist.get_rank(), dist.get_world_size()
    params = [p for p in model.parameters() if p.requires_grad]  # each tensor once: the tied weight too
    ref_params = [p for p in ref.parameters() if p.requires_grad]
    probe = {"ledger": None, "events": []}

    def seen(i):  # runs before the learner's hook of the same parameter: registered first
        ledger = probe["ledger"]
        live = sum(q.grad.nbytes for q in params if q.grad is not None)
        probe["events"].append((i, len(ledger.records) if ledger else 0, live))

    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda p, i=i: seen(i))
    ref_flat, ref_state, steps_out = _flat(ref_params), {}, []
    baseline = held_tensors(params[0].device)  # every tensor held before the answer exists
    answer = cls(params, bucket_numel, lr)
    held = None
    for step in range(steps):
        mine = batches[step].view(n, -1)[rank]  # this rank's shard of the global batch
        probe["events"] = []
        before = _flat(params)
        with CommLedger() as ledger:
            probe["ledger"] = ledger
            F.cross_entropy(model(x[mine]), y[mine]).backward()
            after_backward = len(ledger.records)
            live_after = sum(q.grad.nbytes for q in params if q.grad is not None)
            shards = [g.detach().clone() if torch.is_tensor(g) else None for g in answer.grad_shards]
            answer.step()
        probe["ledger"] = None
        if held is None:  # what the answer holds after its first step: the checker's own copies left out
            held, baseline = added_bytes(baseline, params[0].device, [before, *shards]), None
        ref.zero_grad()  # plain DDP, outside the ledger: all-reduce, divide, Adam on everything
        F.cross_entropy(ref(x[mine]), y[mine]).backward()
        mean = torch.cat([p.grad.reshape(-1) for p in ref_params])
        dist.all_reduce(mean)
        mean /= n
        adam_update(ref_flat, mean, ref_state, lr=lr)
        with torch.no_grad():
            for p, piece in zip(ref_params, ref_flat.split([p.numel() for p in ref_params])):
                p.copy_(piece.view_as(p))
        steps_out.append({"events": probe["events"], "after_backward": after_backward, "live_after": live_after,
                          "records": [(r.op, r.payload_bytes, r.wire_bytes) for r in ledger.records],
                          "shards": shards, "mean": mean.clone(), "before": before, "after": _flat(params)})
    tensors = {id(t): t for s in answer.states for t in s.values() if torch.is_tensor(t)} if isinstance(
        answer.states, list) else {}
    return {"steps": steps_out, "final": _flat(params), "ref": ref_flat.clone(), "sizes": [p.numel() for p in params],
            "state_bytes": sum(t.nbytes for t in tensors.values()), "held_bytes": held,
            "state_steps": [s.get("step") for s in answer.states] if isinstance(answer.states, list) else []}


def _zero2_on_rank(cls, x, y, batches, bucket_numels, lr, steps):
    device = rank_device()
    out, x, y = {"error": None}, x.to(device), y.to(device)
    try:
        for bucket_numel in bucket_numels:
            torch.manual_seed(0)  # the same model on every rank and for DDP: the broadcast is lab 02's business
            model = ToyNet().to(device)
            torch.manual_seed(0)
            ref = ToyNet().to(device)
            out[bucket_numel] = _one_case(cls, model, ref, x, y, batches, bucket_numel, lr, steps)
    except Exception as exc:  # noqa: BLE001 - reported in the notebook, with every rank's view
        out["error"] = caught(exc, cls.__name__)
    return out


def _judge_comm(case, buckets, chunks, n, label):
    """One reduce-scatter per bucket, right after its last gradient; then all-gathers only."""
    __tracebackhide__ = True
    step = case["steps"][0]
    records, cut = step["records"], step["after_backward"]
    ops = [op for op, _, _ in records]
    if "all_reduce" in ops:
        fail(ZERO_HINTS, "all_reduce", f"{label}: your step calls {sorted(set(ops))}.", n)
    during = [(j, payload) for j, (op, payload, _) in enumerate(records[:cut]) if op in REDUCE_SCATTER]
    after = [op for op in ops[cut:] if op in REDUCE_SCATTER]
    if after:
        fail(ZERO_HINTS, "after_backward", f"{label}: {len(after)} reduce-scatter(s) issued after backward had "
             f"finished, {len(during)} during it.", n)
    want = [4 * c * n for c in chunks]
    if [p for _, p in during] != want:
        fail(ZERO_HINTS, "bucket_size", f"{label}: during backward you reduce-scattered {[p for _, p in during]} "
             f"bytes; the {len(buckets)} buckets of make_buckets are {want} bytes, padded to chunk * n numbers.", n)
    if len(during) != cut:
        others = [op for op in ops[:cut] if op not in REDUCE_SCATTER]
        fail(ZERO_HINTS, "bytes", f"{label}: during backward you also called {others}.", n)
    arrival = {i: k for k, (i, _, _) in enumerate(step["events"])}  # parameter index -> its place in backward
    counts = [c for _, c, _ in step["events"]]
    for b, ((j, _), bucket) in enumerate(zip(during, buckets)):
        issued_after = max((k for k, c in enumerate(counts) if c <= j), default=-1)  # last gradient before it
        due = max(arrival[i] for i in bucket)  # the bucket's last gradient
        if issued_after != due:
            fail(ZERO_HINTS, "late", f"{label}: bucket {b} ({[PARAM_NAMES[i] for i in bucket]}) was complete after "
                 f"gradient {due + 1} of {len(counts)}, but its reduce-scatter came after gradient "
                 f"{issued_after + 1}.", n)
    gathered = sum(p for op, p, _ in records[cut:] if op in ALL_GATHER)
    if not gathered:
        fail(ZERO_HINTS, "not_gathered", f"{label}: after backward you called {ops[cut:] or 'no collective'}: the "
             "updated chunks never reach the other ranks.", n)
    if any(op not in ALL_GATHER for op in ops[cut:]) or gathered != sum(want):
        fail(ZERO_HINTS, "bytes", f"{label}: after backward you called {ops[cut:] or 'nothing'} with "
             f"{gathered:,} bytes of all-gather; the padded buckets are {sum(want):,} bytes.", n)


def _judge_values(ranks, bucket_numel, buckets, chunks, n, lr, label):
    __tracebackhide__ = True
    cases = [r[bucket_numel] for r in ranks]
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
    if case["state_bytes"] == 0 and close(case["final"], case["ref"], WEIGHT_TOL):
        fail(ZERO_HINTS, "state_hidden", f"{label}: the parameters are right, but self.states holds no tensor.", n)
    if any(s != len(case["steps"]) for s in case["state_steps"]):
        fail(ZERO_HINTS, "state_reset", f"{label}: after {len(case['steps'])} steps Adam's step counters are "
             f"{case['state_steps']}.", n)
    step = case["steps"][0]
    moved = (step["after"] - step["before"]).abs()[step["mean"].abs() > 1e-6]
    if moved.numel() and not 0.9 * lr <= moved.median().item() <= 1.1 * lr:
        fail(ZERO_HINTS, "lr_ignored", f"{label}: Adam's first step moves each parameter by lr = {lr:g}; yours moved "
             f"them by {moved.median().item():.3g} (median).", n)
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
    """Check ``cls(params, bucket_numel, lr)`` (gradient hooks, then ``.step()``) on ToyNet beside plain DDP.

    First ``check_make_buckets(make_buckets)``. Then on each world size n, for each bucket size:
    ``steps`` steps of 16 samples per rank of ``digits``. Demands: one reduce-scatter per bucket,
    right after its last gradient; only all-gathers after backward; no full gradient outliving its
    bucket; gradient chunks = DDP's mean; 8 bytes of Adam state per number of the rank's chunks; the
    first step of size ``lr``; parameters equal to DDP's (``WEIGHT_TOL``).
    """
    __tracebackhide__ = True
    if steps < 1 or not bucket_numels or min(bucket_numels) < 1:
        raise ValueError(f"steps={steps}, bucket_numels={bucket_numels}: need at least one step and bucket sizes >= 1.")
    check_make_buckets(make_buckets)
    x, y = digits()
    lines, measured, timeline = [], {}, ""
    for n in world_sizes:
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(n))
        batches = order[: steps * 16 * n].view(steps, 16 * n)  # (steps, 16n): 16 samples per rank per step
        ranks = launch_answer(_zero2_on_rank, (cls, x, y, batches, tuple(bucket_numels), lr, steps), n, timeout,
                              cls.__name__, ZERO_HINTS["deadlock"])
        raise_if_error(first_error(ranks), n, ZERO_HINTS, ERROR_PHRASES)
        for bucket_numel in bucket_numels:
            case = ranks[0][bucket_numel]
            sizes = case["sizes"]
            buckets = bucket_indices(make_buckets, [torch.zeros(k) for k in sizes], bucket_numel)  # yours, judged:
            judge_buckets(sizes, buckets, bucket_numel, f"ToyNet, bucket_numel={bucket_numel:,}")  # never recomputed
            chunks = [-(-sum(sizes[i] for i in b) // n) for b in buckets]
            label = f"bucket_numel={bucket_numel:,}"
            for r in ranks:
                _judge_comm(r[bucket_numel], buckets, chunks, n, label)
                judge_memory(ZERO_HINTS, r[bucket_numel], buckets, chunks, n, label, PARAM_NAMES)
            diff = _judge_values(ranks, bucket_numel, buckets, chunks, n, lr, label)
            m = {"psi": sum(sizes), "buckets": [sum(sizes[i] for i in b) for b in buckets],
                 "reduce_scatters": len(buckets),
                 "peak_grad_bytes": max(e[2] for r in ranks for e in r[bucket_numel]["steps"][0]["events"]),
                 "grad_shard_bytes": sum(g.nbytes for g in case["steps"][0]["shards"]),
                 "state_bytes": max(r[bucket_numel]["state_bytes"] for r in ranks),
                 "held_bytes": max(r[bucket_numel]["held_bytes"] for r in ranks),
                 "wire_bytes": max(sum(w for _, _, w in r[bucket_numel]["steps"][0]["records"]) for r in ranks),
                 "max_diff": diff}
            measured[n, bucket_numel] = m
            timeline = timeline or f"rank 0, world_size={n}, {label}, first step:\n" + _timeline(case, buckets)
            lines.append(f"world_size={n}, {label}: {len(buckets)} reduce-scatters during backward, each right "
                         f"after its bucket's last gradient; full gradients alive at most {m['peak_grad_bytes']:,} B "
                         f"(DDP: 4Ψ = {4 * m['psi']:,}); Adam state {m['state_bytes']:,} B, all tensors kept "
                         f"{m['held_bytes']:,} B per rank; sent "
                         f"{m['wire_bytes']:,.0f} B; params = DDP's after {steps} steps (max diff {diff:.1e})")
    return ZeroCheckResult(cls.__name__, lines, measured, timeline)
