"""Activation recomputation run, not only modelled: no checkpointing, full and selective, on the capstone's layers
(lesson 09c, ``notebooks/09c_activation_recompute.ipynb``, derives each piece). It sits beside ``activation_memory``:
that module measures what autograd keeps for backward, this one keeps less of it and recomputes the rest.

- ``MODES``: "none" (autograd keeps what each op saves), "full" (``torch.utils.checkpoint``, non-reentrant: keep
  the layer's input, replay its forward in backward), "selective" (the same checkpoint with a policy from
  ``create_selective_checkpoint_contexts``: keep the outputs of the matrix multiplications, ``SAVED_OPS``;
  recompute the rest: norms, RoPE, attention's scores and softmax, the MLP's activation);
- ``run_layers``: layers in sequence under one mode; ``kept_per_layer``: the bytes the forward keeps for backward,
  per layer, by op (``utils.sharding.activation_memory.KeptBytes``); ``step_flops``: forward + backward FLOPs,
  recomputation included (``torch.utils.flop_counter.FlopCounterMode``); ``grads``: the parameters' gradients;
- ``matmul_output_bytes``: the formula for what the selective policy keeps, from the model's shape (a
  ``utils.planner.ModelShape``, read here by its fields: the planner imports ``utils.sharding``, so this module
  does not import the planner back).
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .activation_memory import KeptBytes

__all__ = ["MODES", "SAVED_OPS", "save_matmuls", "run_layers", "kept_per_layer", "step_flops", "grads",
           "matmul_output_bytes"]

MODES = ("none", "full", "selective")
aten = torch.ops.aten
# nn.Linear reaches the kernels as a 2-D matmul (aten.linear -> matmul -> mm, or addmm with a bias). Attention's
# two batched matmuls (bmm, or the fused sdpa kernel) are left out on purpose: their s x s scores are what
# selective recomputation exists to drop (Korthikanti et al. 2022, Sec. 5).
SAVED_OPS = (aten.mm.default, aten.addmm.default)


def save_matmuls(ctx, op, *args, **kwargs):
    """The selective policy: keep a linear layer's output, recompute every other op in backward."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _one(layer, h, mode, kwargs):
    if mode == "none":
        return layer(h, **kwargs)
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: use one of {MODES}.")
    context_fn = {} if mode == "full" else {
        "context_fn": functools.partial(create_selective_checkpoint_contexts, save_matmuls)}
    return checkpoint(layer, h, use_reentrant=False, **context_fn, **kwargs)


def run_layers(layers, x, mode, meter=None, **kwargs):
    """``layers`` one after the other on ``x`` (b, s, h), each under ``mode``; ``kwargs`` go to every layer (a
    Llama layer's ``position_embeddings``). ``meter`` (a ``KeptBytes``) is tagged with each layer's index."""
    # a new tensor that needs a gradient, as an embedding's output does: the first layer keeps what the others do
    h = x.detach().requires_grad_() * 1.0
    for i, layer in enumerate(layers):
        if meter is not None:
            meter.tag = i
        h = _one(layer, h, mode, kwargs)
    return h  # (b, s, h)


def kept_per_layer(layers, x, mode, **kwargs):
    """(bytes kept for backward per layer, [(bytes, op, shape, dtype, layer)] of the last layer, output).

    Per layer: all kept bytes / number of layers (a layer's input is made by the layer before, or by
    ``run_layers`` for the first; the last output is left out: the caller holds it anyway)."""
    meter = KeptBytes()
    with meter:
        out = run_layers(layers, x, mode, meter, **kwargs)
    kept = meter.kept(exclude=[out])
    last = [k for k in kept if k[-1] == len(layers) - 1]
    return sum(k[0] for k in kept) / len(layers), last, out


def step_flops(layers, x, mode, **kwargs):
    """(forward FLOPs, forward + backward FLOPs) of ``layers`` under ``mode``: FlopCounterMode counts every matmul
    that runs, the recomputed ones in backward too. Before torch 2.15 it has no formula for CPU's fused attention
    (``_scaled_dot_product_flash_attention_for_cpu``): count attention with ``attn_implementation="eager"``, and
    every torch counts the same."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as fwd:
        out = run_layers(layers, x, mode, **kwargs)
    with FlopCounterMode(display=False) as bwd:
        out.sum().backward()
    return fwd.get_total_flops(), fwd.get_total_flops() + bwd.get_total_flops()


def grads(layers, x, mode, **kwargs):
    """{name: gradient} of the layers' parameters after one backward of ``run_layers(...).sum()``."""
    for p in layers.parameters():
        p.grad = None
    run_layers(layers, x, mode, **kwargs).sum().backward()
    return {n: p.grad.clone() for n, p in layers.named_parameters()}


def matmul_output_bytes(model, micro_batch: int, element_bytes: int = 2) -> float:
    """What the selective policy keeps per layer: the layer's input (s b h) and the output of every linear layer:
    q, o (s b h each), k, v (s b h kv/heads each), the MLP's up (and gate) (s b f each) and down (s b h).
    Llama: s b (4h + 2 kv_dim + 2f) values; measured exactly in lesson 09c. ``model``: a
    ``utils.planner.ModelShape``."""
    s, b, h, f = model.seq_len, micro_batch, model.hidden, model.ffn_hidden
    kv = model.kv_heads * (h // model.heads)
    return element_bytes * s * b * (h + 2 * h + 2 * kv + (2 if model.gated_mlp else 1) * f + h)
