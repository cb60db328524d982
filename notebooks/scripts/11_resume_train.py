"""Lesson 11a's training run under torchrun: checkpoints every k steps, can kill one of its ranks, resumes.

    torchrun --standalone --nproc-per-node 2 notebooks/scripts/11_resume_train.py \\
        --steps 24 --ckpt-every 4 --ckpt-dir /tmp/ckpt --losses /tmp/losses.jsonl --kill-rank 1 --kill-step 10

Run the same command again and it resumes from the newest checkpoint in ``--ckpt-dir`` (what a Slurm
requeue does); add ``--max-restarts 1`` to torchrun and torchrun restarts the workers itself. The
kill happens only in an attempt that started from scratch, so the attempt after it runs to the end.
Rank 0 appends each step's loss (``float.hex``) to ``--losses``. The loop itself is ``utils.scale_out.resume.train``,
which the notebook also calls.

One thing here is not in the loop, and it is the trap of in-job restarts: torchrun's workers share
the agent's TCPStore, which outlives them. A restarted worker that joins a process group on it as
if it were new reads the keys the dead generation left there (gloo: the dead peers' addresses) and
fails with "Connection refused". So each generation gets its own key prefix, and the generation is
counted by the store itself (``utils.scale_out.resume.store_generation``), not taken from
``TORCHELASTIC_RESTART_COUNT``, which may differ between agents when there are several.
"""

import argparse
import datetime
import os
import time
import sys

import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the course's utils/
from utils.scale_out.resume import store_generation, train  # noqa: E402
from utils.scale_out.torchrun import finish  # noqa: E402


def join_process_group(prefix_per_generation=True, stagger_s=0.0, timeout_s=60):
    """The default process group over gloo, on the store torchrun gives us; returns the generation."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's agent hosts the store
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=(rank == 0 and not agent_store), timeout=datetime.timedelta(seconds=timeout_s))
    generation = store_generation(store, world)
    print(f"rank {rank} joining as generation {generation}", flush=True)  # every rank: the first to fail may be any
    if generation > 0:
        time.sleep((world - 1 - rank) * stagger_s)  # restarted workers rarely start at the same moment; rank 0 last here
    if prefix_per_generation:
        store = dist.PrefixStore(f"generation{generation}", store)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return generation


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=24, help="optimizer steps in all")
    p.add_argument("--ckpt-every", type=int, default=4, help="write a DCP checkpoint after every k-th step")
    p.add_argument("--ckpt-dir", required=True, help="where checkpoints go, and where a relaunch looks for them")
    p.add_argument("--losses", required=True, help="rank 0 appends one JSON line per step here")
    p.add_argument("--kill-rank", type=int, default=None, help="this rank SIGKILLs itself ...")
    p.add_argument("--kill-step", type=int, default=None, help="... at the start of this step (first attempt only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-generation-prefix", action="store_true",
                   help="join the process group on the bare agent store (shows the restart trap)")
    p.add_argument("--stagger", type=float, default=0.0,
                   help="after a restart, rank r waits (world_size - 1 - r) times this many seconds before joining")
    a = p.parse_args()
    generation = join_process_group(prefix_per_generation=not a.no_generation_prefix, stagger_s=a.stagger)
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if int(os.environ.get("LOCAL_RANK", rank)) == 0:  # one line per agent
        print(f"generation {generation}: rank {rank} of {world}, this agent's restart count {restart}", flush=True)
    losses = train(a.steps, a.ckpt_dir, a.ckpt_every, seed=a.seed, kill_rank=a.kill_rank, kill_step=a.kill_step,
                   log_path=a.losses, attempt=generation)
    if rank == 0:
        print(f"generation {generation} ran {len(losses)} steps, last loss {float.fromhex(losses[-1]):.6f}"
              if losses else f"generation {generation}: nothing left to do", flush=True)
    finish()  # destroy the group and exit without the interpreter's teardown (utils.scale_out.torchrun.finish says why)


if __name__ == "__main__":
    main()
