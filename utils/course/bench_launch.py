"""How long does a trivial multi-rank launch take, and how many threads should a rank get?
(``make bench``; it measures and prints, and asserts nothing.)

1. Launch time: ``run_ranks`` (ranks forked by the kernel's warm rank server, utils/launch/) against
   ``torchrun`` (fresh interpreters that each import torch), on the same trivial all-reduce.
2. Threads per rank: a small MLP's training steps on 1 and 2 ranks, each rank with 1 torch
   thread and with the cores shared out (the launcher's default, utils/launch/plan.py).

Results go to stdout and to build/bench_launch.json.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from ..hardware import describe_machine
from ..launch import run_ranks
from ..perf import measure

WORLD_SIZE = 4
REPEATS = 30
TORCHRUN_REPEATS = 3


def trivial():
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def time_run_ranks():
    def launch():
        assert run_ranks(trivial, world_size=WORLD_SIZE, verbose=False) == [float(WORLD_SIZE)] * WORLD_SIZE

    return measure(launch, REPEATS, each=True)[0]  # every launch timed alone


def time_torchrun():
    script = Path(tempfile.mkdtemp()) / "trivial.py"
    script.write_text("import torch, torch.distributed as dist\n"
                      "dist.init_process_group('gloo'); t = torch.ones(1); dist.all_reduce(t)\n"
                      "dist.destroy_process_group()\n")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD_SIZE}",
               str(script)]
    return measure(lambda: subprocess.run(command, check=True, capture_output=True), TORCHRUN_REPEATS, each=True)[0]


def mlp_steps(steps=30):
    """Seconds for `steps` forward+backward passes of a 1024-wide MLP on a batch of 256 (per rank)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
    x = torch.randn(256, 1024)
    (seconds,), _ = measure(lambda: net(x).sum().backward(), steps, warmup=1)  # the mean step, after 1 warm-up
    return seconds * steps


def time_threads():
    cores = os.cpu_count()
    rows = []
    for world_size in (1, 2):
        for threads in sorted({1, max(1, cores // world_size)}):
            seconds = run_ranks(mlp_steps, world_size=world_size, threads_per_rank=threads, verbose=False)
            rows.append({"world_size": world_size, "threads_per_rank": threads, "slowest_rank_s": max(seconds)})
    return rows


def main():
    run_ranks(trivial, world_size=WORLD_SIZE, verbose=False)  # warm-up: first-use imports
    ours, theirs = time_run_ranks(), time_torchrun()
    threads = time_threads()
    result = {
        "machine": describe_machine(),
        "world_size": WORLD_SIZE,
        "run_ranks_median_s": statistics.median(ours),
        "run_ranks_max_s": max(ours),
        "run_ranks_repeats": REPEATS,
        "torchrun_median_s": statistics.median(theirs),
        "torchrun_repeats": TORCHRUN_REPEATS,
        "mlp_30_steps_by_threads": threads,
    }
    print(f"{WORLD_SIZE}-rank trivial all-reduce on {result['machine']['cpu_cores']} cores:")
    print(f"  run_ranks: median {result['run_ranks_median_s']:.3f} s, max {result['run_ranks_max_s']:.3f} s "
          f"({REPEATS} launches)")
    print(f"  torchrun : median {result['torchrun_median_s']:.3f} s ({TORCHRUN_REPEATS} launches)")
    print("30 MLP training steps per rank (1024 wide, batch 256), slowest rank:")
    for row in threads:
        print(f"  {row['world_size']} rank(s) x {row['threads_per_rank']} thread(s): {row['slowest_rank_s']:.2f} s")
    out = Path(__file__).resolve().parents[2] / "build" / "bench_launch.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
