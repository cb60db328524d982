"""What this machine has, said out loud: a lesson that claims a speed-up states where it measured.

Notebook 00 prints it; later lessons print it above their timings.
"""

import os
import platform
import shutil
import subprocess

import psutil
import torch
import torch.distributed as dist


def describe_machine() -> dict:
    """CPU cores, memory, GPUs and the communication backends this torch build offers.

    Nothing here initialises CUDA in this process (``torch.cuda.device_count()`` asks the driver,
    names come from ``nvidia-smi``), so the launcher can still fork ranks afterwards.
    """
    gpus = torch.cuda.device_count()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": gpus,
        "gpu_names": _gpu_names() if gpus else [],
        "backends": [b for b, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()),
                                     ("mpi", dist.is_mpi_available())) if ok],
    }


def _gpu_names():
    if not shutil.which("nvidia-smi"):
        return ["(names need nvidia-smi)"]
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return out.stdout.strip().splitlines()
