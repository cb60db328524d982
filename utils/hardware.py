"""What this machine has, said out loud: a lesson that claims a speed-up states where it measured.

Notebook 00 prints it; later lessons print it above their timings. `precision_support` reads what
DeepSpeed and torch say about fp16, bf16 and AMX here, as plain bools (derived in notebook 07a).
"""

import ctypes
import dataclasses
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
    names come from ``nvidia-smi``), so a child process can still use CUDA afterwards; on a CUDA build
    with no NVIDIA driver, ``hide_cuda_without_driver`` (run by ``import utils``) keeps it so.
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


def cuda_build_without_driver() -> bool:
    """A CUDA build of torch on a Linux machine with no NVIDIA driver: what ``pip install torch`` gives a
    laptop or a CI box. Neither of the driver's libraries loads, NVML (``libnvidia-ml.so.1``) nor the
    driver API (``libcuda.so.1``), so CUDA cannot run here whatever torch is asked."""
    if not torch.version.cuda or platform.system() != "Linux":
        return False
    for library in ("libnvidia-ml.so.1", "libcuda.so.1"):
        try:
            ctypes.CDLL(library)  # loading is not initialising: CUDA stays untouched
            return False
        except OSError:
            pass
    return True


def hide_cuda_without_driver(environ=None) -> bool:
    """On a CUDA build with no NVIDIA driver, sets ``CUDA_VISIBLE_DEVICES=""`` (unless you set it): no GPU,
    said to torch in the one way that asks nothing of CUDA. Returns whether it did. ``import utils`` calls it.

    Why: ``torch.cuda.device_count()`` asks NVML, and where NVML is missing it falls back to the CUDA
    runtime (``torch/cuda/__init__.py``, ``device_count``), which registers a fork handler: every process
    forked afterwards is "in bad fork" (``torch.cuda._is_in_bad_fork()``), even with no GPU at all. DeepSpeed
    asks at import (``deepspeed/accelerator/real_accelerator.py``: ``torch.cuda.device_count() > 0``), so a
    rank server that imported DeepSpeed forked only such processes, and Lightning's ``ddp_notebook`` refuses to
    start from one (``_check_bad_cuda_fork``: "Cannot re-initialize CUDA in forked subprocess"). With no visible
    device, ``device_count`` answers 0 from the variable alone (``_device_count_nvml``) and never falls back.
    A CPU build never asks CUDA, and a machine with a driver has NVML: both are left as they are."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ or not cuda_build_without_driver():
        return False
    environ["CUDA_VISIBLE_DEVICES"] = ""
    return True


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, which a container's cpuset, a Slurm job's
    binding or a workshop hub's per-learner slice (``utils/workshop/hub.py``) narrows; ``os.cpu_count()``
    counts the whole machine's regardless. Python 3.13's ``os.process_cpu_count()`` asks the same."""
    if hasattr(os, "sched_getaffinity"):  # Linux; macOS and Windows have no affinity to narrow
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _gpu_names():
    if not shutil.which("nvidia-smi"):
        return ["(names need nvidia-smi)"]
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return out.stdout.strip().splitlines()


# ------------------------------------------------------------------ precision: what this machine computes in

@dataclasses.dataclass(frozen=True)
class PrecisionSupport:
    """Plain bools (never None) about 16-bit floating point on this machine.

    ``deepspeed_fp16`` / ``deepspeed_bf16``: what DeepSpeed's accelerator answers, the test that
    ``deepspeed.initialize`` applies (``ValueError: Type fp16 is not supported on your device``).
    ``cpu_fp16`` / ``cpu_bf16``: oneDNN computes it natively on this CPU (AVX512-FP16 / AVX512-BF16
    or AMX); without them torch still computes in bf16, emulated and slow. ``amx``: Intel AMX tiles.
    """

    accelerator: str
    deepspeed_fp16: bool
    deepspeed_bf16: bool
    cpu_fp16: bool
    cpu_bf16: bool
    amx: bool


def _fact(question) -> bool:
    """Ask a library a yes/no question and normalise the answer with ``bool``.

    Libraries answer ``True``, ``False`` or ``None``: DeepSpeed's CPU accelerator returns None from
    ``is_fp16_supported()`` on a CPU without fp16 (an AMD EPYC), so ``answer == False`` is wrong
    there and only ``bool(answer)`` is right on every machine."""
    return bool(question())


def _torch_cpu_facts():
    """(cpu_fp16, cpu_bf16, amx) as oneDNN and torch see this CPU; private probes, so each is looked up."""
    mkldnn = torch.ops.mkldnn
    fp16 = _fact(mkldnn._is_mkldnn_fp16_supported) if torch.backends.mkldnn.is_available() else False
    bf16 = _fact(mkldnn._is_mkldnn_bf16_supported) if torch.backends.mkldnn.is_available() else False
    init_amx = getattr(torch._C._cpu, "_init_amx", None)  # True where the CPU has AMX tiles (and the OS allows them)
    return fp16, bf16, _fact(init_amx) if init_amx else False


def precision_support(accelerator=None) -> PrecisionSupport:
    """What DeepSpeed's accelerator (default: ``deepspeed.accelerator.get_accelerator()``) and torch say
    about fp16 and bf16 here, each answer normalised to a bool. Notebooks 07a and 07b branch on it."""
    if accelerator is None:
        from deepspeed.accelerator import get_accelerator  # imported here: utils must not import DeepSpeed eagerly
        accelerator = get_accelerator()
    cpu_fp16, cpu_bf16, amx = _torch_cpu_facts()
    return PrecisionSupport(accelerator=str(accelerator.device_name()),
                            deepspeed_fp16=_fact(accelerator.is_fp16_supported),
                            deepspeed_bf16=_fact(accelerator.is_bf16_supported),
                            cpu_fp16=cpu_fp16, cpu_bf16=cpu_bf16, amx=amx)


def half_precision(support: PrecisionSupport) -> str:
    """The 16-bit type a lesson trains DeepSpeed in: "bf16" (no loss scaling) where DeepSpeed accepts it,
    else "fp16" (e.g. a V100, whose accelerator refuses bf16). Raises when it accepts neither."""
    if support.deepspeed_bf16:
        return "bf16"
    if support.deepspeed_fp16:
        return "fp16"
    raise ValueError(f"DeepSpeed's {support.accelerator} accelerator accepts neither bf16 nor fp16 on this machine; "
                     "the 16-bit parts of the lesson need one of them: run them on a CPU rank (both ranks and the "
                     "kernel on CPU accept bf16) or a GPU with bf16 (Ampere or newer).")


def expected_fp16_outcome(support: PrecisionSupport) -> str:
    """What ``deepspeed.initialize`` must do with an fp16 config here: "accepted" or "refused"."""
    return "accepted" if support.deepspeed_fp16 else "refused"


def describe_precision(support: PrecisionSupport) -> str:
    """One line for a lesson to print: what is accepted, and what is native on this CPU."""
    yes = {True: "yes", False: "no"}
    return (f"DeepSpeed's {support.accelerator} accelerator accepts fp16: {yes[support.deepspeed_fp16]}, "
            f"bf16: {yes[support.deepspeed_bf16]} · this CPU computes natively (oneDNN) fp16: "
            f"{yes[support.cpu_fp16]}, bf16: {yes[support.cpu_bf16]} (AMX: {yes[support.amx]})")
