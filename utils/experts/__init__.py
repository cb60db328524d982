"""Mixture of experts and expert parallelism (notebook 15): ``router`` (top-k gate, capacity, Switch's
load-balancing loss), ``layer`` (the MoE layer in one process, the reference), ``dispatch`` (experts sharded
over ranks, tokens sent by all-to-all, and ``wire_values_per_token``, its bytes formula), ``hybrid`` (expert parallelism inside data parallelism: which
gradients are all-reduced over which group).
"""

from .router import TopKRouter, Routes, expert_capacity, route, load_balancing_loss
from .layer import Expert, MoELayer, moe_forward
from .dispatch import check_expert_split, AllToAllRows, exchange_counts, ExpertParallelMoE, wire_values_per_token
from .hybrid import MoENet, expert_parallel, allreduce_moe_gradients

__all__ = ["TopKRouter", "Routes", "expert_capacity", "route", "load_balancing_loss", "Expert", "MoELayer",
           "moe_forward", "check_expert_split", "AllToAllRows", "exchange_counts", "ExpertParallelMoE",
           "wire_values_per_token", "MoENet", "expert_parallel", "allreduce_moe_gradients"]
