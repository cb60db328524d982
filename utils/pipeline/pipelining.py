"""The course model in ``torch.distributed.pipelining`` (lesson 06a, ``notebooks/06a_pipeline_schedules.ipynb``):
``traced_stage``, the tracer's cut at the layer boundaries, and ``pipeline_losses``, the bare loop that lesson 06's
``torchrun`` script (``notebooks/scripts/06_pipeline_train.py``) runs with it, so that the lesson can check that
``torchrun`` reproduces its cells. The one process it must reproduce is ``utils.models.train_reference(steps,
PIPE_BATCH, "sgd", PIPE_LR, ordered=False)``.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..data_parallel.torch_ddp import say_step
from ..datasets import batch
from ..launch import rank_device
from ..models import make_model, make_optimizer
from .schedules import split_layers

__all__ = ["PIPE_BATCH", "PIPE_LR", "SPLIT_NAMES", "traced_stage", "pipeline_losses"]

PIPE_BATCH, PIPE_LR = 32, 0.5  # lesson 06: the batch of its pipeline checks; SGD for the steps after the first
SPLIT_NAMES = ["embed", "mix1", "mix2", "head"]  # the ToyNet submodule where each of its 4 layers begins


def traced_stage(net, microbatch, rank, p, device):
    """Rank ``rank``'s stage of the course model traced by ``torch.distributed.pipelining`` and cut into ``p``.

    The cuts fall at layer boundaries, as evenly as ``utils.pipeline.split_layers`` plans them (it raises for
    more stages than the 4 layers): a ``SplitPoint.BEGINNING`` before the first layer of every stage but the
    first. ``microbatch`` is an example input of one micro-batch, which the tracer runs once."""
    from torch.distributed.pipelining import SplitPoint, pipeline

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
        if rank == 0:
            schedule.step(x)  # the first stage feeds the micro-batches
        elif rank == p - 1:
            schedule.step(target=y, losses=mb_losses)  # the last computes the loss of each
        else:
            schedule.step()
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
