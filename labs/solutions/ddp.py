"""Reference solution of labs/02_ddp_lab.ipynb: bucketed DDP, all-reducing buckets of gradients during backward.

Lesson 02 builds data parallelism from two calls: broadcast the state once, all-reduce every gradient
after backward. Torch's ``DistributedDataParallel`` (Li et al., *PyTorch Distributed*, VLDB 2020,
arXiv 2006.15704) does the same arithmetic faster, in two ways, and this is them:

- **buckets**: gradients are packed into flat buckets of about ``bucket_cap_bytes``, one all-reduce
  per bucket instead of one per tensor, so the fixed cost of a call is paid a few times, not
  hundreds of times;
- **overlap**: a hook on each parameter (``register_post_accumulate_grad_hook``) notes when its
  gradient is final; the hook that completes a bucket launches that bucket's all-reduce
  *asynchronously*, while backward goes on computing the earlier layers. ``finish()`` waits.

Buckets are filled in reverse order of ``model.parameters()``, a good guess of the order in which
backward finishes the gradients, and a bucket is closed once it holds ``bucket_cap_bytes`` or more.
"""

import torch
import torch.distributed as dist


class BucketedDDP:
    """Data parallelism for ``model``: call ``finish()`` after each backward, before ``optimizer.step()``."""

    def __init__(self, model: torch.nn.Module, bucket_cap_bytes: int = 1 << 20):
        if bucket_cap_bytes < 1:
            raise ValueError(f"bucket_cap_bytes={bucket_cap_bytes}: a bucket must be allowed at least 1 byte; "
                             "use 1 for one bucket per gradient, or e.g. 25 << 20 (torch DDP's 25 MiB).")
        self.n = dist.get_world_size()
        with torch.no_grad():  # every replica starts as rank 0's: parameters, frozen ones too, and buffers
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor, src=0)
        # parameters() lists the tied weight once; frozen parameters get no gradient, so no bucket.
        params = [p for p in model.parameters() if p.requires_grad][::-1]  # ~ the order backward finishes
        self.buckets, size = [[]], 0
        for p in params:
            if size >= bucket_cap_bytes:  # the current bucket is full: start a new one
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)  # once per backward, after p.grad is final
        self._new_step()

    def _new_step(self):
        self.missing = [len(bucket) for bucket in self.buckets]  # gradients still to come, per bucket
        self.pending = [None] * len(self.buckets)  # (flat tensor, work) of each launched bucket

    def _grad_ready(self, param):
        """Runs inside backward: the last gradient of a bucket launches the bucket's all-reduce."""
        i = self.bucket_of[id(param)]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])  # one message per bucket
            self.pending[i] = (flat, dist.all_reduce(flat, async_op=True))  # returns at once

    def finish(self):
        """After backward: wait for every bucket and write the mean gradients back into ``.grad``."""
        for i, bucket in enumerate(self.buckets):
            if self.pending[i] is None:
                raise RuntimeError(f"bucket {i} was never launched: did backward reach all its parameters?")
            flat, work = self.pending[i]
            work.wait()
            flat /= self.n  # sum -> mean
            for p, g in zip(bucket, flat.split([p.numel() for p in bucket])):
                p.grad.copy_(g.view_as(p))
        self._new_step()
