"""Megatron's split of the course model, ``ToyNet``, as a plan keyed by module path for torch's
``parallelize_module`` (lesson 08c applies it in Lightning's ``configure_model``; derived there).

Lesson 05a split a transformer's MLP column-then-row with layers of our own; here the same idea is
torch's ``ColwiseParallel`` / ``RowwiseParallel`` on ``ToyNet``, whose residual stream and **tied**
weight (``mix2.weight is mix1.weight``) decide the plan:

- ``embed`` column-parallel: each of t ranks computes hidden/t features of h and keeps them split;
- ``mix1``, ``mix2`` column-parallel on an input that arrives split (``Shard(-1)``): all-gather h,
  multiply by this rank's hidden/t rows; the output holds the same features as this rank's slice of h,
  so the residual ``h + tanh(mix(h))`` adds local slices, with no communication;
- ``head`` row-parallel: (batch, hidden/t) times its hidden/t columns gives partial logits, all-reduced;
- the tie: both ``mix`` layers split the shared weight by rows (``Shard(0)``), so one ``DTensor`` can
  serve both; a column/row pair could not share one tensor.

The frozen ``input_scale`` and the buffer ``input_shift`` are not in the plan: every rank keeps them whole.
"""

from .degrees import check_tp_degree

__all__ = ["apply_toy_tp", "toy_tp_plan"]


def toy_tp_plan():
    """The plan for ``ToyNet``, keyed by module path; shapes for t tensor-parallel ranks.

    embed: column-parallel, its output stays split: (batch, hidden/t) on each rank;
    mix1, mix2: column-parallel on an input that arrives split (``Shard(-1)``): all-gather it to (batch, hidden),
    multiply by this rank's hidden/t rows, give (batch, hidden/t), the same features as the residual h holds;
    head: row-parallel: (batch, hidden/t) @ its hidden/t columns -> partial logits, all-reduced to (batch, classes).
    """
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"embed": ColwiseParallel(),
            "mix1": ColwiseParallel(input_layouts=Shard(-1)),
            "mix2": ColwiseParallel(input_layouts=Shard(-1)),
            "head": RowwiseParallel()}


def apply_toy_tp(net, tp_mesh):
    """``parallelize_module(net, tp_mesh, toy_tp_plan())``, then the tie restored: mix2's weight IS mix1's again.

    ``parallelize_module`` replaces each layer's weight by a new ``DTensor`` parameter, layer by layer, so after it
    mix1 and mix2 hold two equal copies. Both are column-parallel (``Shard(0)`` rows), so one copy can serve both:
    we point mix2 at mix1's, and its gradient again sums the two uses, as in the one-process model.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    check_tp_degree(tp_mesh.size(), hidden=net.embed.out_features)
    if net.mix2.weight is not net.mix1.weight:
        raise ValueError("apply_toy_tp expects ToyNet's tied mix1/mix2 weight (mix2.weight is mix1.weight)")
    parallelize_module(net, tp_mesh, toy_tp_plan())
    net.mix2.weight = net.mix1.weight  # one DTensor, two layers: the tie of the one-process model
    return net
