"""``make test-torch TORCH=2.15.0``: the whole suite on another torch, in an environment of its own, and what broke.

For a maintainer deciding whether a torch release joins the supported range (``utils/torch_versions.py``).
``.venv`` and ``make test`` are left as they are. Three steps:

1. **The environment**: a virtual environment (``--venv``, default ``build/torch-<version>/venv``) with
   ``torch==<version>`` and every other pin of ``pyproject.toml``, installed under a constraints file naming that
   exact torch (so no pin can move it), the course itself with ``--no-deps``, and the course's kernel inside it
   (``utils.course.notebook_runner.kernel_env`` finds a kernel in the ``sys.prefix`` of the Python running pytest, so
   the notebooks run on that torch too). Made once: a stamp holds the torch and the pins, and the next run with
   the same ones reuses it. pip installs what its configuration says: the CUDA build from PyPI on Linux, or the
   CPU build with ``PIP_INDEX_URL=https://download.pytorch.org/whl/cpu PIP_EXTRA_INDEX_URL=https://pypi.org/simple``.
2. **The suite**, as ``make test`` runs it (``-n auto --dist loadgroup``; extra pytest arguments after ``--``),
   with a JUnit XML file beside the report.
3. **The report** (``build/torch-<version>/report.md``, also printed): passed, failed, skipped, the time and the
   load average, then what broke, in three lists: the notebooks, the claim pointers (``utils/course/claims.py --json``
   where that checker exists, and the failures of ``tests/test_course_claims.py``), and the other tests.

Exits 0 when nothing broke, 1 when something did, 2 when the environment could not be made.
Only the standard library: it runs with any Python 3.11 or 3.12, before the environment exists; so by its path,
``python utils/course/torch_suite.py``, not with ``-m``, which would import ``utils`` and with it torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAMP = ".torch-suite-stamp"


def pins_but_torch() -> list[str]:
    """pyproject.toml's dependencies less torch (the Makefile's PINS_BUT_TORCH, for SYSTEM_TORCH=1, does the same)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps if re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower() != "torch"]


def make_environment(version: str, venv: Path, python: str) -> Path:
    """The environment with torch ``version`` and the course's other pins; reused while its stamp matches."""
    bin_python = venv / "bin" / "python"
    wanted = json.dumps({"torch": version, "pins": pins_but_torch()}, sort_keys=True)
    stamp = venv / STAMP
    if bin_python.exists() and stamp.exists() and stamp.read_text() == wanted:
        print(f"torch_suite: reusing {venv} (torch {version}, the same pins)", flush=True)
        install_course(bin_python, version)  # this checkout, not the one the environment was made from
        return bin_python
    print(f"torch_suite: making {venv} with torch {version} (a CUDA build is several GB; minutes)", flush=True)
    if not bin_python.exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    (venv / "torch-constraint.txt").write_text(f"torch=={version}\n")
    (venv / "pins-but-torch.txt").write_text("\n".join(pins_but_torch()) + "\n")
    pip = [str(bin_python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--constraint", str(venv / "torch-constraint.txt"), f"torch=={version}",
                    "--requirement", str(venv / "pins-but-torch.txt")], check=True)
    # as `make setup` does (the Makefile says why): ~2 s of CPU less in every process that imports nbformat
    subprocess.run([str(bin_python), "-m", "pip", "uninstall", "--quiet", "--yes", "rfc3987-syntax"],
                   stderr=subprocess.DEVNULL)
    install_course(bin_python, version)
    got = subprocess.run([str(bin_python), "-c", "import torch; print(torch.__version__)"], check=True,
                         capture_output=True, text=True).stdout.strip()
    if got.split("+")[0] != version.split("+")[0]:
        raise RuntimeError(f"{venv} has torch {got}, not {version}: is a pip configuration capping torch?")
    stamp.write_text(wanted)
    return bin_python


def install_course(bin_python: Path, version: str):
    """This checkout into the environment (editable, no dependencies) and its kernel: seconds, so done on every run,
    and an environment made from another checkout or worktree tests this one."""
    subprocess.run([str(bin_python), "-m", "pip", "install", "--quiet", "--no-deps", "--editable", str(ROOT)],
                   check=True)
    subprocess.run([str(bin_python), "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3",
                    "--display-name", f"Python 3 (distributed course, torch {version})"], check=True,
                   stdout=subprocess.DEVNULL)


def describe_torch(bin_python: Path) -> str:
    code = ("import torch; print(torch.__version__, '(CUDA ' + torch.version.cuda + ' build)' "
            "if torch.version.cuda else '(CPU build)', torch.cuda.device_count(), 'GPU(s)')")
    out = subprocess.run([str(bin_python), "-c", code], capture_output=True, text=True)
    return out.stdout.strip() or out.stderr.strip().splitlines()[-1]


def run_suite(bin_python: Path, junit: Path, workers: str, pytest_args: list[str]) -> int:
    cmd = [str(bin_python), "-m", "pytest", "-n", workers, "--dist", "loadgroup", "--no-loadscope-reorder",
           f"--junitxml={junit}", *pytest_args]
    print("torch_suite:", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


def read_junit(junit: Path) -> dict:
    """Counts and the broken tests (node ids, first line of the message) from pytest's JUnit XML."""
    counts = dict(passed=0, failed=0, errors=0, skipped=0)
    broken = []  # (nodeid, message)
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        nodeid = f"{module}.py::{case.get('name')}" if module else case.get("name")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            counts["failed" if bad.tag == "failure" else "errors"] += 1
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            broken.append((nodeid, message[0][:200] if message else ""))
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return dict(counts=counts, broken=broken)


def check_claims(bin_python: Path, out: Path) -> tuple[str, list[str]]:
    """(status line, broken pointers) from ``utils/course/claims.py --json``, or why there is none."""
    checker = ROOT / "utils" / "course" / "claims.py"
    if not checker.exists():
        return "no claims checker (utils/course/claims.py is not in this checkout)", []
    result_file = out / "claims.json"
    run = subprocess.run([str(bin_python), "-m", "utils.course.claims", "--json", str(result_file)], cwd=ROOT,
                         capture_output=True, text=True)
    try:
        data = json.loads(result_file.read_text())
    except (OSError, ValueError) as exc:
        tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or [""]
        return (f"utils/course/claims.py exited {run.returncode} without a readable {result_file.name} ({exc}): "
                f"{tail[0]}", [])
    broken = [json.dumps(item, sort_keys=True)[:240] for item in _broken_items(data)]
    if run.returncode and not broken:  # it says something broke, in a shape not read here: point at the file
        broken = [f"(see {result_file}: the checker exited {run.returncode})"]
    return f"utils/course/claims.py exited {run.returncode}; {len(broken)} broken pointer(s) in {result_file}", broken


def _broken_items(data):
    """The broken entries of the checker's JSON, whichever of the usual shapes it has: a ``broken`` list, or
    entries marked ``ok: false`` / ``status`` other than ok / ``broken: true``."""
    if isinstance(data, dict):
        if isinstance(data.get("broken"), list):
            return data["broken"]
        data = next((v for v in data.values() if isinstance(v, list)), [])
    return [item for item in data if isinstance(item, dict) and (item.get("ok") is False or item.get("broken") is True
            or str(item.get("status", "ok")).lower() not in ("ok", "pass", "passed"))]


def write_report(out: Path, version: str, torch_line: str, junit: dict, claims: tuple[str, list[str]],
                 seconds: float, load: tuple, exit_code: int) -> str:
    c = junit["counts"]
    notebooks = [b for b in junit["broken"] if "test_notebooks.py" in b[0]]
    claim_tests = [b for b in junit["broken"] if "test_course_claims.py" in b[0]]
    others = [b for b in junit["broken"] if b not in notebooks and b not in claim_tests]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    lines = [f"# The suite on torch {version}", "",
             f"- torch: {torch_line}; course commit {commit.strip() or '?'}; "
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- {c['passed']} passed, {c['failed']} failed, {c['errors']} errors, {c['skipped']} skipped "
             f"(pytest exit {exit_code}) in {seconds / 60:.1f} min",
             f"- load average (1, 5, 15 min) at the start {load[0]}, at the end {load[1]}; {os.cpu_count()} cores", ""]

    def section(title, items):
        lines.extend([f"## {title} ({len(items)})", ""] + [f"- `{n}`: {m}" for n, m in items] + (
            [] if items else ["- none"]) + [""])

    section("Notebooks that broke", notebooks)
    lines.extend([f"## Claim pointers that broke", "", f"- {claims[0]}"] + [f"- {b}" for b in claims[1]]
                 + [f"- `{n}`: {m}" for n, m in claim_tests] + [""])
    section("Other tests that broke", others)
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    return text


def parse_args(argv):
    """(options, pytest arguments): everything after ``--`` goes to pytest untouched."""
    ours, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="after --: arguments for pytest")
    parser.add_argument("torch", help="the torch release, e.g. 2.15.0")
    parser.add_argument("--venv", type=Path, help="its environment (default build/torch-<version>/venv)")
    parser.add_argument("--out", type=Path, help="the report and junit.xml (default build/torch-<version>)")
    parser.add_argument("--python", default=sys.executable, help="the Python that makes the environment")
    parser.add_argument("--workers", default="auto", help="pytest-xdist workers, as TEST_WORKERS (default auto)")
    return parser.parse_args(ours), pytest_args


def main(argv=None) -> int:
    args, pytest_args = parse_args(sys.argv[1:] if argv is None else argv)
    out = (args.out or ROOT / "build" / f"torch-{args.torch}").resolve()
    venv = (args.venv or out / "venv").resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        bin_python = make_environment(args.torch, venv, args.python)
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        print(f"torch_suite: no environment with torch {args.torch}: {exc}", file=sys.stderr)
        return 2
    torch_line = describe_torch(bin_python)
    junit_path = out / "junit.xml"
    junit_path.unlink(missing_ok=True)
    load_start, start = os.getloadavg(), time.monotonic()
    code = run_suite(bin_python, junit_path, args.workers, pytest_args)
    seconds, load_end = time.monotonic() - start, os.getloadavg()
    junit = read_junit(junit_path) if junit_path.exists() else dict(
        counts=dict(passed=0, failed=0, errors=0, skipped=0), broken=[("(the suite)", f"no junit.xml: pytest exit {code}")])
    claims = check_claims(bin_python, out)
    fmt = lambda load: ", ".join(f"{x:.2f}" for x in load)  # noqa: E731
    print("\n" + write_report(out, args.torch, torch_line, junit, claims, seconds, (fmt(load_start), fmt(load_end)),
                              code))
    print(f"torch_suite: report in {out / 'report.md'}, JUnit XML in {junit_path}")
    return 1 if junit["broken"] or claims[1] or code not in (0, 5) else 0


if __name__ == "__main__":
    sys.exit(main())
