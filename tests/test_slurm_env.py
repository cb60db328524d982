"""The Slurm template's environment handling, with a fake Slurm: SLURM_* variables and fake ``scontrol``,
``srun`` and ``python`` on PATH. No Slurm is needed; lesson 10's closing note has the run on a real one.

What is checked: the rendezvous host is the first of ``scontrol show hostnames``, the port comes from the job id
(or RDZV_PORT), one torchrun agent per node with the right flags, IFNAME sets gloo's and NCCL's interface,
a task outside a job stops with a message, and USR1 to the batch shell requeues the job.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "notebooks" / "scripts" / "slurm"
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="bash scripts")

FAKE_SCONTROL = """#!/usr/bin/env bash
echo "scontrol $*" >> "$FAKE_LOG"
if [ "$1 $2" = "show hostnames" ]; then printf '%s\\n' $FAKE_HOSTS; fi
if [ "$1" = "requeue" ] && [ -f "$FAKE_DIR/srun.pid" ]; then kill "$(cat "$FAKE_DIR/srun.pid")"; fi
"""
# srun: run the command once per node (SLURM_NODEID 0..N-1), as --ntasks-per-node=1 does; options are ignored
FAKE_SRUN = """#!/usr/bin/env bash
echo $$ > "$FAKE_DIR/srun.pid"
while [ "${1#--}" != "$1" ]; do shift; done
if [ -n "${FAKE_SRUN_SLEEP:-}" ]; then exec sleep "$FAKE_SRUN_SLEEP"; fi
for ((node = 0; node < SLURM_JOB_NUM_NODES; node++)); do SLURM_NODEID=$node "$@" || exit $?; done
"""
# python: record its arguments and the interface variables, one JSON line per call
FAKE_PYTHON = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["FAKE_CALLS"], "a") as f:
    env = {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "SLURM_NODEID")}
    f.write(json.dumps({"argv": sys.argv[1:], "env": env}) + "\\n")
"""


@pytest.fixture
def fake_slurm(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN), ("python", FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RDZV_", "NPROC_", "IFNAME"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PYTHON=str(bin_dir / "python"), FAKE_DIR=str(tmp_path),
               FAKE_LOG=str(tmp_path / "scontrol.log"), FAKE_CALLS=str(tmp_path / "calls.jsonl"),
               FAKE_HOSTS="gpu03 gpu04", SLURM_JOB_ID="1234", SLURM_JOB_NODELIST="gpu[03-04]",
               SLURM_JOB_NUM_NODES="2", SLURM_NODEID="1", SLURM_GPUS_ON_NODE="4", SLURM_SUBMIT_DIR=str(ROOT))
    return tmp_path, env


def calls(tmp):
    path = tmp / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_node(env, *args):
    return subprocess.run(["bash", str(SLURM / "torchrun_node.sh"), "train.py", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=30)


def test_one_agent_per_node_meets_at_the_first_host(fake_slurm):
    tmp, env = fake_slurm
    done = run_node(env, "--steps", "3")
    assert done.returncode == 0, done.stderr
    (call,) = calls(tmp)
    assert call["argv"] == ["-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "4",
                            "--rdzv-backend", "c10d", "--rdzv-endpoint", "gpu03:29734", "--rdzv-id", "1234",
                            "train.py", "--steps", "3"]  # 29734 = 29500 + 1234 % 1000
    assert "scontrol show hostnames gpu[03-04]" in (tmp / "scontrol.log").read_text()
    assert call["env"]["GLOO_SOCKET_IFNAME"] is None, "no interface forced unless IFNAME says so"
    assert "node 1/2" in done.stdout and "gpu03:29734" in done.stdout


def test_overrides_and_interface(fake_slurm):
    tmp, env = fake_slurm
    env.update(RDZV_PORT="41000", NPROC_PER_NODE="2", IFNAME="ib0")
    del env["SLURM_JOB_NUM_NODES"]
    env["SLURM_NNODES"] = "3"  # older Slurm sets only this one
    assert run_node(env).returncode == 0
    (call,) = calls(tmp)
    argv = call["argv"]
    assert argv[argv.index("--rdzv-endpoint") + 1] == "gpu03:41000"
    assert argv[argv.index("--nproc-per-node") + 1] == "2" and argv[argv.index("--nnodes") + 1] == "3"
    assert call["env"]["GLOO_SOCKET_IFNAME"] == call["env"]["NCCL_SOCKET_IFNAME"] == "ib0"


def test_cpu_node_defaults_to_one_process(fake_slurm):
    tmp, env = fake_slurm
    del env["SLURM_GPUS_ON_NODE"]
    assert run_node(env).returncode == 0
    argv = calls(tmp)[0]["argv"]
    assert argv[argv.index("--nproc-per-node") + 1] == "1"


@pytest.mark.parametrize("missing", ["SLURM_JOB_ID", "SLURM_JOB_NODELIST"])
def test_outside_a_job_it_stops_and_says_why(fake_slurm, missing):
    tmp, env = fake_slurm
    del env[missing]
    done = run_node(env)
    assert done.returncode != 0 and missing in done.stderr
    assert calls(tmp) == [], "nothing was started"


def test_no_host_from_scontrol_stops(fake_slurm):
    tmp, env = fake_slurm
    env["FAKE_HOSTS"] = ""
    done = run_node(env)
    assert done.returncode == 2 and "printed no host" in done.stderr


def test_sbatch_template_runs_one_agent_per_node(fake_slurm):
    tmp, env = fake_slurm
    done = subprocess.run(["bash", str(SLURM / "train.sbatch"), "notebooks/scripts/02_ddp_train.py", "--steps", "2"],
                          env=env, cwd=tmp, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    got = calls(tmp)
    assert [c["env"]["SLURM_NODEID"] for c in got] == ["0", "1"]
    assert all(c["argv"][-3:] == ["notebooks/scripts/02_ddp_train.py", "--steps", "2"] for c in got)
    assert len({tuple(c["argv"]) for c in got}) == 1, "every node runs the same command: same endpoint and id"
    assert "srun exited with status 0" in done.stdout


def test_template_asks_for_the_signal_and_requeue():
    text = (SLURM / "train.sbatch").read_text()
    assert "#SBATCH --signal=B:USR1@" in text and "#SBATCH --requeue" in text
    assert "trap requeue USR1" in text and 'scontrol requeue "$SLURM_JOB_ID"' in text


def test_usr1_requeues_the_job(fake_slurm):
    """USR1 reaches the batch shell while srun runs: the trap requeues (our fake scontrol then ends srun)."""
    tmp, env = fake_slurm
    env["FAKE_SRUN_SLEEP"] = "60"
    job = subprocess.Popen(["bash", str(SLURM / "train.sbatch")], env=env, cwd=tmp, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (tmp / "srun.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp / "srun.pid").exists(), "the template never started srun"
        time.sleep(0.3)  # let bash reach `wait`
        job.send_signal(signal.SIGUSR1)
        out, _ = job.communicate(timeout=20)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert "scontrol requeue 1234" in (tmp / "scontrol.log").read_text()
    assert "USR1: time limit near, requeueing job 1234" in out
    assert "srun exited with status" in out
