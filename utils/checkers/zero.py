"""The checker of lab 03 (ZeRO): a sharded optimizer step, compared with plain DDP and with its bill.

Used by ``labs/03_zero_lab.ipynb``, which derives what is checked here. The learner writes
``shard_bounds(numel, rank, world_size) -> (start, stop)`` and two steps with the signature
``step(flat_param, flat_grad, state, lr) -> None``: ``flat_param`` (Ψ,) holds every trainable
parameter (the same on all ranks, updated in place), ``flat_grad`` (Ψ,) this rank's local
gradient, ``state`` a dict that persists between steps and holds *all* the optimizer state of
this rank (filled by ``adam_update``). Same conventions as every lab (``utils.checkers.common``): a ``CheckResult`` on
success (here ``ZeroCheckResult``, with the measured numbers in ``.measured``), else
``LabCheckFailed`` with ``.mistake`` and ``.hint``. Three kinds of evidence:

- **values**: the parameters after a few Adam steps equal plain DDP's (all-reduce, divide, full
  Adam on every rank), on a small vector whose length n does not divide and on ``ToyNet``;
- **memory**: the bytes of the tensors in ``state``: Adam keeps 8 bytes per element it updates,
  so a rank that updates Ψ/n elements holds 8Ψ/n bytes, and one that updates everything 8Ψ;
- **bytes**: ``CommLedger``'s wire bytes per step: ZeRO-1 all-reduce + all-gather =
  3(n-1)/n x 4Ψ, ZeRO-2 reduce-scatter + all-gather = 2(n-1)/n x 4Ψ (plus at most n-1 padding
  elements per collective).
"""

import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..adam import LR, adam_update
from ..datasets import digits
from ..launch import rank_device
from ..ledger import CommLedger
from ..models import ToyNet
from .common import WEIGHT_TOL, CheckResult, caught, close, fail, first_error, launch_answer, raise_if_error



def padded_bounds(numel, rank, world_size):
    """The layout the lab asks for: pieces of ceil(numel / n) elements, the last ones clipped."""
    size = -(-numel // world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


ZERO_HINTS = {
    "lost_elements": "some elements belong to no rank, so nobody updates them: with pieces of numel // n the last "
                     "numel % n elements are lost. Use pieces of ceil(numel / n) = -(-numel // n), clipped to numel.",
    "duplicated_elements": "some elements belong to two ranks (the shards overlap): start rank r where rank r-1 "
                           "stops.",
    "out_of_range": "the bounds must lie in [0, numel]: clip them with min(..., numel). The padding exists only in "
                    "the communication buffers, never in the parameter vector.",
    "layout": "use the padded layout: rank r owns [r * s, (r + 1) * s) clipped to numel, with s = ceil(numel / n). "
              "Then the padded vector (s * n elements) cut into n equal pieces gives every rank its shard, which is "
              "what all_gather_single / reduce_scatter_single need.",
    "not_ints": "return two Python ints (start, stop), e.g. with int(...).",
    "unequal_pieces": "all_gather_single / reduce_scatter_single (all_gather_into_tensor / reduce_scatter_tensor "
                      "before torch 2.13) need n equal pieces: pad the flat vector with zeros to s * n elements "
                      "(s = ceil(numel / n)) and send s elements per rank, even from a rank with a short shard.",
    "deadlock": "some rank skips a collective that the others call: every rank, even one whose shard is short or "
                "empty, must take part in every all-reduce, reduce-scatter and all-gather.",
    "not_divided": "the collectives SUM the gradients: divide by dist.get_world_size() to get the mean. Adam almost "
                   "hides the mistake (it is scale-invariant, up to eps), but its state holds n times the gradient, "
                   "and with SGD, clipping or weight decay the training changes.",
    "not_gathered": "after the update each rank holds new values only in its own shard: all-gather the updated "
                    "shards (dist.all_gather_single, all_gather_into_tensor before torch 2.13) into flat_param, so "
                    "every replica is whole and the same again.",
    "state_not_sharded": "every rank updates (and keeps Adam's state for) the whole vector: call adam_update only on "
                         "this rank's slice, flat_param[start:stop], so the state is Ψ/n elements per rank.",
    "state_hidden": "keep the optimizer state in the `state` dict you are given (adam_update(..., state, ...)): it "
                    "survives between steps there, and the checker counts it there.",
    "state_reset": "pass the `state` dict you are given to adam_update, every step: a new (or emptied) dict each "
                   "step restarts Adam at step 1.",
    "zero2_all_reduce": "ZeRO-2 does not all-reduce: reduce-scatter the (padded) gradient with "
                        "dist.reduce_scatter_single (reduce_scatter_tensor before torch 2.13), so each rank receives "
                        "only the sum of its own shard, in half the bytes of an all-reduce.",
    "bytes": "send each collective once per step on the flat vector: ZeRO-1 = one all-reduce of the gradient + one "
             "all-gather of the parameters; ZeRO-2 = one reduce-scatter + one all-gather.",
    "wrong": "after the step, flat_param must equal DDP's: mean gradient (sum / n), Adam on your shard, then every "
             "rank's shard gathered everywhere.",
}
ERROR_PHRASES = [(phrase, "unequal_pieces") for phrase in (  # gloo's and NCCL's words for pieces that do not fit
    "invalid tensor size", "same size", "must be divisible", "output tensor size", "* worldSize", "times world")]


@dataclasses.dataclass
class ZeroCheckResult(CheckResult):
    """A passed check, with ``measured[n]`` = dict(psi, state_bytes (per rank), wire_bytes (per rank, one step),
    ops, max_diff)."""

    measured: dict = dataclasses.field(default_factory=dict)



def check_shard_bounds(fn, world_sizes=range(1, 9)):
    """Check ``fn(numel, rank, world_size) -> (start, stop)`` against the padded layout, on sizes
    with and without remainder (1 element, fewer than n, 4n + 1, ToyNet's 9,034)."""
    __tracebackhide__ = True
    for n in world_sizes:
        for numel in sorted({1, max(1, n - 1), 4 * n, 4 * n + 1, 9_034}):
            got = [fn(numel, r, n) for r in range(n)]
            label = f"numel={numel:,}, world_size={n}: your bounds are {got if n <= 4 else got[:4] + ['...']}"
            if not all(isinstance(b, tuple | list) and len(b) == 2 and all(isinstance(v, int) for v in b)
                       for b in got):
                fail(ZERO_HINTS, "not_ints", f"{label}; each must be a (start, stop) tuple of ints.", n)
            if any(a < 0 or b > numel or a > b for a, b in got):
                fail(ZERO_HINTS, "out_of_range", f"{label}: a bound lies outside [0, {numel}] or start > stop.", n)
            owners = torch.zeros(numel, dtype=torch.int64)
            for a, b in got:
                owners[a:b] += 1
            if (owners == 0).any():
                lost = (owners == 0).nonzero().flatten()
                fail(ZERO_HINTS, "lost_elements", f"{label}: {lost.numel()} element(s) belong to no rank, e.g. index "
                      f"{lost[0].item()}.", n)
            if (owners > 1).any():
                fail(ZERO_HINTS, "duplicated_elements", f"{label}: {(owners > 1).sum().item()} element(s) belong to two ranks.",
                      n)
            expected = [padded_bounds(numel, r, n) for r in range(n)]
            if [tuple(b) for b in got] != expected:
                fail(ZERO_HINTS, "layout", f"{label}; the padded layout is {expected if n <= 4 else expected[:4] + ['...']}.", n)
    size = -(-9_034 // 4)
    line = (f"world sizes {list(world_sizes)}: every element in exactly one shard, padded layout; e.g. Ψ=9,034 on 4 "
            f"ranks: shards of {size:,}, the last {9_034 - 3 * size:,}, {4 * size - 9_034} padding elements")
    return CheckResult("shard_bounds", [line])


def _unit_grad(numel, rank, step):
    """Small integers in [-3, 3], different per rank and step: their sum over ranks is exact in float32."""
    return ((torch.arange(numel) * (step + 1) + 3 * rank) % 7 - 3).float()


def _state_bytes(state):
    """Bytes of the tensors in ``state`` (each storage once): the optimizer memory of this rank."""
    storages = {v.untyped_storage().data_ptr(): v.untyped_storage() for v in state.values() if torch.is_tensor(v)}
    return sum(storage.nbytes() for storage in storages.values())


@torch.no_grad()
def _load_flat(model, flat):
    params = [p for p in model.parameters() if p.requires_grad]  # each tensor once: the tied weight too
    for p, piece in zip(params, flat.split([p.numel() for p in params])):
        p.copy_(piece.view_as(p))


def _run_case(step_fn, flat, local_grad, steps):
    """``steps`` learner steps on ``flat`` beside plain DDP on a copy; returns what the checker compares.

    ``local_grad(step, params)`` is this rank's gradient at ``params``. DDP all-reduces it, divides
    by n and runs Adam on the whole vector, on every rank.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    initial, ref, ref_state, state, records = flat.clone(), flat.clone(), {}, {}, []
    for step in range(steps):
        local = local_grad(step, flat)
        with CommLedger() as ledger:
            step_fn(flat, local.clone(), state, LR)
        records.append([(r.op, r.payload_bytes, r.wire_bytes) for r in ledger.records])
        mean = local_grad(step, ref)
        dist.all_reduce(mean)  # plain DDP, outside the ledger
        adam_update(ref, mean / n, ref_state, LR)
    start, stop = padded_bounds(flat.numel(), rank, n)
    exp_avg = state.get("exp_avg")
    return {"initial": initial, "final": flat.clone(), "ref": ref, "records": records,
            "state_bytes": _state_bytes(state), "state_step": state.get("step"),
            "exp_avg": exp_avg.clone() if isinstance(exp_avg, torch.Tensor) else None,
            "ref_exp_avg": ref_state["exp_avg"][start:stop].clone()}


def _zero_on_rank(step_fn, x, y, batches, seed):
    """Runs on every rank: a unit case (4n + 1 elements, integer gradients), then ToyNet on digits."""
    rank, n, device = dist.get_rank(), dist.get_world_size(), rank_device()
    out, x, y = {"error": None}, x.to(device), y.to(device)
    try:
        numel = 4 * n + 1  # n never divides it: padding needed
        flat = ((torch.arange(numel) % 5 + 1) * 0.1).to(device)  # (numel,), the same on every rank
        out["unit"] = _run_case(step_fn, flat, lambda step, _: _unit_grad(numel, rank, step).to(device), 2)

        torch.manual_seed(seed)  # the same model on every rank: the broadcast is lab 02's business
        model = ToyNet().to(device)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters() if p.requires_grad])  # (Ψ,)

        def local_grad(step, params):
            _load_flat(model, params)
            mine = batches[step].view(n, -1)[rank]  # this rank's shard of the global batch
            model.zero_grad()
            F.cross_entropy(model(x[mine]), y[mine]).backward()
            return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.requires_grad])  # (Ψ,)

        out["model"] = _run_case(step_fn, flat, local_grad, len(batches))
    except Exception as exc:  # noqa: BLE001 - reported to the learner in the kernel
        out["error"] = caught(exc, getattr(step_fn, "__name__", "your step"))
    return out


def _judge_values(case, ranks, n, label):
    """Raises the mistake the final parameters (and Adam's state) show; returns the max diff to DDP."""
    __tracebackhide__ = True
    rs = [r[case] for r in ranks]
    for rank, r in enumerate(rs):
        if r["state_step"] == 1 and len(r["records"]) > 1:
            fail(ZERO_HINTS, "state_reset", f"{label}: after {len(r['records'])} steps rank {rank}'s state says step 1.", n)
        mine, ref_m = r["exp_avg"], r["ref_exp_avg"]  # Adam's m: linear in the gradients it was given
        if n > 1 and mine is not None and mine.numel() >= ref_m.numel() > 0 and ref_m.abs().max() > 0 \
                and close(mine[: ref_m.numel()], n * ref_m, WEIGHT_TOL):
            fail(ZERO_HINTS, "not_divided", f"{label}: rank {rank}'s Adam exp_avg is {n} x DDP's (the summed gradient).", n)
    ref = rs[0]["ref"]
    diff = max((r["final"].double() - ref.double()).abs().max().item() for r in rs)
    if all(close(r["final"], ref, WEIGHT_TOL) for r in rs):
        return diff
    if all(r["state_bytes"] == 0 for r in rs):
        fail(ZERO_HINTS, "state_reset", f"{label}: the parameters differ from DDP's by up to {diff:.3g}, and the `state` dict "
              "you were given is still empty after the steps.", n)
    if any(not torch.equal(r["final"], rs[0]["final"]) for r in rs):
        ops = {op for r in rs for op, _, _ in r["records"][0]}
        gathered = "you call " + ", ".join(sorted(ops)) if ops else "you call no collective"
        fail(ZERO_HINTS, "not_gathered", f"{label}: the replicas differ after the step ({gathered}); rank 1 differs from rank 0 "
              f"at {(rs[1]['final'] != rs[0]['final']).sum().item()} elements.", n)
    final, initial = rs[0]["final"], rs[0]["initial"]
    bad = (~torch.isclose(final, ref, **WEIGHT_TOL)).nonzero().flatten()
    if torch.equal(final[bad], initial[bad]):
        fail(ZERO_HINTS, "lost_elements", f"{label}: {bad.numel()} element(s) were never updated, first at index "
              f"{bad[0].item()} of {final.numel()}.", n)
    fail(ZERO_HINTS, "wrong", f"{label}: flat_param differs from DDP's at {bad.numel()} of {final.numel()} elements, first at "
          f"index {bad[0].item()}: got {final[bad[0]].item():.6g}, DDP {ref[bad[0]].item():.6g}.", n)


def _judge_memory(state, psi, n):
    """Adam keeps 8 bytes per element it updates: 8 x ceil(Ψ/n) at most on a rank that updates its shard."""
    __tracebackhide__ = True
    if n > 1 and state >= 8 * psi:
        fail(ZERO_HINTS, "state_not_sharded", f"a rank holds {state:,} bytes of optimizer state, DDP's 8 x Ψ = {8 * psi:,}, "
              f"not about 1/{n} of it ({8 * psi / n:,.0f}).", n)
    if state == 0:
        fail(ZERO_HINTS, "state_hidden", "the `state` dict holds no tensor after the steps.", n)
    if state > 8 * -(-psi // n):
        fail(ZERO_HINTS, "state_not_sharded", f"a rank holds {state:,} bytes of optimizer state, more than 8 bytes x its shard "
              f"of ceil(Ψ/n) = {-(-psi // n):,} elements.", n)


def _judge_bytes(stage, records, ranks, psi, n):
    """Wire bytes of one step against 3(n-1)/n x 4Ψ (ZeRO-1) or 2(n-1)/n x 4Ψ (ZeRO-2), + padding."""
    __tracebackhide__ = True
    ops = sorted({op for op, _, _ in records})
    if stage == 2 and "all_reduce" in ops:
        fail(ZERO_HINTS, "zero2_all_reduce", f"zero2_step calls {ops}.", n)
    wire = max(sum(w for _, _, w in r["model"]["records"][0]) for r in ranks)
    factor = 3 if stage == 1 else 2
    low = factor * (n - 1) / n * 4 * psi
    high = low + stage * (n - 1) / n * 4 * (n - 1)  # ZeRO-1 pads 1 collective, ZeRO-2 2, by n-1 elements at most
    formula = f"{factor}(n-1)/n x 4Ψ = {low:,.0f}"
    if not low - 1e-6 <= wire <= high + 1e-6:
        breakdown = ", ".join(f"{op} {payload:,} B" for op, payload, _ in records)
        fail(ZERO_HINTS, "bytes", f"a rank sent {wire:,.0f} bytes in one step ({breakdown or 'no collective'}); the formula is "
              f"{formula} bytes (+ padding, up to {high:,.0f}).", n)
    return ops, wire, formula


def _check_zero(stage, step_fn, shard_bounds, world_sizes, steps, timeout):
    __tracebackhide__ = True
    check_shard_bounds(shard_bounds, world_sizes=sorted(set(world_sizes) | {1, 2, 3, 4}))
    x, y = digits()
    lines, measured = [], {}
    for n in world_sizes:
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(n))
        batches = order[: steps * 16 * n].view(steps, 16 * n)  # (steps, 16n): 16 samples per rank per step
        ranks = launch_answer(_zero_on_rank, (step_fn, x, y, batches, 0), n, timeout, f"zero{stage}_step",
                        ZERO_HINTS["deadlock"])
        raise_if_error(first_error(ranks), n, ZERO_HINTS, ERROR_PHRASES)
        unit_diff = _judge_values("unit", ranks, n, f"one step on {4 * n + 1} elements")
        diff = _judge_values("model", ranks, n, f"{steps} Adam steps of ToyNet on digits")
        psi = ranks[0]["model"]["final"].numel()
        state = max(r["model"]["state_bytes"] for r in ranks)
        _judge_memory(state, psi, n)
        records = ranks[0]["model"]["records"][0]
        ops, wire, formula = _judge_bytes(stage, records, ranks, psi, n)
        measured[n] = {"psi": psi, "state_bytes": state, "wire_bytes": wire, "ops": ops, "max_diff": diff}
        lines.append(f"world_size={n}: params = DDP after 2 steps on {4 * n + 1} elements (max diff {unit_diff:.1e}) "
                     f"and {steps} Adam steps of ToyNet (max diff {diff:.1e}); optimizer state {state:,} B per rank "
                     f"(max) = 1/{n} of DDP's {8 * psi:,} + padding; sent {wire:,.0f} B per step "
                     f"({' + '.join(ops)}), formula {formula}")
    return ZeroCheckResult(f"zero{stage}_step", lines, measured)


def check_zero1(zero1_step, shard_bounds, world_sizes=(2, 4), steps=3, timeout=60.0):
    """Check ``zero1_step(flat_param, flat_grad, state, lr)``: all-reduce, Adam on this rank's shard, all-gather.

    First ``check_shard_bounds(shard_bounds)``. Then on each world size n: two steps on a vector of
    4n + 1 elements with integer gradients, and ``steps`` Adam steps of ``ToyNet`` (16 samples per
    rank per step of ``digits``). Demands: parameters equal DDP's on every rank (``WEIGHT_TOL``),
    Adam's state not n x DDP's (not divided), no more than 8 x ceil(Ψ/n) bytes of state per rank,
    and 3(n-1)/n x 4Ψ wire bytes per step (+ padding).
    """
    __tracebackhide__ = True
    return _check_zero(1, zero1_step, shard_bounds, world_sizes, steps, timeout)


def check_zero2(zero2_step, shard_bounds, world_sizes=(2, 4), steps=3, timeout=60.0):
    """Check ``zero2_step(flat_param, flat_grad, state, lr)``: reduce-scatter, Adam on the shard, all-gather.

    As ``check_zero1``, but no all-reduce is allowed, and the bill is 2(n-1)/n x 4Ψ: DDP's.
    """
    __tracebackhide__ = True
    return _check_zero(2, zero2_step, shard_bounds, world_sizes, steps, timeout)
