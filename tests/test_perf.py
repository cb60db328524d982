"""utils.perf, the course's one home for timing: the stopwatch and the measure loop (on a fake clock), best_seconds,
one_thread, the peak table and its lookup, the measured peak, MFU's formula, and the Llama built from the planner's
shape."""

import time

import pytest
import torch

from utils.perf import (PEAK_BF16, best_seconds, bf16_peak, llama_config, llama_shape, matmul_peak, measure, mfu,
                        one_thread, stopwatch, table_peak)
from utils.planner import ModelShape, flops_per_token


class FakeClock:
    """A clock that a step advances by hand, and a sync that records when it was called."""

    def __init__(self):
        self.now, self.log = 0.0, []

    def __call__(self):
        self.log.append(("clock", self.now))
        return self.now

    def sync(self):
        self.log.append(("sync", self.now))


def test_stopwatch_times_one_interval_between_two_syncs():
    clock = FakeClock()
    clock.now = 10.0
    with stopwatch(sync=clock.sync, clock=clock) as watch:
        assert watch.seconds is None  # no interval yet inside the block
        clock.now += 2.5  # the work: a launch, process start-up included
    assert watch.seconds == 2.5
    assert [k for k, _ in clock.log] == ["sync", "clock", "sync", "clock"], clock.log  # the device waited for first


def test_stopwatch_leaves_seconds_unset_when_the_block_raises():
    clock = FakeClock()
    with pytest.raises(RuntimeError, match="rank 1"):
        with stopwatch(sync=clock.sync, clock=clock) as watch:
            clock.now += 1.0
            raise RuntimeError("rank 1 failed")
    assert watch.seconds is None  # a failed interval is no measurement
    with stopwatch() as real:  # the real clock and synchronize: a CPU run has no CUDA to wait for
        time.sleep(0.01)
    assert real.seconds >= 0.01


def test_measure_one_interval_warms_up_then_averages():
    clock, calls = FakeClock(), []

    def step():
        calls.append(clock.now)
        clock.now += 2.0 if len(calls) <= 2 else 0.5  # two slow warm-up steps, then 0.5 s each
        return len(calls)

    seconds, last = measure(step, 4, warmup=2, sync=clock.sync, clock=clock)
    assert seconds == [0.5] and last == 6  # the mean timed step; what the last call returned
    kinds = [k for k, _ in clock.log]
    assert kinds == ["sync", "clock", "sync", "clock"], kinds  # the device waited for before and after the clock
    assert clock.log[1] == ("clock", 4.0)  # the clock starts after the warm-up


def test_measure_each_step_with_before_outside_the_clock():
    clock, befores = FakeClock(), []
    durations = iter([9.0, 3.0, 1.0, 2.0])  # one warm-up, then three timed steps

    def before():
        befores.append(clock.now)
        clock.now += 100.0  # a slow barrier: never counted

    def step():
        clock.now += next(durations)

    seconds, _ = measure(step, 3, warmup=1, each=True, before=before, sync=clock.sync, clock=clock)
    assert seconds == [3.0, 1.0, 2.0] and len(befores) == 4  # before every call, warm-up included
    assert [k for k, _ in clock.log][1:4] == ["clock", "sync", "clock"]  # each step waited for before the clock


def test_measure_refuses_bad_arguments():
    with pytest.raises(ValueError, match="steps"):
        measure(lambda: None, 0)
    with pytest.raises(ValueError, match="each=True"):
        measure(lambda: None, 1, before=lambda: None)


def test_best_seconds_keeps_the_minimum_of_each():
    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1

    def slow():
        calls["slow"] += 1
        time.sleep(0.02)

    seconds = best_seconds({"fast": fast, "slow": slow}, repeats=3)
    assert calls == {"fast": 3, "slow": 3}  # round-robin, each `repeats` times
    assert seconds["slow"] >= 0.02 > seconds["fast"]
    with pytest.raises(ValueError, match="repeats"):
        best_seconds({"fast": fast}, repeats=0)


def test_one_thread_restores_the_thread_count():
    before = torch.get_num_threads()
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756), ("NVIDIA H100 NVL", 835), ("NVIDIA H200", 989),
    ("NVIDIA H200 NVL", 835), ("NVIDIA A100-SXM4-80GB", 312),
    ("NVIDIA A100 80GB PCIe", 312), ("NVIDIA A100-PCIE-40GB", 312), ("NVIDIA L4", None), ("Tesla T4", None)])
def test_the_peak_table_by_device_name(name, tflops):
    """torch.cuda.get_device_name()'s names: the specific one before the family (an H100 PCIe is not an SXM)."""
    assert table_peak(name) == (None if tflops is None else tflops * 1e12)
    assert all(v in (312e12, 756e12, 835e12, 989e12) for v in PEAK_BF16.values())  # the data sheets' dense figures


def test_peaks_measured_on_a_cpu_leave_cuda_alone():
    flops = matmul_peak(64, repeats=2, device="cpu")
    assert 0 < flops < 1e15
    peak, source = bf16_peak("cpu")  # no data sheet for a CPU: measured
    assert peak > 0 and source.startswith("CPU: ") and "measured here" in source
    assert not torch.cuda.is_initialized()


def test_mfu_is_model_flops_per_token_times_tokens_over_the_peak():
    shape = llama_shape(2, 64, 4, 128, 32)
    assert mfu(1000.0, shape, 1e12) == pytest.approx(flops_per_token(shape, "none")[0] * 1000.0 / 1e12)
    assert mfu(0.0, shape, 1e12) == 0
    with pytest.raises(ValueError, match="peak"):
        mfu(1000.0, shape, 0)


def test_llama_config_builds_the_shape_it_is_given():
    from transformers import LlamaForCausalLM

    shape = llama_shape(2, 48, 4, 96, 16)  # Llama's 8h/3 MLP by default
    assert shape.ffn_hidden == 128 and shape.gated_mlp and shape.tied_embeddings
    config = llama_config(shape)
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.vocab_size, config.max_position_embeddings) == (48, 128, 2, 4, 4, 96, 16)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as the shape says
    matrices = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n)
    matrices += model.lm_head.weight.numel()  # the tied head counts as a matrix once
    assert flops_per_token(shape)[0] == 6 * matrices + 12 * 2 * 48 * 16  # the FLOPs counted are the model built
    assert llama_shape(2, 48, 4, 96, 16, ffn_hidden=96).ffn_hidden == 96  # the capstone's 2h
    with pytest.raises(ValueError, match="llama_shape"):
        llama_config(ModelShape(layers=1, hidden=8, heads=2, vocab=8, seq_len=4))  # GPT style
