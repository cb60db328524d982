"""What DeepSpeed's ZeRO optimizer holds on one rank, read from its own partitions (lesson 07b,
notebooks/07b_deepspeed_zero.ipynb, "Counting the bytes"): the 16-bit parameters this rank keeps, the
gradient it keeps for its ``step``, and the fp32 master weights plus the inner optimizer's state.

The attribute names are DeepSpeed 0.19's (``deepspeed/runtime/zero/stage_1_and_2.py`` and ``stage3.py``,
and ``FP16_UnfusedOptimizer`` / ``BF16_Optimizer`` at stage 0); a DeepSpeed that renames them fails here
with an AttributeError naming the missing one.
"""

from __future__ import annotations

import torch

__all__ = ["ds_tensors", "ds_partition_bytes"]


def ds_tensors(x):
    """The tensors in DeepSpeed's nested lists / dicts of partitions."""
    if isinstance(x, torch.Tensor):
        return [x]
    items = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else []
    return [t for item in items for t in ds_tensors(item)]


def _nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def ds_partition_bytes(engine, ds_optimizer, stage):
    """{"params", "grads", "optim"}: bytes this rank holds in DeepSpeed's partitions at ZeRO `stage`, taken
    between backward and step (gradients and the optimizer's state both alive)."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}.")
    trainable = [p for p in engine.module.parameters() if p.requires_grad]
    params = _nbytes(getattr(p, "ds_tensor", p) for p in trainable)  # ZeRO-3: p is empty, p.ds_tensor is our slice
    if stage == 0:  # every rank: full 16-bit grads, full fp32 master
        grads, master = _nbytes(p.grad for p in trainable), _nbytes(ds_tensors(ds_optimizer.fp32_groups))
    elif stage < 3:  # ZeRO-1/2: this rank's slice of the grads and of the fp32 master
        grads = _nbytes(ds_tensors(ds_optimizer.averaged_gradients))
        master = _nbytes(ds_tensors(ds_optimizer.single_partition_of_fp32_groups))
    else:
        grads = _nbytes(ds_tensors(ds_optimizer.grad_partitions_flat_buffer))
        master = _nbytes(ds_tensors(ds_optimizer.fp32_partitioned_groups_flat))
    adam = _nbytes(t for s in ds_optimizer.optimizer.state.values() for t in s.values() if t.dim() > 0)  # m and v
    return {"params": params, "grads": grads, "optim": master + adam}
