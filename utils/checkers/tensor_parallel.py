"""The checker of lab 05 (tensor parallelism): Megatron's f and g, and the column- and row-parallel linears.

Used by ``labs/05_tensor_parallel_lab.ipynb``; notebook 05 derives what is checked here. The
learner writes two ``torch.autograd.Function`` classes, ``f`` (CopyToTensorParallelRegion:
identity forward, all-reduce backward) and ``g`` (ReduceFromTensorParallelRegion: all-reduce
forward, identity backward), and two modules built from a full ``nn.Linear``:
``ColumnParallelLinear(full, rank, world_size)`` (weight (out/t, in), bias (out/t,)) and
``RowParallelLinear(full, rank, world_size)`` (weight (out, in/t), bias (out,), added once).
Same conventions as every lab (``utils.checkers.common``): a ``CheckResult`` on success, else ``LabCheckFailed`` with
``.mistake`` and ``.hint``. Three kinds of evidence:

- **values**: on small integer inputs the operators' outputs and gradients are exact, so a wrong
  one *looks like* a known mistake (the input untouched where a sum was due, or the reverse);
  the layers' outputs and every gradient are compared with ``nn.Linear``'s (float32, rtol 1e-5);
- **collectives**: ``CommLedger`` says which layer all-reduces what, in which direction: the column
  layer must all-reduce only in backward (its input's gradient), the row layer only in forward;
- **shapes**: a weight split along the wrong dimension shows in its shape before anything runs.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..ledger import CommLedger
from .common import CheckResult, caught, fail, first_error, launch_answer, raise_if_error

TP_HINTS = {
    "f_g_swapped": "the all-reduce runs in the wrong direction: f (before a column-parallel layer) is identity in "
                   "forward and all-reduces the gradient in backward; g (after a row-parallel layer) all-reduces "
                   "in forward and passes the gradient through in backward.",
    "missing_backward_all_reduce": "each rank's input gradient comes from its own slice of the weight only: f's "
                                   "backward must all-reduce it (dist.all_reduce on a copy of grad), and the "
                                   "column-parallel layer must call f on its input.",
    "missing_forward_all_reduce": "each rank's row-parallel output is a partial sum X_r B_r: g's forward must "
                                  "all-reduce it (on a copy), and the row-parallel layer must call g.",
    "all_reduce_both_ways": "an operator all-reduces in forward AND backward: one direction only. f: identity "
                            "forward; g: identity backward (the gradient of a sum is the same on every rank).",
    "in_place": "do not all-reduce the tensor you were given: it belongs to the caller (and to autograd). "
                "All-reduce a copy, x.clone(), and return that.",
    "wrong_dimension": "column-parallel splits the OUTPUT features: rows of nn.Linear's weight, "
                       "weight.chunk(t, dim=0), and the bias with them; row-parallel splits the INPUT features: "
                       "weight.chunk(t, dim=1), and keeps the whole bias.",
    "shape": "column-parallel: weight (out/t, in), bias (out/t,); row-parallel: weight (out, in/t), bias (out,).",
    "bias_every_rank": "the row-parallel bias is added on every rank BEFORE the all-reduce, so the sum holds it t "
                       "times: add it once, after g (z = g(y_r @ W_r^T) + b).",
    "no_divisibility_check": "call utils.tensor_parallel.check_tp_degree(world_size, out_features=...) (column) or "
                             "(..., in_features=...) (row) first: it raises ValueError naming the numbers and the "
                             "degrees that fit, before any rank gets a piece of the wrong size.",
    "wrong": "compare with the notebook: the column layer computes F.linear(f(x), W_r, b_r), the row layer "
             "g(F.linear(y_r, W_r)) + b.",
    "deadlock": "every rank must call the same collectives in the same order: an all-reduce that only some "
                "ranks reach waits forever.",
}
ERROR_PHRASES = [("shapes cannot be multiplied", "wrong_dimension"), ("size mismatch", "wrong_dimension")]
IN, HIDDEN, OUT, BATCH = 12, 120, 10, 6  # the checker's MLP: IN -> HIDDEN (column) -> OUT (row);
# 120: whole, equal slices on 1-6 and 8 ranks



# ------------------------------------------------------------------------------------------------ f and g

def _operators_on_rank(f, g):
    """Runs on every rank: each operator on (rank + 1) x [1..6], then backward of 10 (rank + 1) x [1..6]."""
    rank, out = dist.get_rank(), {"error": None}
    base = torch.arange(1.0, 7.0)
    for name, op in (("f", f), ("g", g)):
        x = ((rank + 1) * base).requires_grad_()
        try:
            with CommLedger() as forward:
                y = op.apply(x)
            changed = not torch.equal(x.detach(), (rank + 1) * base)
            with CommLedger() as backward:
                y.backward(10 * (rank + 1) * base)
        except Exception as exc:  # noqa: BLE001 - reported to the learner in the kernel
            out["error"] = caught(exc, f"{name}")
            return out
        out[name] = {"y": y.detach().clone(), "grad": x.grad.clone(), "changed": changed,
                     "ops": ([r.op for r in forward.records], [r.op for r in backward.records])}
    return out


def _judge_operator(name, r, own, total, own_grad, total_grad, n):
    """f must give (own, summed gradient), g (sum, own gradient); anything else looks like a known mistake."""
    __tracebackhide__ = True
    y = "own" if torch.equal(r["y"], own) else "sum" if torch.equal(r["y"], total) else "other"
    grad = "own" if torch.equal(r["grad"], own_grad) else "sum" if torch.equal(r["grad"], total_grad) else "other"
    want = ("own", "sum") if name == "f" else ("sum", "own")
    told = f"{name}: forward gave {r['y'].tolist()}, input gradient {r['grad'].tolist()}"
    if (y, grad) == want:
        return
    mistake = {("sum", "sum"): "all_reduce_both_ways", (want[1], want[0]): "f_g_swapped",
               ("own", "own"): "missing_backward_all_reduce" if name == "f" else "missing_forward_all_reduce"}
    fail(TP_HINTS, mistake.get((y, grad), "wrong"), f"{told} (own = this rank's, sum = summed over ranks: {y}, {grad}); "
                                           f"expected {want[0]}, {want[1]}.", n)


def check_operators(f, g, world_sizes=(2, 4), timeout=30.0):
    """Check Megatron's conjugate operators: ``f`` identity / all-reduce, ``g`` all-reduce / identity.

    On each world size n every rank feeds (rank + 1) x [1, ..., 6] (exact sums) and back-propagates
    10 (rank + 1) x [1, ..., 6]; the outputs, the input gradients, and that the caller's tensor is
    left untouched are checked. Returns a ``CheckResult``; raises ``LabCheckFailed`` with a hint.
    """
    __tracebackhide__ = True
    lines = []
    for n in world_sizes:
        ranks = launch_answer(_operators_on_rank, (f, g), n, timeout, "f and g", TP_HINTS["deadlock"])
        raise_if_error(first_error(ranks), n, TP_HINTS)
        base, total = torch.arange(1.0, 7.0), n * (n + 1) / 2
        for rank, r in enumerate(ranks):
            for name in ("f", "g"):
                _judge_operator(name, r[name], (rank + 1) * base, total * base, 10 * (rank + 1) * base,
                                10 * total * base, n)
                if r[name]["changed"]:
                    fail(TP_HINTS, "in_place", f"{name} changed the tensor it was given on rank {rank}.", n)
        lines.append(f"world_size={n}: f = identity forward, summed gradient; g = summed forward, identity "
                     f"backward; exact on every rank, inputs untouched")
    return CheckResult("f and g", lines)


# ------------------------------------------------------------------------------------------------ the layers

def _layers_on_rank(column_cls, row_cls):
    """Runs on every rank: the MLP IN -> HIDDEN -> OUT split column/row beside the full one, same seed."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {"error": None, "refused": {}}
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, OUT)
    with torch.no_grad():
        fc2.bias.uniform_(1.0, 2.0)  # a bias that shows when it is added t times
    gen = torch.Generator().manual_seed(1)
    x, weights = torch.randn(BATCH, IN, generator=gen), torch.randn(BATCH, OUT, generator=gen)
    for cls, bad in ((column_cls, nn.Linear(IN, n + 1)), (row_cls, nn.Linear(n + 1, OUT))):  # n never divides n+1
        try:
            cls(bad, rank, n)
            out["refused"][cls.__name__] = None
        except Exception as exc:  # noqa: BLE001
            out["refused"][cls.__name__] = f"{type(exc).__name__}: {exc}"
    try:
        column, row = column_cls(fc1, rank, n), row_cls(fc2, rank, n)
        out["shapes"] = [tuple(p.shape) for p in (column.weight, column.bias, row.weight, row.bias)]
        x_split = x.clone().requires_grad_()
        with CommLedger() as col_fwd:
            hidden = column(x_split)
        with CommLedger() as row_fwd:
            y = row(F.gelu(hidden))
        with CommLedger() as bwd:
            (y * weights).sum().backward()
    except Exception as exc:  # noqa: BLE001 - reported to the learner in the kernel
        out["error"] = caught(exc, "your layers")
        return out
    x_full = x.clone().requires_grad_()
    y_ref = fc2(F.gelu(fc1(x_full)))
    (y_ref * weights).sum().backward()
    out["ops"] = {k: [(r.op, r.payload_bytes) for r in led.records] for k, led in
                  (("column forward", col_fwd), ("row forward", row_fwd), ("backward", bwd))}
    out["pairs"] = {  # name: (yours, the full layer's piece)
        "output": (y.detach(), y_ref.detach()), "input gradient": (x_split.grad, x_full.grad),
        "column weight gradient": (column.weight.grad, fc1.weight.grad.chunk(n, 0)[rank]),
        "column bias gradient": (column.bias.grad, fc1.bias.grad.chunk(n, 0)[rank]),
        "row weight gradient": (row.weight.grad, fc2.weight.grad.chunk(n, 1)[rank]),
        "row bias gradient": (row.bias.grad, fc2.bias.grad)}
    out["bias"] = fc2.bias.detach().clone()
    return out


def _judge_shapes(shapes, n):
    __tracebackhide__ = True
    want = [(HIDDEN // n, IN), (HIDDEN // n,), (OUT, HIDDEN // n), (OUT,)]
    if shapes == want:
        return
    if shapes[0] == (HIDDEN, IN // n) or shapes[2] == (OUT // n, HIDDEN) or shapes[2] == (-(-OUT // n), HIDDEN):
        fail(TP_HINTS, "wrong_dimension", f"column weight {shapes[0]}, row weight {shapes[2]}; for nn.Linear({IN}, {HIDDEN}) "
                                 f"and nn.Linear({HIDDEN}, {OUT}) on {n} ranks expected {want[0]} and {want[2]}.", n)
    fail(TP_HINTS, "shape", f"(column weight, column bias, row weight, row bias) shapes {shapes}, expected {want}.", n)


def _judge_collectives(ops, n):
    """Which layer all-reduced what: the payload says whose tensor it was (IN, HIDDEN and OUT differ)."""
    __tracebackhide__ = True
    x_bytes, y_bytes = BATCH * IN * 4, BATCH * OUT * 4
    col_fwd, row_fwd, bwd = ops["column forward"], ops["row forward"], ops["backward"]
    said = f"all-reduces seen (op, bytes): {ops}"
    if col_fwd or (y_bytes in [b for _, b in bwd] and not row_fwd):
        fail(TP_HINTS, "f_g_swapped", f"the column layer all-reduces in forward or the row layer in backward; {said}.", n)
    if ("all_reduce", y_bytes) in bwd:
        fail(TP_HINTS, "all_reduce_both_ways", f"the row layer's output gradient was all-reduced in backward; {said}.", n)
    if row_fwd != [("all_reduce", y_bytes)]:
        fail(TP_HINTS, "missing_forward_all_reduce", f"expected one all-reduce of the ({BATCH}, {OUT}) output in the row "
                                            f"layer's forward; {said}.", n)
    if bwd != [("all_reduce", x_bytes)]:
        fail(TP_HINTS, "missing_backward_all_reduce", f"expected one all-reduce of the ({BATCH}, {IN}) input gradient in "
                                             f"backward; {said}.", n)


def check_parallel_linear(column_cls, row_cls, world_sizes=(2, 4), timeout=30.0):
    """Check ``ColumnParallelLinear`` and ``RowParallelLinear`` as an MLP, beside the unsplit ``nn.Linear`` pair.

    On each world size n: ``Linear(12, 120)`` split by columns, GeLU, ``Linear(120, 10)`` split by
    rows, built on every rank from the same seed. Demands, in this order: the weights' shapes; one
    all-reduce in the row layer's forward (the output) and one in backward (the input gradient),
    none elsewhere; the output, the input gradient and every weight and bias gradient equal to the
    full layers' (``torch.testing.assert_close``, rtol 1e-5); and a ``ValueError`` naming the
    numbers for a layer whose features n does not divide.
    """
    __tracebackhide__ = True
    lines = []
    for n in world_sizes:
        ranks = launch_answer(_layers_on_rank, (column_cls, row_cls), n, timeout, "the parallel layers", TP_HINTS["deadlock"])
        first = ranks[0]
        if "shapes" in first:
            _judge_shapes(first["shapes"], n)
        raise_if_error(first_error(ranks), n, TP_HINTS, ERROR_PHRASES)
        _judge_collectives(first["ops"], n)
        worst = 0.0
        for rank, r in enumerate(ranks):
            y, y_ref = r["pairs"]["output"]
            if torch.allclose(y, y_ref + (n - 1) * r["bias"], rtol=1e-5, atol=1e-5):
                fail(TP_HINTS, "bias_every_rank", f"rank {rank}'s output = the full layer's + {n - 1} x the bias.", n)
            for name, (got, want) in r["pairs"].items():
                if got is None or got.shape != want.shape or not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
                    diff = "missing" if got is None else (f"shape {tuple(got.shape)}" if got.shape != want.shape
                                                          else f"max |diff| {(got - want).abs().max():.2e}")
                    fail(TP_HINTS, "wrong", f"rank {rank}: {name} differs from the full layers' ({diff}).", n)
                worst = max(worst, (got - want).abs().max().item())
        for name, refused in first["refused"].items():
            if refused is None or not refused.startswith("ValueError") or str(n + 1) not in refused:
                fail(TP_HINTS, "no_divisibility_check", f"{name} built from a layer of {n + 1} features on {n} ranks "
                                               f"{'raised ' + refused if refused else 'did not complain'}.", n)
        lines.append(f"world_size={n}: output, input gradient and 4 parameter gradients equal to nn.Linear's (max "
                     f"|diff| {worst:.1e}); all-reduces: 1 forward ({BATCH}x{OUT}), 1 backward ({BATCH}x{IN}); "
                     f"{n + 1} features on {n} ranks refused with ValueError")
    return CheckResult("ColumnParallelLinear and RowParallelLinear", lines)
