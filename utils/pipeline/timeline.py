"""Run a pipeline schedule on stage ranks with send/recv, record every op's time, draw it as a Gantt chart.

Derived in ``notebooks/06a_pipeline_schedules.ipynb`` (GPipe and 1F1B from scratch; timed in 06b); the pipeline
lab's checker (``utils.checkers.pipeline_schedule``) runs the learner's op lists through the same
``run_stage``. The op lists come from ``utils.pipeline`` (``("F", mb)``, ``("B", mb)``).

``run_stage`` runs on rank s = stage s of p, and for each op:

- **F, mb**: stage 0 takes micro-batch ``mb`` of the input; a later stage *receives* it from
  stage s - 1 (``irecv`` then ``wait``: a receive has to block, its data is needed; the ``irecv``
  of the next op is posted before this op computes, so its message can land meanwhile; on gloo). Then the
  forward; the last stage adds the loss (divided by m, so the m losses sum to the full-batch
  mean). The output goes to stage s + 1 with ``isend``, which does not wait for the receiver:
  a blocking ``send`` here is how two stages that both send first deadlock on gloo.
- **B, mb**: the last stage calls ``loss.backward()``; the others receive the gradient of their
  output from stage s + 1 and call ``output.backward(grad)``. The gradient of the stage's input
  goes back to stage s - 1 (``isend``).
- **split backward** (the list has ``("W", mb)`` ops, notebook 06c): B computes only the gradient of the
  stage's input (``backward(inputs=[x], retain_graph=True)``), sends it, and keeps the graph and the output
  gradient; **W, mb** then computes the weight gradients (``backward(inputs=parameters)``) and frees them.

Every op is recorded as ``Interval(rank, kind, mb, start, end)`` with ``time.perf_counter()``, one
clock for all processes of a machine (on GPUs, synchronise before reading it); ``send`` is the
time to post the ``isend``, ``recv`` the time spent waiting. Idle is what is left.

``costs=(forward_s, backward_s)`` (or ``(forward_s, backward_s, weight_s)``) makes each op take exactly that
long: the real (small) compute runs, then the rank *sleeps* until the op's fixed duration is up. Sleeping
ranks do not compete for cores, so p = 4 stages on a 2-core machine give an honest timeline: a **fixed-cost**
run, labelled as such wherever it is shown.

``track_memory=True`` counts the bytes autograd saves for backward (``saved_tensors_hooks``,
parameters excluded): the activations a stage holds, per micro-batch and at peak.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .schedules import Interval

COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#8172B2", "send": "#C0C0C0", "recv": "#E0B040"}
# Told apart without colour too (a grey-scale print, colour blindness): a pattern per kind, and each pass's label
# starts with its letter (F3: the forward of micro-batch 3).
HATCHES = {"F": "", "B": "////", "W": "xxxx", "send": "", "recv": "...."}
NAMES = {"F": "F: forward", "B": "B: backward", "W": "W: weight gradient", "send": "send", "recv": "waiting to receive"}


class _Recorder:
    """Context manager per op: appends an Interval; with a cost, pads the op to that duration."""

    def __init__(self, rank, device):
        self.rank, self.intervals = rank, []
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)  # GPU ops are asynchronous

    def op(self, kind, mb, cost=None):
        recorder = self

        class _Span:
            def __enter__(self):
                recorder.sync()
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                recorder.sync()
                if cost is not None:
                    left = self.start + cost - time.perf_counter()
                    if left > 0:
                        time.sleep(left)  # fixed-cost op: sleep, so oversubscribed ranks do not fight for cores
                recorder.intervals.append(Interval(recorder.rank, kind, mb, self.start, time.perf_counter()))

        return _Span()


class _ActivationCounter:
    """Bytes of the tensors autograd saves for backward, per micro-batch (each storage once, parameters excluded)."""

    def __init__(self, module):
        self.params = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self.params |= {b.untyped_storage().data_ptr() for b in module.buffers()}
        self.held, self.seen, self.peak_bytes, self.peak_count, self.per_mb = {}, {}, 0, 0, 0
        self.mb = None

    def pack(self, t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.params and ptr not in self.seen.setdefault(self.mb, set()):
            self.seen[self.mb].add(ptr)
            self.held[self.mb] = self.held.get(self.mb, 0) + t.untyped_storage().nbytes()
        return t

    def after_forward(self, mb):
        self.per_mb = max(self.per_mb, self.held.get(mb, 0))
        self.peak_bytes = max(self.peak_bytes, sum(self.held.values()))
        self.peak_count = max(self.peak_count, len(self.held))

    def release(self, mb):
        self.held.pop(mb, None)
        self.seen.pop(mb, None)


def run_stage(stage_module, ops, *, stage, stages, x_mbs=None, y_mbs=None, recv_shape=None, loss_fn=None,
              costs=None, track_memory=False):
    """Run this rank's op list (see the module docstring). Rank ``stage`` of the default group is stage ``stage``.

    ``x_mbs``: the input micro-batches (stage 0); ``y_mbs``: the targets (last stage); ``recv_shape``:
    the shape of the activation a stage s > 0 receives. Returns a dict with ``intervals``, ``losses``
    (last stage: one per micro-batch, already divided by m), and with ``track_memory`` the activation
    bytes: ``per_mb``, ``peak_bytes``, ``peak_count`` (micro-batches held at once).
    """
    device = next(stage_module.parameters()).device
    first, last, m = stage == 0, stage == stages - 1, len({op[1] for op in ops})
    rec, counter = _Recorder(stage, device), (_ActivationCounter(stage_module) if track_memory else None)
    inputs, outputs, losses, pending, posted = {}, {}, {}, [], {}
    forward_cost, backward_cost, weight_cost = (*costs, None)[:3] if costs is not None else (None, None, None)
    split = any(op[0] == "W" for op in ops)  # zero-bubble: B is the input gradient, W the weight gradient
    params, held_grads = [q for q in stage_module.parameters() if q.requires_grad], {}
    # Early receives only on gloo: NCCL runs the p2p ops between two ranks in order on one stream, so an early
    # irecv of a gradient would queue our own isend of the activation (that the gradient needs) behind it.
    early = dist.get_backend() == "gloo"

    def post_recv(i):
        """Post op i's receive early (irecv does not wait): the message can land while we compute."""
        if i >= len(ops) or i in posted:
            return
        kind, mb = ops[i][0], ops[i][1]
        if kind == "F" and not first:
            buf, src = torch.empty(recv_shape, device=device), stage - 1  # (rows, features) activation
        elif kind == "B" and not last and mb in outputs:
            buf, src = torch.empty_like(outputs[mb]), stage + 1  # gradient of our output
        else:
            return
        posted[i] = (buf, dist.irecv(buf, src, tag=mb))

    def post_next(i):
        """Post the receive of the next op after op i that receives (a W receives nothing: look past it)."""
        while i + 1 < len(ops) and ops[i + 1][0] == "W":
            i += 1
        post_recv(i + 1)

    def receive(i):
        post_recv(i)
        buf, work = posted.pop(i)
        with rec.op("recv", ops[i][1]):
            work.wait()
        return buf

    for i, op in enumerate(ops):
        kind, mb = op[0], op[1]
        if kind == "F":
            x = x_mbs[mb] if first else receive(i).requires_grad_()  # a leaf: backward stops here, leaves x.grad
            if early:
                post_next(i)
            with rec.op("F", mb, forward_cost):
                if counter:
                    counter.mb = mb
                    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
                        out = stage_module(x)
                        out = loss_fn(out, y_mbs[mb]) / m if last else out
                else:
                    out = stage_module(x)
                    out = loss_fn(out, y_mbs[mb]) / m if last else out
            if counter:
                counter.after_forward(mb)
            inputs[mb], outputs[mb] = x, out
            if last:
                losses[mb] = out.detach()
            else:
                with rec.op("send", mb):
                    pending.append(dist.isend(out.detach(), stage + 1, tag=mb))
        elif kind == "B":
            if mb not in outputs:
                raise RuntimeError(f"stage {stage}: backward of micro-batch {mb} before its forward (or twice).")
            grad = None if last else receive(i)  # d loss / d (our output), from stage s + 1
            if early:
                post_next(i)
            with rec.op("B", mb, backward_cost):
                if not split:
                    outputs[mb].backward(grad)
                elif not first:  # input gradient only; stage 0 has no input gradient to compute
                    outputs[mb].backward(grad, inputs=[inputs[mb]], retain_graph=True)
            if not first:
                with rec.op("send", mb):
                    pending.append(dist.isend(inputs[mb].grad, stage - 1, tag=mb))
            if split:
                held_grads[mb] = grad  # W needs it, and the graph: both stay alive until W
            else:
                del outputs[mb]  # frees the graph: this micro-batch's activations are gone
                inputs.pop(mb)
                if counter:
                    counter.release(mb)
        elif kind == "W" and split:
            if mb not in held_grads:
                raise RuntimeError(f"stage {stage}: weight gradient of micro-batch {mb} before its B (or twice).")
            with rec.op("W", mb, weight_cost):
                outputs.pop(mb).backward(held_grads.pop(mb), inputs=params)  # accumulates into .grad
            inputs.pop(mb)
            if counter:
                counter.release(mb)
            if early:
                post_next(i)
        else:
            raise ValueError(f"stage {stage}: unknown op {op!r}; use ('F', mb), ('B', mb) or ('W', mb).")
    for work in pending:  # every isend must complete before its buffer may be freed
        work.wait()
    result = {"intervals": rec.intervals, "losses": [losses[k] for k in sorted(losses)]}
    if counter:
        result.update(per_mb=counter.per_mb, peak_bytes=counter.peak_bytes, peak_count=counter.peak_count)
    return result


def draw_gantt(ax, intervals, title="", unit="ms", show_comm=True, label_mb=True):
    """One row per rank (rank 0 on top): forwards blue (F), backwards green and hatched (B), weight gradients purple
    and cross-hatched (W), recv waits yellow and dotted, sends grey; white is idle; a legend beside names them;
    passes wide enough carry their letter and micro-batch (F3).
    ``intervals``: measured (seconds, shown in ``unit``) or simulated (``unit=None``)."""
    from matplotlib.patches import Patch  # here: the ranks import this module and draw nothing

    if not intervals:
        return ax
    t0 = min(iv.start for iv in intervals)
    scale = {"ms": 1e3, "s": 1.0, None: 1.0}[unit]
    ranks = max(iv.rank for iv in intervals) + 1
    for iv in intervals:
        if iv.kind in ("send", "recv") and not show_comm:
            continue
        height = 0.8 if iv.kind in ("F", "B", "W") else 0.25
        y = ranks - 1 - iv.rank
        left, width = (iv.start - t0) * scale, (iv.end - iv.start) * scale
        ax.barh(y, width, left=left, height=height, color=COLORS[iv.kind], hatch=HATCHES[iv.kind],
                edgecolor="white" if height > 0.5 else None, linewidth=0.5,
                alpha=1.0 if iv.chunk == 0 else 0.6)  # later chunks (interleaved) lighter
        if label_mb and iv.kind in ("F", "B", "W"):
            span = (max(i.end for i in intervals) - t0) * scale
            if width > span / 40:
                text = f"{iv.kind}{iv.mb}" if iv.chunk == 0 else f"{iv.kind}{iv.mb}.{iv.chunk}"
                ax.text(left + width / 2, y, text, ha="center", va="center", color="white", fontsize=7,
                        bbox=dict(boxstyle="square,pad=0.2", facecolor=COLORS[iv.kind], linewidth=0))
    kinds = [k for k in COLORS if any(iv.kind == k for iv in intervals) and (show_comm or k in ("F", "B", "W"))]
    ax.legend(handles=[Patch(facecolor=COLORS[k], hatch=HATCHES[k], edgecolor="white", label=NAMES[k]) for k in kinds],
              loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, frameon=False)  # beside: clear of the labels
    ax.set_yticks(range(ranks), [f"rank {r}" for r in reversed(range(ranks))])
    ax.set_xlabel(f"time ({unit})" if unit else "time (units of one stage's forward)")
    ax.set_title(title, fontsize=10)
    return ax
