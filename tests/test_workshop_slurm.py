"""The workshop's Slurm recipe (utils/workshop/slurm.py) and its job script, notebooks/scripts/slurm/jupyter_lab.sbatch,
run with a fake Slurm as lesson 10's scripts are (tests/test_slurm_env.py): a fake ``srun`` that runs its command,
a fake ``python`` that records how it was called."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from utils.workshop.slurm import SCRIPT, main, nodes_needed, recipe

ROOT = Path(__file__).resolve().parents[1]

# srun: record its options, then run the command (the first argument that is not an option)
FAKE_SRUN = """#!/usr/bin/env bash
echo "$*" > "$FAKE_DIR/srun.args"
while [ "${1#--}" != "$1" ]; do shift; done
exec "$@"
"""
# python: print a token when asked for one; record every other call (jupyter lab) with the environment
FAKE_PYTHON = """#!/usr/bin/env python3
import json, os, sys
if sys.argv[1:2] == ["-c"]:
    print("faketoken")
    sys.exit()
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "JUPYTER_PATH": os.environ.get("JUPYTER_PATH")}) + "\\n")
"""


@pytest.fixture
def fake_slurm(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("python", FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "LAB_", "LOGIN_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PYTHON=str(bin_dir / "python"), FAKE_DIR=str(tmp_path),
               FAKE_CALLS=str(tmp_path / "calls.jsonl"), SLURM_JOB_ID="1034", SLURMD_NODENAME="gpu07",
               SLURM_SUBMIT_HOST="login1", SLURM_SUBMIT_DIR=str(ROOT), SLURM_CPUS_PER_TASK="8",
               CUDA_VISIBLE_DEVICES="3", USER="alice")
    return tmp_path, env


def run_job(env):
    return subprocess.run(["bash", str(ROOT / SCRIPT)], env=env, cwd=env["FAKE_DIR"], capture_output=True, text=True,
                          timeout=30)


def test_the_job_serves_jupyterlab_and_prints_the_tunnel(fake_slurm):
    tmp, env = fake_slurm
    done = run_job(env)
    assert done.returncode == 0, done.stderr
    assert "ssh -N -L 8888:gpu07:8834 alice@login1" in done.stdout  # 8834 = 8800 + 1034 % 1000
    assert "?token=faketoken" in done.stdout and "scancel 1034" in done.stdout
    assert "8 core(s), GPUs: 3" in done.stdout
    (call,) = [json.loads(line) for line in (tmp / "calls.jsonl").read_text().splitlines()]
    assert call["argv"] == ["-m", "jupyter", "lab", "--no-browser", "--ip=0.0.0.0", "--port=8834",
                            "--ServerApp.token=faketoken", f"--ServerApp.root_dir={ROOT}"]
    assert call["cwd"] == str(ROOT), "the server runs from the submit directory (the course), not the spool copy"
    assert call["JUPYTER_PATH"] == f"{ROOT}/.venv/share/jupyter"
    assert (tmp / "srun.args").read_text().split()[:2] == ["--ntasks=1", "--cpus-per-task=8"]


def test_port_and_login_can_be_chosen(fake_slurm):
    tmp, env = fake_slurm
    env.update(LAB_PORT="9100", LOGIN_HOST="hpc.example.org")
    done = run_job(env)
    assert done.returncode == 0 and "ssh -N -L 8888:gpu07:9100 alice@hpc.example.org" in done.stdout


def test_outside_a_job_it_stops_and_says_why(fake_slurm):
    tmp, env = fake_slurm
    del env["SLURM_JOB_ID"]
    done = run_job(env)
    assert done.returncode != 0 and "SLURM_JOB_ID" in done.stderr and "sbatch" in done.stderr
    assert not (tmp / "calls.jsonl").exists(), "nothing was started"


def test_the_scripts_directives():
    text = (ROOT / SCRIPT).read_text()
    for directive in ("--nodes=1", "--ntasks=1", "--cpus-per-task=", "--time=", "--output=lab-%j.out"):
        assert f"#SBATCH {directive}" in text


@pytest.mark.parametrize("learners, cpus, gpus, nodes", [(20, 8, 1, 3), (20, 8, 0, 3), (4, 8, 2, 1), (16, 4, 1, 2)])
def test_nodes_for_the_reservation(learners, cpus, gpus, nodes):
    assert nodes_needed(learners, cpus, gpus, cores_per_node=64, gpus_per_node=8) == nodes


def test_recipe_fills_in_every_command(capsys):
    main(["--learners", "alice,bob", "--account", "dl-acct", "--start", "2026-12-01T09:00:00", "--hours", "6"])
    text = capsys.readouterr().out
    assert ("scontrol create reservation ReservationName=dl-course StartTime=2026-12-01T09:00:00 Duration=06:00:00 "
            "Users=alice,bob Accounts=dl-acct NodeCnt=1") in text
    assert (f"sbatch --account=dl-acct --reservation=dl-course --cpus-per-task=8 --gpus=1 --time=06:00:00 {SCRIPT}"
            in text)
    assert "ssh -N -L 8888:<node>:<port>" in text
    assert (ROOT / SCRIPT).exists()


def test_recipe_refuses_what_slurm_would():
    with pytest.raises(ValueError, match="not Unix logins"):
        recipe(["Alice Smith"], "acct", "now")
    with pytest.raises(ValueError, match="do not fit a node of 8"):
        recipe(["alice"], "acct", "now", gpus_per_learner=16)
    assert "--gpus" not in recipe(["alice"], "acct", "now", gpus_per_learner=0).split("sbatch", 1)[1]
