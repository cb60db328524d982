"""Step 1 of a launch, in the kernel: check the arguments and decide what will run where.

Nothing is started here. ``plan_launch`` answers three questions, or raises saying what to do:

- **Which backend, on which device?** NCCL with one GPU per rank when there are at least as many
  GPUs as ranks, otherwise gloo with CPU tensors (or, asked by name, ``"relay"``: CPU tensors
  whose every message passes through the kernel, ``relay.py``: a checker's way to see what the
  ranks sent). Two NCCL ranks cannot share one GPU, so on a
  1-GPU machine one rank runs on the GPU over NCCL and 2 or more run on the CPU over gloo (the
  launch line says which, and why).
- **How many torch threads per rank?** The cores shared out: a rank never gets fewer than one. The
  cores are those this kernel may run on (its CPU affinity: ``utils.hardware.usable_cores``), so a
  learner on a workshop hub, whose server is pinned to a slice of the machine, shares out the slice.
- **Is the machine oversubscribed?** More CPU ranks than cores still works, timings get pessimistic.

The number of GPUs comes from ``torch.cuda.device_count()``, which asks the driver without
initialising CUDA in the kernel (``import utils`` sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` so that
``torch.cuda.is_available()`` does not initialise it either).
"""

from __future__ import annotations

import dataclasses
import os
import warnings

import torch
import torch.distributed as dist

from ..hardware import usable_cores

SEAT_VARIABLE = "COURSE_SEAT"  # set by a workshop hub (utils/workshop/hub.py): this learner's share, in words


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """What ``run_ranks`` will start, decided before any process exists."""

    world_size: int
    backend: str  # "gloo", "nccl" or "relay"
    device: str  # "cpu" or "cuda"
    threads_per_rank: int  # torch intra-op threads in each rank
    cpu_cores: int
    gpus: int  # GPUs visible to this process
    note: str = ""  # why the backend is not the obvious one, if it is not
    seat: str = ""  # on a workshop hub: the cores and GPUs this learner was dealt ($COURSE_SEAT)

    def describe(self) -> str:
        """The ``[launch]`` line printed above a multi-rank cell's output."""
        if self.device == "cuda":
            where = f"GPU {'0' if self.world_size == 1 else f'0-{self.world_size - 1}'}"
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible:  # torch numbers the visible GPUs from 0: say which of the machine's they are
                where += f" (the machine's {visible}: CUDA_VISIBLE_DEVICES)"
        else:
            where = "CPU"
        line = (f"[launch] {self.world_size} rank{'s' if self.world_size > 1 else ''} · {self.backend} on {where} · "
                f"{self.threads_per_rank} torch thread(s) per rank on {self.cpu_cores} core(s)")
        if self.device == "cpu" and self.world_size > self.cpu_cores:
            # on a line of its own: JupyterLab wraps a long output line anywhere, mid-word too
            line += (f"\n[launch] oversubscribed: {self.world_size} ranks share {self.cpu_cores} cores, "
                     f"so results are right and timings pessimistic")
        line += f"\n[launch] {self.note}" if self.note else ""
        return line + (f"\n[launch] your seat: {self.seat}" if self.seat else "")


@dataclasses.dataclass(frozen=True)
class RankSetup:
    """What one rank needs to know, sent from the kernel (``kernel.py``) through the server to the rank
    (``rank.py``): the plan's choices, where to meet its peers, and the kernel's folder, path and environment."""

    rank: int
    world_size: int
    backend: str  # "gloo", "nccl" or "relay", from the LaunchPlan
    device: str  # "cpu" or "cuda", from the LaunchPlan
    threads_per_rank: int  # torch intra-op threads, from the LaunchPlan
    timeout: float  # the launcher's timeout in seconds; the process group's is a minute longer
    store: str  # the FileStore's path, where the ranks meet
    process_group: bool  # False: the function makes its own (Lightning's ddp_notebook)
    cwd: str  # the kernel's working folder
    sys_path: tuple  # the kernel's import path
    env: dict  # the kernel's environment variables
    cell_sources: dict  # notebook cell file name -> its source lines, for tracebacks

    @classmethod
    def for_rank(cls, plan: LaunchPlan, rank: int, **launch) -> "RankSetup":
        """Rank ``rank`` of ``plan``; ``launch`` holds the fields that are the same on every rank."""
        return cls(rank=rank, world_size=plan.world_size, backend=plan.backend, device=plan.device,
                   threads_per_rank=plan.threads_per_rank, **launch)


def default_threads(world_size: int, cores: int) -> int:
    """Torch threads per CPU rank: the cores shared out evenly, at least one.

    ``make bench`` measures it (utils/course/bench_launch.py): on a quiet 2-core machine one rank
    ran 30 MLP steps in 0.55 s with both cores and in 1.04 s with one thread; with two ranks, one
    thread each already fills the cores, and more threads than cores make the ranks fight. Sharing the
    cores out is what torchrun's users do with ``OMP_NUM_THREADS``. Before the rank server, ranks
    forked from the kernel had to stay at one thread: GNU OpenMP's pool does not survive a fork.
    """
    return max(1, cores // world_size)


def plan_launch(world_size, backend="auto", threads_per_rank=None) -> LaunchPlan:
    """Check the arguments and decide backend, device and threads, or raise saying what to do."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}; "
                         f"use e.g. world_size=2 (ranks are CPU processes when there are no GPUs).")
    if backend not in ("auto", "gloo", "nccl", "relay"):
        raise ValueError(f"backend must be 'auto', 'gloo', 'nccl' or 'relay', got {backend!r}.")
    if threads_per_rank is not None and (isinstance(threads_per_rank, bool) or not isinstance(threads_per_rank, int)
                                         or threads_per_rank < 1):
        raise ValueError(f"threads_per_rank must be None (share the cores out) or a positive integer, "
                         f"got {threads_per_rank!r}.")
    gpus = torch.cuda.device_count()  # asks the driver (NVML): CUDA stays uninitialised in the kernel
    nccl = dist.is_nccl_available()
    if backend == "nccl" and (gpus < world_size or not nccl):
        if not gpus:
            raise RuntimeError(f"backend='nccl' needs one GPU per rank: {world_size} ranks asked, no GPU found. "
                               f"Use backend='auto' or 'gloo' to run the ranks as CPU processes.")
        raise RuntimeError(f"backend='nccl' needs one GPU per rank: {world_size} ranks asked, {gpus} GPU(s) found"
                           f"{'' if nccl else ' and this torch has no NCCL'}. Two NCCL ranks cannot share a GPU: "
                           f"use backend='auto' (gloo on CPU here) or world_size<={gpus}.")
    note = ""
    if backend == "auto":
        backend = "nccl" if gpus >= world_size and nccl else "gloo"
        if backend == "gloo" and gpus:
            note = (f"{gpus} GPU(s) here, {world_size} ranks asked: NCCL needs one GPU per rank (two NCCL ranks "
                    f"cannot share a GPU), so these ranks run on the CPU over gloo. "
                    f"world_size<={gpus} runs on the GPU{'s' if gpus > 1 else ''} over NCCL.")
    device = "cuda" if backend == "nccl" else "cpu"

    cores = usable_cores()
    if device == "cpu" and world_size > 2 * cores:
        warnings.warn(f"{world_size} CPU ranks on {cores} cores is more than this machine can sensibly run: "
                      f"each rank gets {cores / world_size:.2f} of a core, results stay correct but every step is slow. "
                      f"Use world_size<={2 * cores} here, or a machine with more cores.", stacklevel=3)
    threads = threads_per_rank or default_threads(world_size, cores)
    return LaunchPlan(world_size, backend, device, threads, cores, gpus, note, os.environ.get(SEAT_VARIABLE, ""))
