"""Lesson 02's torch DDP as a script for torchrun: the course model, lesson 02's data order, SGD.

    python -m torch.distributed.run --standalone --nproc-per-node 4 notebooks/scripts/02_ddp_train.py --steps 3

The loop is ``utils.data_parallel.torch_ddp.ddp_losses``: rank r trains on samples r, r+n, ... of each global batch of
240 digits and DDP averages the gradients. Rank 0 prints the per-step global losses, exactly (``RESULT``),
which lesson 02 compares with its own cells and lesson 10 with the same run on two nodes.
"""

import argparse
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `utils`
from utils.data_parallel.torch_ddp import DDP_BATCH, DDP_LR, ddp_losses  # noqa: E402 - after the path
from utils.scale_out.torchrun import finish, init_from_env, print_result  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=7, help="optimizer steps (7 batches of 240 = one pass)")
    parser.add_argument("--batch", type=int, default=DDP_BATCH, help="global batch, divisible by the world size")
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adamw"])
    parser.add_argument("--lr", type=float, default=DDP_LR)
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    args = parser.parse_args(argv)
    init_from_env(args.backend)
    losses = ddp_losses(args.steps, args.batch, args.optimizer, args.lr)
    if dist.get_rank() == 0:
        print_result(losses)
    finish()  # destroy the group and exit without the interpreter's teardown (utils.scale_out.torchrun.finish says why)


if __name__ == "__main__":
    main()
