"""What this machine has, said out loud: a lesson that claims a speed-up states where it measured.

Notebook 00 prints it; later lessons print it above their timings.
"""

import os
import platform

import psutil
import torch
import torch.distributed as dist


def describe_machine() -> dict:
    """CPU cores, memory, GPUs and the communication backends this torch build offers.

    ``torch.cuda.device_count()`` asks the driver without initialising CUDA, so calling this does
    not stop the launcher from forking ranks afterwards.
    """
    gpus = torch.cuda.device_count()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": gpus,
        "gpu_names": [torch.cuda.get_device_properties(i).name for i in range(gpus)],
        "backends": [b for b, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()),
                                     ("mpi", dist.is_mpi_available())) if ok],
    }
