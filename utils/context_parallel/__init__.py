"""Context parallelism: attention over a sequence split across ranks (notebook 14).

- ``ring``: ring attention from scratch (K/V passed around the ring, the online-softmax ``merge``, causal masking,
  the contiguous and zig-zag layouts, ``causal_work``), Liu et al., arXiv 2310.01889.
- ``ulysses``: DeepSpeed-Ulysses from scratch (all-to-all from sequence to head sharding and back), arXiv 2309.14509.
"""

from .ring import causal_work, check_sequence, merge, positions, ring_attention, shard, unshard
from .ulysses import check_heads, ulysses_attention

__all__ = ["ring_attention", "merge", "check_sequence", "positions", "shard", "unshard", "causal_work",
           "ulysses_attention", "check_heads"]
