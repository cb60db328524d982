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
"""

import torch
from torch import nn


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
