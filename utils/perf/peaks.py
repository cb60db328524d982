"""The denominator of MFU: the data sheets' dense bf16 peaks in one table, and a peak measured with matmuls where no
data sheet applies (a CPU, a GPU not in the table). Lessons 08b, 08d and 09b divide by these; 09b shows
``matmul_peak`` (notebooks/09b_3d_costs_and_planner.ipynb).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .measure import measure

__all__ = ["PEAK_BF16", "table_peak", "matmul_peak", "bf16_peak"]

#: Dense bf16 tensor-core FLOP/s from NVIDIA's data sheets, keyed by a substring of ``torch.cuda.get_device_name()``;
#: the more specific names first (the first match wins). Hopper's data sheets print the figure *with* 2:4 structured
#: sparsity (a footnote says so); dense is half of it: H100 SXM and H200 SXM 1,979 -> 989 TFLOP/s, H100 NVL and H200
#: NVL 1,671 -> 835, H100 PCIe 1,513 -> 756. The A100's prints both: 312 dense, 624 sparse (40 and 80 GB, SXM, PCIe).
PEAK_BF16 = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H200 NVL": 835e12, "H100": 989e12, "H200": 989e12,
             "A100": 312e12}


def table_peak(name: str) -> float | None:
    """The data sheet's dense bf16 FLOP/s of the GPU called ``name`` (``torch.cuda.get_device_name()``), or None
    when the table does not know it."""
    return next((peak for key, peak in PEAK_BF16.items() if key in name), None)


def matmul_peak(n: int = 512, repeats: int = 5, dtype=torch.float32, device=None) -> float:
    """FLOP/s of this rank: the best of ``repeats`` n x n matmuls (all ranks at the same time when a process group
    is up, so that ranks sharing cores measure their share)."""
    from ..launch import rank_device
    a = torch.randn(n, n, device=device or rank_device()).to(dtype)
    if dist.is_initialized():
        dist.barrier()
    seconds, _ = measure(lambda: a @ a, repeats, each=True)  # each matmul waited for, timed alone
    return 2 * n**3 / min(seconds)


def bf16_peak(device) -> tuple[float, str]:
    """(FLOP/s, where the figure comes from) for ``device``: a GPU in ``PEAK_BF16`` gets its data sheet's dense bf16
    peak; any other device the best of 5 bf16 matmuls measured here (8192^3 on a GPU, 512^3 on a CPU). A measured
    peak is below the data sheet's (on an H100 about 80% of it), so MFU against it reads higher."""
    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    peak = table_peak(name) if device.type == "cuda" else None
    if peak is not None:
        return peak, f"{name}: {peak / 1e12:.0f} TFLOP/s dense bf16 (data sheet)"
    n = 8192 if device.type == "cuda" else 512
    peak = matmul_peak(n, dtype=torch.bfloat16, device=device)
    return peak, f"{name}: {peak / 1e12:.3g} TFLOP/s, the best of 5 bf16 {n}^3 matmuls measured here (not in our table)"
