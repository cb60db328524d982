"""``make preflight``: check a box the day before a workshop, and say what to fix.

Each check answers ok, warn (the course runs, something will be slow or shared) or fail (a lesson will
not run), with the fix beside each warning and failure. What is checked, in order: Python, torch and its
CUDA, cores, memory and disk for ``--learners`` learners (memory for ``--schedule``'s notebooks), each GPU (a matmul, and memory that others
already hold), NCCL between every pair of GPUs, gloo, the ports a hub and a lab listen on, the launcher's
rank server, and a 2-rank all-reduce. The last two go through the launcher itself (``utils.launch``),
so a pass means lesson 00 runs here. The GPU checks run only where there are GPUs;
tests/test_workshop_preflight.py fakes them the way tests/test_hardware_branches.py fakes hardware.

Memory per learner is measured, not guessed: the largest peak among the notebooks of the schedule
(TEACHING.md's; ``all`` for every lesson and lab), as ``make course`` measured it and stored it in
utils/course/run_minutes.json (``teaching_guide.measured_peak``: the resident memory of papermill, the kernel and
its ranks summed, sampled every 0.5 s at full parameters, so a spike shorter than that may be missed; shared pages
are counted in every process, so the sum is an upper bound on them; the same figures as TEACHING.md's memory
column). A learner runs one notebook at a time, so the largest, not the sum. Headroom on top: at least one idle
kernel with its rank server, measured here in a fresh process after importing the heavy libraries a lesson imports
(``server_handle.HEAVY_MODULES``, those installed), which the lesson's rank server imports too. At least, because
JupyterLab keeps a notebook's kernel running when its tab is closed (its ``kernelShutdown`` setting is false by
default) and the hub culls no idle kernel: every earlier lesson's kernel is still there unless the learner shut it
down. A notebook of the schedule with no measured peak is named, and warned about; one whose optional requirements
(``metadata.course.requires``: notebooks 13a and 13b need TensorFlow, ``make frameworks``) are not installed here
cannot run here, so it is left out of the ask, with a note saying so.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import socket
import sys
import time
from itertools import combinations
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from ..hardware import usable_cores
from ..launch import RankError, run_ranks
from ..launch.server_handle import HEAVY_MODULES, rank_server
from ..course import minutes, schedules, teaching_guide
from ..course.notebook_runner import missing_requirements
from ..torch_versions import SUPPORTED, is_supported
from .seats import deal_seats

ROOT = Path(__file__).resolve().parents[2]
PORTS = {8000: "the hub (make hub, HUB_PORT)", 8001: "the hub's proxy API", 8081: "the hub itself",
         8888: "make lab", 29500: "torchrun's default (lesson 10)"}
RANKS_PER_LEARNER = 4  # lesson 00's WORLD_SIZE: the most ranks a lesson starts by default
SCHEDULES = ["all", *map(teaching_guide.schedule_name, schedules.PLANS)]  # --schedule's choices
GIB = 2**30


@dataclasses.dataclass
class Check:
    name: str
    status: str  # "ok", "warn" or "fail"
    detail: str
    fix: str = ""

    def line(self) -> str:
        mark = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}[self.status]
        return f"[{mark}] {self.name}: {self.detail}" + (f"\n       fix: {self.fix}" if self.fix else "")


LEARNER_PORTS = {8888: "make lab", 29500: "torchrun's default (lesson 10)"}  # a learner's own machine runs no hub


def check_system(system=None, release=None, root=ROOT) -> Check:
    """The operating system: Linux is what the course is tested on; WSL 2 is Linux (but slow on /mnt/c); macOS is
    untested; Windows itself cannot run the ranks' fork server (no fork)."""
    system = system or sys.platform
    release = platform.release() if release is None else release
    if system.startswith("win"):
        return Check("system", "fail", "Windows itself: the course's launcher forks its ranks, which Windows cannot",
                     "install WSL 2 (`wsl --install` in PowerShell gives Ubuntu), clone the course in your WSL home "
                     "and run the same commands there; or follow the workshop on its hub")
    if system == "darwin":
        return Check("system", "warn", f"macOS {platform.mac_ver()[0] or release}: the course is not tested there",
                     "if a lesson fails, tell your teacher and follow the workshop on its hub")
    if "microsoft" in release.lower():
        if str(root).startswith("/mnt/"):
            return Check("system", "warn", f"WSL 2, the course in {root}: the Windows file system, much slower",
                         "clone the course again in your WSL home (cd ~) and run the commands there")
        return Check("system", "ok", f"WSL 2 ({release}), the course in the Linux file system")
    return Check("system", "ok", f"{system} {release}")


def check_python(version=None) -> Check:
    version = version or sys.version_info[:3]
    text = ".".join(map(str, version))
    if (3, 11) <= tuple(version[:2]) <= (3, 12):
        return Check("python", "ok", f"{text} ({sys.executable})")
    return Check("python", "fail", f"{text}; the course needs 3.11 or 3.12",
                 "install Python 3.12 and run `make setup PYTHON=python3.12` (rm -rf .venv first)")


def check_torch(version=None, cuda_build="unset", gpus=None, driver_gpus=None) -> Check:
    """torch's version, and whether its build matches the GPUs: a CPU wheel on a GPU box is the classic."""
    version = version or torch.__version__
    cuda_build = torch.version.cuda if cuda_build == "unset" else cuda_build
    gpus = torch.cuda.device_count() if gpus is None else gpus
    driver_gpus = _nvidia_smi_gpus() if driver_gpus is None else driver_gpus
    build = f"CUDA {cuda_build}" if cuda_build else "CPU-only build"
    if not is_supported(version):
        return Check("torch", "fail", f"{version}; the course runs on {SUPPORTED}",
                     "rm -rf .venv && make setup (installs torch 2.13.0)")
    if driver_gpus and not cuda_build:
        return Check("torch", "fail", f"{version}, {build}, but nvidia-smi lists {driver_gpus} GPU(s)",
                     "install torch's CUDA wheel for this driver into the system Python, then "
                     "`rm -rf .venv && make setup SYSTEM_TORCH=1`")
    if driver_gpus and gpus < driver_gpus:
        return Check("torch", "fail", f"{version}, {build}, sees {gpus} of the {driver_gpus} GPU(s) nvidia-smi lists",
                     "CUDA_VISIBLE_DEVICES hides some (unset it), or the driver is older than CUDA "
                     f"{cuda_build} needs (update the driver, or install a torch built for an older CUDA)")
    return Check("torch", "ok", f"{version}, {build}, {gpus} GPU(s) visible")


def check_cores(learners, cores=None) -> Check:
    cores = usable_cores() if cores is None else cores
    per = cores / learners
    detail = f"{cores} usable core(s), {per:.1f} per learner for {learners} learner(s)"
    if per < 0.5:  # seats.py deals each learner a core at least: here more than two learners would share one
        return Check("cores", "fail", detail + ": more than two learners a core",
                     f"at most {2 * cores} learners here, or a machine with {learners * 2} cores")
    if per < 2:
        return Check("cores", "warn", detail + f": a {RANKS_PER_LEARNER}-rank lesson runs "
                     f"{RANKS_PER_LEARNER / per:.0f} ranks a core, results right, timings pessimistic",
                     f"{learners * 2} cores or more give 2 per learner")
    return Check("cores", "ok", detail)


SHUT_DOWN = ("ask learners to shut each lesson's kernel down before opening the next (Kernel > Shut Down Kernel): "
             "closing its tab leaves it running, and every kernel left running adds its share")


def check_memory(learners, schedule, idle, available=None, data=None, missing=None) -> Check:
    """Memory for ``learners`` working through ``schedule`` (see the module's docstring): each the largest measured
    peak of its notebooks (``data``: run_minutes.json's content) plus ``idle``, at least one kernel left running.
    ``missing(stem)``: the notebook's optional requirements not installed here (default: ``missing_requirements``)."""
    available = psutil.virtual_memory().available if available is None else available
    data = minutes.load_data() if data is None else data
    missing = missing or (lambda stem: missing_requirements(teaching_guide.stem_path(stem)))
    stems = teaching_guide.schedule_stems(schedule)
    cannot = {stem: needs for stem in stems if (needs := missing(stem))}
    left_out = ("; left out, their requirements not installed here: " +
                ", ".join(f"{stem} (needs {', '.join(needs)})" for stem, needs in cannot.items()) +
                " (make frameworks installs TensorFlow; then measure them)") if cannot else ""
    peaks = {stem: teaching_guide.measured_peak(stem, data) for stem in stems if stem not in cannot}
    unmeasured = [stem for stem, peak in peaks.items() if not peak]
    remeasure = "make course, then python -m utils.course.minutes --measured build/course --memory-only"
    if len(unmeasured) == len(peaks):
        return Check("memory", "warn", f"no notebook of schedule {schedule} has a measured peak" + left_out, remeasure)
    top = max(peaks, key=lambda stem: peaks[stem] or 0)
    peak = peaks[top]
    need = learners * (peak + idle)
    detail = (f"{available / GIB:.1f} GiB available; schedule {schedule}: its largest measured peak, {top}, "
              f"{peak / GIB:.2f} GiB + at least one kernel left running, with its rank server, {idle / GIB:.2f} GiB "
              f"(measured here) = {need / GIB:.1f} GiB for {learners} learner(s)")
    unmeasured = f"; not measured: {', '.join(unmeasured)}" if unmeasured else ""
    if available < learners * peak:
        most = int(available // peak)
        return Check("memory", "fail", detail + f": {top} at once for every learner does not fit" + unmeasured +
                     left_out, f"at most {most} learner(s) here, a schedule of smaller notebooks, or more memory"
                     if most else f"more memory: one learner running {top} needs {(peak + idle) / GIB:.1f} GiB")
    detail += unmeasured + left_out
    if available < need:
        return Check("memory", "warn", detail, SHUT_DOWN)
    if unmeasured:
        return Check("memory", "warn", detail, f"measure them: {remeasure}")
    return Check("memory", "ok", f"{detail}; still, {SHUT_DOWN}")


IDLE_KERNEL = """
import importlib, json, os, psutil, torch
from utils.launch import run_ranks
from utils.launch.server_handle import HEAVY_MODULES, rank_server
imported = []
for name in HEAVY_MODULES:
    try:
        importlib.import_module(name)
        imported.append(name)
    except ImportError:
        pass
run_ranks(os.getpid, world_size=1, process_group=False, timeout=120, verbose=False)
server = rank_server()
server.mirror_imports()
print(json.dumps([psutil.Process().memory_info().rss + psutil.Process(server.proc.pid).memory_info().rss, imported]))
"""


def measure_idle_kernel(timeout=300):
    """(resident bytes, modules imported) of an idle lesson kernel and its rank server: a fresh process that imports
    torch and the installed ``HEAVY_MODULES`` (as a lesson does; its rank server mirrors them), then starts its rank
    server and forks a rank. None where that fails (the rank server check says why)."""
    import json
    import subprocess
    try:
        done = subprocess.run([sys.executable, "-c", IDLE_KERNEL], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
        rss, imported = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
        return None
    return rss, imported


def check_disk(learners, path=ROOT, free=None) -> Check:
    """Each learner's home holds a copy of the notebooks and labs (hub.py), plus checkpoints and outputs."""
    free = shutil.disk_usage(path).free if free is None else free
    copy = sum(f.stat().st_size for d in ("notebooks", "labs", "data") for f in (ROOT / d).rglob("*") if f.is_file())
    need = learners * (copy + GIB // 2) + 2 * GIB  # + half a GiB each for checkpoints and executed notebooks, 2 GiB spare
    detail = f"{free / GIB:.1f} GiB free under {path}; {need / GIB:.1f} GiB wanted for {learners} learner(s)"
    if free < need:
        return Check("disk", "fail", detail, "free space (pip cache purge; rm -rf build) or put the hub's homes elsewhere")
    return Check("disk", "ok", detail)


def _nvidia_smi_gpus() -> int:
    import subprocess
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=30)
    return len([line for line in out.stdout.splitlines() if line.startswith("GPU ")])


def _probe_gpu(index):
    """(name, total bytes, bytes held by others, matmul ok) for GPU ``index``; initialises CUDA here, which
    the launcher does not mind: its ranks are forked by the rank server, never by this process."""
    name = torch.cuda.get_device_name(index)
    free, total = torch.cuda.mem_get_info(index)
    x = torch.randn(1024, 1024, device=f"cuda:{index}")
    ok = bool(torch.isfinite((x @ x).sum()).item())
    return name, total, total - free, ok


def check_gpus(count) -> list[Check]:
    checks = []
    for i in range(count):
        try:
            name, total, used, ok = _probe_gpu(i)
        except Exception as exc:  # noqa: BLE001 - a broken GPU is what this looks for
            checks.append(Check(f"GPU {i}", "fail", f"{type(exc).__name__}: {exc}",
                                f"nvidia-smi -i {i} -q (ECC errors, Xid in dmesg); leave it out with CUDA_VISIBLE_DEVICES"))
            continue
        detail = f"{name}, {total / GIB:.0f} GiB, {used / GIB:.1f} GiB already in use, a matmul {'ok' if ok else 'NOT finite'}"
        if not ok:
            checks.append(Check(f"GPU {i}", "fail", detail, f"leave GPU {i} out with CUDA_VISIBLE_DEVICES; report it"))
        elif used > 0.1 * total:
            checks.append(Check(f"GPU {i}", "warn", detail, f"nvidia-smi -i {i} shows who holds it; stop that before the workshop"))
        else:
            checks.append(Check(f"GPU {i}", "ok", detail))
    return checks


def _pair_all_reduce(i, j, timeout=60.0):
    """A 2-rank NCCL all-reduce on GPUs ``i`` and ``j`` (through the launcher); returns each rank's sum."""
    def ranks_sum():
        t = torch.tensor([float(dist.get_rank() + 1)], device="cuda")
        dist.all_reduce(t)
        return t.item()

    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = f"{i},{j}"  # the ranks get this environment: cuda:0 is i, cuda:1 is j
    try:
        return run_ranks(ranks_sum, world_size=2, backend="nccl", timeout=timeout, verbose=False)
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES")
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def check_nccl_pairs(gpus) -> list[Check]:
    """NCCL between every pair: one bad link (a P2P or NVLink fault) hangs only the lessons that use it."""
    checks = []
    for i, j in combinations(gpus, 2):
        start = time.perf_counter()
        try:
            sums = _pair_all_reduce(i, j)
        except Exception as exc:  # noqa: BLE001
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            checks.append(Check(f"NCCL {i}<->{j}", "fail", first,
                                f"rerun with NCCL_DEBUG=INFO; NCCL_P2P_DISABLE=1 tests whether peer-to-peer is at fault; "
                                f"deal GPUs {i} and {j} to different learners"))
            continue
        status = "ok" if sums == [3.0, 3.0] else "fail"
        checks.append(Check(f"NCCL {i}<->{j}", status, f"all-reduce of 1 + 2 gave {sums} in "
                            f"{time.perf_counter() - start:.1f} s", "" if status == "ok" else "NCCL returned a wrong sum: report it"))
    return checks


def check_ports(ports=PORTS) -> Check:
    busy = []
    for port, what in ports.items():
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                busy.append(f"{port} ({what})")
    if busy:
        return Check("ports", "warn", f"in use: {', '.join(busy)}",
                     "`ss -ltnp` shows who listens; stop it, or choose others: "
                     "make hub HUB_PORT=... HUB_ARGS='--hub-port P --proxy-api-port Q'")
    return Check("ports", "ok", f"free: {', '.join(map(str, ports))}")


def check_gloo() -> Check:
    if dist.is_gloo_available():
        return Check("gloo", "ok", "this torch has gloo, the CPU backend every lesson falls back on")
    return Check("gloo", "fail", "this torch has no gloo", "install the torch wheel from PyPI (make setup)")


def check_rank_server():
    """The launcher's rank server starts and forks a rank: (Check, the server's resident bytes)."""
    start = time.perf_counter()
    try:
        parents = run_ranks(os.getppid, world_size=1, process_group=False, timeout=120, verbose=False)
        server = rank_server()
        rss = psutil.Process(server.proc.pid).memory_info().rss
    except (RankError, RuntimeError, OSError) as exc:
        return Check("rank server", "fail", f"{type(exc).__name__}: {exc}",
                     "run `python -m utils.launch.server 0` to see why it does not start; is .venv complete (make setup)?"), 0
    if parents != [server.proc.pid]:
        return Check("rank server", "fail", f"the rank's parent is {parents}, not the server ({server.proc.pid})",
                     "report it: the launcher's ranks must be forked by its rank server"), 0
    return Check("rank server", "ok", f"started and forked a rank in {time.perf_counter() - start:.1f} s "
                 f"({rss / GIB:.2f} GiB resident)"), rss


def _rank_sum():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return t.item()


def check_all_reduce() -> Check:
    """A 2-rank gloo all-reduce through ``run_ranks``, as lesson 00's first cell."""
    start = time.perf_counter()
    try:
        sums = run_ranks(_rank_sum, world_size=2, backend="gloo", timeout=120, verbose=False)
    except RankError as exc:
        return Check("2-rank all-reduce", "fail", str(exc).splitlines()[0],
                     "run notebooks/00_start_here.ipynb: its cells say more about the failure")
    if sums != [1.0, 1.0]:
        return Check("2-rank all-reduce", "fail", f"0 + 1 gave {sums}", "report it: gloo returned a wrong sum")
    return Check("2-rank all-reduce", "ok", f"0 + 1 = {sums} on both ranks in {time.perf_counter() - start:.2f} s")


def check_sandbox(why=None) -> Check:
    """``make grade`` runs each answer in utils.workshop.sandbox (bubblewrap): ``why`` it cannot, or None."""
    from .sandbox import available

    why = available() if why is None else why
    if why:
        return Check("grading sandbox", "warn", why, "make grade refuses to run without it; install it, or grade "
                     "with GRADE_ARGS=--no-sandbox, knowing an answer can then read the solutions")
    return Check("grading sandbox", "ok", "bubblewrap runs: make grade isolates each answer")


def run_preflight(learners=1, schedule="all") -> list[Check]:
    """Every check, in order; GPU checks only where there are GPUs."""
    checks = [check_system(), check_python(), check_torch(), check_gloo(),
              check_ports(PORTS if learners > 1 else LEARNER_PORTS)]
    server, server_rss = check_rank_server()
    checks += [server, check_all_reduce(), check_cores(learners)]
    idle = measure_idle_kernel() if server_rss else None
    if idle:  # a lesson's idle kernel and its server, the heavy libraries imported in both
        checks.append(check_memory(learners, schedule, idle[0]))
    elif server_rss:  # the fresh kernel failed: this process (torch, no CUDA yet) + its server, a lower bound
        checks.append(check_memory(learners, schedule, psutil.Process().memory_info().rss + server_rss))
    checks.append(check_disk(learners))
    if learners > 1:  # a room: its teacher grades the submissions
        checks.append(check_sandbox())
    gpus = torch.cuda.device_count()
    if gpus:
        checks += check_gpus(gpus)
        seats = deal_seats([f"learner{i + 1}" for i in range(learners)])
        shared = sum(1 for s in seats if set(s.gpus) & set(seats[0].gpus)) > 1
        checks.append(Check("GPU seats", "warn" if shared else "ok", seats[0].describe(),
                            "learners share GPUs: NCCL lessons need one GPU per rank; fewer learners, or let "
                            "those lessons run on the CPU" if shared else ""))
    if gpus >= 2:
        checks += check_nccl_pairs(list(range(gpus)))
    return checks


def verdict(checks, learners=None) -> str:
    """The last line. ``learners=1``: a learner checking their own machine, told in their words what to do."""
    fails = [c for c in checks if c.status == "fail"]
    warns = [c for c in checks if c.status == "warn"]
    alone = learners == 1
    if fails:
        return (f"NOT READY: {len(fails)} failure(s) ({', '.join(c.name for c in fails)}), {len(warns)} warning(s). "
                "Fix the failures above (each says how), then run make preflight again." + (
                    " If you cannot, send these lines to your teacher: you can follow the workshop on its hub, "
                    "in the browser, with nothing installed." if alone else ""))
    if warns:
        return (f"READY, with {len(warns)} warning(s) ({', '.join(c.name for c in warns)}): the course runs; read "
                "each fix." + (" Send these lines to your teacher." if alone else ""))
    return "READY: every check passed." + (" Your machine runs the course; send these lines to your teacher."
                                           if alone else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Check this machine before a workshop (make preflight).")
    parser.add_argument("--learners", type=int, default=1, help="how many learners this machine will serve")
    parser.add_argument("--schedule", choices=SCHEDULES, default="all",
                        help="TEACHING.md's schedule the workshop follows: memory is asked for its notebooks "
                        "(default: all, every lesson and lab)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    print(f"[preflight] {platform.node()}: checking for {args.learners} learner(s), schedule {args.schedule}",
          flush=True)
    checks = run_preflight(args.learners, args.schedule)
    for check in checks:
        print(check.line(), flush=True)
    print(f"[preflight] {verdict(checks, args.learners)} ({time.perf_counter() - start:.1f} s)")
    return 1 if any(c.status == "fail" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
