"""FP8 numerics from scratch (lesson 08d, ``notebooks/08d_fp8_numerics.ipynb``, derives every piece).

- the formats: ``FORMATS`` (e4m3 for weights and activations, e5m2 for gradients, the split of Micikevicius et al.,
  "FP8 formats for deep learning", arXiv 2209.05433) and ``format_facts``, each number from its formula;
- scaling: ``scale_for`` (max finite / amax, per tensor or per row), ``quantize`` / ``dequantize`` (saturating:
  values beyond the format are clamped, not turned into inf or NaN), ``fake_quantize`` (the two together);
- delayed scaling: ``AmaxHistory`` (the scale of step t from the amaxes of the steps before it, Transformer
  Engine's "max" algorithm);
- ``Float8Linear``: ``nn.Linear``'s drop-in whose three matmuls (forward, grad of the input, grad of the weight)
  see their operands rounded to FP8 and accumulate in fp32, as an FP8 tensor core does. The matmul itself runs
  in fp32 on the dequantized operands: a *simulation* of the numerics, not a speed-up.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

__all__ = ["FORMATS", "format_facts", "scale_for", "quantize", "clipped_count", "dequantize", "fake_quantize",
           "AmaxHistory", "Recipe", "Float8Linear", "swap_linears"]

#: the course's names for the two FP8 dtypes of torch (``fn``: finite and NaN only, no infinity)
FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
_BITS = {torch.float8_e4m3fn: (4, 3), torch.float8_e5m2: (5, 2), torch.bfloat16: (8, 7), torch.float16: (5, 10),
         torch.float32: (8, 23)}


def format_facts(dtype) -> dict:
    """Exponent and mantissa bits of `dtype`, and its numbers from their formulas (bias = 2^(e-1) - 1):
    smallest normal 2^(1-bias), smallest subnormal 2^(1-bias-m), relative spacing eps = 2^-m, and the largest
    finite value: (2 - 2^-m) 2^bias where the top exponent is kept for inf/NaN (IEEE: e5m2, bf16, fp16, fp32);
    e4m3fn keeps only mantissa 111 of the top exponent for NaN, so its top exponent 2^(bias+1) still holds
    values up to (2 - 2^(1-m)) 2^(bias+1) = 448."""
    if dtype not in _BITS:
        raise ValueError(f"no bit layout for {dtype}; use one of {list(_BITS)}.")
    e, m = _BITS[dtype]
    bias = 2 ** (e - 1) - 1
    top = (2 - 2.0 ** (1 - m)) * 2.0 ** (bias + 1) if dtype == torch.float8_e4m3fn else (2 - 2.0 ** -m) * 2.0 ** bias
    return dict(exponent_bits=e, mantissa_bits=m, bias=bias, max=top, smallest_normal=2.0 ** (1 - bias),
                smallest_subnormal=2.0 ** (1 - bias - m), eps=2.0 ** -m)


def _amax(x, dim):
    """Largest |x|: of the whole tensor (dim None) or along `dim`, kept as a size-1 axis so that it broadcasts."""
    return x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)


def scale_for(amax, dtype):
    """The scale that maps `amax` onto the format's largest finite value: x * scale fills the range.

    An amax of 0 (an all-zero tensor or row) gets scale 1 instead of infinity."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    return torch.where(amax > 0, torch.finfo(dtype).max / amax.clamp_min(torch.finfo(torch.float32).tiny), 1.0)


def quantize(x, dtype, scale):
    """x * scale rounded to `dtype`, clamped to its finite range first (saturation: torch's cast of an
    out-of-range value is not the same in every release, and e5m2 would give inf)."""
    top = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-top, top).to(dtype)


def clipped_count(x, dtype, scale) -> int:
    """How many elements of x * scale lie beyond the format's largest finite value (``quantize`` saturates them);
    a relative margin of 1e-6 keeps fp32's rounding of amax * (max / amax) from counting the amax itself."""
    return int((x.detach().abs() * scale > torch.finfo(dtype).max * (1 + 1e-6)).sum())


def dequantize(q, scale):
    """The fp32 value an FP8 number stands for: q / scale."""
    return q.float() / scale


def fake_quantize(x, dtype, dim=None, scale=None):
    """x after a round trip through `dtype` (fp32 out): scaled per tensor (`dim` None) or per slice along `dim`
    (dim=-1: one scale per row) from its own amax, unless `scale` is given (delayed scaling). A dtype without
    scaling (bf16) is rounded as it is."""
    if dtype not in FORMATS.values():
        return x.to(dtype).float()
    scale = scale_for(_amax(x.detach(), dim), dtype) if scale is None else scale
    return dequantize(quantize(x, dtype, scale), scale)


class AmaxHistory:
    """Delayed scaling: the amaxes of the last `length` steps; the scale of this step comes from their max.

    ``scale()`` is read *before* this step's amax is known (so the cast needs no pass over the tensor first);
    ``record(amax)`` appends it afterwards. A step whose amax exceeds the history's clips: ``quantize`` saturates.
    The first step has no history and scales by its own amax."""

    def __init__(self, length=16):
        if length < 1:
            raise ValueError(f"an amax history needs length >= 1, got {length}.")
        self.length, self.amaxes = length, []

    def scale(self, dtype, current_amax):
        return scale_for(max(self.amaxes) if self.amaxes else current_amax, dtype)

    def record(self, amax):
        self.amaxes = (self.amaxes + [float(amax)])[-self.length:]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How a Float8Linear rounds: `forward` dtype for inputs and weights, `backward` dtype for the output gradient,
    `granularity` "tensor" or "row", `scaling` "dynamic" (this step's amax) or "delayed" (an AmaxHistory)."""

    forward: torch.dtype = torch.float8_e4m3fn
    backward: torch.dtype = torch.float8_e5m2
    granularity: str = "tensor"
    scaling: str = "dynamic"
    history: int = 16

    def __post_init__(self):
        if self.granularity not in ("tensor", "row") or self.scaling not in ("dynamic", "delayed"):
            raise ValueError(f"granularity {self.granularity!r} must be 'tensor' or 'row', scaling {self.scaling!r} "
                             "'dynamic' or 'delayed'.")
        if self.granularity == "row" and self.scaling == "delayed":
            raise ValueError("delayed scaling keeps one amax history per tensor; use granularity='tensor' with it "
                             "(per-row scales are computed dynamically, as torchao's rowwise recipe does).")


class _Float8Matmul(torch.autograd.Function):
    """y = x W^T, each of its three matmuls on operands rounded by `fq(tensor, role, dim)`, fp32 accumulation.

    `dim` is the contraction dimension of that matmul: a per-row scale must lie along the *other* dimension to
    factor out of the sum, so each matmul rounds its operands again along its own contraction (torchao's rowwise
    recipe does the same)."""

    @staticmethod
    def forward(ctx, x, weight, fq):  # x (tokens, in), weight (out, in)
        ctx.save_for_backward(x, weight)
        ctx.fq = fq
        return fq(x, "x", -1) @ fq(weight, "w", -1).t()  # (tokens, out): contraction over `in`

    @staticmethod
    def backward(ctx, grad_out):  # (tokens, out)
        x, weight = ctx.saved_tensors
        fq = ctx.fq
        grad_x = fq(grad_out, "g", -1) @ fq(weight, "w", 0)  # (tokens, in): contraction over `out`
        grad_w = fq(grad_out, "g", 0).t() @ fq(x, "x", 0)  # (out, in): contraction over tokens
        return grad_x, grad_w, None


class Float8Linear(nn.Linear):
    """``nn.Linear`` with FP8 numerics (simulated): inputs and weights in `recipe.forward` (e4m3), output
    gradients in `recipe.backward` (e5m2), the bias and the accumulation in fp32. With delayed scaling it keeps an
    AmaxHistory for x, w and the gradient; ``clipped`` counts the elements that saturated."""

    def __init__(self, in_features, out_features, bias=True, recipe=Recipe()):
        super().__init__(in_features, out_features, bias)
        self.recipe = recipe
        self.histories = {role: AmaxHistory(recipe.history) for role in "xwg"}
        self.clipped = 0
        self._scales = {}  # delayed scaling: the scale each tensor got at its first use this step

    def _fq(self, t, role, dim):
        r = self.recipe
        dtype = r.backward if role == "g" else r.forward
        if dtype not in FORMATS.values():  # bf16 or fp32: rounding without a scale
            return t.to(dtype).float()
        if r.scaling == "dynamic":
            return fake_quantize(t, dtype, dim=None if r.granularity == "tensor" else dim)
        if dim == -1:  # delayed, first use of this tensor (x, w in forward; g in backward): scale from the history
            amax = _amax(t.detach(), None)
            self._scales[role] = self.histories[role].scale(dtype, amax)
            self.clipped += clipped_count(t, dtype, self._scales[role])
            self.histories[role].record(amax)  # after use: this step's amax serves the next steps
        return fake_quantize(t, dtype, scale=self._scales[role])  # second use (backward): the same scale

    def forward(self, x):  # (..., in) -> (..., out)
        y = _Float8Matmul.apply(x.reshape(-1, x.shape[-1]), self.weight, self._fq)
        y = y.reshape(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


def swap_linears(model, recipe, skip=("lm_head",)):
    """Replaces every ``nn.Linear`` of `model` (but those whose name ends in one of `skip`) by a Float8Linear with
    the same weight and bias tensors (the very Parameters: ties and optimizer state carry over). Returns the names."""
    swapped = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and not full.endswith(skip):
                new = Float8Linear(child.in_features, child.out_features, child.bias is not None, recipe)
                new.weight, new.bias = child.weight, child.bias
                setattr(module, child_name, new)
                swapped.append(full)
    return swapped
