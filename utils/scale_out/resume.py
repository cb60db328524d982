"""Kill and resume: a small training run that checkpoints everything it needs to go on bit for bit (notebook 11).

Lesson 11 kills a rank of this run with SIGKILL and starts it again, by hand (what a Slurm requeue
does) and with ``torchrun --max-restarts`` (an in-job restart), and checks that the per-step losses
of the two attempts, joined, are bitwise those of a run that was never interrupted. The script
``notebooks/scripts/11_resume_train.py`` and the notebook's own cells both call ``train`` from here,
so there is one copy of the loop.

What a checkpoint must hold for that, each a piece of state the next step reads:

- the model's weights and the optimizer's state (AdamW's moments and step counts);
- every random-number generator the step draws from, one per rank (here: dropout draws from the
  torch CPU generator; on a GPU the CUDA generators too; this run uses neither numpy nor ``random``);
- where the data stream stands: the epoch (the sampler's shuffle) and the batch within it.

Checkpoints are written with ``torch.distributed.checkpoint`` (DCP) into ``<root>/step_00006`` and
so on; DCP writes the ``.metadata`` file last, so a folder without one is a save that was cut short
and is skipped.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

__all__ = ["make_model", "make_data", "train", "latest_checkpoint", "store_generation", "join_losses",
           "read_loss_log", "SAMPLES", "GLOBAL_BATCH"]

SAMPLES, DIM, HIDDEN, CLASSES = 384, 16, 64, 4  # the data set: 384 points in 16-D, 4 classes
GLOBAL_BATCH = 48  # samples per optimizer step, split across ranks: 8 steps per epoch


def make_data(seed=0):
    """A fixed classification data set from a seeded generator: (SAMPLES, DIM) inputs, SAMPLES labels."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, DIM, generator=g)
    teacher = torch.randn(DIM, CLASSES, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def make_model(seed=0):
    """A small MLP with dropout, so that every step draws random numbers (the RNG state matters)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Dropout(0.2), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Dropout(0.2), nn.Linear(HIDDEN, CLASSES))


def latest_checkpoint(root):
    """The newest complete checkpoint folder under ``root`` (one with DCP's ``.metadata``), or None."""
    done = sorted(p for p in Path(root).glob("step_*") if (p / ".metadata").exists())
    return done[-1] if done else None


def _step_of(path):
    return int(Path(path).name.split("_")[1])


def store_generation(store, world_size, key="course/workers_started"):
    """Which restart generation this worker belongs to, counted by the store all workers share.

    Every worker adds 1 when it starts. The workers of one generation all start after those of the
    previous one have stopped, so ``(count - 1) // world_size`` is the same number on all of them,
    whatever each torchrun agent's own restart count says (with two agents they differ)."""
    return (store.add(key, 1) - 1) // world_size


def read_loss_log(path):
    """The lines rank 0 wrote: dicts with attempt, step and loss (``float.hex``)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def join_losses(records):
    """Join the attempts of a run: step -> loss hex, the later attempt winning. A step that two
    attempts both computed must have the same bits in both, else resuming was not exact."""
    joined = {}
    for r in records:
        if r["step"] in joined and joined[r["step"]] != r["loss"]:
            raise AssertionError(f"step {r['step']} computed twice with different losses: {joined[r['step']]} "
                                 f"then {r['loss']} (attempt {r['attempt']})")
        joined[r["step"]] = r["loss"]
    return [joined[s] for s in sorted(joined)]


def _rng_state():
    state = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # only where this run used CUDA
        state["torch_cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state):
    torch.set_rng_state(state["torch_cpu"])
    if "torch_cuda" in state:
        torch.cuda.set_rng_state(state["torch_cuda"])


def _save(root, step, model, optimizer, epoch, batch):
    """One DCP checkpoint: model, optimizer, this rank's RNG, the data position."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    rank = dist.get_rank()
    state = {"model": model_sd, "optim": optim_sd,
             f"rng_rank{rank}": _rng_state(),  # each rank's generator is its own: one key per rank
             "data": torch.tensor([step, epoch, batch])}  # identical on every rank: DCP writes it once
    dcp.save(state, checkpoint_id=os.path.join(root, f"step_{step:05d}"))


def _load(path, model, optimizer, restore_rng, restore_data):
    """Load a checkpoint into model and optimizer; returns the data position (step, epoch, batch)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    rank = dist.get_rank()
    state = {"model": model_sd, "optim": optim_sd, "data": torch.zeros(3, dtype=torch.long)}
    rng_key = f"rng_rank{rank}"
    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata  # what was written
    has_rng = any(k == rng_key or k.startswith(rng_key + ".") for k in saved)  # a rank the saving run did not have: none
    if restore_rng and has_rng:
        state[rng_key] = _rng_state()
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if restore_rng and has_rng:
        _set_rng_state(state[rng_key])
    step, epoch, batch = state["data"].tolist()
    if not restore_data:  # the mistake on purpose: the data stream starts again from the top
        epoch, batch = 0, 0
    return step, epoch, batch, restore_rng and has_rng


def _settle_ddp_buckets(model, x):
    """One throw-away backward, so that every attempt trains its first step with DDP's final buckets.

    DDP lays its gradient buckets out anew after its first backward (in the order the gradients
    arrived). With more than 2 ranks the layout decides in which order each gradient's copies are
    added (gloo's ring starts each chunk at another rank), so a run resumed from a checkpoint would
    train its first step with another layout, and other last bits, than the uninterrupted run had
    at that step (measured at 4 ranks). In eval mode: no dropout, no random numbers drawn."""
    model.eval()
    model(x[:1]).sum().mul(0).backward()
    model.train()
    model.zero_grad(set_to_none=True)


def train(steps, ckpt_root=None, ckpt_every=0, lr=3e-3, seed=0, resume="latest", restore_rng=True,
          restore_data=True, kill_rank=None, kill_step=None, log_path=None, attempt=0):
    """Train ``steps`` AdamW steps with DDP on the default process group; return the losses (``float.hex``).

    ``ckpt_every`` k > 0 writes a DCP checkpoint after every k-th step under ``ckpt_root``.
    ``resume``: "latest" starts from the newest complete checkpoint there (if any), an int from that
    step's, None from scratch. ``restore_rng`` / ``restore_data`` False leave out the RNG state or
    the data position on resuming (to see what they are for). ``kill_rank`` / ``kill_step``: that
    rank sends itself SIGKILL at the start of that step, but only in an attempt that started from
    scratch (so the attempt after it goes through). ``log_path``: rank 0 appends one JSON line per
    step (attempt, step, loss), flushed at once, so the losses of a killed attempt survive it.
    Returns the losses of the steps this call ran (the global mean loss, identical on every rank).
    """
    if ckpt_every and not ckpt_root:
        raise ValueError(f"ckpt_every={ckpt_every} needs a ckpt_root folder to write checkpoints into.")
    if kill_step is not None and ckpt_every and kill_step <= ckpt_every:
        raise ValueError(f"kill_step={kill_step} comes before the first checkpoint (step {ckpt_every}): the "
                         f"restart would start from scratch and die again; use kill_step > {ckpt_every}.")
    torch.set_num_threads(1)  # the same bits whoever started us: a matmul's sums can depend on the thread count
    rank, world = dist.get_rank(), dist.get_world_size()
    if GLOBAL_BATCH % world:
        raise ValueError(f"GLOBAL_BATCH={GLOBAL_BATCH} is not divisible by {world} ranks; use 1, 2, 3, 4, 6 or 8.")
    x, y = make_data(seed)
    model = DDP(make_model(seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(seed + 1000 + rank)  # each rank its own dropout masks
    sampler = DistributedSampler(range(SAMPLES), num_replicas=world, rank=rank, shuffle=True, seed=seed,
                                 drop_last=True)
    per_rank = GLOBAL_BATCH // world
    batches_per_epoch = len(sampler) // per_rank
    start, epoch, batch, rng_restored = 0, 0, 0, False
    path = latest_checkpoint(ckpt_root) if (resume == "latest" and ckpt_root) else None
    if isinstance(resume, int) and not isinstance(resume, bool):
        path = Path(ckpt_root) / f"step_{resume:05d}"
    if path is not None:
        start, epoch, batch, rng_restored = _load(path, model, optimizer, restore_rng, restore_data)
    _settle_ddp_buckets(model, x)
    log = open(log_path, "a") if (log_path and rank == 0) else None
    losses = []
    try:
        for step in range(start + 1, steps + 1):
            if kill_step == step and kill_rank == rank and start == 0:
                os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no last words: what a lost node looks like
            sampler.set_epoch(epoch)  # the shuffle of this epoch
            order = list(sampler)
            idx = order[batch * per_rank:(batch + 1) * per_rank]
            per_sample = F.cross_entropy(model(x[idx]), y[idx], reduction="none")  # (GLOBAL_BATCH/world,)
            loss = per_sample.mean()  # this rank's mean; DDP averages the gradients
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            # The global mean loss, for the log, added in a fixed order: per-sample losses one by one in
            # Python, then the ranks' sums in rank order, so that the number does not depend on how a
            # vectorised sum or an all-reduce happens to split its additions.
            mine = torch.tensor([sum(per_sample.tolist())], dtype=torch.float64)
            every = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(every, mine)
            value = sum(t.item() for t in every) / GLOBAL_BATCH
            losses.append(float(value).hex())
            if log:
                log.write(json.dumps({"attempt": attempt, "step": step, "loss": losses[-1]}) + "\n")
                log.flush()
            batch += 1
            if batch == batches_per_epoch:
                epoch, batch = epoch + 1, 0
            if ckpt_every and step % ckpt_every == 0:
                _save(ckpt_root, step, model, optimizer, epoch, batch)
    finally:
        if log:
            log.close()
    return losses
