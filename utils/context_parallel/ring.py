"""Ring attention from scratch: a sequence split across ranks, K/V passed around the ring (notebook 14).

Each rank holds the queries, keys and values of its own tokens, (b, heads, s/n, d). Attention needs every key for
every query, so the K/V block travels: n steps, and at each one a rank attends its queries to the block it holds,
then passes that block to the next rank (``RingPass``, n-1 sends per forward). The partial results are merged with
the *online softmax* (``merge``): a block's output is kept normalised together with its log-sum-exp, and two of
them combine exactly, in any order. That is Ring Attention (Liu, Zaharia, Abbeel, arXiv 2310.01889) built on the
blockwise softmax of FlashAttention (Dao et al., arXiv 2205.14135).

Causal masking makes the naive *contiguous* split lopsided (rank 0's queries see one block, the last rank's see
all); the *zig-zag* split (``layout="zigzag"``: 2n chunks, rank r holds chunks r and 2n-1-r, as Llama 3 does and
torch's ``_HeadTailLoadBalancer``) gives every rank the same work. ``causal_work`` is the formula, ``stats`` the
measurement.

Backward is autograd's: each ``RingPass`` sends the gradient of the block it received back to the rank that sent
it, so dK and dV travel the ring the other way. This keeps the lesson's code short; it also means autograd keeps
every step's score block, s/n x s per rank over the ring. ``utils.context_parallel.fused_ring`` keeps only the
output and the log-sum-exp instead, and recomputes each block in backward (lab 14 writes the block's gradients).
"""

import math

import torch
import torch.distributed as dist

from ..comm.p2p import sendrecv

__all__ = ["LAYOUTS", "check_sequence", "chunk_ids", "positions", "shard", "unshard", "block_attention", "merge",
           "RingPass", "pass_on", "ring_attention", "causal_work"]

LAYOUTS = ("contiguous", "zigzag")


def _chunks(world_size, layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}.")
    return world_size if layout == "contiguous" else 2 * world_size


def check_sequence(seq_len, world_size, layout="contiguous"):
    """Refuse at once a sequence that does not cut into whole chunks: n for contiguous, 2n for zig-zag."""
    parts = _chunks(world_size, layout)
    if seq_len % parts:
        lower, upper = seq_len - seq_len % parts, seq_len - seq_len % parts + parts
        how = f"2 x {world_size} = {parts} chunks" if layout == "zigzag" else f"{parts} chunks, one per rank"
        raise ValueError(f"sequence length {seq_len} does not split into {how} ({layout} layout on {world_size} "
                         f"ranks): {seq_len} = {seq_len // parts} x {parts} + {seq_len % parts}; pad or cut it to "
                         f"{lower or parts} or {upper}.")
    return seq_len // parts  # tokens per chunk


def chunk_ids(rank, world_size, layout="contiguous"):
    """Which of the sequence's chunks rank holds, in the order it holds them."""
    _chunks(world_size, layout)
    return [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]


def positions(rank, world_size, seq_len, layout="contiguous"):
    """The global token indices rank holds: (s/n,) int64."""
    c = check_sequence(seq_len, world_size, layout)
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in chunk_ids(rank, world_size, layout)])


def shard(x, rank, world_size, layout="contiguous", dim=-2):
    """This rank's tokens of a full tensor (sequence along ``dim``)."""
    return x.index_select(dim, positions(rank, world_size, x.shape[dim], layout).to(x.device))


def unshard(pieces, layout="contiguous", dim=-2):
    """The full tensor from every rank's piece (a list ordered by rank): tokens back in sequence order."""
    n, s = len(pieces), sum(p.shape[dim] for p in pieces)
    order = torch.cat([positions(r, n, s, layout) for r in range(n)])
    return torch.cat(pieces, dim).index_select(dim, torch.argsort(order).to(pieces[0].device))


def block_attention(q, k, v, diagonal=False, scale=None):
    """Attention of q to one block of keys: the block's normalised output and its log-sum-exp per query.

    q: (b, heads, sq, d), k and v: (b, heads, sk, d). ``diagonal``: q and k are the same chunk of tokens, so the causal
    mask is the chunk's lower triangle (every query sees at least itself: no row is fully masked).
    """
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale  # (b, heads, sq, sk): the only s x s-like tensor, one block of it
    if diagonal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # (b, heads, sq, 1)
    return torch.exp(scores - lse) @ v, lse  # softmax over this block only, times v


def merge(acc, new):
    """Online softmax: two (output, log-sum-exp) pairs over disjoint key blocks -> the pair over both, exactly.

    acc, new: (output (..., sq, d), log-sum-exp (..., sq, 1)); acc None (nothing merged yet) returns new. The result
    is the output and log-sum-exp of both blocks' scores together: each output re-weighted by the share of the
    softmax mass its block holds. Exact in any order of the blocks, and finite at any scores: ``logaddexp`` never
    forms e^l, and each weight e^(l_i - lse) lies in [0, 1] (tests/test_context_parallel.py tests it).
    """
    if acc is None:
        return new
    (o1, l1), (o2, l2) = acc, new
    lse = torch.logaddexp(l1, l2)
    return o1 * torch.exp(l1 - lse) + o2 * torch.exp(l2 - lse), lse


class RingPass(torch.autograd.Function):
    """Send my block to the next rank, receive the previous rank's; backward sends the gradient the other way.

    ``group``: the ring's ranks (default: all of them); next and previous are taken in the group's order."""

    @staticmethod
    def forward(ctx, block, group=None):
        ctx.group = group
        return pass_on(block, +1, group)

    @staticmethod
    def backward(ctx, grad):
        return pass_on(grad, -1, ctx.group), None  # to my sender


def pass_on(block, offset, group=None):
    """One step of the ring: send ``block`` ``offset`` places along it (+1: the next rank), receive as much from the
    rank ``offset`` places back; returns what was received."""
    received = torch.empty_like(block)
    sendrecv(block.contiguous(), _peer(group, offset), received, _peer(group, -offset), group)
    return received


def _peer(group, offset):
    """The global rank ``offset`` places along ``group``'s ring from this rank."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    peer = (rank + offset) % n
    return peer if group is None else dist.get_global_rank(group, peer)


def _pair(q_chunk, k_chunk, causal):
    """What a (query chunk, key chunk) pair needs: "full", "diagonal" (causal triangle) or "skip" (all masked)."""
    if not causal or q_chunk > k_chunk:
        return "full"
    return "diagonal" if q_chunk == k_chunk else "skip"


def _block_kind(q_rank, q_part, k_rank, k_part, world_size, layout, causal=True):
    """``_pair`` of q_rank's chunk q_part and k_rank's chunk k_part."""
    return _pair(chunk_ids(q_rank, world_size, layout)[q_part], chunk_ids(k_rank, world_size, layout)[k_part], causal)


def ring_attention(q, k, v, causal=False, layout="contiguous", stats=None, group=None, with_lse=False):
    """Attention of this rank's queries to the whole sequence, K/V passed around the ring n-1 times.

    q, k, v: (b, heads, s/n, d), this rank's tokens in ``layout`` order (``shard``). Returns (b, heads, s/n, d), and
    with ``with_lse`` also each query's log-sum-exp over the whole sequence, (b, heads, s/n, 1). ``stats``, a dict,
    receives what was computed: steps, score entries per step and in all, unmasked entries (per batch element and
    head). ``group``: the ranks that share the sequence (a mesh's "cp" dimension; default all ranks), ranked in the
    group's order.
    """
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    parts = _chunks(n, layout) // n  # chunks per rank: 1 contiguous, 2 zig-zag
    c = q.shape[-2] // parts  # tokens per chunk
    check_sequence(c * _chunks(n, layout), n, layout)
    q_chunks = q.split(c, dim=-2)
    acc = [None] * parts
    kv = torch.stack([k, v])  # (2, b, heads, s/n, d): K and V travel as one message
    computed, unmasked, per_step = 0, 0, []
    for step in range(n):
        if step:
            kv = RingPass.apply(kv, group)  # now holding the block of rank (rank - step) mod n
        src = (rank - step) % n  # the rank whose K/V block this is
        step_entries = 0
        for i in range(parts):
            for j in range(parts):
                kind = _block_kind(rank, i, src, j, n, layout, causal)  # full, diagonal or skip
                if kind == "skip":
                    continue
                block = block_attention(q_chunks[i], kv[0, ..., j * c:(j + 1) * c, :],
                                        kv[1, ..., j * c:(j + 1) * c, :], diagonal=kind == "diagonal")
                acc[i] = merge(acc[i], block)
                step_entries += c * c
                unmasked += c * c if kind == "full" else c * (c + 1) // 2
        computed += step_entries
        per_step.append(step_entries)
    out = torch.cat([o for o, _ in acc], dim=-2)
    if n > 1:
        # A rank that used none of its last block must still relay the gradients of the others' blocks in
        # backward: tie the block to the output with weight 0, so autograd runs every RingPass on every rank.
        out = out + 0 * kv.sum()
    if stats is not None:
        stats.update(steps=n, passes=n - 1, per_step=per_step, computed=computed, unmasked=unmasked,
                     largest_block=max((c * c if e else 0) for e in per_step))
    return (out, torch.cat([lse for _, lse in acc], dim=-2)) if with_lse else out


def causal_work(seq_len, world_size, layout="contiguous"):
    """Unmasked score entries (query-key pairs) per rank under a causal mask, by formula: a list by rank.

    Chunk i (c tokens) sees i full chunks and its own triangle: i c^2 + c(c+1)/2.
    """
    c = check_sequence(seq_len, world_size, layout)
    return [sum(i * c * c + c * (c + 1) // 2 for i in chunk_ids(r, world_size, layout)) for r in range(world_size)]
