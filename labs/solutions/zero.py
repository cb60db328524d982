"""Reference solution of labs/03_zero_lab.ipynb: ZeRO-2 with gradient buckets reduced during backward.

Lesson 03's ZeRO-2 reduce-scatters the gradients of one *module unit* at a time. DeepSpeed cuts the
gradients by size instead (``reduce_bucket_size``, in numbers): backward produces them in roughly
the reverse order of ``model.parameters()``, they are collected into a bucket, and as soon as a
bucket's last gradient exists its padded flat copy is **reduce-scattered** (each rank receives the
sum of its chunk only) and the full gradients are **freed**. So a rank never holds more than about
one bucket of full gradients, and after backward it holds Ψ/n gradient numbers, not Ψ.

Then the sharded step of ZeRO (Rajbhandari et al., arXiv 1910.02054): any ``torch.optim`` optimizer
(``optimizer_class``, with its ``**defaults``, as torch's ``ZeroRedundancyOptimizer`` takes them) over this
rank's chunk of each bucket (Adam's state: 8 bytes x Ψ/n in fp32), and an **all-gather** of the updated
chunks so that every replica is whole again. ``params`` is what any torch optimizer takes: tensors or
parameter groups, a generator works, frozen parameters are skipped (``utils.sharding.groups``). A bucket
never spans two groups (DeepSpeed also flattens and partitions each parameter group on its own), so each
chunk belongs to one group and the inner optimizer gets that group's options. For an element-wise rule
(SGD, Adam, AdamW) a chunk's update is the unsharded optimizer's, element for element. Per step a rank sends Ψ(n-1)/n values in the reduce-scatters and
Ψ(n-1)/n in the all-gathers: 2Ψ(n-1)/n values, DDP's bill (plus at most n-1 padding values per bucket).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from utils.comm import compat  # all_gather_single / reduce_scatter_single on torch 2.11-2.15
from utils.sharding.groups import param_groups


def make_buckets(params, bucket_numel):
    """Group ``params`` into buckets in the order backward produces their gradients (reversed).

    DeepSpeed's rule: a bucket is closed *before* a parameter that would take it past
    ``bucket_numel`` numbers, so no bucket holds more, except a single parameter that is larger
    on its own.
    """
    if bucket_numel < 1:
        raise ValueError(f"bucket_numel={bucket_numel}: a bucket must hold at least 1 number; DeepSpeed's "
                         "reduce_bucket_size is typically 5e8, use e.g. 1_000 for a model of 9,034 parameters.")
    buckets, current, size = [], [], 0
    for p in reversed(params):
        if current and size + p.numel() > bucket_numel:  # p would overflow the bucket: close it first
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += p.numel()
    if current:
        buckets.append(current)
    return buckets


class BucketedZeRO2:
    """ZeRO-2 (P_os+g) as DeepSpeed runs it: buckets reduce-scattered from gradient hooks during backward,
    then ``optimizer_class`` (any element-wise torch.optim optimizer) on this rank's chunks."""

    def __init__(self, params, bucket_numel, optimizer_class=torch.optim.Adam, **defaults):
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.param_groups = param_groups(params)  # dicts of trainable tensors: frozen ones dropped, a generator read
        self.buckets, self.group_of = [], []  # one group per bucket, so a chunk has one group's options
        for g, group in enumerate(self.param_groups):
            for bucket in make_buckets(group["params"], bucket_numel):
                self.buckets.append(bucket)
                self.group_of.append(g)
        self.grad_shards = [None for _ in self.buckets]  # after backward: the mean gradient of each chunk
        self.numels = [sum(p.numel() for p in bucket) for bucket in self.buckets]
        self.chunks = [-(-numel // self.n) for numel in self.numels]  # ceil: n equal chunks, with padding
        self.param_shards = []  # this rank's chunk of each bucket's flat parameters: what the optimizer updates
        for bucket, numel, chunk in zip(self.buckets, self.numels, self.chunks):
            flat = F.pad(torch.cat([p.detach().reshape(-1) for p in bucket]), (0, chunk * self.n - numel))
            self.param_shards.append(flat[self.rank * chunk:(self.rank + 1) * chunk].clone())  # (chunk,)
        shards_of_group = [[] for _ in self.param_groups]
        for shard, g in zip(self.param_shards, self.group_of):
            shards_of_group[g].append(shard)
        self.optimizer = optimizer_class(  # each group's own options (lr, weight_decay...) over its chunks
            [{**group, "params": shards} for group, shards in zip(self.param_groups, shards_of_group)], **defaults)
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.missing = [len(bucket) for bucket in self.buckets]  # gradients still to come, per bucket
        for bucket in self.buckets:
            for p in bucket:
                p.register_post_accumulate_grad_hook(self._grad_ready)  # runs once p.grad is complete

    def _grad_ready(self, p):
        """During backward: count the bucket's gradients; when the last is there, reduce-scatter and free."""
        i = self.bucket_of[id(p)]
        self.missing[i] -= 1
        if self.missing[i] > 0:
            return
        self.missing[i] = len(self.buckets[i])  # ready for the next backward
        bucket, numel, chunk = self.buckets[i], self.numels[i], self.chunks[i]
        full = F.pad(torch.cat([q.grad.reshape(-1) for q in bucket]), (0, chunk * self.n - numel))  # (chunk * n,)
        for q in bucket:
            q.grad = None  # the full gradients go now: only the flat copy lives, until the end of this call
        shard = full.new_empty(chunk)  # (chunk,)
        compat.reduce_scatter_single(shard, full)  # a SUM of chunk `rank` over the ranks
        self.grad_shards[i] = shard.div_(self.n)  # the mean: the gradient of the global batch's loss

    @torch.no_grad()
    def step(self):
        """After backward: the optimizer on this rank's chunks, then all-gather every bucket's parameters."""
        for shard, grad in zip(self.param_shards, self.grad_shards):
            shard.grad = grad  # the same storage: no copy
        self.optimizer.step()  # on chunk numbers only: Adam's state is 8 B x chunk per bucket
        for i, bucket in enumerate(self.buckets):
            full = self.param_shards[i].new_empty(self.chunks[i] * self.n)  # (chunk * n,)
            compat.all_gather_single(full, self.param_shards[i])
            pieces = full[: self.numels[i]].split([p.numel() for p in bucket])  # drop the padding
            for p, piece in zip(bucket, pieces):
                p.copy_(piece.view_as(p))
