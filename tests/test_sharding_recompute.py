"""utils.sharding.recompute and the planner's activation terms it corrected (lesson 09c): none, full and selective
checkpointing run on the capstone's Hugging Face Llama layers, bytes kept and FLOPs measured, exact."""

import dataclasses

import pytest
import torch

from utils.planner import ModelShape, flops_per_token, layer_activation_bytes, layer_matrices
from utils.sharding.recompute import MODES, grads, kept_per_layer, matmul_output_bytes, run_layers, step_flops
from utils.sharding.activation_memory import KeptBytes, saved_bytes

B, S = 2, 8  # a small batch: the counts are exact at any size


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny ops: one thread (on a busy 2-core machine the second one waits for a core); restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def capstone(request):
    """The capstone's tiny Llama (lesson 09), its layers, an input and the rotary embedding for S tokens."""
    from utils.mesh.parallelize3d import make_model
    model = make_model(attn_implementation=request.param)
    x = torch.randn(B, S, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    return request.param, model.model.layers, x, {"position_embeddings": model.model.rotary_emb(x, torch.arange(S)[None])}


def shape_of(layers, attention):
    """The planner's ModelShape of the capstone, plain PyTorch kernels (Hugging Face's eager RMSNorm and SwiGLU)."""
    from utils.mesh.parallelize3d import HEADS, HIDDEN, LAYERS, VOCAB
    return ModelShape(layers=LAYERS, hidden=HIDDEN, heads=HEADS, vocab=VOCAB, seq_len=S, ffn_hidden=2 * HIDDEN,
                      tied_embeddings=True, gated_mlp=True, norm="rmsnorm", biases=False, positions="rope",
                      dropout=False, attention="flash" if attention == "sdpa" else "eager", fused_kernels=False)


def test_kept_bytes_equal_the_planner_exactly(capstone):
    impl, layers, x, kw = capstone
    model = shape_of(layers, impl)
    for mode in MODES:
        per_layer, _, _ = kept_per_layer(layers, x, mode, **kw)
        planned = (matmul_output_bytes(model, B, 4) if mode == "selective"
                   else layer_activation_bytes(model, B, checkpointing=mode, element_bytes=4))
        assert per_layer == planned, (impl, mode, per_layer, planned)


def test_the_paper_count_is_what_fused_kernels_keep(capstone):
    """The correction is a named term: without it (fused kernels) the planner is 4 + 2/h units of e sbh short."""
    impl, layers, x, kw = capstone
    eager = shape_of(layers, impl)
    fused = dataclasses.replace(eager, fused_kernels=True)
    gap = layer_activation_bytes(eager, B, element_bytes=4) - layer_activation_bytes(fused, B, element_bytes=4)
    assert gap == 4 * S * B * (4 * eager.hidden + 2)


def test_hooks_miss_the_selective_cache(capstone):
    """saved_tensors_hooks see what autograd saves: everything without checkpointing, only the input with full or
    selective checkpointing, since selective keeps its matmul outputs in a cache of its own."""
    impl, layers, x, kw = capstone
    skip = list(layers.parameters()) + list(kw["position_embeddings"])
    for mode in MODES:
        hooks, _ = saved_bytes(lambda: run_layers(layers, x, mode, **kw), exclude=skip)
        kept, _, _ = kept_per_layer(layers, x, mode, **kw)
        assert (hooks == kept * len(layers)) == (mode != "selective"), (mode, hooks, kept)


def test_gradients_equal_across_modes(capstone):
    _, layers, x, kw = capstone
    ref = grads(layers, x, "none", **kw)
    for mode in ("full", "selective"):
        got = grads(layers, x, mode, **kw)
        for name in ref:  # the same ops on the same values: bitwise on CPU; a tolerance for other kernels' orders
            torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-6)


def test_recompute_flops_equal_the_planner():
    """Eager attention (FlopCounterMode has no formula for CPU's fused sdpa): what full and selective run again."""
    from utils.mesh.parallelize3d import make_model
    model = make_model(attn_implementation="eager")
    layers, x = model.model.layers, torch.randn(B, S, model.config.hidden_size)
    kw = {"position_embeddings": model.model.rotary_emb(x, torch.arange(S)[None])}
    shape = shape_of(layers, "eager")
    flops = {mode: step_flops(layers, x, mode, **kw) for mode in MODES}
    forward = flops["none"][0]
    assert forward == B * S * (2 * len(layers) * layer_matrices(shape) + 4 * len(layers) * shape.hidden * S)
    for mode in MODES:  # the planner's per-token extra of the layers (the head's FLOPs cancel in the difference)
        extra = (flops_per_token(shape, mode)[1] - flops_per_token(shape, mode)[0]) * B * S
        assert flops[mode][1] - flops["none"][1] == extra, (mode, flops, extra)
    assert flops["full"][1] - flops["none"][1] < forward  # the early stop: the replay skips the down projection


def test_kept_bytes_counts_views_once_and_forgets_freed_storages():
    w = torch.randn(4, 4, requires_grad=True)
    with KeptBytes() as meter:
        a = torch.randn(3, 4)  # new storage, kept by nobody but us
        b = (a @ w).t()  # mm keeps a (its input) for w's gradient; the view t() adds no storage
        c = torch.tanh(b)  # tanh keeps its output c
        del a, b
    kept = meter.kept(exclude=[c])
    assert [k[:2] for k in kept] == [[48, "aten.randn.default"]], kept  # a's 3 x 4 floats, kept by mm; b's freed
    del c
    assert meter.kept() == []


def test_matmul_output_bytes_counts_every_linear():
    gpt = ModelShape(layers=1, hidden=64, heads=4, vocab=10, seq_len=8)  # 4h MLP, not gated: up and down
    assert matmul_output_bytes(gpt, 2, 2) == 2 * 8 * 2 * (64 + 4 * 64 + 4 * 64 + 64)


def test_unknown_mode_and_attention_say_what_to_use():
    with pytest.raises(ValueError, match="use one of"):
        run_layers(torch.nn.ModuleList([torch.nn.Identity()]), torch.zeros(1), "sometimes")
    with pytest.raises(ValueError, match="'eager'.*'flash'"):
        ModelShape(layers=1, hidden=8, heads=2, vocab=4, seq_len=4, attention="paged")
