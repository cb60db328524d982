"""A course script under ``torchrun``, started from a notebook or a test: the command line, the launch, the result.

The parent's side of every ``torchrun`` launch in the course. Lesson 10 (``notebooks/10_torchrun_and_slurm.ipynb``)
derives it; lessons 02, 04, 05 and 06 use it before that to check their scripts against their own cells
(``run_script``), lessons 07 and 08 to run their DeepSpeed and Lightning scripts (``launch``), lesson 11 to kill,
relaunch and restart one (``run_agents``), lesson 13b to start its TensorFlow workers. What runs *inside* a script
(join the process group, print the ``RESULT`` line, leave) is ``utils.scale_out.torchrun``. Three rules a notebook
must keep when it starts ``torchrun``:

- ``sys.executable -m torch.distributed.run``: the kernel's own Python and torch, whatever ``torchrun`` is on PATH;
- a timeout on every launch, and on timeout kill the agent and every process under it (killing only the agent
  leaves its workers holding their ports and its output pipe), then say what each printed;
- every script's rank 0 ends with one line ``RESULT {json}`` (``utils.scale_out.torchrun.print_result``): its
  per-step losses as ``float.hex`` strings, so the notebook reads back the exact floats and can compare them
  bitwise, and any other field the lesson reads (``parse_result``); and, as it trains, a line ``step k/n ...`` per
  step, which ``launch`` shows in the notebook as it comes.

``launch`` runs any command this way, not only ``torchrun`` (lesson 08 runs its Lightning script with it, lesson
13b its TensorFlow workers), and ``run_agents`` is the runner under it: start, stream, wait with a timeout, stop
the whole tree, each step done by ``utils.launch.children`` (the course's one home for child processes, which the
grader and the test suite use too).

    losses, seconds, out = run_script("02_ddp_train.py", ["--steps", 3], nproc=2, timeout=300)
"""

import json
import os
import re
import socket
import sys
import time
from pathlib import Path

from .children import run_children

__all__ = ["ROOT", "SCRIPTS", "free_port", "free_ports", "torchrun_command", "run_agents", "launch", "run_script",
           "RESULT", "parse_result", "parse_losses", "TorchrunFailed"]

ROOT = Path(__file__).resolve().parents[2]  # the repository (utils/launch/scripts.py)
SCRIPTS = ROOT / "notebooks" / "scripts"
RESULT = "RESULT "  # the one line a course script's rank 0 prints at the end: JSON, its losses as float.hex strings


class TorchrunFailed(RuntimeError):
    """A torchrun agent exited with an error or ran out of time; the message holds the tail of its output."""


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


def run_agents(commands, timeout, env=None, progress=True, until=None, cwd=ROOT):
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
    TensorFlow worker its own ``TF_CONFIG``). ``cwd``: the agents' working folder (the repository unless given).
    Lesson 11 uses it directly (it expects failures); ``launch`` raises on them."""
    if timeout <= 0:
        raise ValueError(f"timeout={timeout}: give the agents a positive number of seconds, e.g. 300")
    envs = env if isinstance(env, list) else [env] * len(commands)
    if len(envs) != len(commands):
        raise ValueError(f"{len(envs)} environments for {len(commands)} commands: give one dict per command, "
                         "or one dict for all")
    done = run_children(commands, timeout, env=[_env(e) for e in envs], cwd=cwd, until=until,
                        echo=PROGRESS.match if progress else False, prefix="[agent {i}] " if len(commands) > 1 else "")
    return [d.code for d in done], [d.output for d in done], done[0].seconds, done[0].stopped


def launch(commands, timeout, env=None, progress=True, cwd=ROOT):
    """``run_agents``, for runs that must succeed: returns (stdouts, seconds); raises ``TorchrunFailed`` when
    an agent fails or time runs out (every process still alive killed first), with the ranks' error lines and
    the agents' last lines."""
    codes, outputs, seconds, problem = run_agents(commands, timeout, env, progress, cwd=cwd)
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


def run_script(script, args=(), nproc=2, timeout=120, env=None, cwd=ROOT):
    """One agent (one node) with ``nproc`` processes running ``notebooks/scripts/<script>``: (losses, seconds,
    stdout)."""
    (out,), seconds = launch([torchrun_command(SCRIPTS / script, args, nproc)], timeout, env, cwd=cwd)
    return parse_losses(out), seconds, out

