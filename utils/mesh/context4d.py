"""Context parallelism as the capstone's fourth mesh dimension (lesson 09a's model, lesson 14's ring).

The capstone (``parallelize3d``) trains a Hugging Face Llama on a ("dp", "pp", "tp") mesh. A fourth dimension,
"cp", splits every sequence across its ranks (the zig-zag layout of lesson 14, so that causal work is balanced);
the mesh is then ("dp", "pp", "cp", "tp"), tp fastest, Llama 3's order. Three things change, and only these:

- **attention**: each layer's attention runs ``utils.context_parallel.ring_attention`` over the cp group, causal,
  on this rank's heads (tp) and tokens (cp). Hugging Face's attention modules call the function registered under
  ``config._attn_implementation`` in its ``AttentionInterface``; ``use_ring_attention`` registers ours and
  points the model's config at it;
- **the batch**: a rank keeps its tokens of each sequence (``shard_batch``), and the rotary embedding is given
  their *global* positions (``positions``), not 0..s/cp-1;
- **gradients**: cp ranks hold the same weights and see different tokens, so their gradients are averaged like
  dp's: FSDP2 shards over the flattened ("dp", "cp") mesh, as torchtitan does. Each rank's loss is the mean over
  its tokens, and every rank holds as many, so the average over dp x cp ranks is the global mean.
"""


from ..context_parallel.ring import positions as _positions
from ..context_parallel.ring import ring_attention, shard

__all__ = ["LAYOUT", "ATTENTION", "ring_attention_forward", "use_ring_attention", "positions", "shard_batch"]

LAYOUT = "zigzag"  # 2 cp chunks of every sequence: rank r holds r and 2cp-1-r (lesson 14)
ATTENTION = "course_ring"  # the name our attention function is registered under in Hugging Face's interface


def ring_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Hugging Face's attention-function signature: (b, heads, s/cp, d) q, k, v -> ((b, s/cp, heads, d), None)."""
    if attention_mask is not None or dropout:
        raise ValueError("ring attention here is causal only, without a mask or dropout: the stage passes neither "
                         f"(got a mask: {attention_mask is not None}, dropout={dropout}).")
    if scaling is not None and abs(scaling - query.shape[-1] ** -0.5) > 1e-12:
        raise ValueError(f"ring_attention scales by 1/sqrt(d) = {query.shape[-1] ** -0.5}, the model asks {scaling}.")
    groups = query.shape[1] // key.shape[1]  # grouped-query attention: each K/V head serves `groups` query heads
    key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
    out = ring_attention(query, key, value, causal=True, layout=LAYOUT, group=module.cp_group)
    return out.transpose(1, 2).contiguous(), None


def use_ring_attention(stage, cp_group):
    """Make every attention layer of ``stage`` (a ``LlamaStage``) run ring attention over ``cp_group``."""
    from transformers import AttentionInterface
    AttentionInterface.register(ATTENTION, ring_attention_forward)  # a global table; registering twice is harmless
    for layer in stage.layers.values():
        layer.self_attn.cp_group = cp_group
        layer.self_attn.config._attn_implementation = ATTENTION  # the config the layers share with the model


def positions(cp_rank, cp, seq_len):
    """Global positions of this cp rank's tokens, (s/cp,): what the rotary embedding must see."""
    return _positions(cp_rank, cp, seq_len, LAYOUT)


def shard_batch(x, y, cp_rank, cp):
    """This cp rank's tokens of the (b, s) inputs and targets (the zig-zag chunks, along the sequence)."""
    return tuple(shard(t, cp_rank, cp, LAYOUT, dim=1) for t in (x, y)) if cp > 1 else (x, y)
