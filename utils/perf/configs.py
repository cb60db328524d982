"""The course's Llama models built from one description: the planner's ``ModelShape`` (lessons 08d and 09).

``llama_shape`` writes a Llama-style ``ModelShape`` (tied embedding, gated MLP, RMSNorm, no biases, RoPE, no
dropout); ``llama_config`` turns any such shape into Hugging Face's ``LlamaConfig``. The model a lesson times and the
FLOPs its MFU counts (``utils.planner.flops_per_token``) then come from the same object, so they cannot disagree.
Lesson 09's capstone (``utils.mesh.parallelize3d.SHAPE``) has an MLP of 2h; the MFU benchmarks of lessons 08d and 09b
keep Llama's own 8h/3 (three h x 8h/3 matrices: GPT-2's 8h^2 MLP parameters).
"""

from __future__ import annotations

from ..planner import ModelShape

__all__ = ["llama_shape", "llama_config"]


def llama_shape(layers, hidden, heads, vocab, seq, ffn_hidden=None) -> ModelShape:
    """The planner's shape of a tied-embedding Llama; its MLP is 3 matrices of h x ``ffn_hidden`` (default 8h/3)."""
    return ModelShape(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq,
                      ffn_hidden=8 * hidden // 3 if ffn_hidden is None else ffn_hidden, tied_embeddings=True,
                      gated_mlp=True, norm="rmsnorm", biases=False, positions="rope", dropout=False)


def llama_config(shape: ModelShape, attn_implementation="sdpa"):
    """Hugging Face's ``LlamaConfig`` of ``shape`` (random weights when built: no download). Refuses a shape a Llama
    cannot be (a GPT-style MLP, LayerNorm, biases, learned positions, dropout, experts), naming the field."""
    from transformers import LlamaConfig  # heavy import: only when a model is built
    llama = dict(gated_mlp=True, norm="rmsnorm", biases=False, positions="rope", dropout=False, n_experts=0)
    wrong = {k: getattr(shape, k) for k, v in llama.items() if getattr(shape, k) != v}
    if wrong:
        raise ValueError(f"a Llama has {', '.join(f'{k}={llama[k]!r}' for k in wrong)}; this shape has "
                         f"{', '.join(f'{k}={v!r}' for k, v in wrong.items())}: build it with llama_shape().")
    # sdpa: torch's fused attention, causal when no mask is given; "eager": matmul + softmax, its scores kept
    return LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.ffn_hidden,
                       num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                       num_key_value_heads=shape.kv_heads, max_position_embeddings=shape.seq_len,
                       tie_word_embeddings=shape.tied_embeddings, attn_implementation=attn_implementation)
