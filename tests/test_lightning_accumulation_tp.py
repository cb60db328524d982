"""utils.lightning.accumulation and .gpu_strategies (lesson 08c): the equality the lesson asserts, on the
smallest case, and the errors that name the numbers. (ToyNet's tensor-parallel plan: tests/test_toy_tp_plan.py.)"""

import pytest
import torch
from torch.utils.data import TensorDataset

from utils.lightning.accumulation import fit_accumulating
from utils.lightning.gpu_strategies import cpu_refusal, fit_gpu_strategy_in_ranks
from utils.lightning.toy import digits_in_order

TOL = dict(rtol=1e-5, atol=1e-6)  # float32, another summation order


def test_accumulation_equals_the_large_batch_in_one_process():
    x, y = digits_in_order()
    data = TensorDataset(x[:96], y[:96])
    large = fit_accumulating(data, steps=2, micro_batches=1, global_batch=48, lr=0.5)
    small = fit_accumulating(data, steps=2, micro_batches=3, global_batch=48, lr=0.5)
    assert small["optimizer_steps"] == large["optimizer_steps"] == 2 and len(small["losses"]) == 6
    assert small["allreduces"] == 0, "one process: no DDP, nothing to count"
    torch.testing.assert_close(small["weights"], large["weights"], **TOL)


def test_accumulation_names_an_indivisible_batch():
    x, y = digits_in_order()
    with pytest.raises(ValueError, match="global batch 70 does not split into 4 micro-batches on 1 ranks"):
        fit_accumulating(TensorDataset(x[:70], y[:70]), steps=1, micro_batches=4, global_batch=70, lr=0.5)


def test_gpu_strategies_are_refused_on_a_cpu_by_lightning_itself():
    if torch.cuda.device_count():  # never is_available() here: that would initialise CUDA in the test process
        pytest.skip("a CUDA device is present: Lightning accepts fsdp and deepspeed")
    for name in ("fsdp", "deepspeed"):
        refusal = cpu_refusal(name)
        assert refusal and ("GPU" in refusal or "CUDA" in refusal), (name, refusal)
    with pytest.raises(ValueError, match="cpu_refusal knows"):
        cpu_refusal("ddp")


def test_gpu_run_outside_gpu_ranks_says_what_to_do():
    with pytest.raises(RuntimeError, match="needs GPU ranks"):
        fit_gpu_strategy_in_ranks(None, "fsdp", steps=1, global_batch=48, lr=0.5)
