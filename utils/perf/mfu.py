"""Model FLOPs utilisation, computed one way for the course (lessons 08b, 08d and 09b).

MFU is the model FLOPs a second over the peak: model FLOPs per token from the planner's ``flops_per_token`` (6 x the
matrix parameters + 12 L h s for the attention scores, PaLM's accounting, Chowdhery et al. 2022, appendix B; no
recomputation counted, which is what separates it from hardware FLOPs utilisation) times tokens per second. The peak
comes from ``utils.perf.peaks``.
"""

from __future__ import annotations

from ..planner import ModelShape, flops_per_token

__all__ = ["mfu"]


def mfu(tokens_per_second: float, shape: ModelShape, peak_flops: float) -> float:
    """Model FLOPs utilisation: the planner's model FLOPs per token (no recompute) x tokens/s over the peak."""
    if tokens_per_second < 0 or peak_flops <= 0:
        raise ValueError(f"tokens/s {tokens_per_second} must be >= 0 and the peak {peak_flops} FLOP/s > 0.")
    return flops_per_token(shape, "none")[0] * tokens_per_second / peak_flops
