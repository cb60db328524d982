"""Inside a lesson script under ``torchrun``: join the process group torchrun describes, report, leave.

Every lesson that trains has a script in ``notebooks/scripts/`` (notebook 10, ``notebooks/10_torchrun_and_slurm.ipynb``,
derives them); each imports its model and loop from ``utils`` and these three steps from here:

- ``init_from_env``: ``dist.init_process_group`` from the variables torchrun sets (gloo or NCCL, said on rank 0);
- ``print_result``: rank 0's last line, ``RESULT {json}``, its per-step losses as ``float.hex`` strings, which the
  notebook reads back exactly (``utils.launch.scripts.parse_result``);
- ``finish``: destroy the group and leave at once (its docstring says why not simply return).

The notebook's side, starting the scripts under ``torchrun`` with a timeout and killing the whole tree, is
``utils.launch.scripts`` (``run_script``, ``launch``): it is used from lesson 02 on, before lesson 10 explains it.
"""

import json
import os
import sys

from ..launch.scripts import RESULT

__all__ = ["init_from_env", "print_result", "finish"]


def init_from_env(backend="auto"):
    """In a script under torchrun: join the process group torchrun described in the environment.

    ``auto``: NCCL when this node has a GPU per local process, else gloo (said on rank 0). Two agents
    emulating two nodes on a machine with fewer GPUs than processes must use gloo: pass ``gloo``."""
    import torch
    import torch.distributed as dist
    local_rank, local_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local_size else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)  # one GPU per local process
    dist.init_process_group(backend)
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size()} processes on {os.environ.get('GROUP_WORLD_SIZE', '1')} node(s), backend "
              f"{backend}, torch {torch.__version__}", flush=True)
    return backend


def finish(code=0):
    """The last line of a script under torchrun: destroy the process group, flush, and leave at once.

    Why not simply return: ``destroy_process_group`` stops gloo's worker threads only when nothing else holds
    the group, and a DeviceMesh (FSDP2, DTensor, pipelining) is kept alive by torch's own caches. The threads
    then outlive ``main()``; if one drops its last reference to a tensor while Python is shutting down, it
    needs the interpreter lock that no longer exists and the process aborts with SIGABRT ("terminate called
    without an active exception") after printing correct results. On 2 cores that was 1 run in 3 at 3 ranks
    (lesson 04a's script), and torchrun reports it as a failed rank. ``os._exit`` skips that teardown; it is
    also how every ``multiprocessing`` child, and every rank of the course's notebook launcher, ends."""
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()  # nobody tears the group down while a peer still talks to it
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def print_result(losses, **fields):
    """What a script's rank 0 prints at the end: its losses, readable, then one ``RESULT {json}`` line with the exact
    losses (``float.hex`` keeps every bit) and any other fields the lesson reads back (numbers, strings, lists)."""
    print("losses:", [round(float(v), 6) for v in losses])
    print(RESULT + json.dumps({"losses": [float(v).hex() for v in losses], **fields}), flush=True)
