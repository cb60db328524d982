"""Lightning's ``fsdp`` and ``deepspeed`` strategies: GPU-only, run where a GPU is, refused on a CPU (notebook 08c).

Both refuse a CPU accelerator, at two different moments (``lightning/pytorch``):

- ``fsdp`` (FSDP1's ``FullyShardedDataParallel``) when the ``Trainer`` is built:
  ``trainer/connectors/accelerator_connector.py`` raises ``ValueError("The strategy `fsdp` requires a GPU
  accelerator, ...")`` unless ``accelerator`` is "cuda"/"gpu" or a ``CUDAAccelerator``;
- ``deepspeed`` when ``fit`` sets the strategy up in each rank: ``DeepSpeedStrategy.setup_environment``
  (``strategies/deepspeed.py``) raises ``RuntimeError("The DeepSpeed strategy is only supported on CUDA
  GPUs ...")`` unless the accelerator is a ``CUDAAccelerator``.

``cpu_refusal`` asks Lightning itself and returns the message; ``fit_gpu_strategy_in_ranks`` is the real run,
for the ranks of ``run_ranks`` on GPUs (one per rank, NCCL): lesson 08's ``LitToy`` under the strategy,
joining the existing process group as ``ModelParallelStrategy`` does in lesson 08a.
"""

import os

__all__ = ["GPU_STRATEGIES", "cpu_refusal", "fit_gpu_strategy_in_ranks"]

GPU_STRATEGIES = ("fsdp", "deepspeed")


def cpu_refusal(name, devices=2):
    """Lightning's own refusal of ``strategy=name`` on the CPU, ``"ExceptionType: first line"``; None if accepted."""
    import lightning as L
    from lightning.pytorch.accelerators import CPUAccelerator

    if name not in GPU_STRATEGIES:
        raise ValueError(f"cpu_refusal knows {GPU_STRATEGIES}, got {name!r}")
    try:
        if name == "fsdp":  # checked when the Trainer is built
            L.Trainer(accelerator="cpu", devices=devices, strategy="fsdp", logger=False)
        else:  # checked when fit() sets the strategy up in each rank: call that check directly
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed: told, not left to probe for a GPU
            from lightning.pytorch.strategies import DeepSpeedStrategy
            DeepSpeedStrategy(accelerator=CPUAccelerator()).setup_environment()
    except Exception as exc:  # noqa: BLE001 - the refusal is what we return
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def fit_gpu_strategy_in_ranks(train_data, name, steps, global_batch, lr):
    """In every rank of ``run_ranks`` on GPUs: ``steps`` SGD steps of ``LitToy`` under ``strategy=name``.

    Returns this rank's per-step losses of its slice, the strategy class, and the peak GPU memory it allocated.
    """
    import torch
    import torch.distributed as dist

    from .toy import LitToy, quiet_lightning, quiet_trainer

    if name not in GPU_STRATEGIES:
        raise ValueError(f"fit_gpu_strategy_in_ranks runs {GPU_STRATEGIES}, got {name!r}")
    if not (dist.is_initialized() and dist.get_backend() == "nccl"):
        raise RuntimeError(f"strategy={name!r} needs GPU ranks: run it with run_ranks on a machine with a CUDA GPU "
                           f"per rank (backend nccl), not {dist.get_backend() if dist.is_initialized() else 'no group'}")
    os.environ.setdefault("DS_ACCELERATOR", "cuda")
    quiet_lightning()
    model = LitToy(train_data, global_batch=global_batch, lr=lr)
    trainer = quiet_trainer(accelerator="gpu", devices=dist.get_world_size(), strategy=name, max_steps=steps,
                            enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(model)
    return dict(losses=model.losses, strategy=type(trainer.strategy).__name__,
                peak_bytes=torch.cuda.max_memory_allocated())
