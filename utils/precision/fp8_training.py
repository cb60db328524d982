"""FP8 recipes in training (lesson 08d, ``notebooks/08d_fp8_numerics.ipynb``): the course model trained a few steps
under each ``Recipe`` of ``utils.precision.fp8`` on CPU, and torchao's float8 training of a Llama timed on a GPU with
FP8 tensor cores.

``train_steps`` runs lesson 02's ``ToyNet`` (frozen parameter, buffer, tied weight) on the digits with Adam, its
``nn.Linear`` layers swapped for ``Float8Linear`` (none for the fp32 reference); ``gradient_error`` is the relative
error of all gradients together, ||g - g_ref|| / ||g_ref||. ``fp8_gpu_skip_reason`` says why the GPU part cannot run
here (or None), and ``torchao_speedup`` times it: lesson 09b's MFU Llama (``utils.perf.llama_shape``: tied embedding,
gated MLP of 8h/3, not the capstone's 2h) at a size where the matmuls dominate, bf16 + ``torch.compile`` against
torchao's float8 + ``torch.compile``, with ``utils.perf``'s timing loop, peak and MFU.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from ..perf import llama_config, llama_shape, measure, mfu, table_peak
from .fp8 import Recipe, swap_linears

__all__ = ["train_steps", "gradient_error", "fp8_gpu_skip_reason", "torchao_speedup"]


def train_steps(recipe: Recipe | None, x_all, y_all, steps, batch=240, lr=1e-2, hidden=64, seed=0):
    """`steps` Adam steps of ToyNet(hidden) on consecutive batches of (x_all, y_all); recipe None: plain fp32.

    Returns (losses of every step, gradients of step 0 by parameter name, names of the swapped layers)."""
    from ..models import ToyNet
    if steps < 1 or batch > len(x_all):
        raise ValueError(f"steps={steps} must be >= 1 and batch={batch} at most the {len(x_all)} samples.")
    torch.manual_seed(seed)
    model = ToyNet(hidden=hidden)
    swapped = swap_linears(model, recipe) if recipe is not None else []
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses, grads = [], None
    for step in range(steps):
        start = step * batch % (len(x_all) - batch + 1)
        x, y = x_all[start:start + batch], y_all[start:start + batch]  # (batch, 64), (batch,)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        losses.append(loss.item())
    return losses, grads, swapped


def gradient_error(grads, ref) -> float:
    """||g - g_ref|| / ||g_ref|| over all parameters together (the same names in both)."""
    if grads.keys() != ref.keys():
        raise ValueError(f"the two runs have different gradients: {sorted(grads.keys() ^ ref.keys())}.")
    num = sum(((grads[n].float() - ref[n]) ** 2).sum() for n in ref)
    return float((num / sum((ref[n] ** 2).sum() for n in ref)).sqrt())


def fp8_gpu_skip_reason():
    """None where torchao's float8 training can run (a CUDA GPU of compute capability >= 8.9 and torchao
    installed), else the reason in one sentence. Asks ``device_count`` first, so a CPU machine leaves CUDA alone."""
    if torch.cuda.device_count() == 0:
        return "no CUDA GPU here: FP8 matmuls need tensor cores of compute capability 8.9 or later (Ada, Hopper)"
    capability = torch.cuda.get_device_capability(0)
    if capability < (8, 9):
        return (f"{torch.cuda.get_device_name(0)} has compute capability {capability[0]}.{capability[1]}; "
                "FP8 tensor cores need 8.9 or later (L4, L40S, H100, H200, B200)")
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed: `pip install torchao` (a release matching this torch) into .venv"
    return None


def _tokens_per_second(model, tokens, steps, warmup=3):
    """Tokens/s of AdamW steps of ``model`` on ``tokens`` (B, T+1), and the last step's loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    x, y = tokens[:, :-1], tokens[:, 1:]  # (B, T) each

    def step():
        loss = F.cross_entropy(model(x).logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    (seconds,), loss = measure(step, steps, warmup)  # warm-up: compilation, cuBLAS's choice of kernels
    return x.numel() / seconds, loss.item()


def torchao_speedup(layers=4, hidden=4096, heads=32, vocab=32768, seq=2048, batch=4, steps=10, recipe="tensorwise"):
    """On a CUDA GPU with FP8: lesson 09b's MFU Llama (tied embedding, gated MLP of 3 x h x 8h/3) in bf16 weights,
    every linear but the head converted by torchao's ``convert_to_float8_training`` with `recipe` ("tensorwise",
    "rowwise", "rowwise_with_gw_hp"), both compiled; tokens/s of each, the speed-up and MFU against the data
    sheet's dense bf16 peak (``utils.perf.PEAK_BF16``; the dense FP8 peak is twice it)."""
    if (why := fp8_gpu_skip_reason()) is not None:
        raise RuntimeError(f"torchao's float8 training cannot run here: {why}.")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from transformers import LlamaForCausalLM

    shape = llama_shape(layers, hidden, heads, vocab, seq)  # the model timed and the FLOPs counted: one shape
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(0)).cuda()
    rates, losses = {}, {}
    for name in ("bf16", f"float8 {recipe}"):
        torch.manual_seed(0)
        model = LlamaForCausalLM(llama_config(shape)).to("cuda", torch.bfloat16)
        if name != "bf16":  # torch.nn.Linear -> torchao's Float8Linear; the head stays bf16 (tied to the embedding)
            convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                                       module_filter_fn=lambda mod, fqn: fqn != "lm_head")
        rates[name], losses[name] = _tokens_per_second(torch.compile(model), tokens, steps)
        del model
        torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name(0)
    peak = table_peak(gpu)  # None for a GPU not in the table: no MFU rather than one against a guess
    return dict(gpu=gpu, tokens_per_s=rates, losses=losses, speedup=rates[f"float8 {recipe}"] / rates["bf16"],
                mfu={k: mfu(r, shape, peak) for k, r in rates.items()} if peak else None, peak_bf16=peak)
