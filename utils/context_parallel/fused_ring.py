"""Ring attention whose backward recomputes each block from the output and the log-sum-exp (lab 14).

``ring_attention`` (``ring.py``) leaves backward to autograd, which keeps every step's score block: s/n x s per rank
over the ring. A fused ring, as FlashAttention does inside one GPU and Ring Attention across GPUs, keeps only q, k,
v, the output and each query's log-sum-exp over the whole sequence, and in backward passes the K/V blocks around the
ring again, with an accumulator of their gradients dK, dV travelling beside them: at each step a rank computes one
block's gradients from what it holds, adds its dq and the block's dK, dV, and passes K, V, dK, dV on. After n steps
every block has met every query; one more pass brings each block's dK, dV home.

What one block's gradients are, from (q, k, v, the output, the log-sum-exp, the output's gradient), is lab 14's
task: ``block_backward`` is an argument here, and nothing in the course computes it. Forward is the lesson's ring.

Bytes per rank in backward: K and V n-1 times and dK, dV n times, 2·b·h·(s/n)·d values each pass, as torch's
``_templated_ring_attention_backward`` sends (lesson 14, "Bytes on the wire").
"""

import torch
import torch.distributed as dist

from .ring import _block_kind, _chunks, pass_on, ring_attention

__all__ = ["FusedRingAttention", "fused_ring_attention"]


class FusedRingAttention(torch.autograd.Function):
    """Forward: the lesson's ring, saving q, k, v, the output and the log-sum-exp only. Backward: the K/V blocks and
    their gradient accumulators around the ring, ``block_backward`` on each (query chunk, key chunk) pair."""

    @staticmethod
    def forward(ctx, q, k, v, block_backward, causal, layout, group):
        out, lse = ring_attention(q, k, v, causal=causal, layout=layout, group=group, with_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block_backward, ctx.causal, ctx.layout, ctx.group = block_backward, causal, layout, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, layout = ctx.group, ctx.layout
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        parts = _chunks(n, layout) // n  # chunks per rank: 1 contiguous, 2 zig-zag
        c = q.shape[-2] // parts  # tokens per chunk
        mine = [t.split(c, dim=-2) for t in (q, out, lse, dout.contiguous())]  # my chunks' q, o, lse, dout
        dq = [torch.zeros_like(chunk) for chunk in mine[0]]
        kv = torch.stack([k, v])  # the block that travels, as in forward
        dkv = torch.zeros_like(kv)  # its gradient, accumulated by every rank it visits
        for step in range(n):
            if step:
                kv, dkv = pass_on(kv, +1, group), pass_on(dkv, +1, group)
            src = (rank - step) % n  # the rank whose block this is
            for i in range(parts):
                for j in range(parts):
                    kind = _block_kind(rank, i, src, j, n, layout, ctx.causal)
                    if kind == "skip":
                        continue
                    keys = slice(j * c, (j + 1) * c)
                    q_i, o_i, lse_i, dout_i = (t[i] for t in mine)
                    gq, gk, gv = ctx.block_backward(q_i, kv[0, ..., keys, :], kv[1, ..., keys, :], o_i, lse_i,
                                                    dout_i, diagonal=kind == "diagonal")
                    dq[i] = dq[i] + gq
                    dkv[0, ..., keys, :] += gk
                    dkv[1, ..., keys, :] += gv
        if n > 1:
            dkv = pass_on(dkv, +1, group)  # I hold rank (rank + 1)'s block: its gradient goes home
        return torch.cat(dq, dim=-2), dkv[0], dkv[1], None, None, None, None


def fused_ring_attention(q, k, v, block_backward, causal=False, layout="contiguous", group=None):
    """``ring_attention``'s output, with the fused backward above. ``block_backward(q, k, v, o, lse, dout,
    diagonal=False) -> (dq, dk, dv)``: one block's share of the gradients (lab 14). The other arguments are
    ``ring_attention``'s."""
    return FusedRingAttention.apply(q, k, v, block_backward, causal, layout, group)
