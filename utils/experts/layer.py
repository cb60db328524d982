"""A mixture-of-experts layer in one process: the reference that expert parallelism must equal.

Derived in notebook 15 (expert parallelism). E experts, each a small MLP (h -> ffn -> h), and a
top-k router (``utils.experts.router``). For each token x:

    y(x) = sum over its kept routes i of  w_i(x) * expert_i(x)       # zero if every route was dropped

The caller adds the residual, ``x + moe(x)``, so a dropped token passes through unchanged (Switch
Transformer, arXiv 2101.03961). Capacity is counted per *group* of tokens (GShard's G dimension,
arXiv 2006.16668): ``groups=n`` splits the batch into n equal groups, each with its own capacity,
which is what n expert-parallel ranks do, each routing its own batch. Without dropping, the groups
change nothing.
"""

import torch
from torch import nn

from .router import TopKRouter, load_balancing_loss, route

__all__ = ["Expert", "MoELayer", "moe_forward"]


class Expert(nn.Module):
    """One expert: the transformer's MLP, h -> ffn -> h with a GELU."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.up, self.act, self.down = nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden)

    def forward(self, x):  # (rows, h) -> (rows, h)
        return self.down(self.act(self.up(x)))


def moe_forward(x, router, experts, capacity_factor=None, alpha=0.01):
    """One group of tokens through router and experts, in one process. Returns (y, aux loss, Routes)."""
    probs, weights, chosen = router(x)  # (T, E), (T, k), (T, k)
    routes = route(weights, chosen, router.num_experts, capacity_factor)
    y = torch.zeros_like(x)
    rows = x[routes.token]  # (kept routes, h), sorted by expert
    for e, chunk in enumerate(rows.split(routes.counts.tolist())):
        if len(chunk):
            start = int(routes.counts[:e].sum())
            y.index_add_(0, routes.token[start:start + len(chunk)],
                         routes.weight[start:start + len(chunk), None] * experts[e](chunk))
    return y, load_balancing_loss(probs, chosen, router.num_experts, alpha), routes


class MoELayer(nn.Module):
    """Router + E experts in one process. ``forward(x, groups=1)`` -> (y, aux loss); ``last_routes``
    keeps each group's ``Routes`` (counts, dropped) for inspection."""

    def __init__(self, hidden, ffn, num_experts, k, capacity_factor=None, alpha=0.01):
        super().__init__()
        self.router = TopKRouter(hidden, num_experts, k)
        self.experts = nn.ModuleList(Expert(hidden, ffn) for _ in range(num_experts))
        self.capacity_factor, self.alpha = capacity_factor, alpha
        self.last_routes = []

    def forward(self, x, groups=1):  # x: (tokens, h)
        if x.shape[0] % groups:
            raise ValueError(f"{x.shape[0]} tokens do not split into {groups} equal groups; "
                             f"use a multiple of {groups} tokens.")
        outs, aux, self.last_routes = [], 0.0, []
        for chunk in x.chunk(groups):  # each group routed alone, with its own capacity
            y, loss, routes = moe_forward(chunk, self.router, self.experts, self.capacity_factor, self.alpha)
            outs.append(y)
            aux = aux + loss / groups  # the mean of the groups' losses, as the ranks' mean
            self.last_routes.append(routes)
        return torch.cat(outs), aux
