"""The parameters a sharded optimizer is given, as ``torch.optim`` takes them: tensors or parameter groups.

Lesson 03's ``ZeroDP`` and lab 03's ``BucketedZeRO2`` take ``params`` the way every ``torch.optim`` optimizer
(and ``torch.distributed.optim.ZeroRedundancyOptimizer``) does: an iterable (a generator such as
``model.parameters()`` works) of tensors, or of dicts ``{"params": [...], "lr": ..., "weight_decay": ...}``
whose other keys override the optimizer's defaults for that group. ``param_groups`` reads it once into a
list of dicts and drops the frozen parameters (``requires_grad=False``): they get no gradient, so a sharded
optimizer gives them no hook and no shard (torch's ZeroRedundancyOptimizer skips them only in the buckets
of ``parameters_as_bucket_view``,
``_is_trainable`` in ``torch/distributed/optim/zero_redundancy_optimizer.py``; its partition still assigns
them to ranks).
"""

import torch

__all__ = ["param_groups"]


def param_groups(params):
    """``params`` (tensors or dicts, any iterable) -> a list of dicts, each with its trainable tensors in "params".

    A tensor listed twice (a tied weight reached twice) is kept once, in its first group. Groups left
    without a trainable tensor are dropped. Raises like torch: a lone tensor, an empty list, a mix.
    """
    if isinstance(params, torch.Tensor):
        raise TypeError(f"params must be an iterable of tensors or dicts, got one {torch.typename(params)}: "
                        "pass model.parameters() or [tensor].")
    items = list(params)  # a generator is read once, here
    if not items:
        raise ValueError("params is empty: pass model.parameters(), a list of tensors or a list of parameter groups.")
    if all(isinstance(p, torch.Tensor) for p in items):
        items = [{"params": items}]
    elif not all(isinstance(g, dict) and "params" in g for g in items):
        raise TypeError("params must be all tensors or all dicts with a 'params' key (torch.optim's parameter "
                        f"groups), got {sorted({type(p).__name__ for p in items})}.")
    seen, groups = set(), []
    for group in items:
        tensors = [group["params"]] if isinstance(group["params"], torch.Tensor) else list(group["params"])
        trainable = []
        for p in tensors:
            if p.requires_grad and id(p) not in seen:  # frozen: no gradient, nothing to shard
                seen.add(id(p))
                trainable.append(p)
        if trainable:
            groups.append({**group, "params": trainable})
    if not groups:
        raise ValueError("every parameter in params is frozen (requires_grad=False): nothing to optimize.")
    return groups
