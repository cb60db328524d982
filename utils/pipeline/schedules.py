"""Pipeline schedules as data: who runs which forward and backward, in which order, and the bubble.

Derived in ``notebooks/06a_pipeline_schedules.ipynb``; the schedule explorer widget of
``notebooks/06b_pipeline_bubble.ipynb``, the measured runs (``utils.pipeline.timeline``) and the pipeline
lab's checker (``utils.checkers.pipeline_schedule``) all use this one module, so the picture the widget draws
is the schedule the notebook ran.

A *schedule* is one list of ops per stage rank, executed in order. An op is a tuple
``("F", mb)`` or ``("B", mb)``: forward or backward of micro-batch ``mb`` through this rank's
stage; interleaved schedules add the model chunk, ``("F", mb, chunk)``, and rank r then holds the
virtual stages r, r + p, r + 2p, ... (Narayanan et al., 2021, arXiv 2104.04473). Zero-bubble schedules
(``utils.pipeline.zero_bubble``, notebook 06c) split the backward: ``("B", mb)`` is then the input
gradient only and ``("W", mb)`` the weight gradient, which needs this stage's B of mb. Communication
is implied: a forward on stage s > 0 first receives its input from stage s - 1, a backward on
stage s < last first receives its output gradient from stage s + 1.

- ``gpipe_order``: all forwards, then all backwards (Huang et al., 2019, arXiv 1811.06965).
- ``one_f_one_b_order``: p - s - 1 warm-up forwards, then one forward one backward, then the
  cool-down backwards (PipeDream-Flush, Narayanan et al., 2021; also called 1F1B).
- ``simulate``: turns the lists into a timeline with given op costs (unit by default), or raises
  ``PipelineDeadlock`` naming the op each rank waits on.
- ``bubble_fraction``: the idle share of the step, (p - 1) / (v m + p - 1).
- ``bubble_at_cost``, ``start_shift``: a measured step against the formula and the simulation,
  in a form that disturbances can only move one way (see ``bubble_at_cost``).

Idle, here and in the measurements: over the span from the first op start on any rank to the last
op end on any rank, the share of rank-time not spent in a forward or a backward.
"""

from __future__ import annotations

import dataclasses


class PipelineDeadlock(RuntimeError):
    """No rank can run its next op: each waits for an op that waits, in turn, for it."""

    def __init__(self, message, waiting):
        super().__init__(message)
        self.waiting = waiting  # {rank: (op, what it waits for)}


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def split_layers(layers: int, stages: int) -> list[tuple[int, int]]:
    """[start, stop) of the layers of each stage, as even as possible (the first stages get the extra ones)."""
    if stages < 1:
        raise ValueError(f"a pipeline needs at least 1 stage, got {stages}.")
    if stages > layers:
        raise ValueError(f"cannot split {layers} layers into {stages} stages: every stage needs at least one layer; "
                         f"use at most {layers} stages (or a deeper model).")
    size, extra = divmod(layers, stages)
    bounds, start = [], 0
    for s in range(stages):
        stop = start + size + (s < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def microbatch_size(batch: int, microbatches: int) -> int:
    """Rows per micro-batch; the batch must split into equal micro-batches (so the loss is the full-batch mean)."""
    if microbatches < 1 or batch % microbatches:
        raise ValueError(f"a batch of {batch} does not split into {microbatches} equal micro-batches; use a divisor "
                         f"of {batch}: {', '.join(map(str, _divisors(batch)))}.")
    return batch // microbatches


def check_ranks(stages: int, ranks: int):
    """One stage (or one group of chunks) per rank: a schedule of p stages needs p ranks."""
    if stages > ranks:
        raise ValueError(f"this schedule needs {stages} stage ranks but only {ranks} rank(s) are running; use "
                         f"stages <= {ranks}, or world_size={stages}.")


# ------------------------------------------------------------------ the schedules

def gpipe_order(stage: int, stages: int, microbatches: int) -> list[tuple]:
    """GPipe: every forward, then every backward (in reverse, the order autograd frees them)."""
    _check_stage(stage, stages, microbatches)
    return [("F", mb) for mb in range(microbatches)] + [("B", mb) for mb in reversed(range(microbatches))]


def one_f_one_b_order(stage: int, stages: int, microbatches: int) -> list[tuple]:
    """1F1B (PipeDream-Flush): p - s - 1 warm-up forwards, then alternate F and B, then the cool-down.

    Stage s holds at most p - s micro-batches of activations, whatever m is; GPipe holds m.
    """
    _check_stage(stage, stages, microbatches)
    warmup = min(stages - stage - 1, microbatches)
    ops = [("F", mb) for mb in range(warmup)]
    for i in range(microbatches - warmup):  # steady state: one forward, one backward
        ops += [("F", warmup + i), ("B", i)]
    return ops + [("B", mb) for mb in range(microbatches - warmup, microbatches)]


SCHEDULES = {"GPipe": gpipe_order, "1F1B": one_f_one_b_order}


def schedule_orders(name: str, stages: int, microbatches: int) -> list[list[tuple]]:
    """The op list of every rank for ``name`` in ("GPipe", "1F1B")."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; use one of {list(SCHEDULES)} (interleaved 1F1B is lab 06's "
                         "to write; notebook 06b takes its order from torch's ScheduleInterleaved1F1B).")
    return [SCHEDULES[name](s, stages, microbatches) for s in range(stages)]


def _check_stage(stage, stages, microbatches):
    if not 0 <= stage < stages:
        raise ValueError(f"stage {stage} does not exist in a pipeline of {stages} stages (0 ... {stages - 1}).")
    if microbatches < 1:
        raise ValueError(f"a pipeline needs at least 1 micro-batch, got {microbatches}.")


# ------------------------------------------------------------------ formulas

def bubble_fraction(stages: int, microbatches: int, chunks: int = 1) -> float:
    """Idle share of a step: (p - 1) / (v m + p - 1). The p - 1 fill/drain slots cost a full stage's
    F + B each, or 1/v of it with v chunks per rank; the useful work is m of them."""
    return (stages - 1) / (chunks * microbatches + stages - 1)


def peak_in_flight(ops: list[tuple]) -> int:
    """Most micro-batch chunks whose forward ran and whose backward has not yet: activations held.
    With the backward split (W ops in the list), a micro-batch is held until its W: the weight
    gradient needs the stage's saved inputs and the output gradient."""
    held, peak, done = set(), 0, "W" if any(op[0] == "W" for op in ops) else "B"
    for op in ops:
        key = (op[1], op[2] if len(op) > 2 else 0)
        if op[0] == "F":
            held.add(key)
            peak = max(peak, len(held))
        elif op[0] == done:
            held.discard(key)
    return peak


# ------------------------------------------------------------------ the simulator

@dataclasses.dataclass(frozen=True)
class Interval:
    """One op on one rank: kind "F", "B", "send", "recv"; start and end in seconds (or units)."""

    rank: int
    kind: str
    mb: int
    start: float
    end: float
    chunk: int = 0


def simulate(orders: list[list[tuple]], forward: float = 1.0, backward: float = 1.0, comm: float = 0.0,
             chunks: int | None = None, weight: float = 0.0, placement: str = "loop") -> list[Interval]:
    """Run the op lists with fixed costs: each rank executes its ops in order, an op starts when the rank is
    free and its inputs have arrived (``comm`` after the op that produced them on another rank).

    ``forward`` and ``backward`` are the costs of a whole stage; a chunk costs 1/v of them; ``weight`` is a W
    op's (the backward split, W after B on the same rank). ``placement="v"`` puts chunk 1 of rank r on stage
    2p - 1 - r (the V of torch's ZBV schedule; v = 2) instead of p + r. Sends are
    asynchronous (buffered), as with ``isend``: only a receive waits. Raises ``PipelineDeadlock`` when
    no rank can go on, and ``ValueError`` when an op is missing, repeated or unknown.
    """
    p = len(orders)
    v = chunks or 1 + max((op[2] for ops in orders for op in ops if len(op) > 2), default=0)
    last = p * v - 1
    _check_complete(orders, p, v)
    if placement not in ("loop", "v") or (placement == "v" and v != 2):
        raise ValueError(f"placement {placement!r} with {v} chunks: use 'loop', or 'v' with 2 chunks per rank.")

    def vstage(rank, op):
        chunk = op[2] if len(op) > 2 else 0
        return 2 * p - 1 - rank if placement == "v" and chunk else chunk * p + rank

    done, free, pos, out = {}, [0.0] * p, [0] * p, []  # done[(kind, mb, vstage)] = (end, rank)

    def ready(rank, op):
        """When op's inputs are there on this rank, or None while they are not."""
        kind, mb, vs = op[0], op[1], vstage(rank, op)
        needs = [("F", mb, vs - 1)] if kind == "F" and vs > 0 else []
        if kind == "B":
            needs = [("F", mb, vs)] + ([("B", mb, vs + 1)] if vs < last else [])
        if kind == "W":
            needs = [("B", mb, vs)]
        t = 0.0
        for need in needs:
            if need not in done:
                return None, need
            end, where = done[need]
            t = max(t, end + (comm if where != rank else 0.0))
        return t, None

    while any(pos[r] < len(orders[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                op = orders[r][pos[r]]
                t, _ = ready(r, op)
                if t is None:
                    break
                start = max(free[r], t)
                end = start + {"F": forward, "B": backward, "W": weight}[op[0]] / v
                done[(op[0], op[1], vstage(r, op))] = (end, r)
                out.append(Interval(r, op[0], op[1], start, end, op[2] if len(op) > 2 else 0))
                free[r], pos[r], progressed = end, pos[r] + 1, True
        if not progressed:
            waiting = {r: (orders[r][pos[r]], ready(r, orders[r][pos[r]])[1]) for r in range(p)
                       if pos[r] < len(orders[r])}
            lines = "; ".join(f"rank {r} is at {op} and waits for {_name(need, p)}" for r, (op, need) in
                              waiting.items())
            raise PipelineDeadlock(f"deadlock: no rank can go on: {lines}.", waiting)
    return out


def _name(need, p):
    kind, mb, vs = need
    return f"{ {'F': 'forward', 'B': 'backward', 'W': 'weight gradient'}[kind]} of micro-batch {mb} on stage {vs}" + (
        f" (rank {vs % p})" if vs >= p else "")


def _check_complete(orders, p, v):
    """Every (F|B, micro-batch, chunk) exactly once per rank, the same micro-batches everywhere (and W: none, or one
    per B)."""
    ms = set()
    for r, ops in enumerate(orders):
        seen = set()
        for op in ops:
            if not (isinstance(op, tuple) and len(op) in (2, 3) and op[0] in ("F", "B", "W")):
                raise ValueError(f"rank {r}: {op!r} is not an op; use ('F', mb) or ('B', mb) (or ('F', mb, chunk)).")
            key = (op[0], op[1], op[2] if len(op) > 2 else 0)
            if key in seen:
                raise ValueError(f"rank {r} runs {op} twice.")
            seen.add(key)
        ms.add(frozenset(seen))
    if len(ms) > 1:
        raise ValueError("the ranks run different sets of ops: every rank needs F and B of every micro-batch "
                         "(and chunk).")
    for r, ops in enumerate(orders):
        fs = {(op[1], op[2] if len(op) > 2 else 0) for op in ops if op[0] == "F"}
        bs = {(op[1], op[2] if len(op) > 2 else 0) for op in ops if op[0] == "B"}
        ws = {(op[1], op[2] if len(op) > 2 else 0) for op in ops if op[0] == "W"}
        if fs != bs:
            raise ValueError(f"rank {r}: forwards without a backward or backwards without a forward: "
                             f"{sorted(fs ^ bs)}.")
        if ws and ws != bs:
            raise ValueError(f"rank {r}: a split backward needs one W per B: {sorted(ws ^ bs)} lack one.")


def idle_fraction(intervals: list[Interval]) -> float:
    """1 - (time in F, B and W, summed over ranks) / (ranks x span); span = first start to last end, any rank."""
    work = [iv for iv in intervals if iv.kind in ("F", "B", "W")]
    ranks = len({iv.rank for iv in intervals})
    span = max(iv.end for iv in intervals) - min(iv.start for iv in intervals)
    return 1.0 - sum(iv.end - iv.start for iv in work) / (ranks * span)


def bubble_at_cost(intervals: list[Interval], forward: float, backward: float, weight: float = 0.0) -> float:
    """The bubble of a step counted with each forward costing ``forward``, each backward ``backward`` (each W
    ``weight``):
    1 - (those costs, summed over the F and B ops of all ranks) / (ranks x span).

    With the fixed costs of a fixed-cost run, or the fastest op times ever measured on real compute,
    no op can be shorter than its cost: a disturbance (a preempted op, a late wake-up, a slow message)
    only lengthens the span, never the work counted. So this estimate is never below the schedule's
    own bubble, (p-1)/(m+p-1) for GPipe and 1F1B, and a disturbance only raises it. ``idle_fraction``
    counts the work as timed instead: a preempted op is timed as busy, and its idle share can fall
    *below* the formula (notebook 06b shows both).
    """
    costs = {"F": forward, "B": backward, "W": weight}
    work = sum(costs[iv.kind] for iv in intervals if iv.kind in costs)
    ranks = len({iv.rank for iv in intervals})
    span = max(iv.end for iv in intervals) - min(iv.start for iv in intervals)
    return 1.0 - work / (ranks * span)


def start_shift(measured: list[Interval], simulated: list[Interval]) -> float:
    """How far a measured timeline is from a simulated one: the largest difference between the start of an
    F or B op (the same rank, kind and micro-batch) and its simulated start, both counted from their first
    F or B, as a share of the simulated span. 0 for a timeline that is the simulation's, op for op."""
    def starts(intervals):
        ops = [iv for iv in intervals if iv.kind in ("F", "B", "W")]
        t0 = min(iv.start for iv in ops)
        return {(iv.rank, iv.kind, iv.mb, iv.chunk): iv.start - t0 for iv in ops}
    got, want = starts(measured), starts(simulated)
    if got.keys() != want.keys():
        raise ValueError(f"the timelines run different ops: {sorted(got.keys() ^ want.keys())[:6]} ...")
    span = max(iv.end for iv in simulated) - min(iv.start for iv in simulated)
    return max(abs(got[k] - want[k]) for k in want) / span
