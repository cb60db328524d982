"""Reference solution of labs/14_ring_attention_lab.ipynb: one key block's gradients, recomputed from the output and
the log-sum-exp, as a fused ring attention's backward needs them.

The forward saved, per query, the output o over the whole sequence and the log-sum-exp lse of its scores over the
whole sequence. For one block of keys: the scores s = q k^T / sqrt(d) (the causal triangle masked on a diagonal
block), the block's share of the whole row's softmax P = exp(s - lse) (never larger than 1: nothing overflows),
then the chain rule through o = P v: dv = P^T dout, dP = dout v^T, and through the softmax
dS = P * (dP - D) with D = rowsum(P * dP) over the *whole* row, which one block does not hold; but that sum is
rowsum(dout * o) (o = sum over all keys of P v), which each query does hold. Then dq = dS k / sqrt(d) and
dk = dS^T q / sqrt(d). FlashAttention's backward (Dao et al., arXiv 2205.14135, appendix B.2; FlashAttention-2,
arXiv 2307.08691, algorithm 2, where D_i = rowsum(dO_i * O_i)).
"""

import torch


def block_backward(q, k, v, o, lse, dout, diagonal=False):
    """This block's share of the gradients: dq (.., sq, d) from these keys, dk and dv (.., sk, d) of these keys."""
    scale = q.shape[-1] ** -0.5
    scores = q @ k.transpose(-2, -1) * scale
    if diagonal:  # the same chunk of tokens: a query sees the keys at or before its own place
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    p = torch.exp(scores - lse)  # this block's entries of the whole row's softmax
    dv = p.transpose(-2, -1) @ dout
    dp = dout @ v.transpose(-2, -1)
    d = (dout * o).sum(-1, keepdim=True)  # rowsum(P * dP) over the whole row, from what the query holds
    ds = p * (dp - d)
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv
