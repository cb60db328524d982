"""What autograd keeps for backward, counted: lesson 07c (notebooks/07c_deepspeed_features.ipynb, activation
checkpointing) derives it, lesson 08b (notebooks/08b_lightning_speedups.ipynb, ``no_grad`` at evaluation)
uses it again.

``torch.autograd.graph.saved_tensors_hooks`` calls ``pack`` on every tensor an operation saves for its
backward; we add up the bytes of their storages, each storage once (a view and its base share one). The
ledger of ``utils.sharding.memory`` cannot see these tensors: the C++ graph holds them. A checkpoint that keeps its
inputs elsewhere (DeepSpeed's reentrant ``ctx.deepspeed_saved_tensors``), or runs under hooks of its own
(the innermost hooks are the ones autograd calls), hides them from this count.
"""

from __future__ import annotations

import torch

__all__ = ["saved_bytes"]


def saved_bytes(fn, exclude=()):
    """(bytes, fn's result): the bytes of the distinct storages autograd saves for backward while fn() runs,
    leaving out the storages of the tensors in `exclude` (e.g. ``model.parameters()``, which exist anyway)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out
