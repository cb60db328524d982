"""Model FLOPs utilisation measured on one rank: a matmul peak, and a bf16 compiled Llama's MFU (lesson 09).

Lesson 09 calls ``matmul_peak`` on every rank of a mesh (the denominator of its MFU on CPUs) and
``bf16_compiled_mfu`` on one rank (the settings real MFU is measured with: bf16 weights in the matmuls, every block
compiled, FSDP2 applied last). The FLOPs of a step come from ``utils.planner.flops_per_token`` (PaLM's count).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..planner import ModelShape, flops_per_token

#: dense bf16 FLOP/s of the data sheets, by a substring of ``torch.cuda.get_device_name()`` (first match wins)
PEAK_BF16 = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}


def timed(fn) -> float:
    """Seconds ``fn()`` takes; on a GPU the kernels are waited for, not only launched."""
    start = time.perf_counter()
    fn()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def matmul_peak(n: int = 512, repeats: int = 5, dtype=torch.float32) -> float:
    """FLOP/s of this rank: the best of ``repeats`` n x n matmuls (all ranks at the same time when a process group
    is up, so that ranks sharing cores measure their share)."""
    from ..launch import rank_device
    a = torch.randn(n, n, device=rank_device()).to(dtype)
    if dist.is_initialized():
        dist.barrier()
    return max(2 * n**3 / timed(lambda: a @ a) for _ in range(repeats))


def llama_shape(layers, hidden, heads, vocab, seq) -> ModelShape:
    """The planner's shape of the Llama that ``bf16_compiled_mfu`` builds (tied, MLP of 3 matrices of h x 8h/3)."""
    return ModelShape(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq, ffn_hidden=8 * hidden // 3,
                      tied_embeddings=True, gated_mlp=True, norm="rmsnorm", biases=False, positions="rope",
                      dropout=False)


def bf16_compiled_mfu(layers, hidden, heads, vocab, seq, batch, steps):
    """One rank: a tied-embedding Llama in bf16 with compiled blocks, FSDP2 last; tokens/s and MFU (lesson 09).

    bf16 weights in the matmuls, fp32 gradient reduction and master weights (FSDP2's ``MixedPrecisionPolicy``);
    Inductor on a GPU, ``aot_eager`` on a CPU. The peak is the data sheet's for a GPU in ``PEAK_BF16``, otherwise
    the best of 5 bf16 matmuls measured here. Returns device, psi, seconds a step, tokens_per_s, flops (model FLOPs
    of a step), mfu, peak, loss."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..launch import rank_device
    device = rank_device()
    gpu = device.type == "cuda"
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=8 * hidden // 3, num_hidden_layers=layers,
        num_attention_heads=heads, max_position_embeddings=seq, tie_word_embeddings=True,
        attn_implementation="sdpa")).to(device)  # MLP of 3 matrices of h x 8h/3: GPT-2's 8h^2 parameters
    psi = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp",))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:  # compile, then FSDP: the order of lesson 09's `build`
        layer.compile(backend="inductor" if gpu else "aot_eager")
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(0)).to(device)

    def step():
        loss = F.cross_entropy(model(x[:, :-1]).logits.flatten(0, 1).float(), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    step(), step()  # compilation and warm-up
    if gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    loss = loss.item()  # waits for the GPU
    seconds = (time.perf_counter() - start) / steps
    name = torch.cuda.get_device_name() if gpu else "CPU"
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    if peak is None:  # a CPU, or a GPU not in the table: measured
        peak = matmul_peak(4096 if gpu else 512, dtype=torch.bfloat16)
    flops = flops_per_token(llama_shape(layers, hidden, heads, vocab, seq))[0] * batch * seq
    return dict(device=name, psi=psi, seconds=seconds, tokens_per_s=batch * seq / seconds, flops=flops,
                mfu=flops / seconds / peak, peak=peak, loss=loss)
