"""Reference solution of labs/03_zero_lab.ipynb: the sharded optimizer step of ZeRO-1 and ZeRO-2.

ZeRO (Rajbhandari et al., arXiv 1910.02054) keeps data parallelism's replicated forward and
backward but splits the *optimizer step*: the flat vector of Ψ trainable parameters is cut into n
shards, rank r updates only shard r and keeps Adam's state only for it, then the updated shards
are all-gathered so every replica is whole again.

- **ZeRO-1** (P_os, optimizer state partitioned): all-reduce the gradient as DDP does, update the
  own shard, all-gather the parameters. Bytes per rank: 2(n-1)/n + (n-1)/n = 3(n-1)/n x 4Ψ.
- **ZeRO-2** (P_os+g, gradients too): a rank needs the summed gradient of its own shard only, so a
  reduce-scatter replaces the all-reduce (an all-reduce *is* a reduce-scatter followed by an
  all-gather): 2(n-1)/n x 4Ψ, exactly DDP's bill, and only Ψ/n gradient elements kept.

Shards use the **padded layout**: s = ceil(Ψ / n) elements per rank, rank r owns [r s, (r+1) s)
clipped to Ψ. The collectives move n equal pieces of s elements, from a buffer padded with zeros
to s n elements (at most n-1 padding elements); the parameter vector itself is never padded.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from utils import compat  # all_gather_single / reduce_scatter_single on torch 2.11-2.13
from utils.adam import adam_update


def shard_bounds(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of the flat vector that ``rank`` owns: pieces of ceil(numel / n), clipped."""
    size = -(-numel // world_size)  # ceil without floats
    start = min(rank * size, numel)
    return start, min(start + size, numel)


def _gather_parameters(flat_param):
    """Every rank sends its (updated) shard, padded to s elements; every rank receives all of them."""
    rank, n, numel = dist.get_rank(), dist.get_world_size(), flat_param.numel()
    start, stop = shard_bounds(numel, rank, n)
    size = -(-numel // n)
    shard = flat_param.new_zeros(size)  # (s,): a short or empty last shard is padded with zeros
    shard[: stop - start] = flat_param[start:stop]
    gathered = flat_param.new_empty(size * n)  # (s * n,)
    compat.all_gather_single(gathered, shard)  # dist.all_gather_single on torch 2.13
    flat_param.copy_(gathered[:numel])  # drop the padding


def zero1_step(flat_param: torch.Tensor, flat_grad: torch.Tensor, state: dict, lr: float) -> None:
    """ZeRO-1: all-reduce the gradient, Adam on this rank's shard only, all-gather the parameters."""
    rank, n = dist.get_rank(), dist.get_world_size()
    start, stop = shard_bounds(flat_param.numel(), rank, n)
    dist.all_reduce(flat_grad)  # the sum over ranks, everywhere (we only use our shard of it)
    flat_grad /= n  # ... the mean: the gradient of the global batch's loss
    adam_update(flat_param[start:stop], flat_grad[start:stop], state, lr=lr)  # state: 8 bytes x Ψ/n
    _gather_parameters(flat_param)


def zero2_step(flat_param: torch.Tensor, flat_grad: torch.Tensor, state: dict, lr: float) -> None:
    """ZeRO-2: reduce-scatter the gradient (each rank gets its shard's sum), Adam on it, all-gather."""
    rank, n, numel = dist.get_rank(), dist.get_world_size(), flat_param.numel()
    start, stop = shard_bounds(numel, rank, n)
    size = -(-numel // n)
    padded = F.pad(flat_grad, (0, size * n - numel))  # (s * n,): n equal pieces
    grad_shard = flat_grad.new_empty(size)  # (s,): this rank's piece of the sum
    compat.reduce_scatter_single(grad_shard, padded)  # a SUM of each rank's piece
    grad_shard /= n
    adam_update(flat_param[start:stop], grad_shard[: stop - start], state, lr=lr)
    _gather_parameters(flat_param)
