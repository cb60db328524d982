"""Tensor parallelism as a graph rewrite: Megatron's MLP split applied to a ``torch.fx`` graph (notebook 12b).

Lesson 05 writes tensor parallelism by hand: a column-parallel linear layer, the element-wise GeLU, a
row-parallel linear layer, and Megatron-LM's two conjugate operators (Shoeybi et al., arXiv 1909.08053), which
live in ``utils.tensor_parallel.communications``:

- ``f`` = ``CopyToTensorParallelRegion``: identity forward, all-reduce backward (before the column layer);
- ``g`` = ``ReduceFromTensorParallelRegion``: all-reduce forward, identity backward (after the row layer).

Lesson 12, part 2 (``notebooks/12b_fx_rewrite_and_export.ipynb``) derives the same split as a *pass*
over a traced graph, with no hand-edited module:

- ``find_mlp_pairs``: every ``Linear -> element-wise ops -> Linear`` chain in the graph (the MLPs; attention
  is not matched, its two linear layers are joined by matrix products of two activations);
- ``tensor_parallel_mlp``: for each pair, ``f`` inserted before the first layer, the first layer cut by
  output features (rows of its weight), the second by input features (columns), ``g`` inserted after it and
  the second layer's bias added once, *after* the sum. The nodes ``f`` and ``g`` are ordinary
  ``call_function`` nodes: print ``gm.code`` to see them.
"""

import operator

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..tensor_parallel import check_tp_degree
from ..tensor_parallel.communications import (CopyToTensorParallelRegion, ReduceFromTensorParallelRegion,
                                              copy_to_tensor_parallel_region, reduce_from_tensor_parallel_region)

__all__ = ["CopyToTensorParallelRegion", "ReduceFromTensorParallelRegion", "copy_to_tensor_parallel_region",
           "reduce_from_tensor_parallel_region", "ELEMENTWISE", "find_mlp_pairs", "tensor_parallel_mlp"]


#: Ops that act on each hidden unit alone: a column-parallel rank can apply them to its own units.
ELEMENTWISE = {F.gelu, F.relu, F.silu, torch.tanh, torch.relu, torch.sigmoid, "gelu", "relu", "tanh", "sigmoid"}


def _linear(gm, node):
    return node.op == "call_module" and isinstance(gm.get_submodule(node.target), nn.Linear)


def find_mlp_pairs(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node]]:
    """(first, second) ``Linear`` nodes joined only by element-wise ops, each used once: the MLPs of the graph."""
    pairs = []
    for node in gm.graph.nodes:
        if not _linear(gm, node):
            continue
        current = node
        while len(current.users) == 1:
            (user,) = current.users
            if _linear(gm, user):
                pairs.append((node, user))
                break
            if user.target not in ELEMENTWISE or len(user.all_input_nodes) != 1:
                break  # a matmul of two activations, a residual add...: not an MLP's inside
            current = user
    return pairs


def _set_module(gm, path, module):
    parent, _, name = path.rpartition(".")
    setattr(gm.get_submodule(parent) if parent else gm, name, module)


def tensor_parallel_mlp(gm: fx.GraphModule, rank: int, t: int) -> fx.GraphModule:
    """Rewrite ``gm`` in place into rank ``rank``'s share of t-way tensor parallelism of every MLP; returns it.

    Before: ``x -> fc1 -> gelu -> fc2 -> z``. After: ``x -> f -> fc1[rows of rank] -> gelu ->
    fc2[columns of rank, no bias] -> g -> + fc2.bias -> z``. The weights are sliced from the full ones
    (so the result is exactly comparable with the unsplit model), and t is checked before anything changes."""
    pairs = find_mlp_pairs(gm)
    if not pairs:
        raise ValueError("no Linear -> element-wise -> Linear chain in this graph: nothing to split.")
    for first, second in pairs:  # check every size before changing anything
        check_tp_degree(t, ffn=gm.get_submodule(first.target).out_features)
    for first, second in pairs:
        col, row = gm.get_submodule(first.target), gm.get_submodule(second.target)
        shard = nn.Linear(col.in_features, col.out_features // t, device=col.weight.device)
        shard.weight = nn.Parameter(col.weight.detach().chunk(t, dim=0)[rank].clone())  # (out/t, in)
        shard.bias = nn.Parameter(col.bias.detach().chunk(t, dim=0)[rank].clone())  # (out/t,)
        _set_module(gm, first.target, shard)
        partial = nn.Linear(row.in_features // t, row.out_features, bias=False, device=row.weight.device)
        partial.weight = nn.Parameter(row.weight.detach().chunk(t, dim=1)[rank].clone())  # (out, in/t)
        _set_module(gm, second.target, partial)
        bias_path = second.target + "_bias"  # the whole bias, added once after the sum (not t times)
        _set_module(gm, bias_path, nn.Parameter(row.bias.detach().clone()))
        graph = gm.graph
        with graph.inserting_before(first):  # f at the input of the column-parallel layer
            f = graph.call_function(copy_to_tensor_parallel_region, (first.args[0],))
        first.args = (f, *first.args[1:])
        with graph.inserting_after(second):  # g, then the bias, after the row-parallel layer
            g = graph.call_function(reduce_from_tensor_parallel_region, (second,))
        with graph.inserting_after(g):
            bias = graph.get_attr(bias_path)
        with graph.inserting_after(bias):
            out = graph.call_function(operator.add, (g, bias))
        second.replace_all_uses_with(out, delete_user_cb=lambda user: user is not g)
    gm.graph.lint()
    gm.recompile()
    return gm
