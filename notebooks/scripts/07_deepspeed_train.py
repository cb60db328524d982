"""Lesson 07 as a script: the course model on digits under DeepSpeed ZeRO, for torchrun or the
`deepspeed` launcher, on CPU processes (gloo) or GPUs (NCCL). Run from the repository root:

    # one machine, 2 CPU processes (what notebook 07c runs) or 2 GPUs:
    torchrun --standalone --nproc_per_node 2 notebooks/scripts/07_deepspeed_train.py --stage 2
    deepspeed --num_gpus 2 notebooks/scripts/07_deepspeed_train.py --stage 2            # GPUs
    # several machines: the same command on each node with torchrun (--nnodes, --rdzv_backend c10d,
    # --rdzv_endpoint, --rdzv_id; no --node_rank: torchrun ignores it with c10d, which numbers the nodes, lesson 10),
    # or once with the deepspeed launcher and a hostfile (ssh to every node):
    deepspeed --hostfile notebooks/scripts/hostfile.example --num_nodes 2 --num_gpus 8 \\
        notebooks/scripts/07_deepspeed_train.py --stage 3 --dtype bf16

Options: --stage 0-3, --steps, --micro-batch, --grad-accum, --dtype fp32|bf16|fp16, --clip,
--offload (optimizer state to CPU, with a torch optimizer: no cpu_adam to compile), --save DIR
(a DeepSpeed checkpoint at the end), --config FILE (your own DeepSpeed JSON config instead of the
built-in one; it is checked with utils.deepspeed.config first and the script stops on a finding).
The last line printed by rank 0 is a JSON summary (losses, world size, ops compiled).
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)  # the course's utils package

import torch
import torch.distributed as dist
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stage", type=int, default=2, choices=range(4))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--micro-batch", type=int, default=16, help="samples per rank per micro-step")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step")
    p.add_argument("--dtype", default="bf16", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--clip", type=float, default=1.0, help="gradient clipping (max global norm); 0 = off")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--offload", action="store_true", help="ZeRO-Offload: optimizer state in CPU memory")
    p.add_argument("--save", default=None, help="folder for a DeepSpeed checkpoint at the end")
    p.add_argument("--config", default=None, help="a DeepSpeed JSON config file (replaces the built-in one)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help="set by the deepspeed launcher")
    return p.parse_args()


def ds_config(args):
    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,  # "gpu" means rank
        "gradient_accumulation_steps": args.grad_accum,
        "gradient_clipping": args.clip,
        "steps_per_print": 10**9,  # we print ourselves
        "zero_optimization": {"stage": args.stage},
        "zero_allow_untested_optimizer": True,  # a torch optimizer: no FusedAdam to compile
    }
    if args.dtype != "fp32":
        config[args.dtype] = {"enabled": True}
    if args.offload:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        config["zero_force_ds_cpu_optimizer"] = False  # keep the torch optimizer (no cpu_adam build)
    return config


def main():
    args = parse_args()
    cuda = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "cuda") == "cuda"
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")  # before importing deepspeed
    local_rank = int(os.environ.get("LOCAL_RANK", args.local_rank or 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    else:  # share the cores among the processes of this node
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    dist.init_process_group("nccl" if cuda else "gloo")  # env:// from torchrun or the deepspeed launcher
    import deepspeed

    from utils.datasets import digits
    from utils.deepspeed.cpu import avoid_op_builds, built_ops
    from utils.deepspeed.config import check_config, report
    from utils.models import ToyNet
    from utils.scale_out.torchrun import finish, print_result

    avoid_op_builds()
    deepspeed.init_distributed()  # wraps the existing process group
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.config is None:
        config = ds_config(args)
    else:
        with open(args.config) as f:
            config = json.load(f)
    findings = check_config(args.config or config, world_size=world)
    if [f for f in findings if f.kind != "note"]:
        raise SystemExit(f"rank {rank}: fix the DeepSpeed config first:\n{report(findings)}")

    torch.manual_seed(0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    model = ToyNet(hidden=args.hidden).to(dtype)  # buffers too: DeepSpeed casts parameters only
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    start = time.perf_counter()
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    init_s = time.perf_counter() - start

    x_all, y_all = digits()
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    losses = []
    for step in range(args.steps):
        total = torch.zeros((), device=engine.device)
        for m in range(gas):  # rank r's m-th micro-batch of this step's global batch
            lo = ((step * gas + m) * world + rank) * micro % (len(x_all) - micro)
            x = x_all[lo:lo + micro].to(engine.device, dtype)  # (micro, 64)
            loss = F.cross_entropy(engine(x).float(), y_all[lo:lo + micro].to(engine.device))
            engine.backward(loss)
            engine.step()  # applies the update at the end of each accumulation
            total += loss.detach() / gas
        dist.all_reduce(total)
        losses.append(total.item() / world)
        if rank == 0:
            print(f"step {step:3d}  loss {losses[-1]:.4f}", flush=True)
    if args.save:
        engine.save_checkpoint(args.save)
    if rank == 0:
        print_result(losses, world_size=world, stage=args.stage, dtype=args.dtype, init_s=round(init_s, 2),
                     device=str(engine.device), ops_built=built_ops(os.environ.get("TORCH_EXTENSIONS_DIR", "")))
    finish()  # destroy the group and exit without the interpreter's teardown (utils.scale_out.torchrun.finish says why)


if __name__ == "__main__":
    main()
