"""A lesson script under ``torchrun``, run from a notebook as a subprocess: one agent, or two agents as two nodes.

Notebook 10 (``notebooks/10_torchrun_and_slurm.ipynb``) derives it; lessons 02, 04 and 06 use it to check their
scripts, lesson 11 to kill, relaunch and restart one (``run_agents``). Three rules a notebook must keep when it
starts ``torchrun``:

- ``sys.executable -m torch.distributed.run``: the kernel's own Python and torch, whatever ``torchrun`` is on PATH;
- a timeout on every launch, and on timeout kill the agent and every process under it (killing only the agent
  leaves its workers holding their ports and its output pipe), then say what each printed;
- every script's rank 0 ends with one line ``RESULT {json}`` (``print_result``): its per-step losses as ``float.hex``
  strings, so the notebook reads back the exact floats and can compare them bitwise, and any other field the lesson
  reads (``parse_result``); and, as it trains, a line ``step k/n ...`` per step, which ``launch`` shows in the
  notebook as it comes.

``launch`` runs any command this way, not only ``torchrun`` (lesson 08 runs its Lightning script with it, lesson
13b its TensorFlow workers), and
``run_agents`` is the runner under it: start, stream, wait with a timeout, stop the whole tree, each step done by
``utils.launch.children`` (the course's one home for child processes, which the grader and the test suite use too).
"""

import json
import os
import re
import socket
import sys
import time
from pathlib import Path

from ..launch.children import run_children

__all__ = ["ROOT", "SCRIPTS", "init_from_env", "free_port", "free_ports", "torchrun_command", "run_agents", "launch", "run_script",
           "run_two_agents", "RESULT", "print_result", "parse_result", "parse_losses", "finish", "TorchrunFailed"]

ROOT = Path(__file__).resolve().parents[2]  # the repository (utils/scale_out/torchrun.py)
SCRIPTS = ROOT / "notebooks" / "scripts"


class TorchrunFailed(RuntimeError):
    """A torchrun agent exited with an error or ran out of time; the message holds the tail of its output."""


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


def free_ports(n):
    """n different TCP ports nobody listens on now (the OS picks them, all bound at once so none comes twice;
    another program may take one before we use it: rare, and the launch then fails with the port in its error)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port():
    """A TCP port nobody listens on now (the OS picks it): the rendezvous endpoint of one run."""
    return free_ports(1)[0]


def torchrun_command(script, args=(), nproc=2, nnodes=1, endpoint=None, run_id="course", max_restarts=0):
    """The command line of one ``torchrun`` agent: ``--standalone`` for one node, else c10d at ``endpoint``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if nnodes == 1 and endpoint is None:
        cmd += ["--standalone"]  # a c10d rendezvous on localhost, on a free port torchrun picks itself
    else:
        cmd += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id]
    cmd += ["--max-restarts", str(max_restarts), str(script), *map(str, args)]
    return cmd


def _env(extra=None):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))  # said, so torchrun does not warn
    env.pop("MASTER_ADDR", None), env.pop("MASTER_PORT", None)  # a parent's rendezvous must not leak into ours
    env.update(extra or {})
    return env


PROGRESS = re.compile(r"^step \d+/\d+")  # the progress lines rank 0 of a course script prints, one per step


def run_agents(commands, timeout, env=None, progress=True, until=None):
    """Start every command at once, each in its own session; wait at most ``timeout`` seconds for all.

    Returns (codes, outputs, seconds, stopped) and raises nothing: ``codes[i]`` is agent i's exit code, or None
    when it was stopped; ``stopped`` says why agents were stopped (``timed out after ...``, ``exit code ...`` of
    the agent that failed first, or ``until``), None when all ended by themselves. Whatever ends the wait, every
    process still alive is killed first, workers included, so that nothing is left holding a port or a CPU.
    ``until``: a function of the output so far (all agents' lines, joined) that stops the launch when it returns
    true. ``progress``: print each agent's progress lines (``step k/n ...``) as they come, so that a long launch
    shows it is alive; with several agents each line starts with ``[agent i]``. A thread per agent reads its
    output (a full pipe would stop the agent); only the calling thread prints, so the lines land in the calling
    cell. ``env``: extra variables for every agent, or a list of one dict per agent (lesson 13b gives each
    TensorFlow worker its own ``TF_CONFIG``). Lesson 11 uses it directly (it expects failures); ``launch``
    raises on them."""
    if timeout <= 0:
        raise ValueError(f"timeout={timeout}: give the agents a positive number of seconds, e.g. 300")
    envs = env if isinstance(env, list) else [env] * len(commands)
    if len(envs) != len(commands):
        raise ValueError(f"{len(envs)} environments for {len(commands)} commands: give one dict per command, "
                         "or one dict for all")
    done = run_children(commands, timeout, env=[_env(e) for e in envs], cwd=ROOT, until=until,
                        echo=PROGRESS.match if progress else False, prefix="[agent {i}] " if len(commands) > 1 else "")
    return [d.code for d in done], [d.output for d in done], done[0].seconds, done[0].stopped


def launch(commands, timeout, env=None, progress=True):
    """``run_agents``, for runs that must succeed: returns (stdouts, seconds); raises ``TorchrunFailed`` when
    an agent fails or time runs out (every process still alive killed first), with the ranks' error lines and
    the agents' last lines."""
    codes, outputs, seconds, problem = run_agents(commands, timeout, env, progress)
    if problem is None and any(codes):
        problem = f"exit code {next(c for c in codes if c)}"
    if problem:
        tails = "\n".join(f"--- agent {i}: {' '.join(map(str, commands[i][3:]))}\n" + "\n".join(o.splitlines()[-25:])
                          for i, o in enumerate(outputs))
        what = "torchrun" if all("torch.distributed.run" in map(str, c) for c in commands) else "the launch"
        raise TorchrunFailed(f"{what} {problem} ({seconds:.1f} s). {_errors(outputs)}The agents' last lines:\n{tails}")
    return outputs, seconds


def _errors(outputs):
    """The ranks' exception lines ("[rank0]: ValueError: ..."): torchrun's own summary, at the end, hides them."""
    found = dict.fromkeys(line.strip() for o in outputs for line in o.splitlines()
                          if re.search(r"\b\w*(Error|Exception|Failed)\w*: ", line) and "elastic" not in line)
    return "The ranks raised:\n" + "\n".join(list(found)[:6]) + "\n" if found else ""


RESULT = "RESULT "  # the one line a course script's rank 0 prints at the end: JSON, its losses as float.hex strings


def print_result(losses, **fields):
    """What a script's rank 0 prints at the end: its losses, readable, then one ``RESULT {json}`` line with the exact
    losses (``float.hex`` keeps every bit) and any other fields the lesson reads back (numbers, strings, lists)."""
    print("losses:", [round(float(v), 6) for v in losses])
    print(RESULT + json.dumps({"losses": [float(v).hex() for v in losses], **fields}), flush=True)


def parse_result(stdout):
    """The ``RESULT`` line a script printed, as a dict: ``losses`` as the exact floats, the other fields as printed."""
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT)]
    if len(lines) != 1:
        raise TorchrunFailed(f"expected one RESULT line, found {len(lines)}; output ends:\n{stdout[-2000:]}")
    result = json.loads(lines[0][len(RESULT):])
    result["losses"] = [float.fromhex(h) for h in result["losses"]]
    return result


def parse_losses(stdout):
    """The exact per-step losses of the ``RESULT`` line rank 0 printed."""
    return parse_result(stdout)["losses"]


def run_script(script, args=(), nproc=2, timeout=120, env=None):
    """One agent (one node) with ``nproc`` processes: (losses, seconds, stdout)."""
    (out,), seconds = launch([torchrun_command(SCRIPTS / script, args, nproc)], timeout, env)
    return parse_losses(out), seconds, out


def run_two_agents(script, args=(), nproc_per_node=1, timeout=120, env=None):
    """Two agents on this machine, as two nodes meeting at a c10d rendezvous on localhost:<free port>.

    The agent that binds the endpoint first hosts the rendezvous store, the other joins it; together they
    run 2 x ``nproc_per_node`` processes. Returns (losses, seconds, stdouts)."""
    endpoint, run_id = f"localhost:{free_port()}", f"course-{os.getpid()}-{time.monotonic_ns()}"
    commands = [torchrun_command(SCRIPTS / script, args, nproc_per_node, nnodes=2, endpoint=endpoint, run_id=run_id)
                for _ in range(2)]
    outs, seconds = launch(commands, timeout, env)
    printed = [o for o in outs if any(line.startswith(RESULT) for line in o.splitlines())]  # rank 0 lives on whichever agent got node rank 0
    if len(printed) != 1:
        raise TorchrunFailed(f"expected rank 0's losses from exactly one agent, got {len(printed)}")
    return parse_losses(printed[0]), seconds, outs
