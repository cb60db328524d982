"""Lesson 06's pipeline as a script for torchrun: the course model traced into 2-4 stages, GPipe, SGD.

    python -m torch.distributed.run --standalone --nproc-per-node 2 notebooks/scripts/06_pipeline_train.py --steps 3

The loop is ``utils.pipeline.pipelining.pipeline_losses``: ``torch.distributed.pipelining`` cuts ToyNet at its
layer boundaries (one stage per process, at most 4), runs GPipe over the micro-batches of 32 digits, sums the
tied weight's gradient over the stages and steps. Step 0's loss is lesson 06's one-process loss on its batch.
"""

import argparse
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `utils`
from utils.pipeline.pipelining import PIPE_BATCH, PIPE_LR, pipeline_losses  # noqa: E402 - after the path
from utils.scale_out.torchrun import finish, init_from_env, print_result  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps")
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches per step (divides --batch)")
    parser.add_argument("--batch", type=int, default=PIPE_BATCH, help="rows per step")
    parser.add_argument("--lr", type=float, default=PIPE_LR, help="SGD learning rate")
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    args = parser.parse_args(argv)
    init_from_env(args.backend)
    losses = pipeline_losses(args.steps, args.microbatches, args.batch, args.lr)
    if dist.get_rank() == 0:
        print_result(losses)
    finish()  # destroy the group and exit without the interpreter's teardown (utils.scale_out.torchrun.finish says why)


if __name__ == "__main__":
    main()
