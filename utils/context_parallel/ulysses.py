"""DeepSpeed-Ulysses from scratch: re-shard attention from the sequence to the heads and back (notebook 14).

Jacobs et al., "DeepSpeed Ulysses" (arXiv 2309.14509). Each rank holds its s/n tokens of every head. One
all-to-all per tensor turns that into *all* s tokens of h/n heads; attention is then ordinary, whole-sequence
attention on those heads (any kernel, any mask: heads are independent); one all-to-all turns the output back into
s/n tokens of every head. Forward: 4 all-to-alls (Q, K, V, output) of one rank's (b, h, s/n, d) tensor each;
backward: the same 4 in reverse (the all-to-all's gradient is the all-to-all the other way).

The paper's count (section 3.2): an all-to-all of an aggregate message M over P GPUs moves M/P per link; Q, K, V
(3Nh) and the output (Nh) give 4Nh/P per link, per layer, which stays constant when N and P grow together. The
limit: a rank must hold whole heads, so n must divide the head count (``check_heads``).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..comm import compat

__all__ = ["check_heads", "AllToAll", "seq_to_heads", "heads_to_seq", "ulysses_attention"]


def check_heads(heads, world_size):
    """Refuse at once a head count that ``world_size`` ranks cannot share in whole heads."""
    if heads % world_size:
        fits = [n for n in range(2, heads + 1) if heads % n == 0][:6]
        raise ValueError(f"{heads} attention heads do not divide among {world_size} ranks ({heads} = "
                         f"{heads // world_size} x {world_size} + {heads % world_size}): Ulysses gives each rank whole "
                         f"heads; use {', '.join(map(str, fits))} ranks, or ring attention, which splits the sequence "
                         f"only.")
    return heads // world_size


class AllToAll(torch.autograd.Function):
    """Cut ``x`` into n pieces along ``scatter_dim``, send piece j to rank j, join what arrives along ``gather_dim``."""

    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim):
        ctx.dims = scatter_dim, gather_dim
        n = dist.get_world_size()
        inputs = [piece.contiguous() for piece in x.chunk(n, dim=scatter_dim)]
        outputs = [torch.empty_like(inputs[0]) for _ in range(n)]  # every piece has the same shape
        compat.all_to_all(outputs, inputs)  # through the module: the ledger sees it
        return torch.cat(outputs, dim=gather_dim)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return AllToAll.apply(grad, gather_dim, scatter_dim), None, None  # the same exchange, the other way


def seq_to_heads(x):
    """(b, h, s/n, d), my tokens of every head -> (b, h/n, s, d), every token of my heads."""
    check_heads(x.shape[1], dist.get_world_size())
    return AllToAll.apply(x, 1, 2)


def heads_to_seq(x):
    """(b, h/n, s, d) -> (b, h, s/n, d): back to my tokens of every head."""
    return AllToAll.apply(x, 2, 1)


def ulysses_attention(q, k, v, causal=False):
    """Attention for this rank's tokens (contiguous split), q, k, v: (b, h, s/n, d) -> (b, h, s/n, d)."""
    check_heads(q.shape[1], dist.get_world_size())
    q, k, v = seq_to_heads(q), seq_to_heads(k), seq_to_heads(v)  # (b, h/n, s, d) each: 3 all-to-alls
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # whole sequence, local heads
    return heads_to_seq(out)  # the 4th all-to-all
