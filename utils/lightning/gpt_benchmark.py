"""The GPU benchmark of lesson 08 (notebooks/08b_lightning_speedups.ipynb): a plain PyTorch GPT the size of
GPT-2 small, timed in tokens per second under one precision setting.

The timing loop, the peak and MFU are ``utils.perf``'s (``measure``, ``bf16_peak``, ``mfu``), the ones lessons 08d
and 09b use; MFU counts model FLOPs per token with the planner's ``utils.planner.flops_per_token`` (6 x the matrix
parameters + 12 L h s for the attention scores, PaLM's accounting, Chowdhery et al. 2022, appendix B), the same count
lesson 09 uses, so that the two lessons' MFU figures agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from utils.perf import measure
from utils.planner import ModelShape

__all__ = ["Block", "GPT", "SETTINGS", "gpt_shape", "gpt_tokens_per_second"]

SETTINGS = ("fp32", "tf32", "bf16", "bf16 + compile")


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x MLP, each added to the residual."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))

    def forward(self, x):  # (B, T, width)
        B, T, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, heads, T, w/heads)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, heads, T, width/heads)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, width))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT-2 small's shape by default: token and position embeddings, 12 blocks, a head tied to the token
    embedding (no dropout). The vocabulary is GPT-2's 50257 rounded up to a multiple of 64."""

    def __init__(self, vocab=50304, seq=1024, width=768, layers=12, heads=12):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads={heads}; use a multiple of {heads}.")
        self.shape = ModelShape(layers=layers, hidden=width, heads=heads, vocab=vocab, seq_len=seq, dropout=False)
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2

    def forward(self, idx):  # (B, T) token ids -> (B, T, vocab) logits
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))


def gpt_shape(model: GPT) -> ModelShape:
    """The planner's description of `model` (lesson 09's ``ModelShape``): what ``flops_per_token`` reads."""
    return model.shape


def gpt_tokens_per_second(setting, steps, batch=16, seq=1024, warmup=3):
    """Trains a fresh GPT on CUDA for `warmup` and then `steps` timed AdamW steps of `batch` x `seq` random
    tokens in one of SETTINGS; returns tokens per second. Leaves the fp32 matmul precision at torch's default."""
    if setting not in SETTINGS:
        raise ValueError(f"setting {setting!r} is not one of {SETTINGS}.")
    if steps < 1 or batch < 1 or seq < 1:
        raise ValueError(f"steps={steps}, batch={batch}, seq={seq}: each must be at least 1.")
    torch.set_float32_matmul_precision("highest" if setting == "fp32" else "high")  # "high": fp32 products in TF32
    try:
        torch.manual_seed(0)
        model = GPT(seq=seq).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
        run = torch.compile(model) if setting.endswith("compile") else model
        tokens = torch.randint(model.shape.vocab, (batch, seq + 1), device="cuda")
        x, y = tokens[:, :-1], tokens[:, 1:]  # predict the next token: (B, T) each

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=setting.startswith("bf16")):
                loss = F.cross_entropy(run(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        # warm-up: allocations, cuBLAS's choice of kernels, the compilation itself; the GPU waited for around the clock
        (seconds,), _ = measure(step, steps, warmup)
        del model, opt, run
        torch.cuda.empty_cache()
    finally:
        torch.set_float32_matmul_precision("highest")  # torch's default again
    return batch * seq / seconds
