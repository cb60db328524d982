"""The hardware-dependent branches of lesson 07, without the hardware.

DeepSpeed's accelerator answers ``is_fp16_supported()`` / ``is_bf16_supported()`` with True, False
or None (its CPU accelerator returns None on a CPU without fp16, an AMD EPYC). Each answer is faked
here, and so is a CPU without bf16, to check the normalised facts (``utils.hardware.precision_support``)
and the branch the lesson takes on them (``half_precision``, ``expected_fp16_outcome``): the same
functions notebooks 07a and 07b call.
"""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import utils.hardware as hw


class FakeAccelerator:
    """Answers like a DeepSpeed accelerator, with whatever we tell it to."""

    def __init__(self, fp16, bf16, name="cpu"):
        self.fp16, self.bf16, self.name = fp16, bf16, name

    def device_name(self):
        return self.name

    def is_fp16_supported(self):
        return self.fp16

    def is_bf16_supported(self):
        return self.bf16


ANSWERS = [True, False, None]


@pytest.fixture
def cpu(monkeypatch):
    """Set what torch says about this CPU: cpu(fp16=..., bf16=..., amx=...)."""
    def set_cpu(fp16=False, bf16=False, amx=False):
        monkeypatch.setattr(hw, "_torch_cpu_facts", lambda: (fp16, bf16, amx))
    set_cpu()
    return set_cpu


@pytest.mark.parametrize("fp16", ANSWERS, ids=lambda a: f"fp16={a}")
@pytest.mark.parametrize("bf16", ANSWERS, ids=lambda a: f"bf16={a}")
def test_every_answer_becomes_a_bool(cpu, fp16, bf16):
    support = hw.precision_support(FakeAccelerator(fp16, bf16))
    assert support.deepspeed_fp16 is bool(fp16) and support.deepspeed_bf16 is bool(bf16)
    for name in ("deepspeed_fp16", "deepspeed_bf16", "cpu_fp16", "cpu_bf16", "amx"):
        assert type(getattr(support, name)) is bool, name


@pytest.mark.parametrize("fp16, outcome", [(True, "accepted"), (False, "refused"), (None, "refused")])
def test_fp16_branch(cpu, fp16, outcome):
    """The lesson's assert: fp16 accepted exactly where the accelerator says so; None means refused."""
    assert hw.expected_fp16_outcome(hw.precision_support(FakeAccelerator(fp16, True))) == outcome


@pytest.mark.parametrize("fp16, bf16, dtype", [
    (True, True, "bf16"), (False, True, "bf16"), (None, True, "bf16"),  # bf16 first: no loss scaling
    (True, False, "fp16"), (True, None, "fp16"),                        # a V100: fp16 only
])
def test_half_precision_branch(cpu, fp16, bf16, dtype):
    assert hw.half_precision(hw.precision_support(FakeAccelerator(fp16, bf16))) == dtype


@pytest.mark.parametrize("fp16, bf16", [(False, False), (None, None), (None, False)])
def test_no_half_precision_is_a_clear_error(cpu, fp16, bf16):
    with pytest.raises(ValueError, match="accepts neither bf16 nor fp16"):
        hw.half_precision(hw.precision_support(FakeAccelerator(fp16, bf16, name="xpu")))


def test_cpu_without_bf16(cpu):
    """An AVX2-only CPU: DeepSpeed's CPU accelerator still accepts bf16 (torch emulates it), natively nothing."""
    cpu(fp16=False, bf16=False, amx=False)
    support = hw.precision_support(FakeAccelerator(None, True))
    assert (support.cpu_fp16, support.cpu_bf16, support.amx) == (False, False, False)
    assert hw.half_precision(support) == "bf16" and hw.expected_fp16_outcome(support) == "refused"
    assert "bf16: no" in hw.describe_precision(support) and "accepts fp16: no" in hw.describe_precision(support)


def test_cpu_with_amx(cpu):
    """A Sapphire Rapids Xeon: fp16 and bf16 native, fp16 accepted."""
    cpu(fp16=True, bf16=True, amx=True)
    support = hw.precision_support(FakeAccelerator(True, True))
    assert support.cpu_fp16 and support.cpu_bf16 and support.amx
    assert hw.expected_fp16_outcome(support) == "accepted"


def test_default_accelerator_is_deepspeeds(cpu, monkeypatch):
    """Without an argument, the accelerator comes from deepspeed.accelerator.get_accelerator()."""
    fake = types.ModuleType("deepspeed.accelerator")
    fake.get_accelerator = lambda: FakeAccelerator(None, True, name="fake")
    monkeypatch.setitem(sys.modules, "deepspeed.accelerator", fake)
    support = hw.precision_support()
    assert support.accelerator == "fake" and support.deepspeed_fp16 is False


@pytest.mark.parametrize("native", [True, False])
def test_deepspeed_cpu_accelerator_itself(monkeypatch, native):
    """The real CPU accelerator with torch's answer faked: it returns None (not False) without fp16,
    and precision_support turns that into False."""
    cpu_accelerator = pytest.importorskip("deepspeed.accelerator.cpu_accelerator")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: native)
    accelerator = cpu_accelerator.CPU_Accelerator()
    assert accelerator.is_fp16_supported() is (True if native else None)  # None: the answer that broke lesson 07
    support = hw.precision_support(accelerator)
    assert support.deepspeed_fp16 is native and support.deepspeed_bf16 is True
    assert hw.expected_fp16_outcome(support) == ("accepted" if native else "refused")


def test_real_machine_gives_bools():
    """Whatever this machine is, the facts are bools and the branch functions answer."""
    pytest.importorskip("deepspeed")
    support = hw.precision_support()
    assert all(type(v) is bool for k, v in vars(support).items() if k != "accelerator")
    assert hw.expected_fp16_outcome(support) in ("accepted", "refused")


# ------------------------------------------------------------------ a CUDA build of torch with no NVIDIA driver

def _machine(monkeypatch, cuda, loadable, system="Linux"):
    """torch built with CUDA ``cuda`` (None: a CPU build), on a machine where only ``loadable`` libraries load."""
    def fake_cdll(name):
        if name not in loadable:
            raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(hw.torch.version, "cuda", cuda)
    monkeypatch.setattr(hw.ctypes, "CDLL", fake_cdll)
    monkeypatch.setattr(hw.platform, "system", lambda: system)


@pytest.mark.parametrize("cuda, loadable, system, hidden", [
    ("13.0", [], "Linux", True),  # pip's CUDA wheel on a laptop or a CI box: no driver at all
    ("13.0", ["libnvidia-ml.so.1", "libcuda.so.1"], "Linux", False),  # a GPU box
    ("13.0", ["libcuda.so.1"], "Linux", False),  # a driver without NVML: left alone, a GPU may be there
    (None, [], "Linux", False),  # the CPU build never asks CUDA
    ("13.0", [], "Darwin", False),
])
def test_cuda_hidden_only_where_no_driver_can_run_it(monkeypatch, cuda, loadable, system, hidden):
    _machine(monkeypatch, cuda, loadable, system)
    environ = {}
    assert hw.hide_cuda_without_driver(environ) is hidden
    assert environ == ({"CUDA_VISIBLE_DEVICES": ""} if hidden else {})


def test_a_learners_cuda_visible_devices_is_kept(monkeypatch):
    _machine(monkeypatch, "13.0", [])
    environ = {"CUDA_VISIBLE_DEVICES": "0"}
    assert hw.hide_cuda_without_driver(environ) is False and environ == {"CUDA_VISIBLE_DEVICES": "0"}


def test_no_bad_fork_after_deepspeed_asks_for_gpus():
    """What the hiding is for, in a fresh Python: ``import utils``, then DeepSpeed's import (which counts the
    GPUs), then a fork; the child must not be "in bad fork". Only a CUDA build with no driver could fail it."""
    code = ("import os, utils, deepspeed, torch\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os._exit(3 if torch.cuda._is_in_bad_fork() else 0)\n"
            "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(hw.__file__).resolve().parents[1], env=env)
    assert run.returncode == 0 and run.stdout.strip().splitlines()[-1] == "0", (run.stdout, run.stderr[-2000:])
