"""The checker of lab 06 (pipeline schedules): the learner's 1F1B op order, simulated, then run.

Used by ``labs/06_pipeline_lab.ipynb``. The learner writes ``one_f_one_b(stage, stages,
microbatches) -> list of ("F", mb) / ("B", mb)``, the ops stage ``stage`` runs, in order (see
``utils.pipeline`` for the conventions; notebook 06 derives them). Same conventions as
``utils.checkers.common``: a ``CheckResult`` on success, else ``LabCheckFailed`` with ``.mistake`` and
``.hint``. The evidence, in the order it is checked:

1. **form**: a list of ("F", int) / ("B", int) tuples, F and B of every micro-batch exactly once;
2. **dependencies** on the stage itself: no backward before its own forward;
3. **not GPipe**: all forwards before the first backward holds m micro-batches (allowed only
   when m <= p - s, where 1F1B does the same);
4. **deadlock-free**: ``utils.pipeline.simulate`` runs all stages' lists together; a receive that
   waits for an op that waits, in turn, for it is a deadlock, named with the ops involved;
5. **memory**: stage s holds at most p - s micro-batches of activations (at most p in all);
6. **bubble**: with unit costs the idle share equals (p-1)/(m+p-1), no more;
7. **values**: the schedule runs on p ranks with send/recv (``utils.timeline.run_stage``) and the
   loss and every gradient equal one process's on the whole batch.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..launch import rank_device
from ..pipeline import (PipelineDeadlock, bubble_fraction, idle_fraction, microbatch_size, peak_in_flight, simulate,
                       split_layers)
from ..timeline import run_stage
from .common import GRAD_TOL, CheckResult, fail, launch_answer

CASES = [(2, 4), (3, 5), (4, 8), (4, 2), (4, 1)]  # (stages p, micro-batches m): m > p, m = p + 2, m < p, m = 1

PIPELINE_HINTS = {
    "not_ops": "return a list of tuples ('F', mb) or ('B', mb), mb an int in range(microbatches).",
    "missing_ops": "every stage runs the forward and the backward of every micro-batch exactly once.",
    "backward_before_forward": "a backward needs the activations its forward saved: on every stage, ('B', mb) must "
                               "come after ('F', mb).",
    "gpipe": "all forwards before the first backward is GPipe: stage s then holds m micro-batches of activations. "
             "1F1B warms up with p - s - 1 forwards, then alternates one forward, one backward.",
    "deadlock": "a stage waits to receive something that its neighbour will only send after it has received "
                "something from this stage. Warm-up is p - s - 1 forwards (the FIRST stage warms up the most, the "
                "last not at all), and every stage runs the micro-batches in the same order, 0, 1, 2, ...",
    "too_many_in_flight": "stage s may hold at most p - s micro-batches of activations: warm up with exactly "
                          "p - s - 1 forwards (at most m), then one forward, one backward.",
    "bubble": "the schedule is correct but idles more than 1F1B's (p-1)/(m+p-1): with too little warm-up a stage "
              "waits for its backward. Warm up with p - s - 1 forwards (at most m).",
    "wrong_values": "the loss or the gradients differ from one process's: run every micro-batch once, forward then "
                    "backward, on every stage.",
}



def _orders(fn, p, m):
    """The learner's op lists for every stage, checked for form (not_ops / missing_ops)."""
    __tracebackhide__ = True
    orders = []
    for s in range(p):
        ops = fn(s, p, m)
        label = f"p={p}, m={m}, stage {s}: your ops are {ops}"
        if not isinstance(ops, list | tuple) or not all(
                isinstance(op, tuple) and len(op) == 2 and op[0] in ("F", "B") and isinstance(op[1], int)
                and not isinstance(op[1], bool) and 0 <= op[1] < m for op in ops):
            fail(PIPELINE_HINTS, "not_ops", f"{label}; each must be ('F', mb) or ('B', mb) with 0 <= mb < {m}.")
        want = sorted([("B", k) for k in range(m)] + [("F", k) for k in range(m)])
        if sorted(ops) != want:
            missing = sorted(set(want) - set(ops))
            extra = sorted(op for op in set(ops) if list(ops).count(op) > 1)
            fail(PIPELINE_HINTS, "missing_ops", f"{label}; missing {missing}, repeated {extra}.")
        orders.append(list(ops))
    return orders


def _check_structure(orders, p, m):
    """Dependencies, GPipe, deadlock, memory and bubble of one (p, m) case; returns its summary line."""
    __tracebackhide__ = True
    for s, ops in enumerate(orders):
        label = f"p={p}, m={m}, stage {s}: your ops are {ops}"
        for i, (kind, mb) in enumerate(ops):
            if kind == "B" and ("F", mb) not in ops[:i]:
                fail(PIPELINE_HINTS, "backward_before_forward", f"{label}; ('B', {mb}) comes before ('F', {mb}).")
        first_b = next(i for i, op in enumerate(ops) if op[0] == "B")
        if first_b == m and m > p - s:
            fail(PIPELINE_HINTS, "gpipe", f"{label}; all {m} forwards run before the first backward, so stage {s} holds {m} "
                  f"micro-batches; 1F1B holds {p - s}.")
    try:
        timeline = simulate(orders)
    except PipelineDeadlock as err:
        fail(PIPELINE_HINTS, "deadlock", f"p={p}, m={m}: {err} Your lists: {orders}")
    held = [peak_in_flight(ops) for ops in orders]
    for s, h in enumerate(held):
        if h > min(p - s, m):
            fail(PIPELINE_HINTS, "too_many_in_flight", f"p={p}, m={m}: stage {s} holds up to {h} micro-batches of activations at "
                  f"once; 1F1B holds min(p - s, m) = {min(p - s, m)}. Your ops: {orders[s]}")
    idle, formula = idle_fraction(timeline), bubble_fraction(p, m)
    if idle > formula + 1e-9:
        fail(PIPELINE_HINTS, "bubble", f"p={p}, m={m}: with unit costs your schedule idles {idle:.1%} of the time, 1F1B "
              f"{formula:.1%}.")
    return f"p={p}, m={m}: deadlock-free, activations held per stage {held}, simulated bubble {idle:.1%} = " \
           f"(p-1)/(m+p-1)"


def tower(layers, width=16, seed=0):
    """The lab's model: ``layers`` x (Linear, tanh) then a 4-class head, one stage cut per layer boundary."""
    torch.manual_seed(seed)
    blocks = [nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(layers - 1)]
    return nn.Sequential(*blocks, nn.Linear(width, 4))


def _lab_data(m, width=16, rows=3):
    g = torch.Generator().manual_seed(1)
    return torch.randn(m * rows, width, generator=g), torch.randint(0, 4, (m * rows,), generator=g)


def _run_on_rank(orders, m):
    """Runs on every rank: this stage of the tower, through the learner's op list; returns loss and grads."""
    rank, p, device = dist.get_rank(), dist.get_world_size(), rank_device()
    model = tower(2 * p).to(device)
    x, y = (t.to(device) for t in _lab_data(m))
    start, stop = split_layers(len(model), p)[rank]
    stage = model[start:stop]
    rows = microbatch_size(len(x), m)
    result = run_stage(stage, orders[rank], stage=rank, stages=p, x_mbs=x.chunk(m), y_mbs=y.chunk(m),
                       recv_shape=(rows, 16), loss_fn=F.cross_entropy, track_memory=True)
    grads = {name: p_.grad for name, p_ in stage.named_parameters()}  # a slice of a Sequential keeps the names
    loss = torch.stack(result["losses"]).sum() if result["losses"] else None
    return loss, grads, result["peak_count"]


def reference_grads(p, m):
    """One process, the whole batch: the loss and the gradient of every parameter of the tower."""
    model = tower(2 * p)
    x, y = _lab_data(m)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), {name: p_.grad for name, p_ in model.named_parameters()}


def check_one_f_one_b(fn, world_sizes=(2,), timeout=60):
    """Check the learner's ``fn(stage, stages, microbatches)``: structure on ``CASES``, then a run on each of
    ``world_sizes`` ranks with m = 2p micro-batches, against one process's loss and gradients."""
    __tracebackhide__ = True
    lines = [_check_structure(_orders(fn, p, m), p, m) for p, m in CASES]
    for p in world_sizes:
        m = 2 * p
        orders = _orders(fn, p, m)
        _check_structure(orders, p, m)
        ranks = launch_answer(_run_on_rank, (orders, m), p, timeout, "one_f_one_b's schedule",
                        PIPELINE_HINTS["deadlock"])
        ref_loss, ref_grads = reference_grads(p, m)
        loss = ranks[-1][0]
        diff = 0.0
        for name, ref in ref_grads.items():
            got = next(r[1][name] for r in ranks if name in r[1])
            if got is None or not torch.allclose(got, ref, **GRAD_TOL):
                fail(PIPELINE_HINTS, "wrong_values", f"on {p} ranks, m={m}: the gradient of {name} differs from one process's "
                      f"(max diff {(ref if got is None else got - ref).abs().max():.3g}).", p)
            diff = max(diff, (got - ref).abs().max().item())
        if not torch.allclose(loss, ref_loss, **GRAD_TOL):
            fail(PIPELINE_HINTS, "wrong_values", f"on {p} ranks, m={m}: loss {loss.item():.6f}, one process {ref_loss.item():.6f}.", p)
        held = [r[2] for r in ranks]
        lines.append(f"run on {p} ranks, m={m}: loss {loss.item():.5f} = one process's, max gradient diff {diff:.1e}; "
                     f"measured activations held per stage {held} (<= p - s)")
        if any(h > p - s for s, h in enumerate(held)):
            fail(PIPELINE_HINTS, "too_many_in_flight", f"on {p} ranks, m={m}: measured activations held per stage {held}.", p)
    return CheckResult("one_f_one_b", lines)
