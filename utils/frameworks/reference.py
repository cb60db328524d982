"""The torch reference that lesson 13's TensorFlow runs are held to, and the two tolerances they are held to.

Derived in notebook 13a (other frameworks, part 1: one process, several devices), which prints these
functions; notebook 13b (part 2: worker processes, a parameter server, Horovod) starts from the same
reference without re-typing it. Lesson 02's model, data order and split: ToyNet seeded with 0, the digits
in a fixed order, the first global batch, strided shards ``x[r::n]``.

torch only: TensorFlow is never imported here.
"""

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from utils.datasets import digits
from utils.models import ToyNet

__all__ = ["CROSS_FRAMEWORK", "SAME_FRAMEWORK", "check", "first_batch", "make_model", "max_diff", "torch_ddp_step",
           "torch_grads", "torch_reference"]

SAME_FRAMEWORK = dict(rtol=1e-5, atol=1e-6)  # float32, another summation order (lesson 02)
CROSS_FRAMEWORK = dict(rtol=1e-4, atol=1e-6)  # float32, another framework's kernels (13a explains it)


def first_batch(global_batch):
    """The first ``global_batch`` samples of the digits in lesson 02's fixed order: (B, 64), (B,)."""
    x_all, y_all = digits()  # (1797, 64) in [0, 1], (1797,) classes 0-9
    order = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(0))  # lesson 02's fixed order
    return x_all[order][:global_batch], y_all[order][:global_batch]


def make_model(seed=0):
    torch.manual_seed(seed)
    return ToyNet()


def torch_grads(model):
    """Trainable gradients by torch name; parameters() lists the tied mix1/mix2 weight once."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: p.grad.detach().clone() for p in model.parameters() if p.requires_grad}


def torch_reference(x, y, lr):
    """One process, the whole batch, one plain SGD step: what every data-parallel run must reproduce.

    Returns the initial state_dict (THE initial weights, for both frameworks), the loss, the gradients
    and the trainable weights after the step, by torch name."""
    init_state = {k: v.clone() for k, v in make_model(0).state_dict().items()}
    model = make_model(0)
    loss = F.cross_entropy(model(x), y)  # mean over the B samples
    loss.backward()
    grads = torch_grads(model)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p -= lr * p.grad  # one plain SGD step
    after = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return dict(init_state=init_state, loss=loss.item(), grads=grads, after=after)


def torch_ddp_step(x, y, lr):
    """One torch DDP step on this rank's strided shard (run it with ``utils.run_ranks``)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    model = DDP(make_model(seed=rank))  # a different init per rank: DDP's constructor broadcasts rank 0's
    loss = F.cross_entropy(model(x[rank::n]), y[rank::n])  # mean over this rank's B/n samples
    loss.backward()  # the hooks all-reduce and average the gradients here
    grads = torch_grads(model.module)
    torch.optim.SGD(model.parameters(), lr=lr).step()
    after = {n_: p.detach().clone() for n_, p in model.module.named_parameters() if p.requires_grad}
    return dict(loss=loss.item(), grads=grads, after=after)


def max_diff(a, b):
    """Largest |a - b| over all tensors, and the largest |b| for scale."""
    diff = max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in b)
    return diff, max(float(np.max(np.abs(np.asarray(b[k])))) for k in b)


def check(name, got, want, tol):
    """Print the largest difference beside the tolerance, then assert it: returns the difference."""
    diff, scale = max_diff(got, want)
    print(f"{name:<46} max |diff| = {diff:.1e}  (largest |value| {scale:.1e}; tolerance {tol})")
    torch.testing.assert_close({k: torch.as_tensor(np.asarray(v)) for k, v in got.items()},
                               {k: torch.as_tensor(np.asarray(v)) for k, v in want.items()}, **tol)
    return diff
