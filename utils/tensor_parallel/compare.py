"""Does a tensor-parallel model compute the same function as the unsplit one? Outputs *and* every gradient.

Derived in notebooks/05a_tensor_parallelism.ipynb (part 1 of lesson 05) and used again, on token shards, in
notebooks/05b_dtensor_and_sequence_parallelism.ipynb. Called on every rank of a tensor-parallel group: both models run
forward and backward on the same input, and the outputs, the gradient of the input and the gradient of every
parameter are compared with the matching slice of the full model's (``full_slice``; replicated parameters whole).
Tolerance: float32 sums taken in a different order (t partial sums instead of one), ``rtol=1e-5, atol=1e-5``.
"""

import torch
import torch.distributed as dist

__all__ = ["full_slice", "compare"]


def full_slice(full_param, tp_param, rank, t):
    """The part of a full parameter (or its gradient) that a tensor-parallel rank holds."""
    for dim, (a, b) in enumerate(zip(full_param.shape, tp_param.shape)):
        if a != b:
            return full_param.chunk(t, dim=dim)[rank]
    return full_param  # replicated: LayerNorms, row-parallel biases


def compare(full, parallel, x, shard=lambda t: t, grad_hook=lambda model: None):
    """Forward and backward both models; max |diff| of outputs, input grads and parameter grads."""
    rank, t = dist.get_rank(), dist.get_world_size()
    x_full, x_par = x.clone().requires_grad_(), shard(x).clone().requires_grad_()
    y_full = full(x_full)
    y_full.square().mean().backward()
    y_par = parallel(x_par)
    (y_par.square().sum() / y_full.numel()).backward()  # the same loss (sequence shards: its share)
    grad_hook(parallel)  # sequence parallelism (05b): LayerNorm gradients are summed over the ranks here
    pairs = [("output", y_par, shard(y_full)), ("input grad", x_par.grad, shard(x_full.grad))]
    pairs += [(name, p.grad, full_slice(q.grad, p, rank, t))
              for (name, p), q in zip(parallel.named_parameters(), full.parameters())]
    diffs = {}
    for name, got, expected in pairs:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
        diffs[name] = (got - expected).abs().max().item()
    return diffs
