"""A bf16 compiled Llama's model FLOPs utilisation on one rank (lesson 09b, notebooks/09b_3d_costs_and_planner.ipynb).

``bf16_compiled_mfu`` runs the settings real MFU is measured with: bf16 weights in the matmuls, every block compiled,
FSDP2 applied last. The model's config, the timing loop, the peak and MFU come from ``utils.perf`` (``llama_config``,
``measure``, ``bf16_peak``, ``mfu``), where lessons 08b and 08d take theirs; the FLOPs of a step from
``utils.planner.flops_per_token`` (PaLM's count).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..perf import bf16_peak, llama_config, llama_shape, measure, mfu
from ..planner import flops_per_token

__all__ = ["bf16_compiled_mfu"]


def bf16_compiled_mfu(layers, hidden, heads, vocab, seq, batch, steps):
    """One rank: a tied-embedding Llama in bf16 with compiled blocks, FSDP2 last; tokens/s and MFU (lesson 09).

    bf16 weights in the matmuls, fp32 gradient reduction and master weights (FSDP2's ``MixedPrecisionPolicy``);
    Inductor on a GPU, ``aot_eager`` on a CPU. The peak is ``utils.perf.bf16_peak``'s: the data sheet's for a GPU in
    its table, otherwise the best of 5 bf16 matmuls measured here. Returns device, psi, seconds a step,
    tokens_per_s, flops (model FLOPs of a step), mfu, peak, loss."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaForCausalLM

    from ..launch import rank_device
    device = rank_device()
    gpu = device.type == "cuda"
    torch.manual_seed(0)
    shape = llama_shape(layers, hidden, heads, vocab, seq)  # MLP of 3 matrices of h x 8h/3: GPT-2's 8h^2 parameters
    model = LlamaForCausalLM(llama_config(shape)).to(device)
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

    (seconds,), loss = measure(step, steps, warmup=2)  # 2 untimed steps: compilation and warm-up
    peak, _source = bf16_peak(device)
    tokens_per_s = batch * seq / seconds
    return dict(device=torch.cuda.get_device_name(device) if gpu else "CPU", psi=psi, seconds=seconds,
                tokens_per_s=tokens_per_s, flops=flops_per_token(shape)[0] * batch * seq,
                mfu=mfu(tokens_per_s, shape, peak), peak=peak, loss=loss.item())
