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
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["saved_bytes", "KeptBytes"]


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


class KeptBytes(TorchDispatchMode):
    """Counts the storages the operations inside it create that are still alive afterwards: what a forward pass
    *keeps* (lesson 09c, ``notebooks/09c_activation_recompute.ipynb``). ``saved_bytes`` above sees only what goes
    through autograd's saved-tensor hooks; selective checkpointing keeps its tensors in a cache of its own
    (``torch.utils.checkpoint._CachingTorchDispatchMode``), which this count sees because it watches storages.

    Every operation's new storage is recorded with a weak reference (``StorageWeakRef``: it does not keep the
    storage alive); a view shares its input's storage and is not new. ``tag`` labels what runs next (e.g. the
    layer index). ``kept(exclude)``: [(bytes, op, shape, dtype, tag)] of the recorded storages still alive,
    leaving out those of the tensors in ``exclude`` (the output, which the caller holds anyway). A storage held
    only by a Python reference cycle counts until the garbage collector runs (no forward here makes one; call
    ``gc.collect()`` first where one might: it takes most of a second with ``transformers`` imported)."""

    def __init__(self):
        super().__init__()
        self.made, self.tag = {}, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            ptr, old = storage.data_ptr(), self.made.get(storage.data_ptr())
            if ptr in inputs or not storage.nbytes() or (old is not None and not old[0].expired()):
                continue  # a view of an input, an empty tensor, or a storage already recorded
            self.made[ptr] = (StorageWeakRef(storage), storage.nbytes(), str(func), tuple(t.shape), t.dtype, self.tag)
        return out

    def kept(self, exclude=()):
        skip = {t.untyped_storage().data_ptr() for t in exclude}
        return [rest for ptr, (ref, *rest) in self.made.items() if not ref.expired() and ptr not in skip]
