"""Did ``torch.compile`` compile a DDP model, and do DDP's all-reduces still overlap the backward pass?
Lesson 08 (notebooks/08b_lightning_speedups.ipynb, "torch.compile and DDP") runs ``compile_check`` in ranks.

No code is generated: the backend is ``aot_autograd`` with two tiny compilers that run each graph as it is,
the forward one counting the operations of each graph it receives, the backward one logging each time a
backward piece runs. A DDP communication hook logs each bucket's all-reduce when DDP issues it.
"""

from __future__ import annotations

import importlib
import logging

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

__all__ = ["ORDERS", "compile_check", "logging_backend"]

ORDERS = ("DDP(compile(m))", "compile(DDP(m))")


def logging_backend(graphs, events):
    """aot_autograd whose compilers run each graph as it is: forward graphs counted, backward ones logged."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def forward_compiler(gm, example_inputs):  # once per captured graph: count its operations
        graphs.append(sum(node.op.startswith("call") for node in gm.graph.nodes))
        return make_boxed_func(gm.forward)  # run it as is: no code generation

    def backward_compiler(gm, example_inputs):  # once per piece's backward: log each time it runs
        run = make_boxed_func(gm.forward)

        def logged(args):
            events.append("backward piece")
            return run(args)
        logged._boxed_call = True  # the calling convention make_boxed_func declares
        return logged

    return aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler)


def compile_check(order, x, y, optimize_ddp=True, hidden=1024, bucket_cap_mb=1):
    """In a rank: ToyNet(hidden) under DDP and torch.compile in `order` (one of ORDERS), trained 3 steps on
    this rank's 60 samples of (x, y) (rows rank, rank + n, ...); what the third step did: graphs, graph breaks and why, the backward's events in order,
    how many all-reduces were issued while backward pieces remained, and whether the gradients were averaged."""
    from torch._dynamo import reset as dynamo_reset
    from torch._dynamo.utils import counters
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from utils.models import ToyNet
    from utils.launch import rank_device

    if order not in ORDERS:
        raise ValueError(f"order {order!r} is not one of {ORDERS}.")
    dynamo_config = importlib.import_module("torch._dynamo.config")
    torch._logging.set_logs(dynamo=logging.ERROR)  # no warnings about the profiler from the tracer
    dynamo_reset()
    counters.clear()
    dynamo_config.optimize_ddp = optimize_ddp  # True is torch's default: the DDPOptimizer
    graphs, events = [], []
    backend = logging_backend(graphs, events)
    rank, n, device = dist.get_rank(), dist.get_world_size(), rank_device()
    torch.manual_seed(0)
    net = ToyNet(hidden=hidden).to(device)
    if order == "DDP(compile(m))":
        ddp = model = DDP(torch.compile(net, backend=backend), bucket_cap_mb=bucket_cap_mb)
    else:
        ddp = DDP(net, bucket_cap_mb=bucket_cap_mb)
        model = torch.compile(ddp, backend=backend)

    def logged_allreduce(state, bucket):  # DDP calls it as soon as every gradient of a bucket is ready
        events.append(f"all-reduce {bucket.index()}")
        return allreduce_hook(dist.group.WORLD, bucket)  # then the usual: the mean over the ranks
    ddp.register_comm_hook(None, logged_allreduce)
    x, y = x[rank::n][:60].to(device), y[rank::n][:60].to(device)  # this rank's share of the batch
    for _ in range(3):  # DDP rebuilds its buckets after the first step, in the order gradients came: watch the 3rd
        events.clear()
        net.zero_grad()
        F.cross_entropy(model(x), y).backward()
    grad = net.head.weight.grad.clone()
    dist.all_reduce(grad)  # if DDP averaged, every rank already holds the mean
    last_piece = max(i for i, e in enumerate(events) if e == "backward piece")
    reasons = [next((line.strip() for line in why.splitlines() if "Explanation" in line), why.splitlines()[0])[:150]
               for why in counters["graph_break"]]  # why Dynamo broke the graph, one line each
    return dict(graphs=graphs, graph_breaks=sum(counters["graph_break"].values()), reasons=reasons, events=events,
                early=sum(e.startswith("all-reduce") for e in events[:last_piece]),  # issued while backward remained
                synced=torch.allclose(grad / n, net.head.weight.grad, atol=1e-6))
