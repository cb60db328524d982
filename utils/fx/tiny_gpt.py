"""The small GPT that lesson 12 traces, costs, cuts into pipeline stages and rewrites (notebooks 12a, 12b).

Derived in notebooks/12a_fx_trace_and_cost.ipynb (trace and cost model) and used again in
notebooks/12b_fx_rewrite_and_export.ipynb (tensor parallelism as a graph rewrite, ``torch.export``). It is lesson 05's
``utils.tensor_parallel.TransformerLayer``, stacked, with a token and position embedding in front and a final
LayerNorm and an output layer (the *head*, untied from the embedding) behind. Plain PyTorch: it has no idea it will
be traced. Shapes are sequence-first, as in lesson 05: ids (s, b) -> logits (s, b, vocab).

- ``TinyGPT``: the model; ``pipeline_units``: its top-level modules in order (the units a pipeline split cuts between);
- ``make_tiny_gpt``: the model built from a seed (the same weights on every rank that calls it with that seed).
"""

import torch
from torch import nn

from ..tensor_parallel.transformer import TransformerLayer

__all__ = ["Embedding", "TinyGPT", "make_tiny_gpt", "pipeline_units"]


class Embedding(nn.Module):
    """Token embedding plus a learned position embedding: (s, b) ids -> (s, b, h)."""

    def __init__(self, vocab, hidden, seq):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)

    def forward(self, ids):  # (s, b) token ids -> (s, b, h)
        pos = torch.arange(ids.shape[0], device=ids.device)  # fx keeps ids.shape and ids.device as nodes
        return self.tokens(ids) + self.positions(pos)[:, None, :]


class TinyGPT(nn.Module):
    """Embedding, ``layers`` of lesson 05's TransformerLayer, a final LayerNorm and the head (with bias)."""

    def __init__(self, vocab, hidden, heads, seq, layers, dropout=0.0):
        super().__init__()
        self.embed = Embedding(vocab, hidden, seq)
        self.layers = nn.Sequential(*[TransformerLayer(hidden, heads, dropout) for _ in range(layers)])
        self.norm, self.head = nn.LayerNorm(hidden), nn.Linear(hidden, vocab)  # head: untied from the embedding

    def forward(self, ids):  # (s, b) -> (s, b, vocab) logits
        return self.head(self.norm(self.layers(self.embed(ids))))


def make_tiny_gpt(seed=0, *, vocab, hidden, heads, seq, layers, dropout=0.0):
    """A ``TinyGPT`` built after ``torch.manual_seed(seed)``: every call with the same arguments, the same weights."""
    if hidden % heads:
        raise ValueError(f"hidden size {hidden} is not divisible by heads={heads}; use a multiple of {heads}.")
    torch.manual_seed(seed)
    return TinyGPT(vocab, hidden, heads, seq, layers, dropout)


def pipeline_units(model: TinyGPT) -> list[str]:
    """The module paths a pipeline split cuts between, in order: ``embed``, ``layers.0`` ... ``layers.L-1``, ``norm``,
    ``head``."""
    return ["embed", *[f"layers.{i}" for i in range(len(model.layers))], "norm", "head"]
