"""Expert parallelism inside data parallelism: a small MoE network and who all-reduces what.

Derived in notebook 15. On a (dp, ep) mesh of dp x ep ranks every rank reads its own slice of the
batch. The experts are sharded over the ``ep`` group (a rank holds E/ep of them) and replicated over
the ``dp`` group; everything else (embedding, dense layer, router, head) is replicated on all ranks.
So after backward:

- a replicated parameter's gradient is summed over **all** ranks (plain data parallelism);
- an expert's gradient already holds the contributions of the tokens of its whole ep group (the
  combine all-to-all carried them back in backward), so it is summed over the **dp** group only;

and both are divided by the world size, since the loss is the mean over all ranks' tokens.
DeepSpeed calls the dp group of the experts the "expert data parallel" group
(``deepspeed.utils.groups._create_expert_and_data_parallel``).
"""

import copy

import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .dispatch import ExpertParallelMoE
from .layer import MoELayer

__all__ = ["MoENet", "expert_parallel", "allreduce_moe_gradients"]


class MoENet(nn.Module):
    """features -> dense (tanh) -> x + MoE(x) -> classes; ``forward(x, y, groups)`` -> (loss, aux)."""

    def __init__(self, features, hidden, ffn, classes, num_experts, k, capacity_factor=None, alpha=0.01):
        super().__init__()
        self.dense = nn.Linear(features, hidden)
        self.moe = MoELayer(hidden, ffn, num_experts, k, capacity_factor, alpha)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x, y, groups=1):
        h = self.dense(x).tanh()  # (tokens, hidden)
        out, aux = self.moe(h, groups) if isinstance(self.moe, MoELayer) else self.moe(h)
        h = h + out  # the residual: a dropped token passes through
        return F.cross_entropy(self.head(h), y) + aux, aux


def expert_parallel(net: MoENet, ep_group=None) -> MoENet:
    """A copy of ``net`` whose MoE layer keeps this rank's experts of the ``ep_group`` only."""
    out = copy.deepcopy(net)
    out.moe = ExpertParallelMoE(net.moe, ep_group)
    return out


def allreduce_moe_gradients(net: nn.Module, dp_group=None):
    """Mean gradients over all ranks: expert parameters summed over ``dp_group``, the rest over all
    ranks, both divided by the world size. Returns {"world": values, "dp": values} all-reduced."""
    world = dist.get_world_size()
    expert_ids = {id(p) for m in net.modules() if isinstance(m, ExpertParallelMoE) for p in m.experts.parameters()}
    values = {"world": 0, "dp": 0}
    for p in net.parameters():
        if p.grad is None:
            continue
        is_expert = id(p) in expert_ids
        if not is_expert or dist.get_world_size(dp_group) > 1:
            dist.all_reduce(p.grad, group=dp_group if is_expert else None)
            values["dp" if is_expert else "world"] += p.numel()
        p.grad /= world
    return values
