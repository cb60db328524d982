"""A workshop on a Slurm cluster instead of one box: the recipe, printed for a teacher to follow.

Three steps, each a command this prints with the workshop's numbers in it:

1. **A reservation** (the cluster's admins run it, a week before): nodes set aside for the learners'
   logins and the workshop's account during the workshop, so nobody waits in the queue.
2. **One job per learner**: each learner, logged in with their own account on the cluster, submits
   ``notebooks/scripts/slurm/jupyter_lab.sbatch`` from their copy of the course under the workshop's
   Slurm account and the reservation. The job ``srun``s JupyterLab on a compute node with the
   learner's cores (Slurm binds them; the launcher shares out what it may use, ``usable_cores``) and
   GPUs (Slurm sets ``CUDA_VISIBLE_DEVICES``).
3. **The SSH tunnel**: the job's output starts with the line to run on the laptop,
   ``ssh -N -L 8888:<node>:<port> <login>@<login node>``, and the address to open.

``python -m utils.workshop.slurm --learners alice,bob --account dl-course --start 2026-12-01T09:00``
prints it (``make slurm-recipe``). tests/test_workshop_slurm.py runs the job script with a fake ``srun``.
"""

from __future__ import annotations

import argparse
import math
import re

SCRIPT = "notebooks/scripts/slurm/jupyter_lab.sbatch"


def nodes_needed(learners, cpus_per_learner, gpus_per_learner, cores_per_node, gpus_per_node) -> int:
    """Nodes for the reservation: enough cores, and enough GPUs, for every learner at once."""
    by_cores = math.ceil(learners * cpus_per_learner / cores_per_node)
    by_gpus = math.ceil(learners * gpus_per_learner / gpus_per_node) if gpus_per_learner else 0
    return max(1, by_cores, by_gpus)


def recipe(learners, account, start, hours=8, reservation="dl-course", cpus_per_learner=8, gpus_per_learner=1,
           cores_per_node=64, gpus_per_node=8, partition=None) -> str:
    """The teacher's three steps as text, with every command filled in."""
    if not learners:
        raise ValueError("no learner: pass their cluster logins, e.g. --learners alice,bob")
    bad = [name for name in learners if not re.fullmatch(r"[a-z_][a-z0-9_.-]*", name)]
    if bad:
        raise ValueError(f"{bad} are not Unix logins: list the learners' cluster accounts (lower case)")
    if gpus_per_learner > gpus_per_node:
        raise ValueError(f"{gpus_per_learner} GPUs per learner do not fit a node of {gpus_per_node}: "
                         f"use --gpus-per-learner {gpus_per_node} or fewer")
    nodes = nodes_needed(len(learners), cpus_per_learner, gpus_per_learner, cores_per_node, gpus_per_node)
    part = f" PartitionName={partition}" if partition else ""
    job = (f"sbatch --account={account} --reservation={reservation} --cpus-per-task={cpus_per_learner} "
           + (f"--gpus={gpus_per_learner} " if gpus_per_learner else "")
           + (f"--partition={partition} " if partition else "") + f"--time={hours:02d}:00:00 {SCRIPT}")
    return "\n".join([
        f"# A workshop on Slurm: {len(learners)} learner(s), {cpus_per_learner} cores and {gpus_per_learner} GPU(s) "
        f"each, {hours} h from {start}.",
        "",
        f"# 1. The admins reserve {nodes} node(s) for the learners and the account "
        f"({cores_per_node} cores, {gpus_per_node} GPUs a node):",
        f"scontrol create reservation ReservationName={reservation} StartTime={start} Duration={hours:02d}:00:00 "
        f"Users={','.join(learners)} Accounts={account} NodeCnt={nodes}{part}",
        "",
        "# 2. Each learner, logged in to the cluster with their own account, once (the course and its .venv):",
        "git clone <the course's repository> course && cd course && make setup",
        "#    then, on the day, from the course folder:",
        job,
        "",
        "# 3. The job's output (lab-<jobid>.out) starts with the tunnel to run on the laptop, e.g.",
        "#    ssh -N -L 8888:<node>:<port> <login>@<login node>",
        "#    and the address to open: http://localhost:8888/lab/tree/notebooks/00_start_here.ipynb?token=...",
        f"#    `squeue --reservation={reservation}` shows every learner's job; scancel <jobid> stops one.",
        f"#    Before the day: `srun --reservation={reservation} --account={account} make preflight` checks a node.",
    ])


def main(argv=None):
    parser = argparse.ArgumentParser(description="Print the Slurm recipe for a workshop (reservation, jobs, tunnel).")
    parser.add_argument("--learners", required=True, help="the learners' cluster logins, comma-separated")
    parser.add_argument("--account", required=True, help="the workshop's Slurm account (sbatch --account)")
    parser.add_argument("--start", required=True, help="the reservation's start, e.g. 2026-12-01T09:00:00")
    parser.add_argument("--hours", type=int, default=8)
    parser.add_argument("--reservation", default="dl-course")
    parser.add_argument("--cpus-per-learner", type=int, default=8)
    parser.add_argument("--gpus-per-learner", type=int, default=1, help="0 on a CPU cluster")
    parser.add_argument("--cores-per-node", type=int, default=64)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--partition")
    args = parser.parse_args(argv)
    print(recipe([name.strip() for name in args.learners.split(",") if name.strip()], args.account, args.start,
                 args.hours, args.reservation, args.cpus_per_learner, args.gpus_per_learner, args.cores_per_node,
                 args.gpus_per_node, args.partition))


if __name__ == "__main__":
    main()
