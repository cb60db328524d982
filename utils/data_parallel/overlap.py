"""DDP's communication overlapping backward, timed on every rank (lesson 02a, ``notebooks/02a_ddp_from_scratch.ipynb``,
"Measuring the overlap", which prints ``timed_overlap``; part 2 and lab 02 come back to buckets).

The evidence is the order of three instants of each step, read on the clock of each rank: backward starts, each
bucket's all-reduce is launched (DDP's communication hook notes it), backward returns. Torch DDP launches its first
bucket before backward returns; our ``allreduce_gradients`` (``utils.data_parallel.scratch``) only after, by design.
"""

import copy
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ..comm.ledger import CommLedger
from ..launch import rank_device
from .scratch import allreduce_gradients

__all__ = ["timed_overlap"]


def timed_overlap(repeats, width=512, depth=8, batch=256, bucket_cap_mb=2):
    """On every rank: ``repeats`` steps each of our DDP and torch DDP (``bucket_cap_mb`` buckets), interleaved; per
    timed step, seconds after backward starts: the step, the first all-reduce launched, backward's return."""
    device = rank_device()
    torch.manual_seed(0)
    layers = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())]
    ours = nn.Sequential(*layers).to(device)
    theirs = DDP(copy.deepcopy(ours), bucket_cap_mb=bucket_cap_mb,
                 device_ids=[device] if device.type == "cuda" else None)
    x, launches = torch.randn(batch, width, device=device), []

    def timed_hook(state, bucket):  # DDP calls it for each bucket the moment the bucket is ready
        launches.append(time.perf_counter())
        flat = bucket.buffer().div_(dist.get_world_size())  # pre-divide, then sum = mean
        return dist.all_reduce(flat, async_op=True).get_future().then(lambda fut: fut.value()[0])

    theirs.register_comm_hook(state=None, hook=timed_hook)
    out = {name: dict(step=[], first_launch=[], backward=[], buckets=0) for name in ("ours", "torch DDP")}
    first_ddp_step = None  # buckets of torch DDP's very first step
    for name in ("ours", "torch DDP", "ours", "torch DDP"):  # interleaved: both see the same machine load
        model = theirs if name == "torch DDP" else ours
        for repeat in range(repeats // 2 + 2):
            dist.barrier()  # start together: a late rank would show up as communication time
            launches.clear()
            t0 = time.perf_counter()
            model(x).square().mean().backward()  # torch DDP: the hook launches buckets in here
            t_backward = time.perf_counter()
            if name == "ours":
                launches.append(time.perf_counter())
                with CommLedger() as ledger:  # counts our all-reduces
                    allreduce_gradients(ours)  # all of it, after backward
            if device.type == "cuda":
                torch.cuda.synchronize()  # CUDA kernels run asynchronously: wait before reading the clock
            if name == "torch DDP" and first_ddp_step is None:
                first_ddp_step = len(launches)
            if repeat >= 2:  # the first two warm up (torch DDP's first step is one bucket; it rebuilds them after it)
                out[name]["step"].append(time.perf_counter() - t0)
                out[name]["first_launch"].append(min(launches) - t0)
                out[name]["backward"].append(t_backward - t0)
                out[name]["buckets"] = len(ledger.records) if name == "ours" else len(launches)  # all-reduces
    out["torch DDP"]["first_step_buckets"] = first_ddp_step
    return out
