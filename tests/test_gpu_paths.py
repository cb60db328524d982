"""The CUDA paths of the lesson scripts and of utils.deepspeed.cpu, checked on a machine without a GPU.

Two failures seen on a 1-GPU machine (issue 12), each faked here at the point where it happened:

- ``07_deepspeed_train.py`` under torchrun: ``avoid_op_builds`` insisted on the shm op, which only
  DeepSpeed's CPU accelerator has; the CUDA accelerator's table of ops has no such name.
- ``08_lightning_train.py --accelerator gpu --strategy fsdp|deepspeed``: the losses were reduced
  as a CPU tensor, which NCCL refuses ("No backend type associated with device type cpu").
"""

import importlib.util
import os

import pytest
import torch

from utils.course.notebook_runner import ROOT

deepspeed = pytest.importorskip("deepspeed")
import deepspeed.accelerator  # noqa: E402
import deepspeed.ops  # noqa: E402

from utils.deepspeed import cpu as deepspeed_cpu  # noqa: E402
from utils.launch.scripts import parse_losses  # noqa: E402

CUDA_LIKE_OPS = {"async_io": False, "fused_adam": True, "cpu_adam": True, "fused_lamb": True,
                 "transformer_inference": True, "deepspeed_not_implemented": False}  # no shm op on CUDA


class CpuLikeAccelerator:
    """The part of DeepSpeed's CPU accelerator that avoid_op_builds asks: it has a shm builder."""

    def device_name(self, device_index=None):
        return "cpu"

    def create_op_builder(self, class_name):
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

        return ShareMemCommBuilder() if class_name == deepspeed_cpu.SHM_BUILDER else None


@pytest.fixture
def accelerator_and_ops(monkeypatch):
    """use(accelerator, table): what ``get_accelerator()`` and ``deepspeed.ops.__compatible_ops__`` return."""
    def use(accelerator, table):
        monkeypatch.setattr(deepspeed.accelerator, "get_accelerator", lambda: accelerator)
        # setitem on the module's dict: a plain setattr would first read the lazy attribute, which probes every op
        monkeypatch.setitem(vars(deepspeed.ops), "__compatible_ops__", table)
        return table
    return use


def test_avoid_op_builds_on_the_cuda_accelerator(accelerator_and_ops):
    """DeepSpeed's real CUDA accelerator (it can be built without a GPU) has no shm builder: nothing to do."""
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    cuda = CUDA_Accelerator()
    assert cuda.create_op_builder(deepspeed_cpu.SHM_BUILDER) is None
    table = accelerator_and_ops(cuda, dict(CUDA_LIKE_OPS))
    deepspeed_cpu.avoid_op_builds()  # raised "DeepSpeed 0.19.8 has no op named 'deepspeed_shm_comm'" before
    assert table == CUDA_LIKE_OPS  # untouched


def test_avoid_op_builds_on_the_cpu_accelerator(accelerator_and_ops):
    table = accelerator_and_ops(CpuLikeAccelerator(), {**CUDA_LIKE_OPS, deepspeed_cpu.SHM_OP: True})
    deepspeed_cpu.avoid_op_builds()
    assert table[deepspeed_cpu.SHM_OP] is False and {k: table[k] for k in CUDA_LIKE_OPS} == CUDA_LIKE_OPS


def test_avoid_op_builds_names_a_missing_op(accelerator_and_ops):
    """A builder whose op is not in the table: a DeepSpeed that changed, said with the fix."""
    accelerator_and_ops(CpuLikeAccelerator(), dict(CUDA_LIKE_OPS))
    with pytest.raises(RuntimeError, match=r"cpu accelerator would build .deepspeed_shm_comm.* update utils/"):
        deepspeed_cpu.avoid_op_builds()


def test_deepspeed_sent_to_a_rank_avoids_the_shm_op_there(accelerator_and_ops, tmp_path):
    """The ``deepspeed`` of import_deepspeed travels to a rank by calling avoid_op_builds on arrival."""
    import cloudpickle

    table = accelerator_and_ops(CpuLikeAccelerator(), {**CUDA_LIKE_OPS, deepspeed_cpu.SHM_OP: True})
    kernel_side = deepspeed_cpu.DeepSpeedForRanks(deepspeed, str(tmp_path))
    assert kernel_side.initialize is deepspeed.initialize and table[deepspeed_cpu.SHM_OP] is True  # nothing yet
    old = os.environ.get("TORCH_EXTENSIONS_DIR")
    try:
        rank_fn = cloudpickle.loads(cloudpickle.dumps(lambda: kernel_side.__version__))  # what run_ranks does
        assert rank_fn() == deepspeed.__version__
        assert table[deepspeed_cpu.SHM_OP] is False and os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path)
    finally:
        os.environ.pop("TORCH_EXTENSIONS_DIR") if old is None else os.environ.update(TORCH_EXTENSIONS_DIR=old)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_import_deepspeed_picks_the_ranks_accelerator(monkeypatch, device):
    """On a GPU machine (the ranks get NCCL and GPUs) DeepSpeed must use its CUDA accelerator, else its CPU one."""
    import types

    import utils.launch

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "unchanged")  # restored after the test
    monkeypatch.setattr(utils.launch, "plan_launch", lambda world_size: types.SimpleNamespace(device=device))
    ds, folder = deepspeed_cpu.import_deepspeed(2, warm=False)
    assert os.environ["DS_ACCELERATOR"] == device and os.environ["TORCH_EXTENSIONS_DIR"] == folder
    assert deepspeed_cpu.built_ops(folder) == [] and ds.__version__ == deepspeed.__version__
    os.rmdir(folder)
    with pytest.raises(ValueError, match="world_size=0"):
        deepspeed_cpu.import_deepspeed(0)


def _lightning_script():
    spec = importlib.util.spec_from_file_location("lightning_train", ROOT / "notebooks/scripts/08_lightning_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lightning_script_reduces_on_the_strategy_device(monkeypatch, capsys):
    """The final mean over ranks gets a tensor on ``strategy.root_device`` (a GPU there; "meta" here)."""
    script, reduced = _lightning_script(), []

    class Strategy:
        root_device = torch.device("meta")  # stands for cuda:0: anything but the CPU

        def reduce(self, tensor, reduce_op):
            reduced.append((tensor.device, reduce_op))
            return torch.tensor([2.0, 1.0])

    class Trainer:
        global_rank, strategy = 0, Strategy()

        def __init__(self, **kwargs):
            self.kwargs = kwargs

        def fit(self, model):
            model.losses = [2.0, 1.0]  # what training_step would have appended

    monkeypatch.setattr(script.L, "Trainer", Trainer)
    script.main(["--accelerator", "gpu", "--devices", "1", "--strategy", "fsdp", "--steps", "2"])
    assert reduced == [(torch.device("meta"), "mean")]
    assert parse_losses(capsys.readouterr().out) == [2.0, 1.0]
