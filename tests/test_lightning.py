"""Unit tests of the modules lessons 07 and 08 moved out of their notebooks: utils.lightning.gpt_benchmark
(with utils.perf's mfu), utils.lightning.compile_check and utils.deepspeed.partitions."""

import pytest
import torch

from utils.lightning.gpt_benchmark import GPT, gpt_shape, gpt_tokens_per_second
from utils.perf import mfu
from utils.planner import ModelShape, flops_per_token


def test_gpt_shape_and_mfu_use_the_planners_count():
    with torch.device("meta"):
        model = GPT(vocab=512, seq=64, width=96, layers=2, heads=4)
    shape = gpt_shape(model)
    assert shape == ModelShape(layers=2, hidden=96, heads=4, vocab=512, seq_len=64, dropout=False)
    per_token = flops_per_token(shape)[0]
    matrices = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and not name.startswith("pos"))
    # 6 per matrix weight (the tied head counted once, as the head) + 12 L h s for attention
    assert per_token == 6 * matrices + 12 * 2 * 96 * 64
    assert mfu(1000.0, shape, 1e12) == pytest.approx(per_token * 1000.0 / 1e12)
    with pytest.raises(ValueError, match="peak"):
        mfu(1000.0, shape, 0)


def test_gpt_benchmark_refuses_bad_arguments():
    with pytest.raises(ValueError, match="not one of"):
        gpt_tokens_per_second("fp8", 1)
    with pytest.raises(ValueError, match="divisible"):
        GPT(width=100, heads=12)


def test_compile_check_and_partitions_refuse_bad_arguments():
    from utils.lightning.compile_check import compile_check
    from utils.deepspeed.partitions import ds_partition_bytes, ds_tensors

    with pytest.raises(ValueError, match="order"):
        compile_check("compile(m)", torch.zeros(4, 64), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="stage"):
        ds_partition_bytes(None, None, 4)
    a, b = torch.zeros(2), torch.zeros(3)
    assert ds_tensors([{"x": a}, (b, None)]) == [a, b]


def test_saved_bytes_counts_each_storage_once_and_excludes():
    from utils.sharding.activation_memory import saved_bytes

    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)  # both operands need grad: mm saves both
    total, out = saved_bytes(lambda: torch.tanh(x @ w))  # mm saves x and w, tanh saves its output
    assert out.shape == (4, 8) and total == (4 * 8 + 8 * 8 + 4 * 8) * 4
    without_w, _ = saved_bytes(lambda: torch.tanh(x @ w), exclude=[w])
    assert without_w == total - 8 * 8 * 4
    with torch.no_grad():
        assert saved_bytes(lambda: torch.tanh(x @ w))[0] == 0
