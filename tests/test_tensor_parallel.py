"""utils.tensor_parallel's transformer, layers, sequence_parallel and compare (lesson 05: notebooks 05a and 05b).

The lesson's own asserts run these at its sizes; here, small and fast: the split model equals the unsplit one on
2 ranks, with and without sequence parallelism, a degree that does not fit is refused before anything is built, and
the classes passed to ``tensor_parallel`` are the ones it uses (the exercises rely on it)."""

import pytest
import torch
import torch.distributed as dist

import utils
from utils.comm.ledger import CommLedger
from utils.tensor_parallel import (ColumnParallelLinear, RowParallelLinear, TransformerLayer, compare, full_slice,
                                   tensor_parallel, transformer_stack)
from utils.tensor_parallel.sequence_parallel import all_gather_seq, reduce_scatter_seq

HIDDEN, HEADS, LAYERS, SEQ, BATCH = 16, 4, 2, 6, 2


def _input():
    return torch.randn(SEQ, BATCH, HIDDEN, generator=torch.Generator().manual_seed(1))


def _tensor_parallel():
    rank, t = dist.get_rank(), dist.get_world_size()
    full = transformer_stack(HIDDEN, HEADS, LAYERS)
    with CommLedger() as ledger:
        diffs = compare(full, tensor_parallel(full, rank, t), _input())  # asserts every tensor itself
    return len(diffs), sorted({r.op for r in ledger.records}), len(ledger.records)


def test_tensor_parallel_equals_the_unsplit_model_on_two_ranks():
    tensors = 1 + 1 + LAYERS * 12  # output, input grad, 12 parameters per layer
    for count, ops, calls in utils.run_ranks(_tensor_parallel, world_size=2, verbose=False):
        assert count == tensors and ops == ["all_reduce"] and calls == 4 * LAYERS  # 2 g forward, 2 f backward


def _sequence_parallel():
    rank, t = dist.get_rank(), dist.get_world_size()
    full = transformer_stack(HIDDEN, HEADS, LAYERS)

    def shard(x):  # (s/t, b, h): this rank's tokens
        return x.chunk(t, dim=0)[rank]

    def sum_replicated(model):  # LayerNorms and row-parallel biases saw only this rank's tokens
        for name, p in model.named_parameters():
            if name.split(".")[-2] in ("ln1", "ln2") or name.endswith(("out.bias", "fc2.bias")):
                dist.all_reduce(p.grad)

    with CommLedger() as ledger:
        diffs = compare(full, tensor_parallel(full, rank, t, sp=True), _input(), shard=shard, grad_hook=sum_replicated)
    x = torch.arange(4.0).reshape(2, 1, 2) + 10 * rank  # (s/t=2, 1, 2): the gather orders the ranks' tokens
    gathered = all_gather_seq(x)
    return len(diffs), gathered, reduce_scatter_seq(gathered), {r.op for r in ledger.records}


def test_sequence_parallel_equals_the_unsplit_model_on_two_ranks():
    results = utils.run_ranks(_sequence_parallel, world_size=2, verbose=False)
    for rank, (count, gathered, scattered, ops) in enumerate(results):
        assert count == 2 + LAYERS * 12
        assert torch.equal(gathered[:, 0, 0], torch.tensor([0.0, 2.0, 10.0, 12.0]))
        assert torch.equal(scattered, 2 * gathered.chunk(2)[rank])  # the sum of two equal copies, my tokens
        layer_ops = ops - {"all_reduce"}  # the all-reduces are sum_replicated's; the layers gather and scatter
        assert len(layer_ops) == 2, ops
        assert any("gather" in op for op in layer_ops) and any("scatter" in op for op in layer_ops), ops


def test_a_degree_that_does_not_fit_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="hidden size 1000 is not divisible by tensor-parallel degree 3"):
        tensor_parallel(torch.nn.Sequential(TransformerLayer(1000, 8)), rank=0, t=3)
    with pytest.raises(ValueError, match="number of heads 6 is not divisible by tensor-parallel degree 4"):
        tensor_parallel(torch.nn.Sequential(TransformerLayer(96, 6)), rank=0, t=4)


def test_the_plan_uses_the_classes_it_is_given():
    class MyColumn(ColumnParallelLinear):
        pass

    class MyRow(RowParallelLinear):
        pass

    full = transformer_stack(HIDDEN, HEADS, 1)
    layer = tensor_parallel(full, rank=1, t=2, column=MyColumn, row=MyRow)[0]
    assert [type(m) for m in (layer.attn.qkv, layer.attn.out, layer.mlp.fc1, layer.mlp.fc2)] == [
        MyColumn, MyRow, MyColumn, MyRow]
    assert layer.attn.qkv.weight.shape == (3 * HIDDEN // 2, HIDDEN)  # 4 heads over 2 ranks: 2 whole heads each
    assert layer.mlp.fc2.weight.shape == (HIDDEN, 2 * HIDDEN)  # 4h inputs over 2 ranks
    assert full[0].attn.qkv.weight.shape == (3 * HIDDEN, HIDDEN), "the model passed in is left whole"
    assert torch.equal(layer.attn.qkv.weight, full_slice(full[0].attn.qkv.weight, layer.attn.qkv.weight, 1, 2))
    assert full_slice(full[0].ln1.weight, layer.ln1.weight, 1, 2) is full[0].ln1.weight  # replicated: whole


def test_the_same_seed_builds_the_same_model():
    a, b = transformer_stack(HIDDEN, HEADS, LAYERS, seed=3), transformer_stack(HIDDEN, HEADS, LAYERS, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert transformer_stack(HIDDEN, HEADS, LAYERS)(_input()).shape == (SEQ, BATCH, HIDDEN)
