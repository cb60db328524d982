"""Reference solution of labs/01_halving_doubling_lab.ipynb: Rabenseifner's all-reduce from send and receive.

Recursive halving, then recursive doubling (R. Rabenseifner, *Optimization of collective reduction
operations*, ICCS 2004; Thakur, Rabenseifner & Gropp, *Optimization of collective communication
operations in MPICH*, 2005). Lesson 01b's ring sends the bandwidth-optimal 2(n-1)/n of the tensor,
but in 2(n-1) steps one after the other; this algorithm sends the same bytes in 2 log2(n) steps.
For p ranks, p a power of two, with virtual ranks v = 0 .. p-1:

1. **reduce-scatter by recursive halving**, log2 p steps: at distance d = p/2, p/4, ..., 1 a rank
   and its partner v XOR d split the segment they both hold in two halves; each keeps one half,
   sends the other, and adds the half it receives. Every step halves the segment and doubles the
   number of ranks summed into it; afterwards virtual rank v holds segment v, complete;
2. **all-gather by recursive doubling**, the same steps backwards (d = 1, 2, ..., p/2): each rank
   swaps its complete segment for its partner's, so the segment doubles at every step.

When n is not a power of two, p is the largest power of two below n and the rem = n - p extra
ranks are *folded* first, as MPICH does: among ranks 0 .. 2 rem - 1, each even rank sends its
whole tensor to the odd rank after it, which adds it and takes part in the p-rank algorithm; at
the end the odd rank sends the result back. Bytes per rank: 2(p-1)/p of the tensor (plus one
whole tensor each way for a folded pair), in 2 log2 p steps (plus 2).
"""

import torch
import torch.distributed as dist


def _exchange(send_buf, dst, recv_buf, src):
    """Send one buffer and receive another at the same time: post both, then wait on both.

    Empty halves (a tensor with fewer elements than ranks) are skipped on both sides: both ranks
    compute the same bounds, so they agree on what is empty.
    """
    works = []
    if send_buf.numel():
        works.append(dist.isend(send_buf, dst))
    if recv_buf.numel():
        works.append(dist.irecv(recv_buf, src))
    for work in works:
        work.wait()


def halving_doubling_all_reduce(tensor: torch.Tensor) -> None:
    """Sum ``tensor`` (contiguous) over all ranks of the default group, in place, like ``dist.all_reduce``."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return
    flat = tensor.view(-1)  # (numel,), a view: writing into it writes into tensor
    p = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    rem = n - p

    # 0. Fold: even ranks below 2 rem hand their tensor to the odd rank after them and sit out.
    if rank < 2 * rem and rank % 2 == 0:
        dist.send(flat, rank + 1)
        dist.recv(flat, rank + 1)  # ... and get the complete sum back at the very end
        return
    if rank < 2 * rem:
        incoming = torch.empty_like(flat)
        dist.recv(incoming, rank - 1)
        flat.add_(incoming)
    v = rank // 2 if rank < 2 * rem else rank - rem  # this rank's virtual rank among the p
    real = lambda u: 2 * u + 1 if u < rem else u + rem  # the real rank of virtual rank u

    # 1. Reduce-scatter by recursive halving: the segment [lo, hi) shrinks by half at each step.
    lo, hi, parents = 0, flat.numel(), []
    scratch = torch.empty_like(flat[: (flat.numel() + 1) // 2])  # the largest half ever received
    d = p // 2
    while d >= 1:
        mid = lo + (hi - lo + 1) // 2  # the lower half gets the odd element, like tensor_split
        parents.append((lo, hi))
        keep, give = ((lo, mid), (mid, hi)) if v & d == 0 else ((mid, hi), (lo, mid))
        incoming = scratch[: keep[1] - keep[0]]
        _exchange(flat[give[0]:give[1]], real(v ^ d), incoming, real(v ^ d))
        flat[keep[0]:keep[1]].add_(incoming)
        lo, hi = keep
        d //= 2
    # Now flat[lo:hi] is segment v of the sum, complete: the sum over all n ranks.

    # 2. All-gather by recursive doubling: swap complete segments, in the reverse order.
    d = 1
    while d < p:
        plo, phi = parents.pop()
        other = (hi, phi) if lo == plo else (plo, lo)  # the partner's half of the parent segment
        _exchange(flat[lo:hi], real(v ^ d), flat[other[0]:other[1]], real(v ^ d))
        lo, hi = plo, phi
        d *= 2

    # 3. Unfold: give the folded partner its result.
    if rank < 2 * rem:
        dist.send(flat, rank - 1)
