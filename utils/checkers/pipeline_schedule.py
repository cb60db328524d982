"""The checker of lab 06 (pipeline schedules): the learner's interleaved 1F1B order, simulated, then set beside torch's.

Used by ``labs/06_pipeline_lab.ipynb``. Lesson 06 runs GPipe and 1F1B from ``utils.pipeline`` and
takes the interleaved order from torch; the lab has the learner write it:
``interleaved_one_f_one_b(rank, ranks, microbatches, chunks) -> list of ("F" | "B", mb, chunk)``,
the ops rank ``rank`` runs, in order, rank r holding the virtual stages r, r + p, ..., r + (v-1)p
(the conventions of ``utils.pipeline``). Same conventions as ``utils.checkers.common``: a
``CheckResult`` on success, else ``LabCheckFailed`` with ``.mistake`` and ``.hint``.

It checks the *schedule*, not only that it computes (and refuses an order that torch's schedules or this
checker computed for the learner's function, ``used_torch``): a correct but wrong schedule (interleaved
GPipe, too little warm-up) gives the right gradients and is rejected by what it costs. In order:

1. **arguments**: m not a multiple of p raises ``ValueError`` naming the numbers, at once;
2. **form**: ("F" | "B", int, int) tuples; F and B of every (micro-batch, chunk) exactly once;
3. **dependencies** on the rank itself: no backward before its own forward;
4. **deadlock-free**: ``utils.pipeline.simulate`` runs all ranks' lists together, any receive that
   waits for an op that waits, in turn, for it is named;
5. **memory**: rank r holds at once no more micro-batch chunks of activations (``peak_in_flight``) than torch's
   own interleaved order (Megatron's) holds on that rank;
6. **bubble**: simulated with a backward costing 1 and 2 forwards, the idle share is
   (p - 1) / (v m + p - 1), no more;
7. **torch**: at every case of ``CASES`` (m = p included), the order equals the one torch's own
   ``ScheduleInterleaved1F1B._calculate_single_rank_operations`` computes, op for op (called in this
   process); on p launched ranks, the one a real ``ScheduleInterleaved1F1B`` builds.
"""

import sys

import torch.distributed as dist
from torch import nn

from ..launch import rank_device
from ..pipeline import PipelineDeadlock, bubble_fraction, idle_fraction, peak_in_flight, simulate
from .answer_side import answer_side
from .common import CheckResult, caught, fail, first_error, launch_answer, learner_call, raise_if_error, watched_call
from .guard import Guard, module_functions

# (p, m, v); m = p last: there a warm-up one forward too long is every forward first on some ranks, so the cases
# with m > p come first and name that mistake as what it is
CASES = [(2, 4, 2), (2, 8, 3), (3, 6, 2), (3, 9, 2), (4, 8, 2), (4, 8, 3), (2, 2, 2), (4, 4, 2)]

PIPELINE_HINTS = {
    "no_divisibility_check": "micro-batches go through in groups of p: when m is not a multiple of p, raise "
                             "ValueError at once, naming m and p (and the nearest multiples of p that would do).",
    "not_ops": "return a list of tuples (kind, mb, chunk): kind 'F' or 'B', 0 <= mb < microbatches, "
               "0 <= chunk < chunks.",
    "missing_ops": "every rank runs the forward and the backward of every (micro-batch, chunk) exactly once: "
                   "2 v m ops.",
    "backward_before_forward": "a backward needs the activations its forward saved: on every rank, ('B', mb, c) must "
                               "come after ('F', mb, c).",
    "deadlock": "a rank waits for something its neighbour will only send after it has received something from this "
                "rank. The forward of chunk c on rank r needs the same chunk's forward on rank r - 1 (on rank 0: "
                "chunk c - 1 on the last rank); backwards go the other way. Send micro-batches in groups of p: "
                "the p of a group through chunk 0, the same p through chunk 1, ...; backwards with the chunks "
                "reversed; count the warm-up from the right end (the last rank warms up least).",
    "all_forwards_first": "every forward before the first backward is interleaved GPipe: rank r then holds all v m "
                          "micro-batch chunks. Warm up only until the rank can start backwards, then alternate one "
                          "forward and one backward (simulate your order to find when).",
    "too_many_in_flight": "your warm-up is longer than Megatron's on this rank: every extra warm-up forward holds "
                          "one more micro-batch chunk of activations and buys no bubble. Find the fewest warm-up "
                          "forwards that keep the bubble at (p-1)/(vm+p-1) (and mind m = p: the same rule holds there).",
    "bubble": "the order is correct but idles more than (p-1)/(vm+p-1): with too little warm-up a rank waits for its "
              "backward, and with micro-batches in groups other than p a virtual stage waits for the one before it.",
    "not_megatron": "your order passes every check above but is not Megatron's (torch's ScheduleInterleaved1F1B "
                    "computes it): either the warm-up count differs (a shorter one is valid and keeps the bubble; "
                    "Megatron warms up longer, to hide messages; the same rule at m = p as at m > p), or the "
                    "micro-batches and chunks are visited in another order; the op named below is the first "
                    "that differs.",
    "deadlock_torch": "the ranks never finished building torch's schedule: a crash or hang outside your function.",
    "used_torch": "write the order yourself: the lab is the order. torch's ScheduleInterleaved1F1B (and this checker, "
                  "which asks it) computes it for you; utils.pipeline's simulate and peak_in_flight may help you check.",
}
TORCH_SCHEDULES = "torch/distributed/pipelining/schedules.py"  # where torch computes the order the lab asks for


def _guard():
    """Every function of torch's schedules module and of this checker, tripped while the learner's function runs."""
    from torch.distributed.pipelining import schedules

    return Guard([(f, f"{f.__qualname__} ({m.__name__.rsplit('.', 1)[-1]}.py)")
                  for m in (schedules, sys.modules[__name__]) for f in module_functions(m)])


@answer_side
def _own(fn, *args):
    """``fn(*args)``, refused when it let torch's schedules, or this checker, compute the order: a profile hook sees
    a call into either module, and the guard trips each of their functions (an alias, a thread, the hook off)."""
    __tracebackhide__ = True

    def forbidden(frame, event, arg):
        where = frame.f_code.co_filename.replace("\\", "/")
        if event == "call" and (where == __file__ or where.endswith(TORCH_SCHEDULES)):
            return f"{frame.f_code.co_name} ({where.rsplit('/', 1)[-1]})"

    ops, seen = watched_call(fn, args, forbidden, where=f"fn{args}", hints=PIPELINE_HINTS, guard=_guard())
    if seen:
        fail(PIPELINE_HINTS, "used_torch", f"fn{args} called {seen}: the order came from torch, not from you.")
    return ops


@answer_side
def _refusal(fn):
    """What ``fn(0, 3, 4, 2)`` (4 micro-batches on 3 ranks) raised as ValueError, or None."""
    __tracebackhide__ = True
    try:
        learner_call(fn, 0, 3, 4, 2, where="fn(0, 3, 4, 2)", hints=PIPELINE_HINTS, let_through=ValueError)
    except ValueError as err:
        return str(err)
    return None


def _orders(fn, p, m, v):
    """The learner's op lists for every rank, checked for form (not_ops / missing_ops)."""
    __tracebackhide__ = True
    orders = []
    want = sorted((kind, mb, c) for kind in "FB" for mb in range(m) for c in range(v))
    for r in range(p):
        ops = _own(fn, r, p, m, v)
        label = f"p={p}, m={m}, v={v}, rank {r}: your ops are {ops}"
        if not isinstance(ops, list | tuple) or not all(
                isinstance(op, tuple) and len(op) == 3 and op[0] in ("F", "B")
                and all(isinstance(k, int) and not isinstance(k, bool) for k in op[1:])
                and 0 <= op[1] < m and 0 <= op[2] < v for op in ops):
            fail(PIPELINE_HINTS, "not_ops", f"{label}; each must be ('F' or 'B', mb, chunk) with 0 <= mb < {m}, "
                                            f"0 <= chunk < {v}.")
        if sorted(ops) != want:
            missing = sorted(set(want) - set(ops))
            extra = sorted(op for op in set(ops) if list(ops).count(op) > 1)
            fail(PIPELINE_HINTS, "missing_ops", f"{label}; missing {missing}, repeated {extra}.")
        orders.append(list(ops))
    return orders


def _check_structure(orders, p, m, v):
    """Dependencies, deadlock, memory and bubble of one (p, m, v) case; returns its summary line."""
    __tracebackhide__ = True
    case = f"p={p}, m={m}, v={v}"
    for r, ops in enumerate(orders):
        for i, (kind, mb, c) in enumerate(ops):
            if kind == "B" and ("F", mb, c) not in ops[:i]:
                fail(PIPELINE_HINTS, "backward_before_forward", f"{case}, rank {r}: ('B', {mb}, {c}) comes before "
                                                                f"('F', {mb}, {c}). Your ops: {ops}")
    try:
        timelines = [simulate(orders, forward, backward, chunks=v) for forward, backward in ((1.0, 1.0), (1.0, 2.0))]
    except PipelineDeadlock as err:
        fail(PIPELINE_HINTS, "deadlock", f"{case}: {err} Your lists: {orders}")
    held = [peak_in_flight(ops) for ops in orders]
    # what torch's own interleaved order (Megatron's) holds on each rank: the checker carries no formula of it
    bound = [peak_in_flight(ops) for ops in _torch_rank_orders(p, m, v)]
    for r, (h, ops) in enumerate(zip(held, orders)):
        if h > bound[r]:
            first_b = next(i for i, op in enumerate(ops) if op[0] == "B")
            mistake = "all_forwards_first" if first_b == v * m else "too_many_in_flight"
            shared = (" At this size a warm-up only one forward too long looks the same: if your order is not all "
                      "forwards first at m > p, that is your mistake." if mistake == "all_forwards_first"
                      and bound[r] == v * m - 1 else "")
            fail(PIPELINE_HINTS, mistake, f"{case}: rank {r} holds up to {h} micro-batch chunks of activations at "
                                          f"once; torch's interleaved 1F1B (Megatron's order) holds {bound[r]}.{shared} "
                                          f"Your ops: {ops}")
    formula = bubble_fraction(p, m, v)
    for timeline, costs in zip(timelines, ("1:1", "1:2")):
        idle = idle_fraction(timeline)
        if idle > formula + 1e-9:
            fail(PIPELINE_HINTS, "bubble", f"{case}: simulated with forward:backward = {costs}, your order idles "
                                           f"{idle:.1%} of the step; (p-1)/(vm+p-1) = {formula:.1%}.")
    return f"{case}: deadlock-free, chunks held per rank {held}, simulated bubble {formula:.1%} = (p-1)/(vm+p-1)"


def _torch_rank_orders(p, m, v):
    """torch's interleaved order of every rank for (p, m, v), computed in this process by torch's own
    ``ScheduleInterleaved1F1B._calculate_single_rank_operations`` (it reads only the four fields set here)."""
    from types import SimpleNamespace

    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    rounds = max(1, m // p)
    plan = SimpleNamespace(n_local_stages=v, pp_group_size=p, _n_microbatches=m, microbatches_per_round=m // rounds)
    return [[("F" if a.computation_type.name == "FORWARD" else "B", a.microbatch_index, a.stage_index // p)
             for a in ScheduleInterleaved1F1B._calculate_single_rank_operations(plan, r) if a is not None]
            for r in range(p)]


def _compare_with_torch(orders, torch_orders, p, m, v, world=None):
    __tracebackhide__ = True
    for r in range(p):
        if orders[r] != torch_orders[r]:
            at = next(i for i, (a, b) in enumerate(zip(orders[r] + [None], torch_orders[r] + [None])) if a != b)
            fail(PIPELINE_HINTS, "not_megatron", f"p={p}, m={m}, v={v}, rank {r}: op {at} is {orders[r][at]}, "
                                                 f"torch's is {torch_orders[r][at]} (ops before it agree).", world)


def _torch_order(m, v):
    """Runs on every rank: torch's ScheduleInterleaved1F1B for p ranks x v tiny stages; rank 0 returns its order."""
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    rank, p, device = dist.get_rank(), dist.get_world_size(), rank_device()
    out = {"error": None, "order": None}
    try:
        stages = [PipelineStage(nn.Linear(4, 4).to(device), c * p + rank, p * v, device) for c in range(v)]
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=nn.functional.mse_loss)
        out["order"] = {r: [("F" if a.computation_type.name == "FORWARD" else "B", a.microbatch_index,
                             a.stage_index // p) for a in actions if a is not None]
                        for r, actions in schedule.pipeline_order.items()}
    except Exception as exc:  # noqa: BLE001
        out["error"] = caught(exc, "torch's ScheduleInterleaved1F1B")
    return out


def check_interleaved(fn, world_sizes=(2,), timeout=60.0):
    """Check ``fn(rank, ranks, microbatches, chunks)``: arguments, then the structure on ``CASES``, then the order
    torch computes on each of ``world_sizes`` ranks (m = 2p micro-batches, v = 2 chunks)."""
    __tracebackhide__ = True
    refused = _refusal(fn)
    if refused is None or "4" not in refused or "3" not in refused:
        fail(PIPELINE_HINTS, "no_divisibility_check", "fn(0, 3, 4, 2), 4 micro-batches on 3 ranks, "
                                                      f"{'raised ValueError: ' + refused if refused else 'did not raise'}.")
    lines = []
    for p, m, v in CASES:
        orders = _orders(fn, p, m, v)
        lines.append(_check_structure(orders, p, m, v))
        _compare_with_torch(orders, _torch_rank_orders(p, m, v), p, m, v)
    lines.append("every case above, m = p included: your order = torch's ScheduleInterleaved1F1B's on every rank")
    for p in world_sizes:
        m, v = 2 * p, 2
        orders = _orders(fn, p, m, v)
        _check_structure(orders, p, m, v)
        ranks = launch_answer(_torch_order, (m, v), p, timeout, "torch's schedule", PIPELINE_HINTS["deadlock_torch"])
        raise_if_error(first_error(ranks), p, PIPELINE_HINTS)
        _compare_with_torch(orders, ranks[0]["order"], p, m, v, p)
        lines.append(f"on {p} ranks, m={m}, v={v}: your order = torch's ScheduleInterleaved1F1B's on every rank, "
                     f"{len(orders[0])} ops each")
    return CheckResult("interleaved_one_f_one_b", lines)
