"""A cost model read off a ``torch.fx`` graph, and the pipeline split it balances (notebook 12a).

Lesson 12, part 1 (``notebooks/12a_fx_trace_and_cost.ipynb``) traces the course's transformer (``utils.fx.tiny_gpt``)
with ``torch.fx.symbolic_trace`` and derives each piece here (part 2, ``12b_fx_rewrite_and_export.ipynb``, uses the
balanced split again for the pipelining tracer):

- ``annotate_costs``: one pass over the graph that runs it on an example input (a ``ShapeProp``, which
  records each node's output shape in ``node.meta["tensor_meta"]``) and writes ``node.meta["cost"]``:
  ``flops`` (matrix multiplications only, 2 per multiply-add, as the course's formulas count them),
  ``param_bytes`` (each parameter counted once, at the node that first uses it), ``out_bytes`` (the
  node's output) and ``saved_bytes`` (what autograd keeps for backward while the node runs, measured
  with ``saved_tensors_hooks``, each storage counted once);
- ``unit_of`` / ``unit_costs``: nodes grouped by the pipeline *unit* (a top-level layer) they belong to,
  read from ``node.meta["nn_module_stack"]``, which the tracer fills in;
- ``balanced_split``: consecutive units into stages minimising the largest stage cost (the *linear
  partition* problem, solved exactly by dynamic programming); ``even_split``: the usual split by layer
  count; ``imbalance``: max / mean of the stage costs (1.0 is perfect);
- ``split_stages`` and ``stage_times``: the graph cut into stage ``GraphModule`` s with fx's own
  ``split_module``, and each stage's forward timed in CPU seconds of the calling thread (median of repeats, several splits
  timed interleaved).
"""

import operator
import statistics
import time

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata
from torch.fx.passes.split_module import split_module

from ..pipeline import split_layers

__all__ = ["annotate_costs", "unit_of", "unit_costs", "balanced_split", "even_split", "imbalance", "split_stages",
           "stage_times"]

# Functions whose FLOPs are 2 x (output elements) x (inner dimension): the matrix products.
_MATMULS = {torch.matmul, operator.matmul, torch.bmm, torch.mm, "matmul", "bmm", "mm"}


def _tensor_bytes(meta) -> int:
    """Bytes of a node's output as ShapeProp recorded it (a tuple of tensors: their sum; anything else: 0)."""
    if isinstance(meta, TensorMetadata):
        return meta.shape.numel() * torch.empty((), dtype=meta.dtype).element_size()
    if isinstance(meta, (tuple, list)):
        return sum(_tensor_bytes(m) for m in meta)
    return 0


def _flops(node: fx.Node, gm: fx.GraphModule) -> int:
    """Multiply-adds x 2 of a matrix product; 0 for everything else (element-wise ops, norms, views, bias adds)."""
    out = node.meta.get("tensor_meta")
    if not isinstance(out, TensorMetadata):
        return 0
    if node.op == "call_module" and isinstance(gm.get_submodule(node.target), nn.Linear):
        return 2 * out.shape.numel() * gm.get_submodule(node.target).in_features  # tokens x out x in, x 2
    if node.op in ("call_function", "call_method") and node.target in _MATMULS:
        inner = node.args[0].meta["tensor_meta"].shape[-1]  # (..., m, k) @ (..., k, n): k
        return 2 * out.shape.numel() * inner
    return 0


class _CostProp(ShapeProp):
    """ShapeProp that also records the bytes autograd saves while each node runs (parameters excluded)."""

    def __init__(self, gm):
        super().__init__(gm)
        self.skip = {p.untyped_storage().data_ptr() for p in gm.parameters()}
        self.seen = set()

    def run_node(self, node):
        saved = {}

        def pack(tensor):
            ptr = tensor.untyped_storage().data_ptr()
            if ptr not in self.skip and ptr not in self.seen:  # a storage saved twice is held once
                saved[ptr] = tensor.untyped_storage().nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            result = super().run_node(node)
        self.seen.update(saved)
        node.meta["saved_bytes"] = sum(saved.values())
        return result


def annotate_costs(gm: fx.GraphModule, *example_inputs) -> fx.GraphModule:
    """Run ``gm`` once on ``example_inputs`` and write ``node.meta["cost"]`` on every node (see the module doc).

    The run is a real forward with autograd on (train mode if the graph was traced in train mode), so
    ``saved_bytes`` is what a training step would keep. Returns ``gm`` for chaining."""
    _CostProp(gm).propagate(*example_inputs)
    counted = set()
    for node in gm.graph.nodes:
        tensors = []
        if node.op == "call_module":
            tensors = list(gm.get_submodule(node.target).parameters())
        elif node.op == "get_attr":
            tensors = [operator.attrgetter(node.target)(gm)]
        fresh = [p for p in tensors if isinstance(p, nn.Parameter) and id(p) not in counted]
        counted.update(id(p) for p in fresh)
        node.meta["cost"] = dict(flops=_flops(node, gm), param_bytes=sum(p.numel() * p.element_size() for p in fresh),
                                 out_bytes=_tensor_bytes(node.meta.get("tensor_meta")),
                                 saved_bytes=node.meta.pop("saved_bytes", 0))
    return gm


def unit_of(node: fx.Node, units) -> str | None:
    """The first of ``units`` (module paths, e.g. ``"layers.3"``) on the node's module stack, or None."""
    for path in node.meta.get("nn_module_stack", {}):
        if path in units:
            return path
    if node.op == "call_module":  # a leaf module called at the top level, e.g. "head"
        for unit in units:
            if node.target == unit or node.target.startswith(unit + "."):
                return unit
    return None


def unit_costs(gm: fx.GraphModule, units, key: str = "flops") -> list:
    """The sum of ``node.meta["cost"][key]`` over the nodes of each unit, in the order of ``units``.

    Nodes outside every unit (the inputs, the output, top-level glue) belong to no stage's cost;
    ``annotate_costs`` must have run."""
    totals = dict.fromkeys(units, 0)
    for node in gm.graph.nodes:
        unit = unit_of(node, units)
        if unit is not None:
            totals[unit] += node.meta["cost"][key]
    return [totals[u] for u in units]


def balanced_split(costs, stages: int) -> list[tuple[int, int]]:
    """[start, stop) of consecutive units per stage, minimising the largest stage's total cost.

    Dynamic programming over (units placed, stages used): O(units^2 x stages), exact; ties go to the split
    whose earlier stages are shorter. Every stage gets at least one unit."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot split {n} units into {stages} stages: use 1 to {n} stages.")
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]  # best[k][i]: the least max cost of units[:i] in k stages
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):  # the last stage holds units[j:i]
                worst = max(best[k - 1][j], prefix[i] - prefix[j])
                if worst < best[k][i]:
                    best[k][i], cut[k][i] = worst, j
    bounds, i = [], n
    for k in range(stages, 0, -1):
        bounds.append((cut[k][i], i))
        i = cut[k][i]
    return bounds[::-1]


def even_split(layers: int, stages: int, first: int = 1, last: int = 1) -> list[tuple[int, int]]:
    """The split by layer count: the ``layers`` middle units as ``utils.pipeline.split_layers`` spreads them (the
    first stages get the extra ones), the ``first`` units (embedding) joined to stage 0 and the ``last`` ones
    (norm, head) to the last stage."""
    bounds = split_layers(layers, stages)
    return [(0 if s == 0 else start + first, stop + first + (last if s == stages - 1 else 0))
            for s, (start, stop) in enumerate(bounds)]


def imbalance(stage_costs) -> float:
    """max / mean of the stage costs: the pipeline runs at the pace of its slowest stage (1.0: balanced)."""
    return max(stage_costs) / (sum(stage_costs) / len(stage_costs))


def split_stages(gm: fx.GraphModule, units, bounds) -> fx.GraphModule:
    """``gm`` cut into ``submod_0``, ``submod_1``, ... one per stage, by fx's ``split_module``.

    A node outside every unit goes with the nearest unit before it (the first stage for the inputs)."""
    stage_of_unit = {u: s for s, (a, b) in enumerate(bounds) for u in units[a:b]}
    stage, assignment = 0, {}
    for node in gm.graph.nodes:
        unit = unit_of(node, units)
        stage = stage_of_unit[unit] if unit is not None else stage
        assignment[node.name] = stage
    return split_module(gm, gm, lambda node: assignment[node.name], keep_original_order=True)


def stage_times(splits: dict[str, fx.GraphModule], example_inputs, repeats: int = 5) -> dict[str, list[float]]:
    """Median CPU seconds of each stage's forward (no autograd), for each split of ``splits`` (label -> split).

    The clock is ``time.thread_time()``: the CPU time of this thread, which a preempted stage does not
    accumulate while it waits, so a loaded machine does not inflate it the way it inflates wall-clock time.
    It sees only work done in this thread: run with ``torch.set_num_threads(1)`` (on a GPU, time with CUDA
    events instead). CPU time still varies with what shares the core's caches and clock, so the splits are
    timed *interleaved*: each of the ``repeats`` rounds times every stage of every split once, and a slow
    stretch of the machine falls on all splits alike instead of on whichever was timed then. The median
    drops the rounds disturbed most."""
    if not isinstance(splits, dict) or not splits:
        raise TypeError(f"stage_times takes a dict of label -> split GraphModule (from split_stages), got "
                        f"{type(splits).__name__}: pass {{'my split': split_stages(...)}}")
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: time each stage at least once")
    jobs = []  # (label, stage module, its captured inputs), every stage of every split
    for label, split in splits.items():
        stages = sorted((name for name, _ in split.named_children() if name.startswith("submod_")),
                        key=lambda name: int(name.split("_")[1]))
        inputs = {}
        hooks = [getattr(split, name).register_forward_pre_hook(
            lambda mod, args, name=name: inputs.setdefault(name, args)) for name in stages]
        with torch.no_grad():
            split(*example_inputs)  # once to capture each stage's inputs (and to warm up)
        for hook in hooks:
            hook.remove()
        jobs += [(label, getattr(split, name), inputs[name]) for name in stages]
    seconds = [[] for _ in jobs]
    with torch.no_grad():
        for _ in range(repeats):
            for (_, stage, args), times in zip(jobs, seconds):
                start = time.thread_time()
                stage(*args)
                times.append(time.thread_time() - start)
    return {label: [statistics.median(times) for (owner, _, _), times in zip(jobs, seconds) if owner == label]
            for label in splits}
