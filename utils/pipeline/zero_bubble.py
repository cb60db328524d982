"""Zero-bubble pipeline schedules: the backward split into B (input gradient) and W (weight gradient).

Derived in ``notebooks/06c_zero_bubble.ipynb``, after 06a/06b (GPipe, 1F1B, interleaving). Qi et al.
(2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241) observe that a stage's backward is two
computations with different consumers: the gradient of its *input*, which the previous stage is
waiting for, and the gradient of its *weights*, which nobody needs before the optimizer step. On a
linear layer Y = X W^T + b:

- **B**: dX = dY W, sent to stage s - 1 at once (``linear_input_grad``);
- **W**: dW = dY^T X, db = sum of dY over rows, any time later (``linear_weight_grad``).

Postponing W lets the B's travel back through the pipeline faster, and the W's fill the idle slots.

- ``zb_h1_order``: the paper's memory-efficient handcrafted schedule ZB-H1, as an op list in the
  conventions of ``utils.pipeline`` (``("F", mb)``, ``("B", mb)``, ``("W", mb)``); ``simulate`` runs it.
- ``zb_h1_bubble``: the paper's bubble of ZB-H1, (p - 1)(T_F + T_B - T_W), as a share of the step.
- ``held_for_weights``: the price, the micro-batches whose B ran but whose W has not (their saved
  inputs and output gradients stay alive).
- ``torch_schedule_class``: torch's zero-bubble schedule classes by name, with a clear error where the
  installed torch lacks one; ``torch_order``: the op list torch computed, in our conventions.
"""

from __future__ import annotations

import torch

__all__ = ["held_for_weights", "linear_input_grad", "linear_weight_grad", "torch_order", "torch_schedule_class",
           "zb_h1_bubble", "zb_h1_order"]


def linear_input_grad(grad_out: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """B of Y = X W^T + b: dX = dY W. (rows, out) @ (out, in) -> (rows, in); the previous stage waits for it."""
    return grad_out @ weight


def linear_weight_grad(x: torch.Tensor, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W of Y = X W^T + b: (dW, db) = (dY^T X, dY summed over rows); needs X saved by the forward and dY kept from B."""
    return grad_out.T @ x, grad_out.sum(0)  # (out, rows) @ (rows, in) -> (out, in); (out,)


def zb_h1_order(stage: int, stages: int, microbatches: int) -> list[tuple]:
    """ZB-H1 on stage ``stage`` of p: 1F1B's warm-up and steady state with the backward split, each W run
    ``stage`` steady steps after its B, the postponed W's closing the cool-down.

    1F1B's order with W right after B is ``one_f_one_b_order`` with a backward costing T_B + T_W: its
    bubble is (p-1)(T_F+T_B+T_W). Here stage s holds back s W's: the B's, no longer queued behind W's,
    come back to stage 0 sooner, and the held-back W's fill the cool-down, where 1F1B's stages idle
    waiting for B's. Every stage then holds at most p micro-batches (stage 0's 1F1B count) instead of
    p - s, the paper's "same number of in-flight micro-batches" on all stages.
    """
    if not 0 <= stage < stages:
        raise ValueError(f"stage {stage} does not exist in a pipeline of {stages} stages (0 ... {stages - 1}).")
    if microbatches < 1:
        raise ValueError(f"a pipeline needs at least 1 micro-batch, got {microbatches}.")
    warmup = min(stages - stage - 1, microbatches)  # as 1F1B
    ops, w_next = [("F", mb) for mb in range(warmup)], 0
    for i in range(microbatches - warmup):  # steady state: F, B, and the W of the micro-batch `stage` B's ago
        ops += [("F", warmup + i), ("B", i)]
        if i >= stage:
            ops.append(("W", w_next))
            w_next += 1
    for mb in range(microbatches - warmup, microbatches):  # cool-down: each B followed by one postponed W
        ops.append(("B", mb))
        if w_next <= mb:
            ops.append(("W", w_next))
            w_next += 1
    return ops + [("W", mb) for mb in range(w_next, microbatches)]  # the W's still held back


def zb_h1_bubble(stages: int, microbatches: int, forward: float = 1.0, backward_input: float = 1.0,
                 backward_weight: float = 1.0) -> float:
    """The idle share of a ZB-H1 step: the paper's bubble (p - 1)(T_F + T_B - T_W) per stage (section 2.1),
    over the step, m (T_F + T_B + T_W) of work plus that bubble. With T_F = T_B = T_W: (p-1) / (3m + p-1),
    where 1F1B idles (p-1)(T_F + T_B + T_W), (p-1)/(m+p-1) of the step. ``zb_h1_order`` reaches it exactly
    when m >= p and T_W <= min(T_F, T_B) (tests/test_zero_bubble.py simulates a grid); outside, its bubble is
    larger, and this raises."""
    if microbatches < stages:
        raise ValueError(f"ZB-H1's bubble (p-1)(T_F+T_B-T_W) assumes m >= p: m = {microbatches}, p = {stages}; "
                         f"use at least {stages} micro-batches (with fewer, simulate the order instead).")
    if backward_weight > min(forward, backward_input):
        raise ValueError(f"this ZB-H1 order reaches (p-1)(T_F+T_B-T_W) when T_W <= min(T_F, T_B), got T_W = "
                         f"{backward_weight}, T_F = {forward}, T_B = {backward_input}; simulate the order instead.")
    bubble = (stages - 1) * (forward + backward_input - backward_weight)
    return bubble / (microbatches * (forward + backward_input + backward_weight) + bubble)


def held_for_weights(ops: list[tuple]) -> int:
    """Most micro-batch chunks whose B ran and whose W has not yet, on one rank: the output gradients
    (and saved inputs) kept alive only because W was postponed; 0 when W follows its B at once."""
    waiting, peak = set(), 0
    for op in ops:
        key = (op[1], op[2] if len(op) > 2 else 0)
        if op[0] == "B":
            waiting.add(key)
        elif op[0] == "W":
            waiting.discard(key)
        peak = max(peak, len(waiting) - (op[0] == "B"))  # a W run right after its B holds nothing extra
    return peak


def torch_schedule_class(name: str):
    """``torch.distributed.pipelining``'s schedule class ``name`` (e.g. "ScheduleZBVZeroBubble"), or an error
    naming the installed torch version and the names it does have."""
    import torch.distributed.pipelining.schedules as schedules  # not at import time: keeps utils light

    cls = getattr(schedules, name, None)
    if cls is None:
        have = sorted(n for n in dir(schedules) if n.startswith("Schedule"))
        raise ImportError(f"torch {torch.__version__} has no {name} in torch.distributed.pipelining; it has "
                          f"{', '.join(have)}. Upgrade torch, or skip this cell.")
    return cls


def torch_order(actions, stage_to_chunk: dict[int, int]) -> list[tuple]:
    """One rank's ``schedule.pipeline_order[rank]`` in our conventions: torch's F, I (input gradient:
    our B), W and B (a whole backward) as ("F" | "B" | "W", mb, chunk); idle slots (None) dropped.
    Raises for an op our simulator does not know (DualPipeV's overlapped F and B)."""
    names = {"FORWARD": "F", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W"}  # by name: their values changed over versions
    ops = []
    for a in actions:
        if a is None:
            continue
        kind = a.computation_type.name
        if kind not in names:
            raise ValueError(f"{a!r}: torch op {kind} is not one of {', '.join(names)}; this order does not map onto "
                             "ours.")
        ops.append((names[kind], a.microbatch_index, stage_to_chunk[a.stage_index]))
    return ops
