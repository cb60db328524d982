"""utils.fx.passes (lesson 12b): Megatron's MLP split as a graph rewrite, equal to the unsplit model on 2 ranks."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import fx, nn

import utils
from utils.fx.passes import find_mlp_pairs, tensor_parallel_mlp


class Model(nn.Module):
    """An MLP (fc1 -> GeLU -> fc2) beside an attention-like product of two activations (q @ k^T) that must not match."""

    def __init__(self, width=8):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.q, self.k = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):  # (rows, width)
        x = x + self.fc2(F.gelu(self.fc1(x)))
        return torch.softmax(self.q(x) @ self.k(x).T, dim=-1) @ x


def test_finds_the_mlp_and_not_the_attention():
    gm = fx.symbolic_trace(Model())
    assert [(a.target, b.target) for a, b in find_mlp_pairs(gm)] == [("fc1", "fc2")]


def test_refuses_a_degree_that_does_not_divide_before_changing_anything():
    gm = fx.symbolic_trace(Model(width=6))  # inner size 24: 5 does not divide it
    before = gm.code
    with pytest.raises(ValueError, match="MLP inner size 24 is not divisible by tensor-parallel degree 5"):
        tensor_parallel_mlp(gm, rank=0, t=5)
    assert gm.code == before


def test_refuses_a_graph_without_mlp():
    with pytest.raises(ValueError, match="nothing to split"):
        tensor_parallel_mlp(fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4))), rank=0, t=2)


def test_rewrite_inserts_f_and_g_and_slices_the_weights():
    gm = tensor_parallel_mlp(fx.symbolic_trace(Model()), rank=1, t=2)
    assert "copy_to_tensor_parallel_region" in gm.code and "reduce_from_tensor_parallel_region" in gm.code
    assert gm.fc1.weight.shape == (16, 8) and gm.fc2.weight.shape == (8, 16) and gm.fc2.bias is None
    assert gm.fc2_bias.shape == (8,)


def _compare():
    rank, t = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    full = Model()
    split = tensor_parallel_mlp(fx.symbolic_trace(copy.deepcopy(full)), rank, t)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    x_full, x_split = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_full, y_split = full(x_full), split(x_split)
    y_full.square().sum().backward()
    y_split.square().sum().backward()
    torch.testing.assert_close(y_split, y_full, rtol=1e-5, atol=1e-6)  # float32: the MLP's sum in t parts
    torch.testing.assert_close(x_split.grad, x_full.grad, rtol=1e-5, atol=1e-6)  # f summed dX over the ranks
    pieces = {"fc1.weight": full.fc1.weight.grad.chunk(t, 0)[rank], "fc1.bias": full.fc1.bias.grad.chunk(t, 0)[rank],
              "fc2.weight": full.fc2.weight.grad.chunk(t, 1)[rank], "fc2_bias": full.fc2.bias.grad,
              "q.weight": full.q.weight.grad, "k.bias": full.k.bias.grad}
    params = dict(split.named_parameters())
    for name, expected in pieces.items():  # atol 1e-5: k.bias's gradient is 0 in exact arithmetic (softmax ignores a
        # shift of a row), so both sides are float32 noise of ~1e-6 and only an absolute tolerance compares them
        torch.testing.assert_close(params[name].grad, expected, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
    return True


def test_rewritten_model_equals_the_unsplit_one_on_two_ranks():
    assert utils.run_ranks(_compare, world_size=2, verbose=False) == [True, True]


def test_the_course_transformer_traces_and_its_mlps_are_found():
    """Lesson 05's TransformerLayer (utils.tensor_parallel), inside lesson 12's TinyGPT, traces as it is: the graph
    runs bit for bit like the model, and the pass finds exactly one MLP per layer, not the attention."""
    from utils.fx.tiny_gpt import make_tiny_gpt, pipeline_units

    model = make_tiny_gpt(vocab=32, hidden=16, heads=4, seq=6, layers=3)
    ids = torch.randint(0, 32, (6, 2), generator=torch.Generator().manual_seed(0))
    gm = fx.symbolic_trace(model)
    torch.testing.assert_close(gm(ids), model(ids), rtol=0, atol=0)
    assert [(a.target, b.target) for a, b in find_mlp_pairs(gm)] == [
        (f"layers.{i}.mlp.fc1", f"layers.{i}.mlp.fc2") for i in range(3)]
    assert pipeline_units(model) == ["embed", "layers.0", "layers.1", "layers.2", "norm", "head"]
