"""Context parallelism: attention over a sequence split across ranks (notebook 14).

- ``ring``: ring attention from scratch (K/V passed around the ring, the online-softmax ``merge``, causal masking,
  the contiguous and zig-zag layouts, ``causal_work``), Liu et al., arXiv 2310.01889.
- ``fused_ring``: the same ring with a backward that keeps only the output and the log-sum-exp and recomputes each
  block (lab 14 writes the block's gradients).
- ``ulysses``: DeepSpeed-Ulysses from scratch (all-to-all from sequence to head sharding and back), arXiv 2309.14509.
"""

from .fused_ring import fused_ring_attention
from .ring import causal_work, check_sequence, merge, positions, ring_attention, shard, unshard
from .ulysses import check_heads, ulysses_attention

__all__ = ["ring_attention", "fused_ring_attention", "merge", "check_sequence", "positions", "shard", "unshard",
           "causal_work", "ulysses_attention", "check_heads"]
