"""Lesson 08's training job as a script, for strategy "ddp" (and for torchrun or a cluster).

The LightningModule itself, ``LitToy``, lives in ``utils/lightning/toy.py``: lesson 08 imports it
from there too, so the module is written once. This script trains it (the course model,
``utils.ToyNet``) on the digits in lesson 02's data order and prints the per-step global losses
on rank 0:

    python notebooks/scripts/08_lightning_train.py --devices 2 --accelerator cpu
    python notebooks/scripts/08_lightning_train.py --devices 2 --strategy model_parallel   # FSDP2

With ``--strategy ddp`` (the default) Lightning starts the other ranks itself, by running this
same file again with ``LOCAL_RANK`` set: that is why ``ddp`` needs a script and is refused in a
notebook kernel, where ``ddp_notebook`` forks its ranks instead. Under ``torchrun`` the processes
already exist (``LOCAL_RANK`` is set) and Lightning only joins them; in a notebook,
``ModelParallelStrategy`` does the same inside ``utils.run_ranks``, and so does ``ddp``: it always installs
its script launcher, but the launcher starts no children when ``LOCAL_RANK`` is set (lesson 08c trains
under ``ddp`` inside ``run_ranks``). Only a ``Trainer(strategy="ddp")`` built in a notebook kernel is refused.
"""

import argparse
import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `utils`
from utils.datasets import digits_in_order  # noqa: E402 - after the path
from utils.lightning.toy import GLOBAL_BATCH, LitToy  # noqa: E402
from utils.scale_out.torchrun import print_result  # noqa: E402


def strategy_from_name(name, devices):
    """Lightning's names pass through ("ddp", "fsdp", "deepspeed"); "model_parallel" is FSDP2 on all devices."""
    if name == "model_parallel":
        from lightning.pytorch.strategies import ModelParallelStrategy

        return ModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1)
    return name


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="processes (CPU) or GPUs")
    parser.add_argument("--accelerator", default="cpu", help="cpu or gpu")
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "model_parallel", "fsdp", "deepspeed"])
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps")
    args = parser.parse_args(argv)
    x, y = digits_in_order()
    n = args.steps * GLOBAL_BATCH
    if n > len(x):
        raise ValueError(f"{args.steps} steps of {GLOBAL_BATCH} need {n} samples, the digits have {len(x)}; "
                         f"use at most {len(x) // GLOBAL_BATCH} steps")
    model = LitToy(TensorDataset(x[:n], y[:n]), shard=args.strategy == "model_parallel")
    trainer = L.Trainer(accelerator=args.accelerator, devices=args.devices,
                        strategy=strategy_from_name(args.strategy, args.devices), max_steps=args.steps,
                        use_distributed_sampler=False,  # keep our sampler: lesson 02's data order
                        enable_progress_bar=False, enable_model_summary=False, logger=False,
                        enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(model)
    # Every rank has its own shard losses; the global loss is their mean (equal shard sizes). The
    # tensor goes on the strategy's device: NCCL reduces CUDA tensors only (gloo takes CPU ones).
    losses = torch.tensor(model.losses, device=trainer.strategy.root_device)
    losses = trainer.strategy.reduce(losses, reduce_op="mean")
    if trainer.global_rank == 0:
        print_result(losses.tolist())


if __name__ == "__main__":
    main()
