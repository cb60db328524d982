"""The robustness run (``make robust``): the suite's claims must hold on a busy machine, every time.

With a busy process pinned to one core throughout (``taskset -c 0``, a Python loop), it runs

1. the notebook suite (``pytest -m notebook``, with the sizes of ``--world-sizes``), then
2. each timing-sensitive notebook (asserts on times, speed-ups, idle shares or the pipeline bubble)
   ``--repeats`` times in a row (default 5) with ``SMOKE=True`` and ``WORLD_SIZE`` from ``--world-size``,

prints the passes per notebook and exits non-zero if any run failed. The busy process is stopped on
every exit, interrupts included. Executed copies go to ``build/robust/``.

    python -m utils.course.robustness                        # all of it (32 minutes on a 2-core machine)
    python -m utils.course.robustness --no-suite --only 06   # lesson 06, 5 times, under the busy core
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from .notebook_runner import BUILD, ROOT, execute, parameters_for

# Notebooks whose asserts involve a time, each a bound or a ratio that the machine's load must not break (issue 34):
# 00 (a bare launch against a fresh torch import timed in turns; a crash reported within 10 s), 01b (the alpha-beta
# fit; our ring vs gloo in the full run), 05a (the naive split's stages never overlap; its wait in recv uses no CPU),
# 06b and 06c (the bubble of fixed-cost stages), 07a (the first DeepSpeed cell compiles nothing), 08b (the training
# process's CPU time with data-loading workers).
TIMING_SENSITIVE = ["notebooks/00_start_here.ipynb", "notebooks/01b_ring_all_reduce.ipynb",
                    "notebooks/05a_tensor_parallelism.ipynb",
                    "notebooks/06b_pipeline_bubble.ipynb", "notebooks/06c_zero_bubble.ipynb",
                    "notebooks/07a_deepspeed_config.ipynb", "notebooks/08b_lightning_speedups.ipynb"]
BUSY_LOOP = "while True: pass"


def start_busy_core(core=0):
    """A process spinning on one core for the whole run (pinned with taskset where there is one)."""
    cmd = [sys.executable, "-c", BUSY_LOOP]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", str(core)] + cmd
    else:
        print(f"taskset not found: the busy process runs unpinned ({os.cpu_count()} cores)", flush=True)
    busy = subprocess.Popen(cmd, start_new_session=True)
    print(f"busy process {busy.pid} spinning on core {core}: {' '.join(cmd)}", flush=True)
    return busy


def stop(busy):
    if busy.poll() is None:
        busy.kill()
        busy.wait()
        print(f"busy process {busy.pid} stopped", flush=True)


def repeat_notebooks(paths, repeats, world_size):
    """Run each notebook `repeats` times in a row; {name: [ok, ...]}, with the log of every failure printed."""
    passes = {}
    for path in paths:
        path = ROOT / path
        for i in range(repeats):
            out = BUILD / "robust" / f"run{i + 1}"
            ok, seconds, log = execute(path, out, parameters_for(path, SMOKE=True, WORLD_SIZE=world_size))
            passes.setdefault(path.name, []).append(ok)
            print(f"{path.name} run {i + 1}/{repeats}: {'passed' if ok else 'FAILED'} in {seconds:.0f} s, "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)
            if not ok:
                print(log[-4000:], flush=True)
    return passes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each timing-sensitive notebook (5)")
    parser.add_argument("--world-size", type=int, default=2, help="WORLD_SIZE of the repeated runs (2)")
    parser.add_argument("--world-sizes", default="suite", help="--world-sizes of the notebook suite (suite)")
    parser.add_argument("--only", nargs="*", help="repeat only the timing-sensitive notebooks whose name starts so, e.g. 06")
    parser.add_argument("--no-suite", action="store_true", help="skip part 1, the notebook suite")
    args = parser.parse_args(argv)
    paths = [p for p in TIMING_SENSITIVE if not args.only or any(Path(p).name.startswith(o) for o in args.only)]

    busy = start_busy_core()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the busy process
    suite_rc, start = None, time.perf_counter()
    try:
        if not args.no_suite:
            suite_rc = subprocess.call([sys.executable, "-m", "pytest", "-m", "notebook",
                                        f"--world-sizes={args.world_sizes}", "-p", "no:cacheprovider"], cwd=ROOT)
        passes = repeat_notebooks(paths, args.repeats, args.world_size)
    finally:  # on any exit, interrupts included: the busy process, and a notebook still running (kernel, ranks)
        for child in psutil.Process().children(recursive=True):
            if child.pid != busy.pid:
                child.kill()
        stop(busy)

    print(f"\nrobustness run, one core kept busy, {time.perf_counter() - start:.0f} s:")
    if suite_rc is not None:
        print(f"  notebook suite (--world-sizes={args.world_sizes}): {'passed' if suite_rc == 0 else 'FAILED'}")
    for name, oks in passes.items():
        print(f"  {name}: {sum(oks)} of {len(oks)} runs passed (WORLD_SIZE={args.world_size})")
    failed = (suite_rc not in (None, 0)) or not all(all(oks) for oks in passes.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
