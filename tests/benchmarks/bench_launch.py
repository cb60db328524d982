"""How long does a trivial multi-rank launch take? (``make bench``; measures, asserts nothing.)

Compares ``run_ranks`` (forks the already-running interpreter) with ``torchrun`` (starts fresh
interpreters that each import torch) on the same trivial all-reduce. Results go to stdout and to
build/bench_launch.json.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from utils import describe_machine, run_ranks

WORLD_SIZE = 4
REPEATS = 30
TORCHRUN_REPEATS = 3


def trivial():
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def time_run_ranks():
    seconds = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        assert run_ranks(trivial, world_size=WORLD_SIZE, verbose=False) == [float(WORLD_SIZE)] * WORLD_SIZE
        seconds.append(time.perf_counter() - start)
    return seconds


def time_torchrun():
    script = Path(tempfile.mkdtemp()) / "trivial.py"
    script.write_text("import torch, torch.distributed as dist\n"
                      "dist.init_process_group('gloo'); t = torch.ones(1); dist.all_reduce(t)\n"
                      "dist.destroy_process_group()\n")
    seconds = []
    for _ in range(TORCHRUN_REPEATS):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={WORLD_SIZE}", str(script)], check=True, capture_output=True)
        seconds.append(time.perf_counter() - start)
    return seconds


def main():
    run_ranks(trivial, world_size=WORLD_SIZE, verbose=False)  # warm-up: first-use imports
    ours, theirs = time_run_ranks(), time_torchrun()
    result = {
        "machine": describe_machine(),
        "world_size": WORLD_SIZE,
        "run_ranks_median_s": statistics.median(ours),
        "run_ranks_max_s": max(ours),
        "run_ranks_repeats": REPEATS,
        "torchrun_median_s": statistics.median(theirs),
        "torchrun_repeats": TORCHRUN_REPEATS,
    }
    print(f"{WORLD_SIZE}-rank trivial all-reduce on {result['machine']['cpu_cores']} cores:")
    print(f"  run_ranks: median {result['run_ranks_median_s']:.3f} s, max {result['run_ranks_max_s']:.3f} s "
          f"({REPEATS} launches)")
    print(f"  torchrun : median {result['torchrun_median_s']:.3f} s ({TORCHRUN_REPEATS} launches)")
    out = Path(__file__).resolve().parents[2] / "build" / "bench_launch.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
