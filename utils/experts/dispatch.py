"""Expert parallelism: the experts sharded over ranks, tokens sent to them and back by all-to-all.

Derived in notebook 15. Each of the n ranks of the expert group holds E/n experts (rank r: experts
r*E/n ... (r+1)*E/n - 1) and a full copy of the router; each routes its *own* tokens. GShard (arXiv
2006.16668) and Switch Transformer (arXiv 2101.03961) pad every expert to a fixed capacity: every split has one size,
known in advance, and a layer is two all-to-alls (dispatch, combine), as in DeepSpeed-MoE. This layer sends only the
rows it kept, whose number changes from step to step (a dropless layer must), so it is three all-to-alls:

1. **counts**: every rank tells every other how many rows it will send to each of its experts
   (E integers), so that each rank knows its receive sizes before any row moves;
2. **dispatch**: the kept routes' token rows, sorted by expert, go to the rank holding that expert
   (``dist.all_to_all_single`` with ``input_split_sizes`` = rows per destination rank);
3. **combine**: the experts' outputs go back the same way with the split sizes swapped, and the
   sending rank sums them into its tokens with the router weights.

Backward runs the two row all-to-alls again in reverse (``AllToAllRows``): the gradient of the
combine is a dispatch and vice versa. Per token, forward moves 2 k h values (dispatch + combine) of
which a fraction leaves the rank ((n-1)/n for a uniform router); backward the same again.
"""

import copy

import torch
import torch.distributed as dist
from torch import nn

from .router import load_balancing_loss, route

__all__ = ["check_expert_split", "AllToAllRows", "exchange_counts", "ExpertParallelMoE", "wire_values_per_token"]


def check_expert_split(num_experts: int, ranks: int) -> int:
    """Experts per rank, or a ValueError naming the numbers when E does not divide over the ranks."""
    if ranks < 1 or num_experts % ranks:
        fits = [d for d in range(1, num_experts + 1) if num_experts % d == 0]
        raise ValueError(f"{num_experts} experts do not split evenly over {ranks} expert-parallel ranks "
                         f"({num_experts} % {ranks} = {num_experts % ranks if ranks else '-'}); use an "
                         f"expert-parallel size in {fits}, or a multiple of {ranks} experts.")
    return num_experts // ranks


def wire_values_per_token(k: int, hidden: int, leaving: float) -> float:
    """Values one token puts on the wire in one MoE layer's forward: dispatch + combine, 2 k h, times the
    fraction ``leaving`` of its routes whose expert is on another rank ((n-1)/n for a uniform router)."""
    return 2 * k * hidden * leaving


class AllToAllRows(torch.autograd.Function):
    """Rows to other ranks with ``all_to_all_single``; backward sends the gradients back the same way.

    send_counts[r] rows of ``rows`` (in order) go to rank r; recv_counts[r] rows arrive from rank r.
    """

    @staticmethod
    def forward(ctx, rows, send_counts, recv_counts, group):
        ctx.send_counts, ctx.recv_counts, ctx.group = send_counts, recv_counts, group
        out = rows.new_empty((sum(recv_counts), rows.shape[1]))  # (rows received, h)
        dist.all_to_all_single(out, rows.contiguous(), output_split_sizes=recv_counts,
                               input_split_sizes=send_counts, group=group)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # the reverse exchange: splits swapped
        grad_in = grad_out.new_empty((sum(ctx.send_counts), grad_out.shape[1]))
        dist.all_to_all_single(grad_in, grad_out.contiguous(), output_split_sizes=ctx.send_counts,
                               input_split_sizes=ctx.recv_counts, group=ctx.group)
        return grad_in, None, None, None


def exchange_counts(counts, group=None):
    """counts: (E,) rows this rank sends to each expert. Returns (n, E/n): rows each rank sends to
    each of *this* rank's experts (the first all-to-all: sizes before rows)."""
    n = dist.get_world_size(group)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous(), group=group)  # E/n counts to each rank
    return received.view(n, -1)


class ExpertParallelMoE(nn.Module):
    """A ``MoELayer``'s router (replicated) and this rank's E/n experts. ``forward(x)`` -> (y, aux loss),
    equal to ``MoELayer(x, groups=n)``'s slice for this rank. ``last`` holds the counts of the last call."""

    def __init__(self, layer, group=None):
        super().__init__()
        self.group = group
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        self.num_experts = layer.router.num_experts
        self.local = check_expert_split(self.num_experts, n)  # experts on this rank
        self.router = copy.deepcopy(layer.router)
        self.experts = nn.ModuleList(copy.deepcopy(layer.experts[rank * self.local + i]) for i in range(self.local))
        self.capacity_factor, self.alpha = layer.capacity_factor, layer.alpha
        self.last = {}

    def forward(self, x):  # x: (T, h), this rank's tokens
        probs, weights, chosen = self.router(x)
        routes = route(weights, chosen, self.num_experts, self.capacity_factor)  # sorted by expert
        recv_per_expert = exchange_counts(routes.counts, self.group)  # (n, E/n)
        send = routes.counts.view(-1, self.local).sum(1).tolist()  # rows to each rank
        recv = recv_per_expert.sum(1).tolist()  # rows from each rank
        rows = AllToAllRows.apply(x[routes.token], send, recv, self.group)  # dispatch: (sum(recv), h)
        # received rows: grouped by source rank, and by local expert within a source
        local_id = torch.arange(self.local).repeat(len(recv)).repeat_interleave(recv_per_expert.reshape(-1))
        order = torch.sort(local_id, stable=True).indices  # all rows of local expert 0 first, ...
        per_expert = torch.bincount(local_id, minlength=self.local).tolist()
        outs = [self.experts[e](chunk) for e, chunk in enumerate(rows[order].split(per_expert))]
        out = torch.cat(outs)[torch.argsort(order)]  # back in arrival order
        back = AllToAllRows.apply(out, recv, send, self.group)  # combine: (kept routes, h)
        y = torch.zeros_like(x).index_add(0, routes.token, routes.weight[:, None] * back)
        self.last = dict(routes=routes, send=send, recv=recv)
        return y, load_balancing_loss(probs, chosen, self.num_experts, self.alpha)
