"""utils.deepspeed.training: lesson 07's shared ZeRO config, model and batches (notebooks 07b and 07c)."""

import pytest
import torch

from utils import run_ranks
from utils.deepspeed.training import MICRO, batch, make_model, zero_config


def test_zero_config_sizes_buckets_from_psi_and_refuses_bad_arguments():
    config = zero_config(2, 4000, "bf16", clip=0.5, gas=4, micro=8)
    zero = config["zero_optimization"]
    assert zero["stage"] == 2 and zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 1000
    assert config["bf16"] == {"enabled": True} and "fp16" not in config
    assert config["gradient_clipping"] == 0.5 and config["gradient_accumulation_steps"] == 4
    assert config["train_micro_batch_size_per_gpu"] == 8
    assert "bf16" not in zero_config(0, 10, "fp32") and "fp16" not in zero_config(0, 10, "fp32")
    offload = zero_config(2, 10, "bf16", offload=True)
    assert offload["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert offload["zero_force_ds_cpu_optimizer"] is False
    with pytest.raises(ValueError, match="stage 4"):
        zero_config(4, 10, "bf16")
    with pytest.raises(ValueError, match="'fp8'"):
        zero_config(2, 10, "fp8")


def test_make_model_is_seeded_and_cast():
    a, b = make_model(3, hidden=16), make_model(3, hidden=16, dtype=torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in [*b.parameters(), *b.buffers()] if t.is_floating_point())
    torch.testing.assert_close(b.head.weight, a.head.weight.to(torch.bfloat16))


def _slices(step, micro, gas, m):
    from utils.datasets import digits

    x, y = batch(*digits(), step, micro, gas, m)
    return x.shape[0], int(y[0])


def test_batch_gives_each_rank_its_slice_and_refuses_past_the_data():
    from utils.datasets import digits

    _, y_all = digits()
    got = run_ranks(_slices, 1, 4, 2, 1, world_size=2, verbose=False)  # step 1, micro 4, gas 2, micro-batch 1
    for rank, (n, first) in enumerate(got):
        assert n == 4 and first == int(y_all[(1 * 2 * 2 + 1 * 2 + rank) * 4])
    with pytest.raises(Exception, match="use fewer steps"):
        run_ranks(_slices, 10_000, MICRO, 1, 0, world_size=2, verbose=False)
