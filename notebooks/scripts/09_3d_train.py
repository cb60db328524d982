"""Lesson 09's 3-D parallel training as a script for torchrun: the tiny Llama on a dp x pp x tp mesh.

    python -m torch.distributed.run --standalone --nproc-per-node 8 notebooks/scripts/09_3d_train.py --dp 2 --pp 2 --tp 2

The run is a ``utils.planner.Plan`` (``utils.mesh.plan3d.mesh_plan``); the model, the split and the loop are
``utils.mesh.parallelize3d`` (``build`` and ``train``), the code lesson 09 derives and runs in its own cells; its
one-process ``reference`` is what the losses must match.
``--dp 1 --pp 1`` is pure tensor (and sequence) parallelism: that is ``05_tp_train.py``.
"""

import argparse
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `utils`
from utils.mesh.parallelize3d import LR, train  # noqa: E402 - after the path
from utils.mesh.plan3d import mesh_plan  # noqa: E402
from utils.scale_out.torchrun import finish, init_from_env, print_result  # noqa: E402


def main(argv=None, tp_only=False):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps")
    if not tp_only:
        parser.add_argument("--dp", type=int, default=1, help="data-parallel degree (FSDP2)")
        parser.add_argument("--pp", type=int, default=1, help="pipeline stages")
    parser.add_argument("--tp", type=int, default=None, help="tensor-parallel degree (default: what is left)")
    parser.add_argument("--lr", type=float, default=LR, help="Adam learning rate")
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    args = parser.parse_args(argv)
    dp, pp = (1, 1) if tp_only else (args.dp, args.pp)
    init_from_env(args.backend)
    n = dist.get_world_size()
    tp = args.tp or n // (dp * pp)
    if dp * pp * tp != n:
        raise ValueError(f"dp x pp x tp = {dp} x {pp} x {tp} = {dp * pp * tp}, but torchrun started {n} processes; "
                         f"choose degrees whose product is {n}")
    out = train(mesh_plan(dp, pp, tp), args.steps, lr=args.lr)  # the planner's check_plan says what does not fit
    if dist.get_rank() == 0:
        print(f"mesh dp={dp} pp={pp} tp={tp}")
        print_result(out["losses"])
    finish()  # destroy the group and exit without the interpreter's teardown (utils.scale_out.torchrun.finish says why)


if __name__ == "__main__":
    main()
