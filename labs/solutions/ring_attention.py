"""Reference solution of labs/14_ring_attention_lab.ipynb: the online-softmax merge and the causal block rule of ring
attention.

``merge``: two partial attention results over disjoint key blocks, each a normalised output o (.., sq, d) and its
log-sum-exp l (.., sq, 1), combine exactly: l = log(e^l1 + e^l2), computed as m + log(e^(l1-m) + e^(l2-m)) with
m = max(l1, l2) so that no exponential overflows, and o = o1 e^(l1-l) + o2 e^(l2-l), each output weighted by the
share of the softmax mass its block holds (FlashAttention's blockwise softmax, Dao et al., arXiv 2205.14135).

``causal_block``: which part of a (query chunk, key chunk) pair a causal mask keeps. Contiguous: rank r holds
chunk r; zig-zag: 2n chunks, rank r holds chunks r (part 0) and 2n-1-r (part 1). Query chunk i sees key chunk j
fully when i > j, its lower triangle when i = j, nothing when i < j.
"""

import torch


def merge(o1, l1, o2, l2):
    """(o1, l1) and (o2, l2), over two disjoint key blocks -> (o, l) over both."""
    m = torch.maximum(l1, l2)
    l = m + torch.log(torch.exp(l1 - m) + torch.exp(l2 - m))  # noqa: E741
    return o1 * torch.exp(l1 - l) + o2 * torch.exp(l2 - l), l


def causal_block(q_rank, q_part, k_rank, k_part, world_size, layout):
    """"full", "diagonal" or "skip": what the causal mask keeps of rank q_rank's chunk q_part x k_rank's k_part."""
    def chunk(rank, part):
        return rank if layout == "contiguous" else (rank if part == 0 else 2 * world_size - 1 - rank)

    i, j = chunk(q_rank, q_part), chunk(k_rank, k_part)
    return "full" if i > j else "diagonal" if i == j else "skip"
