"""Lesson 04's FSDP2 as a script for torchrun: the course model sharded block by block, Adam.

    python -m torch.distributed.run --standalone --nproc-per-node 4 notebooks/scripts/04_fsdp_train.py --hidden 512

The loop is ``utils.sharding.fsdp2.fsdp_losses``: ``fully_shard`` on embed, on the tied mix1/mix2 pair (one
group) and on head, then the root; each rank trains on its 1/n of 120 digits per step. Rank 0 prints the
per-step global losses (``RESULT``), which lesson 04a compares with its own FSDP2 cells.
"""

import argparse
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `utils`
from utils.sharding.fsdp2 import FSDP_BATCH, FSDP_LR, fsdp_losses  # noqa: E402 - after the path
from utils.scale_out.torchrun import finish, init_from_env, print_result  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps")
    parser.add_argument("--hidden", type=int, default=512, help="course model width (lesson 04: 512, SMOKE 128)")
    parser.add_argument("--batch", type=int, default=FSDP_BATCH, help="global batch, divisible by the world size")
    parser.add_argument("--lr", type=float, default=FSDP_LR, help="Adam learning rate")
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    args = parser.parse_args(argv)
    init_from_env(args.backend)
    losses = fsdp_losses(args.steps, args.hidden, args.batch, args.lr)
    if dist.get_rank() == 0:
        print_result(losses)
    finish()  # destroy the group and exit without the interpreter's teardown (utils.scale_out.torchrun.finish says why)


if __name__ == "__main__":
    main()
