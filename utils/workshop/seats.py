"""Many learners on one machine: deal the cores and the GPUs out, one seat per learner.

A workshop hub (``hub.py``) starts one Jupyter server per learner on the same box. Left alone, every
learner's ranks would share out *all* the cores (``run_ranks`` gives each rank cores / world_size
threads), so four learners running 4 ranks each would start 4x as many threads as there are cores,
and NCCL ranks of different learners would land on the same GPU 0. So each learner gets a seat:

- a **CPU slice**, enforced by the kernel: the learner's server is pinned to its cores (CPU
  affinity), its kernel and ranks inherit the pinning, and the launcher shares out what it may use
  (``utils.hardware.usable_cores``), not the machine;
- **GPUs**, by ``CUDA_VISIBLE_DEVICES``: torch then numbers the learner's GPUs from 0, and
  ``run_ranks`` picks NCCL only when the learner has one GPU per rank;
- a line in words (``COURSE_SEAT``), which the launcher prints under its ``[launch]`` line, so a
  learner sees what they got.

With more learners than cores (or GPUs) learners share: seat ``i`` then gets core ``i mod cores``,
and the seat says with how many others. Nothing here imports JupyterHub; it is plain arithmetic,
tested in tests/test_workshop_hub.py.
"""

from __future__ import annotations

import dataclasses
import os

from ..launch.plan import SEAT_VARIABLE


@dataclasses.dataclass(frozen=True)
class Seat:
    """One learner's share of the machine."""

    learner: str
    index: int  # 0-based, in the order the learners were listed
    learners: int
    cores: tuple  # the machine's core numbers this learner's processes may run on
    machine_cores: int
    gpus: tuple  # the machine's GPU numbers (CUDA_VISIBLE_DEVICES), empty on a CPU box
    sharing: int  # how many seats use at least one of the same cores (or GPUs), this one included

    def describe(self) -> str:
        """What the launcher prints under ``[launch]``: ``learner 2 of 4 · cores 2-3 (2 of 8) · GPU 1``."""
        where = f"core{'s' if len(self.cores) > 1 else ''} {_span(self.cores)} ({len(self.cores)} of {self.machine_cores})"
        gpus = f"GPU{'s' if len(self.gpus) > 1 else ''} {','.join(map(str, self.gpus))}" if self.gpus else "no GPU"
        text = f"{self.learner}, learner {self.index + 1} of {self.learners} · {where} · {gpus}"
        if self.sharing > 1:
            text += f" · shared with {self.sharing - 1} other learner(s): more learners than cores or GPUs"
        return text

    def environment(self) -> dict:
        """The variables the hub's spawner sets for this learner's server (and so its kernels and ranks)."""
        env = {SEAT_VARIABLE: self.describe(), "OMP_NUM_THREADS": str(len(self.cores))}
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpus))
        return env


def deal_seats(learners, cores=None, gpus=None) -> list[Seat]:
    """One seat per learner: ``cores`` (the machine's core numbers; default this process's affinity) and
    ``gpus`` (the machine's GPU numbers; default those visible here) dealt out in equal contiguous slices."""
    learners = list(learners)
    if not learners:
        raise ValueError("a workshop needs at least one learner: USERS=4 makes learner1 ... learner4.")
    if len(set(learners)) != len(learners):
        raise ValueError(f"learner names must differ, got {learners}.")
    cores = tuple(sorted(cores if cores is not None else available_cores()))
    gpus = tuple(gpus if gpus is not None else visible_gpus())
    if not cores:
        raise ValueError("no core to deal out: the hub's own CPU affinity is empty.")
    core_slices = _slices(cores, len(learners))
    gpu_slices = _slices(gpus, len(learners)) if gpus else [()] * len(learners)
    seats = []
    for i, name in enumerate(learners):
        overlapping = sum(1 for j in range(len(learners))
                          if set(core_slices[j]) & set(core_slices[i]) or set(gpu_slices[j]) & set(gpu_slices[i]))
        seats.append(Seat(name, i, len(learners), core_slices[i], len(cores), gpu_slices[i], overlapping))
    return seats


def _slices(items, n):
    """``items`` cut into ``n`` equal contiguous slices (the remainder left idle), or, with fewer items than
    slices, one item each, round robin."""
    if len(items) < n:
        return [(items[i % len(items)],) for i in range(n)]
    per = len(items) // n
    return [tuple(items[i * per:(i + 1) * per]) for i in range(n)]


def _span(numbers):
    """``(2, 3, 4, 7)`` -> ``"2-4,7"``: the format of ``taskset -c`` and Slurm's CPU lists."""
    parts, start = [], None
    for k, n in enumerate(numbers):
        if start is None:
            start = n
        if k + 1 == len(numbers) or numbers[k + 1] != n + 1:
            parts.append(f"{start}" if start == n else f"{start}-{n}")
            start = None
    return ",".join(parts)


def available_cores() -> list[int]:
    """The core numbers this process may run on (all of them where there is no affinity, e.g. macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def visible_gpus() -> list[int]:
    """The machine's GPU numbers visible here: ``CUDA_VISIBLE_DEVICES`` if it lists numbers, else
    ``0 .. torch.cuda.device_count() - 1`` (asked of the driver: CUDA stays uninitialised)."""
    import torch

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None and all(part.strip().isdigit() for part in listed.split(",") if part.strip()):
        return [int(part) for part in listed.split(",") if part.strip()]
    return list(range(torch.cuda.device_count()))
