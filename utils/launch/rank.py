"""Step 4 of a launch: what runs inside each rank process, from its first line to its result.

The rank server (``server.py``) forks a rank and calls ``rank_main`` in the child. The child is a
copy of the server, a fresh interpreter that has imported torch and never ran autograd, CUDA or
OpenMP, so the rank may use all three. It does, in order:

1. points its stdout and stderr (the file descriptors, so C++ warnings and crash dumps too) at the
   pipes the kernel reads, which prefix every line with ``[rank k]``;
2. arms the tools the launcher uses to explain failures: ``faulthandler`` prints the Python stack
   on a segfault, and on SIGUSR1 (sent when the ranks hang past their timeout); Linux kills the
   rank if the server dies (PR_SET_PDEATHSIG), and the server dies with the kernel;
3. becomes the kernel, as far as the function can tell: same working folder, ``sys.path`` and
   environment variables, and the source lines of the notebook's cells (for tracebacks); then
   unpickles the function and its arguments (they travelled by value, with cloudpickle);
4. sets what torchrun would set (``RANK``, ``WORLD_SIZE``...), its torch thread count and its GPU,
   reads ``TORCH_DISTRIBUTED_DEBUG`` again (the kernel may have set it after the server imported torch),
   joins the default process group through a ``FileStore`` and waits at a barrier for every peer; a rank of
   ``backend="relay"`` instead seals itself (``seal.py``) and joins the kernel's relay (``relay.py``), before
   its payload is unpickled;
5. calls the function and sends back ``("ok", value)`` with tensors moved to the CPU (cloudpickled; as
   ``torch.save`` bytes of plain data and tensors where the kernel reads restricted, ``restricted.py``), or
   ``("error", report)`` with the traceback, which ``errors.py`` turns into ``RankError``.

A rank never returns into the server's code: it leaves with ``os._exit``.
"""

from __future__ import annotations

import faulthandler
import io
import linecache
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection

import cloudpickle
import torch
import torch.distributed as dist

from . import relay
from .errors import looks_secondary
from .plan import RankSetup
from .restricted import dumps_tensors, restricted
from .seal import available as seal_available, seal


def rank_main(setup: RankSetup, payload, result_fd, out_fd, err_fd, *extra_fds):
    """Entry point of every rank process (a child of the server). Never returns. ``extra_fds``: maybe a pipe holding
    this rank's own arguments (``run_ranks``'s ``rank_args``), read before the payload (and any code of the learner's
    in it) is unpickled; then, for ``backend="relay"``, this rank's socket to the kernel's relay (``relay.py``)."""
    extra = list(extra_fds)
    relay_fd = extra.pop() if setup.backend == "relay" else None
    own_fd = extra[0] if extra else None
    result = Connection(result_fd, readable=False)
    # Our output goes to the kernel's pipes, which prefix it with "[rank k]". Redirecting the file
    # descriptors (not just sys.stdout) also catches C++ warnings and faulthandler's stack dumps.
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd), os.close(err_fd)
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), line_buffering=True)
    faulthandler.enable(file=sys.stderr)  # a segfault prints the Python stack
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # "where are you stuck?"
    die_with_parent()
    rank, world_size = setup.rank, setup.world_size
    try:
        _become_the_kernel(setup)
        # What torchrun would set, for libraries that look (the process group is created below).
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                          LOCAL_WORLD_SIZE=str(world_size))
        own = ()
        if own_fd is not None:
            with open(own_fd, "rb") as f:
                own = pickle.loads(f.read())
        if relay_fd is not None:
            # sealed first (seal.py), before the payload and any code of the learner's in it is unpickled: from here
            # on the relay is this process's one way to its peers, and the kernel sees all that passes there
            if seal_available() is None:  # Linux on x86-64 or AArch64; elsewhere the relay still records
                _before_the_seal()
                seal()
            relay.join(relay_fd, rank, world_size, timedelta(seconds=setup.timeout + 60))
        fn, args, kwargs = cloudpickle.loads(payload)
        torch.set_num_threads(setup.threads_per_rank)
        if setup.device == "cuda":
            torch.cuda.set_device(rank)
        if setup.process_group and relay_fd is None:
            # torch read TORCH_DISTRIBUTED_DEBUG once, when the server imported it: read it again, so that
            # the kernel's value of now (e.g. DETAIL, which checks every collective's shapes) applies.
            dist.set_debug_level_from_env()
            # The gloo/NCCL timeout is longer than the launcher's, so a hang is reported by the
            # launcher, with stacks, rather than as an opaque backend error.
            store = dist.FileStore(setup.store, world_size)
            dist.init_process_group(setup.backend, store=store, rank=rank, world_size=world_size,
                                    timeout=timedelta(seconds=setup.timeout + 60))
            # init can return on one rank while another is still connecting to it; without this
            # barrier a rank whose fn returns at once can exit and break its peer's connection.
            dist.barrier()
        value = fn(*args, *own, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the kernel
        tb = exc.__traceback__.tb_next or exc.__traceback__  # start at the learner's frame, not this one
        report = dict(time=time.monotonic(), type=type(exc).__name__, message=str(exc),
                      traceback="".join(traceback.format_exception(type(exc), exc, tb)),
                      secondary=looks_secondary(exc))
        _leave(result, ("error", report), 1)
    try:
        # cloudpickle: a class defined in the notebook goes back as the kernel's own class; to a kernel that reads
        # its ranks restricted (a grader: restricted.py), plain data and tensors only
        data = dumps_tensors(_to_cpu(value)) if restricted() else cloudpickle.dumps(_to_cpu(value))
    except Exception as exc:  # noqa: BLE001
        _leave(result, ("error", dict(time=time.monotonic(), type="PicklingError", secondary=False,
               message=f"rank {rank} returned a {type(value).__name__} that cannot be sent back: {exc}",
               traceback="Return plain values: tensors, numbers, lists, dicts (e.g. tensor.detach().cpu()).\n")), 1)
    if dist.is_initialized():
        dist.destroy_process_group()
    _leave(result, ("ok", data), 0)


def _before_the_seal():
    """What torch writes once, on its first use of a module it imports lazily, done while a rank still may: the
    temporary folder found (by writing a file there), and torch's cache folder named as that folder, which exists
    (``torch._dynamo``, which torch's optimizers import, makes its cache folder at import: one that exists it leaves
    as it is). Importing torch's own function for it would cost each rank 1.5 s (``torch._inductor``)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.gettempdir())


def _become_the_kernel(setup):
    """Same folder, import path, environment and cell sources as the kernel that launched us."""
    os.chdir(setup.cwd)
    sys.path[:] = setup.sys_path
    os.environ.clear()
    os.environ.update(setup.env)
    for filename, lines in setup.cell_sources.items():  # so tracebacks show the notebook's lines
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)


def _leave(result, message, code):
    """Send the result, flush our output and exit without running any clean-up (the peers may be
    gone, and tearing a process group down could block)."""
    try:
        relay.flush()  # its last acknowledgements reach the relay before its link closes, as gloo's transfers end
        result.send_bytes(pickle.dumps(message))
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)


def _to_cpu(value):
    """Tensors come back on the CPU: unpickling a CUDA tensor would initialise CUDA in the kernel."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_to_cpu(v) for v in value)
    if type(value) is dict:
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def rank_device() -> torch.device:
    """Inside a rank: the device this rank should put its tensors on, ``cuda:<local rank>`` under NCCL, else CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def undumpable():
    """Ask Linux to make this process undumpable (PR_SET_DUMPABLE 0): another process of the same user can then
    neither ptrace it nor read its memory or open files through /proc (it needs CAP_SYS_PTRACE, which a grader's
    sandbox drops). Children forked later inherit it."""
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL(None, use_errno=True).prctl(4, 0)  # 4 = PR_SET_DUMPABLE
        except (OSError, AttributeError):
            pass


def die_with_parent():
    """Ask Linux to kill this process when its parent dies: a rank with its server, the server with
    its kernel, so that nothing outlives a notebook."""
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
