"""The transformer layer that lesson 05 splits: plain PyTorch, written once, with no idea it will be split.

Derived in notebooks/05a_tensor_parallelism.ipynb (part 1 of lesson 05) and split again, along the sequence and
with DTensor, in notebooks/05b_dtensor_and_sequence_parallelism.ipynb. A pre-LayerNorm layer: attention, then an MLP,
each behind a LayerNorm and followed by dropout and the residual add. Shapes are sequence-first, (s, b, h), as in
Megatron (sequence parallelism shards dimension 0). Two details make it splittable from outside
(``utils.tensor_parallel.layers``):

- the fused QKV projection keeps each head's q, k and v rows *together* (``[q k v] of head 0, [q k v] of head 1,
  ...``, as Megatron stores it), so a contiguous slice of its rows is a set of whole heads;
- ``forward`` infers the number of heads from the tensor (``view(..., -1, 3 d)``), so the same code runs with a/t
  heads on a tensor-parallel rank, and infers the sequence length, so it runs on a shard of the tokens too.

Lesson 12 (notebooks/12a_fx_trace_and_cost.ipynb) traces it with ``torch.fx.symbolic_trace``, which is why q, k and v
are *unpacked* from one ``split``: fx reads the three from the caller's ``UNPACK_SEQUENCE`` instruction, whereas a
generator or comprehension over the split would iterate a proxy, which fx refuses (the length is unknown at trace time).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Attention", "MLP", "TransformerLayer", "transformer_stack"]


class Attention(nn.Module):
    def __init__(self, hidden, heads, dropout=0.0):
        super().__init__()
        self.head_dim, self.dropout = hidden // heads, dropout
        self.qkv = nn.Linear(hidden, 3 * hidden)  # rows: [q k v] of head 0, of head 1, ...
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x):  # (s, b, h)
        qkv = self.qkv(x)  # (s, b, 3h), or (s, b, 3h/t) on a tensor-parallel rank
        s, b = qkv.shape[:2]
        qkv = qkv.view(s, b, -1, 3 * self.head_dim)  # (s, b, heads, 3d)
        q, k, v = qkv.permute(1, 2, 0, 3).split(self.head_dim, dim=-1)  # (b, heads, s, d) each
        probs = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.head_dim), dim=-1)  # (b, heads, s, s)
        probs = F.dropout(probs, self.dropout, self.training)
        context = (probs @ v).permute(2, 0, 1, 3).reshape(s, b, -1)  # (s, b, heads x d)
        return self.out(context)


class MLP(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))  # (s, b, h) -> (s, b, 4h) -> (s, b, h)


class TransformerLayer(nn.Module):
    def __init__(self, hidden, heads, dropout=0.0):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(hidden), Attention(hidden, heads, dropout)
        self.ln2, self.mlp, self.dropout = nn.LayerNorm(hidden), MLP(hidden), dropout

    def forward(self, x):
        x = x + F.dropout(self.attn(self.ln1(x)), self.dropout, self.training)
        return x + F.dropout(self.mlp(self.ln2(x)), self.dropout, self.training)


def transformer_stack(hidden, heads, layers, seed=0, dropout=0.0):
    """``layers`` TransformerLayers in an nn.Sequential, built from ``seed``: the same weights on every rank."""
    torch.manual_seed(seed)
    return nn.Sequential(*[TransformerLayer(hidden, heads, dropout) for _ in range(layers)])
