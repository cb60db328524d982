"""What lessons 02, 04 and 06 and their ``torchrun`` scripts share: one definition, imported by both.

Lesson 02 (``notebooks/02b_ddp_in_practice.ipynb``) derives torch DDP with a Python all-reduce hook, lesson 04
FSDP2 on the course model, lesson 06 the course model cut into pipeline stages by ``torch.distributed.pipelining``.
Each lesson imports from here its model (``make_model``), its data order (``batch``) and the piece its technique
adds (02: ``allreduce_hook``; 04: ``utils.sharding.fsdp2.shard_with_fsdp2``; 06: ``traced_stage``), and writes
its training loop in its own cells, where it also measures bytes and memory. Its script in
``notebooks/scripts/`` runs the bare loop below (``ddp_losses``, ``fsdp_losses``, ``pipeline_losses``) with the
same pieces, so the lesson can check that ``torchrun`` reproduces the losses of its own cells. Lesson 05's and
09's scripts train ``utils.mesh.parallelize3d``'s tiny Llama instead.

Every ``*_losses`` function runs on one rank of an initialised process group and returns the per-step
*global* losses (the mean over ranks of each rank's mean loss), the same list on every rank.
``reference_losses`` is one process on the whole batch: what every split run must reproduce.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .launch import rank_device
from .datasets import digits_in_order
from .models import ToyNet

__all__ = ["DDP_BATCH", "DDP_LR", "FSDP_BATCH", "FSDP_LR", "PIPE_BATCH", "PIPE_LR", "SPLIT_NAMES", "batch",
           "digits_in_order", "make_model", "make_optimizer", "reference_losses", "ddp_losses", "fsdp_losses",
           "pipeline_losses", "allreduce_hook", "traced_stage", "say_step", "fsdp_batch", "fsdp_reference"]

DDP_BATCH, DDP_LR = 240, 0.5  # lesson 02: global batch, plain SGD learning rate
FSDP_BATCH, FSDP_LR = 120, 1e-3  # lesson 04: global batch, Adam learning rate
PIPE_BATCH, PIPE_LR = 32, 0.5  # lesson 06: the batch of its pipeline checks; SGD for the steps after the first
SPLIT_NAMES = ["embed", "mix1", "mix2", "head"]  # the ToyNet submodule where each of its 4 layers begins


def make_model(seed=0, hidden=64):
    """The course model, seeded: every rank builds the same one (DDP and FSDP broadcast or shard it anyway)."""
    torch.manual_seed(seed)  # ToyNet's frozen input_scale and buffer input_shift are random too
    return ToyNet(hidden=hidden)


def make_optimizer(params, name, lr):
    """"sgd" (lessons 02, 06), "adam" (lesson 04) or "adamw" (the 30-step two-node run of lesson 10)."""
    optimizers = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if name not in optimizers:
        raise ValueError(f"optimizer {name!r} is not one of {sorted(optimizers)}")
    return optimizers[name](params, lr=lr)


def batch(step, size, ordered=True):
    """Global batch ``step`` of ``size`` digits: lesson 02's shuffled order (``ordered``) or the file's order
    (lessons 04 and 06). Past the end of the 1797 digits it starts again from the first batch."""
    x, y = digits_in_order() if ordered else _digits()
    per_epoch = len(x) // size
    rows = slice((step % per_epoch) * size, (step % per_epoch + 1) * size)
    return x[rows], y[rows]  # (size, 64), (size,)


def _digits():
    from .datasets import digits
    return digits()


def reference_losses(steps, size, optimizer, lr, hidden=64, ordered=True):
    """One process, the whole global batch: the losses every split run must reproduce."""
    model = make_model(hidden=hidden)
    opt = make_optimizer(model.parameters(), optimizer, lr)
    losses = []
    for step in range(steps):
        x, y = batch(step, size, ordered)
        loss = F.cross_entropy(model(x), y)  # mean over the global batch
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def fsdp_batch(step, rank=0, n=1, device="cpu", size=FSDP_BATCH):
    """Rank `rank`'s slice of lesson 04's global batch `step`: (size/n, 64) inputs, (size/n,) labels.

    Equal slices on purpose: every rank's loss is a mean over its own slice and the ranks' gradients
    are then averaged, which is the global mean only when the slices are equal. With 64 rows on 3
    ranks (22 + 22 + 20), each of rank 2's rows weighed 1/60 and the others' 1/66 instead of 1/64,
    and FSDP2 ended 3.8e-3 away from one process after 3 steps, 380x the tolerance lesson 04a uses.
    Derived in lesson 04a (notebooks/04a_fsdp2_zero_redundancy.ipynb); lesson 04b trains on the same batches."""
    if size % n:
        raise ValueError(f"a global batch of {size} does not split into {n} equal slices; use a multiple of {n}")
    x, y = batch(step, size, ordered=False)  # rows [step*size, (step+1)*size) of the digits
    return x.chunk(n)[rank].to(device), y.chunk(n)[rank].to(device)


def fsdp_reference(steps, hidden=512, lr=FSDP_LR, size=FSDP_BATCH):
    """One process, the whole global batch, plain Adam (lesson 04a): what every sharded run must reproduce.
    Returns the final state dict (detached copies) and the losses of the global batches ``steps``."""
    model = make_model(hidden=hidden)
    opt = make_optimizer(model.parameters(), "adam", lr)
    losses = []
    for step in steps:
        x, y = fsdp_batch(step, size=size)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def say_step(step, steps, loss):
    """Rank 0's progress line after each step, which ``utils.launch.scripts.launch`` shows in the notebook as it comes."""
    if dist.get_rank() == 0:
        print(f"step {step + 1}/{steps}: loss {loss:.6f}", flush=True)


def _global_mean(loss):
    """The mean over ranks of each rank's mean loss: the global mean loss when the shards are equal."""
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def allreduce_hook(state, bucket):
    """Lesson 02's DDP communication hook: torch's default all-reduce, written in Python so the ledger sees it.

    DDP calls it once per bucket during backward; ``bucket.buffer()`` is a flat tensor of several gradients,
    and the hook returns a Future of the reduced tensor."""
    flat = bucket.buffer().div_(dist.get_world_size())  # pre-divide, then sum = mean
    return dist.all_reduce(flat, async_op=True).get_future().then(lambda fut: fut.value()[0])


def ddp_losses(steps, size=DDP_BATCH, optimizer="sgd", lr=DDP_LR):
    """Lesson 02's torch DDP: rank r trains on samples r, r+n, ... of each global batch (as DistributedSampler)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank, n, device = dist.get_rank(), dist.get_world_size(), rank_device()
    if size % n:
        raise ValueError(f"a global batch of {size} does not split into {n} equal shards; use a multiple of {n}")
    model = DDP(make_model(seed=rank).to(device), device_ids=[device] if device.type == "cuda" else None)
    model.register_comm_hook(state=None, hook=allreduce_hook)  # DDP broadcast rank 0's weights when built
    opt = make_optimizer(model.parameters(), optimizer, lr)
    losses = []
    for step in range(steps):
        x, y = (t[rank::n].to(device) for t in batch(step, size))  # (B/n, 64)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()  # the hook all-reduces every bucket in here
        opt.step()
        losses.append(_global_mean(loss))
        say_step(step, steps, losses[-1])
    return losses


def fsdp_losses(steps, hidden=512, size=FSDP_BATCH, lr=FSDP_LR):
    """Lesson 04's FSDP2: blocks first (the tied mix1/mix2 pair in one group), then the root; Adam."""
    from torch.distributed.device_mesh import init_device_mesh

    from .sharding.fsdp2 import shard_with_fsdp2
    rank, n, device = dist.get_rank(), dist.get_world_size(), rank_device()
    if size % n:
        raise ValueError(f"a global batch of {size} does not split into {n} equal shards; use a multiple of {n}")
    model = make_model(hidden=hidden).to(device)
    shard_with_fsdp2(model, init_device_mesh(device.type, (n,)))  # in place: embed, [mix1, mix2], head, root
    opt = make_optimizer(model.parameters(), "adam", lr)  # sees DTensors: its state is sharded too
    losses = []
    for step in range(steps):
        x, y = (t.chunk(n)[rank].to(device) for t in batch(step, size, ordered=False))  # (B/n, 64)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()  # reduce-scatter: each rank gets the mean gradient of its rows
        opt.step()
        losses.append(_global_mean(loss))
        say_step(step, steps, losses[-1])
    return losses


def traced_stage(net, microbatch, rank, p, device):
    """Rank ``rank``'s stage of the course model traced by ``torch.distributed.pipelining`` and cut into ``p``.

    The cuts fall at layer boundaries, as evenly as ``utils.pipeline.split_layers`` plans them (it raises for
    more stages than the 4 layers): a ``SplitPoint.BEGINNING`` before the first layer of every stage but the
    first. ``microbatch`` is an example input of one micro-batch, which the tracer runs once."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    from .pipeline import split_layers
    plan = split_layers(len(SPLIT_NAMES), p)  # [(first layer, end), ...] per stage
    spec = {SPLIT_NAMES[first]: SplitPoint.BEGINNING for first, _ in plan[1:]}
    return pipeline(net, mb_args=(microbatch,), split_spec=spec).build_stage(rank, device)


def pipeline_losses(steps, microbatches=4, size=PIPE_BATCH, lr=PIPE_LR):
    """Lesson 06's real tool: ToyNet traced and split into p stages at its layer boundaries, GPipe schedule, SGD.

    The tracer gives each stage its own copy of the parameters, so the tied mix1/mix2 weight exists on the
    stage(s) that use it: its gradient is summed over the ranks (ranks without it add zeros), and every
    holder then takes the same step. Returns the batch losses (the mean of the micro-batch means)."""
    import warnings

    from torch.distributed.pipelining import ScheduleGPipe
    warnings.filterwarnings("ignore", category=FutureWarning)  # the tracer's pytree deprecation notices
    rank, p, device = dist.get_rank(), dist.get_world_size(), rank_device()
    net = make_model().to(device)
    x0, _ = batch(0, size, ordered=False)
    stage = traced_stage(net, x0.to(device).chunk(microbatches)[0], rank, p, device)
    module = stage.submod
    schedule = ScheduleGPipe(stage, n_microbatches=microbatches, loss_fn=F.cross_entropy)
    opt = make_optimizer([q for q in module.parameters() if q.requires_grad], "sgd", lr)
    tied = [q for name, q in module.named_parameters() if name in ("mix1.weight", "mix2.weight")]
    losses = []
    for step in range(steps):
        x, y = (t.to(device) for t in batch(step, size, ordered=False))
        opt.zero_grad()
        mb_losses = []
        schedule.step(x) if rank == 0 else schedule.step(target=y, losses=mb_losses) if rank == p - 1 else schedule.step()
        grad = sum(q.grad for q in tied if q.grad is not None) if tied else torch.zeros(64, 64, device=device)
        dist.all_reduce(grad)  # the tied weight: the stages' shares summed, on every rank
        for q in tied:
            q.grad = grad.clone()
        opt.step()
        loss = torch.stack(mb_losses).mean() if mb_losses else torch.zeros((), device=device)
        dist.broadcast(loss, src=p - 1)  # only the last stage computed it
        losses.append(loss.item())
        say_step(step, steps, losses[-1])
    return losses

