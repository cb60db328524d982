"""The router of a mixture-of-experts layer: which experts each token goes to, with what weight.

Derived in notebook 15 (expert parallelism). A *router* (the "gate") is one linear layer from the
hidden size h to E logits, one per expert. The recipe of Switch Transformer (Fedus, Zoph and Shazeer,
arXiv 2101.03961) and of Mixtral, for top-k routing:

    p(x) = softmax(W_r x)                      # (tokens, E): the gate probabilities
    top-k experts of p(x), weights p_i / sum_{j in top-k} p_j   # renormalised over the k chosen

Each expert can take at most ``capacity`` routes from a group of T tokens (Switch, section 2.2:
"expert capacity = (tokens per batch / number of experts) x capacity factor", here with k routes per
token): ``capacity = ceil(C * T * k / E)``. Routes past it are *dropped*: that token gets nothing
from that expert, and if all its routes are dropped the layer gives it zero, so that the residual
connection around the layer passes it through unchanged (Switch: "the token representation is
passed directly to the next layer through the residual connection"). Which routes go first: all
first choices before any second choice (as GShard and DeepSpeed's ``top2gating`` do), tokens in
order within a choice.

Switch's auxiliary load-balancing loss (section 2.2, equation 4): ``loss = alpha * E * sum_i f_i * P_i``,
f_i the fraction of routes dispatched to expert i, P_i the mean router probability of expert i.
It is ``alpha`` for a perfectly balanced router and grows to ``alpha * E / k`` when every token goes to the
same k experts (k distinct choices per token: each of them gets f_i = 1/k), so ``alpha * E`` for Switch's k = 1.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TopKRouter", "Routes", "expert_capacity", "route", "load_balancing_loss"]


class TopKRouter(nn.Module):
    """Softmax gate over E experts, top-k, weights renormalised over the k chosen (Mixtral's recipe)."""

    def __init__(self, hidden: int, num_experts: int, k: int):
        super().__init__()
        if not 1 <= k <= num_experts:
            raise ValueError(f"k={k}: a token goes to between 1 and E={num_experts} experts.")
        self.k, self.num_experts = k, num_experts
        self.gate = nn.Linear(hidden, num_experts, bias=False)  # W_r: (E, h)

    def forward(self, x):  # x: (tokens, h)
        probs = F.softmax(self.gate(x), dim=-1)  # (tokens, E)
        top_p, experts = probs.topk(self.k, dim=-1)  # (tokens, k) each, best first
        weights = top_p / top_p.sum(dim=-1, keepdim=True)  # renormalised: the k weights sum to 1
        return probs, weights, experts


def expert_capacity(tokens: int, num_experts: int, k: int, capacity_factor: float) -> int:
    """Routes one expert accepts from a group of ``tokens`` tokens: ceil(C * tokens * k / E)."""
    return math.ceil(capacity_factor * tokens * k / num_experts)


class Routes:
    """The kept routes of a group of tokens, sorted by expert: route j sends token ``token[j]`` to
    expert ``expert[j]`` with weight ``weight[j]`` (differentiable: it carries the router's gradient).
    ``counts[e]`` = routes kept for expert e; ``dropped`` = routes past the capacity."""

    def __init__(self, token, expert, weight, counts, dropped, capacity):
        self.token, self.expert, self.weight = token, expert, weight
        self.counts, self.dropped, self.capacity = counts, dropped, capacity


def route(weights, experts, num_experts: int, capacity_factor=None) -> Routes:
    """Apply the capacity to one group's top-k choices; ``capacity_factor=None`` drops nothing.

    weights, experts: (T, k) from ``TopKRouter``. Priority: first choices of every token, then
    second choices, ...; within a choice, token order. The routes come back sorted by expert
    (stable), the order in which they are packed for the all-to-all.
    """
    tokens, k = experts.shape
    flat_expert = experts.t().reshape(-1)  # (k*T,) choice-major: all first choices, then all second
    flat_token = torch.arange(tokens, device=experts.device).repeat(k)
    flat_weight = weights.t().reshape(-1)
    one_hot = F.one_hot(flat_expert, num_experts)  # (k*T, E)
    position = (one_hot.cumsum(0) * one_hot).sum(-1) - 1  # place of each route in its expert's queue
    if capacity_factor is None:
        capacity = tokens * k  # no expert can receive more: nothing is dropped
    else:
        capacity = expert_capacity(tokens, num_experts, k, capacity_factor)
    keep = position < capacity
    order = torch.sort(flat_expert[keep], stable=True).indices  # by expert, queue order within one
    expert = flat_expert[keep][order]
    counts = torch.bincount(expert, minlength=num_experts)
    return Routes(flat_token[keep][order], expert, flat_weight[keep][order], counts,
                  int((~keep).sum()), capacity)


def load_balancing_loss(probs, experts, num_experts: int, alpha: float = 0.01):
    """Switch Transformer's auxiliary loss, alpha * E * sum_i f_i * P_i (arXiv 2101.03961, eq. 4).

    f_i: fraction of the T*k top-k choices that picked expert i (not differentiable: an argmax);
    P_i: mean gate probability of expert i over the T tokens (differentiable: the gradient that
    pushes the router towards balance). Balanced router: alpha. Every token on the same k experts (each
    f_i = 1/k, their P_i summing to at most 1): at most alpha * E / k, so alpha * E for k = 1.
    """
    f = torch.bincount(experts.reshape(-1), minlength=num_experts).to(probs.dtype) / experts.numel()  # (E,)
    P = probs.mean(dim=0)  # (E,)
    return alpha * num_experts * (f * P).sum()
