"""utils.precision.fp8 and fp8_training (lesson 08d): formats from their formulas, saturation, scales per tensor and
per row, the amax history, Float8Linear against its simulation and against torch._scaled_mm, and the training run."""

import pytest
import torch
from torch import nn

from utils.precision.fp8 import (FORMATS, AmaxHistory, Float8Linear, Recipe, fake_quantize, format_facts, quantize,
                                 scale_for, swap_linears)
from utils.perf import one_thread
from utils.precision.fp8_training import fp8_gpu_skip_reason, gradient_error, train_steps

E4, E5 = FORMATS["e4m3"], FORMATS["e5m2"]


@pytest.mark.parametrize("dtype", [E4, E5, torch.bfloat16, torch.float16, torch.float32])
def test_formats_match_finfo(dtype):
    f, fi = format_facts(dtype), torch.finfo(dtype)
    assert (f["max"], f["smallest_normal"], f["eps"]) == (fi.max, fi.smallest_normal, fi.eps)
    sub = torch.tensor([f["smallest_subnormal"], 0.5 * f["smallest_subnormal"]]).to(dtype).float()
    assert sub.tolist() == [f["smallest_subnormal"], 0.0]  # the last step above 0; half of it rounds to 0 (to even)


def test_quantize_saturates_and_zero_scale():
    assert quantize(torch.tensor([1e9, -1e9]), E4, 1.0).float().tolist() == [448.0, -448.0]
    assert quantize(torch.tensor([1e9]), E5, 1.0).float().tolist() == [57344.0]  # a plain cast would give inf
    assert scale_for(torch.tensor(0.0), E4).item() == 1.0


@pytest.mark.parametrize("dtype", [E4, E5])
def test_round_off_bound(dtype):
    x = (torch.linspace(1, 2, 10001)[:-1] * 2.0 ** torch.arange(-3.0, 4.0)[:, None]).flatten()  # normal range
    rel = ((fake_quantize(x, dtype, scale=torch.tensor(1.0)) - x) / x).abs().max().item()
    u = format_facts(dtype)["eps"] / 2  # the unit round-off; the worst x is just below 1 + u: error u / (1 + u)
    assert 0.99 * u / (1 + u) < rel <= u / (1 + u) * (1 + 1e-6)


def test_per_row_keeps_small_rows():
    x = torch.randn(7, 64) * 10.0 ** -torch.arange(7.0)[:, None]  # rows of 1 ... 1e-6
    err = lambda q: ((q - x).norm(dim=1) / x.norm(dim=1))
    assert err(fake_quantize(x, E4, dim=-1)).max() <= format_facts(E4)["eps"] / 2
    assert err(fake_quantize(x, E4)).max() == 1.0  # the 1e-6 row flushes to zero under one scale


def test_amax_history_delays_and_forgets():
    h = AmaxHistory(length=3)
    assert h.scale(E4, torch.tensor(2.0)).item() == 224.0  # first step: its own amax
    for a in (1.0, 8.0, 1.0, 1.0):
        h.record(a)
    assert h.scale(E4, torch.tensor(1.0)).item() == 448.0 / 8  # the spike is still in the last 3
    h.record(1.0)
    assert h.scale(E4, torch.tensor(1.0)).item() == 448.0  # forgotten
    with pytest.raises(ValueError, match="granularity='tensor'"):
        Recipe(granularity="row", scaling="delayed")


@pytest.mark.parametrize("granularity", ["tensor", "row"])
def test_float8_linear_gradients(granularity):
    torch.manual_seed(0)
    x = torch.randn(32, 16, requires_grad=True)
    lin = Float8Linear(16, 8, recipe=Recipe(granularity=granularity))
    y = lin(x)
    dim = None if granularity == "tensor" else -1
    torch.testing.assert_close(y, fake_quantize(x, E4, dim) @ fake_quantize(lin.weight, E4, dim).t() + lin.bias)
    g = torch.randn_like(y)
    y.backward(g)
    w = lin.weight.detach()
    grad_x = fake_quantize(g, E5, dim) @ fake_quantize(w, E4, None if dim is None else 0)
    torch.testing.assert_close(x.grad, grad_x)
    ref = nn.functional.linear(x.detach(), w)
    assert (y.detach() - lin.bias - ref).norm() / ref.norm() < 0.1  # close to fp32, not equal


def test_delayed_linear_records_one_amax_per_tensor_and_step():
    lin = Float8Linear(16, 8, recipe=Recipe(scaling="delayed", history=2))
    for step in range(3):
        x = torch.randn(4, 16) * (8.0 if step == 1 else 1.0)  # a spike at step 1
        lin(x).sum().backward()
    assert {r: len(h.amaxes) for r, h in lin.histories.items()} == {"x": 2, "w": 2, "g": 2}  # the last 2 steps
    assert lin.clipped > 0  # the spike's input saturated: its scale came from step 0


def test_against_scaled_mm():
    a, b = torch.randn(16, 32), torch.randn(24, 32)
    sa, sb = scale_for(a.abs().amax(), E4), scale_for(b.abs().amax(), E4)
    try:
        out = torch._scaled_mm(quantize(a, E4, sa), quantize(b, E4, sb).t(), scale_a=1 / sa, scale_b=1 / sb,
                               out_dtype=torch.float32)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch {torch.__version__} has no CPU _scaled_mm: {e}")
    torch.testing.assert_close(out, fake_quantize(a, E4) @ fake_quantize(b, E4).t())


def test_swap_keeps_ties_and_training_error_order():
    from utils.models import ToyNet
    model = ToyNet()
    assert swap_linears(model, Recipe()) == ["embed", "mix1", "mix2", "head"]
    assert model.mix1.weight is model.mix2.weight and isinstance(model.mix2, Float8Linear)
    x, y = torch.randn(240, 64, generator=torch.Generator().manual_seed(0)), torch.arange(240) % 10
    with one_thread():  # a tiny model: one thread is faster, and immune to other load
        _, ref, _ = train_steps(None, x, y, 1)
        errors = {k: gradient_error(train_steps(r, x, y, 1)[1], ref)
                  for k, r in {"bf16": Recipe(torch.bfloat16, torch.bfloat16), "e4m3": Recipe(E4, E4),
                               "e5m2": Recipe(E5, E5)}.items()}
    assert errors["bf16"] < errors["e4m3"] < errors["e5m2"], errors


def test_gpu_skip_reason_on_this_machine():
    why = fp8_gpu_skip_reason()
    if torch.cuda.device_count() == 0:
        assert "no CUDA GPU" in why and not torch.cuda.is_initialized()
