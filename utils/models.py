"""The course model: a small classifier with the three things hand-written parallelism gets wrong.

Derived in notebook 02 (data parallelism) and reused by the later lessons, so that every strategy
is checked on the same model:

- a **frozen parameter** (``input_scale``, ``requires_grad=False``): it has no gradient, so it must
  be copied to every rank at the start but never all-reduced;
- a **buffer** (``input_shift``, not a parameter): it is state too, so it must be copied to every
  rank at the start, yet an optimizer never sees it;
- a **tied weight** (``mix2.weight is mix1.weight``): one tensor used by two layers. It appears
  once in ``model.parameters()`` but twice in ``named_parameters(remove_duplicate=False)``;
  reducing it twice sends its bytes twice, and if the division by the world size happens once
  at the end, its gradient comes out n times too large.

Both frozen parameter and buffer start *random*, so with different seeds on different ranks the
replicas differ until someone broadcasts them, exactly the bug a from-scratch DDP must avoid.

Every strategy is checked against one run: ``train_reference``, the course model trained in one process on the
whole global batch (lesson 02a derives it). Lessons 02 and 06 check their runs against it with SGD, lesson 04 with
Adam, lesson 10 with AdamW; lessons 04 and 06 take the digits in the file's order (``ordered=False``), lesson 02 in
its shuffled one. ``make_model`` builds the model seeded, as every rank does; ``make_optimizer`` picks the lesson's
optimizer by name.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .datasets import batch

__all__ = ["ToyNet", "make_model", "make_optimizer", "train_reference"]


class ToyNet(nn.Module):
    """(batch, in_features) -> (batch, classes) logits; about 7k parameters at the defaults."""

    def __init__(self, in_features=64, hidden=64, classes=10):
        super().__init__()
        self.input_scale = nn.Parameter(torch.rand(in_features) + 0.5, requires_grad=False)  # frozen
        self.register_buffer("input_shift", torch.rand(in_features) * 0.1)  # state, not a parameter
        self.embed = nn.Linear(in_features, hidden)
        self.mix1 = nn.Linear(hidden, hidden)
        self.mix2 = nn.Linear(hidden, hidden)
        self.mix2.weight = self.mix1.weight  # tied: one tensor, two layers
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        x = (x - self.input_shift) * self.input_scale  # (batch, in_features)
        h = torch.tanh(self.embed(x))  # (batch, hidden)
        h = h + torch.tanh(self.mix1(h))
        h = h + torch.tanh(self.mix2(h))
        return self.head(h)  # (batch, classes)


def make_model(seed=0, hidden=64):
    """The course model, seeded: every rank builds the same one (DDP and FSDP broadcast or shard it anyway)."""
    torch.manual_seed(seed)  # ToyNet's frozen input_scale and buffer input_shift are random too
    return ToyNet(hidden=hidden)


def make_optimizer(params, name, lr):
    """"sgd" (lessons 02, 06), "adam" (lesson 04) or "adamw" (the 30-step two-node run of lesson 10)."""
    optimizers = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if name not in optimizers:
        raise ValueError(f"optimizer {name!r} is not one of {sorted(optimizers)}")
    return optimizers[name](params, lr=lr)


def train_reference(steps, size, optimizer, lr, hidden=64, ordered=True):
    """The reference every split run must reproduce: one process, seed 0, the whole global batch of ``size`` digits
    per step (``utils.datasets.batch``, ``ordered`` or not). Returns (final state dict, detached; per-step losses)."""
    model = make_model(seed=0, hidden=hidden)
    opt = make_optimizer(model.parameters(), optimizer, lr)
    losses = []
    for step in range(steps):
        x, y = batch(step, size, ordered)  # (B, 64), (B,)
        loss = F.cross_entropy(model(x), y)  # mean over the global batch
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses
