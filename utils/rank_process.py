"""What runs inside each rank process that ``utils.launch.run_ranks`` starts (notebook 00).

``run_ranks`` (in the kernel) starts N processes whose entry point is ``rank_main``. Each one, in
order:

1. points its stdout and stderr (the file descriptors, so C++ warnings and crash dumps too) at the
   launcher's pipes, which prefix every line with ``[rank k]``;
2. arms the tools the launcher uses to explain failures: ``faulthandler`` prints the Python stack on
   a segfault, and on SIGUSR1 (sent when the ranks hang past their timeout); Linux kills the rank
   if the kernel dies (PR_SET_PDEATHSIG);
3. sets what torchrun would set (``RANK``, ``WORLD_SIZE``...), its torch thread count and its GPU,
   joins the default process group through the ``FileStore`` and waits at a barrier for every peer;
4. calls the function, and sends back ``("ok", value)`` with tensors moved to the CPU, or
   ``("error", report)`` with the traceback, which ``utils.rank_errors`` turns into ``RankError``.
"""

from __future__ import annotations

import faulthandler
import io
import os
import pickle
import signal
import sys
import time
import traceback
from datetime import timedelta

import cloudpickle
import torch
import torch.distributed as dist

from .rank_errors import looks_secondary



def rank_main(rank, plan, timeout, payload, store_path, result_w, out_w, err_w):
    """Entry point of every rank process. Runs ``fn`` and sends back ("ok", value) or ("error", ...)."""
    # Our output goes to the launcher's pipes, which prefix it with "[rank k]". Redirecting the file
    # descriptors (not just sys.stdout) also catches C++ warnings and faulthandler's stack dumps.
    os.dup2(out_w.fileno(), 1)
    os.dup2(err_w.fileno(), 2)
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), line_buffering=True)
    faulthandler.enable(file=sys.stderr)  # a segfault prints the Python stack
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # "where are you stuck?"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides; it stops every rank on interrupt
    _die_with_parent()
    _plain_display()
    try:
        # What torchrun would set, for libraries that look (the process group already exists).
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(plan.world_size),
                          LOCAL_WORLD_SIZE=str(plan.world_size))
        if payload[0] == "pickled":  # spawn: the function travelled by value
            fn, args, kwargs = cloudpickle.loads(payload[1])
        else:
            fn, args, kwargs = payload[1]
        torch.set_num_threads(plan.threads_per_rank)
        if plan.device == "cuda":
            torch.cuda.set_device(rank)
        # The gloo/NCCL timeout is longer than the launcher's, so a hang is reported by the launcher,
        # with stacks, rather than as an opaque backend error.
        pg_timeout = timedelta(seconds=timeout + 60)
        store = dist.FileStore(store_path, plan.world_size)
        dist.init_process_group(plan.backend, store=store, rank=rank, world_size=plan.world_size, timeout=pg_timeout)
        # init can return on one rank while another is still connecting to it; without this barrier a
        # rank whose fn returns at once can exit and break its peer's connection ("closed by peer").
        dist.barrier()
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        tb = exc.__traceback__.tb_next or exc.__traceback__  # start at the learner's frame, not this one
        report = dict(time=time.monotonic(), type=type(exc).__name__, message=str(exc),
                      traceback="".join(traceback.format_exception(type(exc), exc, tb)),
                      secondary=looks_secondary(exc))
        _send(result_w, ("error", report))
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(1)  # no clean-up: the peers may be gone, and tearing down could block
    value = _to_cpu(value)
    try:
        data = pickle.dumps(value)  # by reference, so a notebook class is the same class in the kernel
    except Exception:  # noqa: BLE001
        try:
            data = cloudpickle.dumps(value)  # lambdas, local functions...
        except Exception as exc:  # noqa: BLE001
            _send(result_w, ("error", dict(time=time.monotonic(), type="PicklingError", secondary=False,
                  message=f"rank {rank} returned a {type(value).__name__} that cannot be sent back: {exc}",
                  traceback="Return plain values: tensors, numbers, lists, dicts (e.g. tensor.detach().cpu()).\n")))
            os._exit(1)
    _send(result_w, ("ok", data))
    sys.stdout.flush(), sys.stderr.flush()
    dist.destroy_process_group()


def _to_cpu(value):
    """Tensors come back on the CPU: unpickling a CUDA tensor would initialise CUDA in the kernel,
    and a kernel with CUDA initialised can no longer fork ranks."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_to_cpu(v) for v in value)
    if type(value) is dict:
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _send(conn, message):
    conn.send_bytes(pickle.dumps(message))


def _die_with_parent():
    """Ask Linux to kill this rank if the kernel dies, so no rank outlives a crashed notebook."""
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _plain_display():
    """In a forked rank the kernel's display channel is not ours: make display() print plain text."""
    ip = sys.modules.get("IPython")
    shell = ip.get_ipython() if ip else None
    if shell is not None:
        from IPython.core.displaypub import DisplayPublisher
        shell.display_pub = DisplayPublisher(shell=shell)
