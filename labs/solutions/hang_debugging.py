"""Reference answers of labs 11a (programs A-C) and 11b (D-F), hang debugging: the diagnosis of each broken program,
and the program fixed.

Each fix changes as little as possible of the broken program in the lab, and keeps its communication.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from utils import rank_device

DIAGNOSES = {"A": "skipped", "B": "shape", "C": "order", "D": "unmatched_send", "E": "wrong_device",
             "F": "skipped"}  # F: rank 0 has one batch more, so it calls DDP's all-reduce once more


# What the report of each program shows, for a learner whose diagnosis is wrong: symptoms, not the bug, yet close to it
# (read with the program's source they point at its kind), so the checker reads them here, on the teacher's side.
CLUES = {
    "A": "rank 0 is in barrier(), every other rank in all_reduce(): compare, rank by rank, the calls each made "
         "before, and look at rank 0's data.",
    "B": "every rank called the same all_reduce, yet some never leave it (others got through it, with wrong numbers): "
         "print what each rank hands it.",
    "C": "rank 0 is stuck in one collective and the other ranks in another one: compare, rank by rank, the calls "
         "each made before.",
    "D": "the last rank is stuck in dist.send, the others already wait at the barrier: which call of which rank "
         "should this one meet?",
    "E": "it did not hang: every rank raised at once. Read the error, then print where the module's parameters are.",
    "F": "rank 0 is stuck in backward, where DDP all-reduces the gradients, the others at the barrier: how many "
         "times does each rank go through the loop (len(data['batches'][rank::world_size]))?",
}


def fixed_A(data):
    """Mean of every sample of every rank. Rank 0 holds none, and must still take part in the sum."""
    device = rank_device()
    x = data[dist.get_rank()].to(device)
    total = torch.stack([x.sum(), torch.tensor(float(len(x)), device=device)])  # (sum, count)
    dist.all_reduce(total)  # every rank, also one with nothing to add: it adds zeros
    dist.barrier()
    return total[0] / total[1]


def fixed_B(data):
    """Class counts over every rank's labels. The histogram has the same length on every rank."""
    labels = data["labels"][dist.get_rank()].to(rank_device())
    counts = torch.bincount(labels, minlength=data["num_classes"])  # (num_classes,) on every rank
    dist.all_reduce(counts)
    dist.barrier()
    return counts


def fixed_C(data):
    """Rank 0's learning rate and the mean gradient, on every rank: the same collectives in the same order."""
    rank, n, device = dist.get_rank(), dist.get_world_size(), rank_device()
    grad = data["grads"][rank].to(device)
    lr = data["lr"].to(device) if rank == 0 else torch.zeros(1, device=device)
    dist.broadcast(lr, src=0)  # every rank: broadcast first ...
    dist.all_reduce(grad)  # ... then all_reduce
    return {"lr": lr, "update": lr * grad / n}


def fixed_D(data):
    """Prefix sums along a chain of ranks; the last rank sends the total to rank 0, which receives it."""
    rank, n, device = dist.get_rank(), dist.get_world_size(), rank_device()
    x = data[rank:rank + 1].clone().to(device)
    if rank > 0:
        prev = torch.zeros(1, device=device)
        dist.recv(prev, src=rank - 1)
        x += prev
    if rank < n - 1:
        dist.send(x, dst=rank + 1)
    total = None
    if rank == n - 1:
        dist.send(x, dst=0)
    if rank == 0:
        total = torch.zeros(1, device=device)
        dist.recv(total, src=n - 1)  # the receive the broken program forgot
    dist.barrier()
    return {"prefix": x, "total": total}


def _train(data, batches):
    device = rank_device()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(device)  # on this rank's device ...
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # ... and only a GPU has an index
    opt = torch.optim.SGD(ddp.parameters(), lr=data["lr"])
    for x, y in batches:
        opt.zero_grad()
        F.mse_loss(ddp(x.to(device)), y.to(device)).backward()
        opt.step()
    return ddp, model


def fixed_E(data):
    """Two DDP steps; model and batches on rank_device(), device_ids only for a GPU."""
    rank, n = dist.get_rank(), dist.get_world_size()
    _, model = _train(data, data["batches"][rank::n])
    dist.barrier()
    return {k: v.detach() for k, v in model.state_dict().items()}


def fixed_F(data):
    """DDP on uneven shards: every rank takes the same number of batches (drop the extra one, as
    DistributedSampler(drop_last=True) does). The other fixes: pad, or train inside `with ddp.join():`."""
    rank, n = dist.get_rank(), dist.get_world_size()
    steps = len(data["batches"]) // n  # the same on every rank
    _, model = _train(data, data["batches"][rank::n][:steps])
    dist.barrier()
    return {k: v.detach() for k, v in model.state_dict().items()}
