"""Reference solutions of labs 01a and 01b: Rabenseifner's all-reduce from send and receive, in two halves.

Recursive halving, then recursive doubling (R. Rabenseifner, *Optimization of collective reduction
operations*, ICCS 2004; Thakur, Rabenseifner & Gropp, *Optimization of collective communication
operations in MPICH*, 2005). Lesson 01b's ring sends the bandwidth-optimal 2(n-1)/n of the tensor,
but in 2(n-1) steps one after the other; this algorithm sends the same bytes in 2 log2(n) steps.
The flat tensor is cut into p chunks as ``torch.tensor_split`` cuts it (MPICH's layout too); a rank
holds a *range* of chunks [a, b), at first all of them. With p = 2^k ranks, virtual ranks v = 0 .. p-1:

1. **reduce-scatter by recursive halving** (lab 01a), log2 p steps: at distance d = p/2, p/4, ..., 1
   a rank and its partner v XOR d hold the same range; the one whose bit d is clear keeps the lower
   half and sends the upper, the other the opposite; each adds the half it receives. Afterwards
   virtual rank v holds chunk v of the sum;
2. **all-gather by recursive doubling** (lab 01b), the same steps backwards (d = 1, 2, ..., p/2):
   each rank swaps the range it holds, chunks [v - v mod d, + d), for its partner's, so the range doubles.

When n is not a power of two (lab 01b), p is the largest power of two below n and the rem = n - p
extra ranks are *folded* first, as MPICH does: among ranks 0 .. 2 rem - 1, each even rank sends its
whole tensor to the odd rank after it, which adds it and takes part in the p-rank algorithm; at the
end the odd rank sends the result back. Bytes per rank: 2(p-1)/p of the tensor (plus one whole
tensor each way for a folded pair), in 2 log2 p steps (plus 2).
"""

import torch
import torch.distributed as dist

from utils.comm.p2p import sendrecv
from utils.comm.subgroup import chunk_bounds, reduce_scatter_chunks


def halving_reduce_scatter(tensor: torch.Tensor) -> None:
    """Lab 01a. On p = 2^k ranks, sum ``tensor`` (contiguous) in place so that afterwards rank v holds
    chunk v of ``tensor.view(-1).tensor_split(p)`` of the sum (its other elements: partial sums)."""
    v, p = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)  # (numel,), a view: writing into it writes into tensor
    bounds = chunk_bounds(flat.numel(), p)  # chunk c is flat[bounds[c]:bounds[c + 1]]
    scratch = torch.empty_like(flat[: bounds[p // 2]])  # the largest half ever received: chunks [0, p/2)
    a, b, d = 0, p, p // 2  # this rank holds chunks [a, b)
    while d >= 1:
        c = (a + b) // 2  # the two halves: chunks [a, c) and [c, b)
        keep, give = ((a, c), (c, b)) if v & d == 0 else ((c, b), (a, c))
        mine, theirs = flat[bounds[keep[0]]:bounds[keep[1]]], flat[bounds[give[0]]:bounds[give[1]]]
        incoming = scratch[: mine.numel()]
        sendrecv(theirs, v ^ d, incoming, v ^ d)  # isend + irecv, then wait on both; empty halves skipped
        mine.add_(incoming)
        (a, b), d = keep, d // 2
    # now [a, b) = [v, v + 1): chunk v, summed over all p ranks


def doubling_all_gather(tensor: torch.Tensor, ranks) -> None:
    """Lab 01b. Among the ranks ``ranks`` (p = 2^k of them, ``ranks[v]`` is virtual rank v): on entry rank
    ranks[v] holds chunk v of ``tensor.view(-1).tensor_split(p)``; on exit every chunk, on every one of them."""
    p, v = len(ranks), list(ranks).index(dist.get_rank())
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), p)
    d = 1
    while d < p:
        a = v - v % d  # this rank holds chunks [a, a + d), its partner the d chunks beside them
        b = a ^ d  # = (v ^ d) - (v ^ d) % d
        mine, theirs = flat[bounds[a]:bounds[a + d]], flat[bounds[b]:bounds[b + d]]
        sendrecv(mine, ranks[v ^ d], theirs, ranks[v ^ d])  # what arrives is final: straight into place
        d *= 2


def halving_doubling_all_reduce(tensor: torch.Tensor, reduce_scatter=reduce_scatter_chunks) -> None:
    """Lab 01b. Sum ``tensor`` over all ranks, in place, like ``dist.all_reduce``: fold the ranks beyond the
    largest power of two, ``reduce_scatter(tensor, ranks)`` and ``doubling_all_gather`` among the p, unfold."""
    rank, n = dist.get_rank(), dist.get_world_size()
    p = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    rem = n - p
    flat = tensor.view(-1)
    # 0. Fold: even ranks below 2 rem hand their tensor to the odd rank after them and sit out.
    if rank < 2 * rem and rank % 2 == 0:
        dist.send(flat, rank + 1)
        dist.recv(flat, rank + 1)  # ... and get the complete sum back at the very end
        return
    if rank < 2 * rem:
        incoming = torch.empty_like(flat)
        dist.recv(incoming, rank - 1)
        flat.add_(incoming)
    ranks = [2 * u + 1 if u < rem else u + rem for u in range(p)]  # ranks[v]: the real rank of virtual rank v
    # 1. reduce-scatter among the p, 2. all-gather among the p
    reduce_scatter(tensor, ranks)
    doubling_all_gather(tensor, ranks)
    # 3. Unfold: give the folded partner its result.
    if rank < 2 * rem:
        dist.send(flat, rank - 1)
