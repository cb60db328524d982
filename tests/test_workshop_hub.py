"""Many learners on one machine: the seats (cores and GPUs dealt out), the launch line that shows a learner's
seat, and a real JupyterHub (``make hub``) serving four learners whose kernels all run 2-rank launches at once.

The hub test is slow (a hub, a proxy, four Jupyter servers, four kernels, four rank servers: about a minute
on a quiet 2-core machine) and needs the ``teacher`` extra: ``make test-hub`` installs it and runs this file.
"""

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from utils.launch import plan_launch
from utils.workshop.seats import _span, available_cores, deal_seats

LEARNERS = [f"learner{i}" for i in range(1, 5)]


# ----------------------------------------------------------------------------------------- the seats

def test_cores_are_dealt_in_disjoint_slices():
    seats = deal_seats(LEARNERS, cores=range(8), gpus=[])
    assert [s.cores for s in seats] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert all(s.sharing == 1 for s in seats) and all("CUDA_VISIBLE_DEVICES" not in s.environment() for s in seats)
    assert seats[1].describe() == "learner2, learner 2 of 4 · cores 2-3 (2 of 8) · no GPU"
    assert seats[1].environment()["OMP_NUM_THREADS"] == "2"


def test_more_learners_than_cores_share_and_say_so():
    seats = deal_seats(LEARNERS, cores=[0, 1], gpus=[])
    assert [s.cores for s in seats] == [(0,), (1,), (0,), (1,)]
    assert all(s.sharing == 2 for s in seats)
    assert "shared with 1 other learner(s)" in seats[0].describe()


def test_gpus_are_dealt_by_cuda_visible_devices():
    seats = deal_seats(LEARNERS, cores=range(16), gpus=range(8))
    assert [s.environment()["CUDA_VISIBLE_DEVICES"] for s in seats] == ["0,1", "2,3", "4,5", "6,7"]
    assert "GPUs 2,3" in seats[1].describe()
    shared = deal_seats(LEARNERS, cores=range(16), gpus=[4, 5])  # the hub itself saw CUDA_VISIBLE_DEVICES=4,5
    assert [s.gpus for s in shared] == [(4,), (5,), (4,), (5,)] and shared[0].sharing == 2


def test_bad_learner_lists_are_refused():
    with pytest.raises(ValueError, match="at least one learner"):
        deal_seats([], cores=[0])
    with pytest.raises(ValueError, match="must differ"):
        deal_seats(["a", "a"], cores=[0, 1])


def test_span_is_tasksets_format():
    assert _span((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8" and _span((3,)) == "3"


def test_launch_line_shows_the_seat_and_the_slice(monkeypatch):
    """The launcher shares out the cores this kernel may use (its affinity), not the machine's."""
    monkeypatch.setenv("COURSE_SEAT", "learner2, learner 2 of 4 · core 1 (1 of 2) · no GPU")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1}, raising=False)
    plan = plan_launch(2, backend="gloo")
    assert plan.cpu_cores == 1 and plan.threads_per_rank == 1
    assert "[launch] your seat: learner2, learner 2 of 4" in plan.describe()
    assert "oversubscribed: 2 ranks share 1 cores" in plan.describe()


def test_launch_line_names_the_machines_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    line = plan_launch(2).describe()
    assert "nccl on GPU 0-1 (the machine's 6,7: CUDA_VISIBLE_DEVICES)" in line


# ------------------------------------------------------------------------------------ the real hub

def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Hub:
    """A running hub and the REST calls the test makes to it, with the admin service's token."""

    def __init__(self, port, proxy_api_port, token, proxy_token):
        self.base, self.token = f"http://127.0.0.1:{port}", token
        self.proxy_api, self.proxy_token = f"http://127.0.0.1:{proxy_api_port}", proxy_token

    def call(self, method, path, body=None, base=None, token=None):
        request = urllib.request.Request((base or self.base) + path, method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"token {token or self.token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
            return json.loads(text) if text else None

    def wait_ready(self, name, deadline):
        while time.monotonic() < deadline:
            server = self.call("GET", f"/hub/api/users/{name}")["servers"].get("")
            if server and server["ready"]:
                return
            time.sleep(0.5)
        raise TimeoutError(f"{name}'s server was not ready in time")


LAUNCH = """
import json, os, tempfile
import torch, torch.distributed as dist
import utils

def hello():
    t = torch.tensor([float(dist.get_rank())], device=utils.rank_device())  # a GPU box: NCCL if the seat has 2 GPUs
    dist.all_reduce(t)
    return t.item(), os.getpid(), sorted(os.sched_getaffinity(0)), torch.get_num_threads()

results = utils.run_ranks(hello, world_size=2)
print("RESULT", json.dumps({"sums": [r[0] for r in results], "pids": [r[1] for r in results],
                            "affinity": [r[2] for r in results], "threads": [r[3] for r in results],
                            "tmp": tempfile.gettempdir(), "kernel": os.getpid()}))
"""
ROOT = Path(__file__).resolve().parents[1]
PROBE = f"""
import json, os, utils
print("PROBE", json.dumps({{"utils": utils.__file__,
                           "solutions": os.path.exists({str(ROOT / 'labs' / 'solutions')!r}),
                           "keys": os.path.exists({str(ROOT / 'labs' / 'solutions' / 'keys')!r}),
                           "checkout_utils": os.path.exists({str(ROOT / 'utils' / 'workshop')!r})}}))
"""
MAGIC = """%%ranks 2 --return total
t = torch.tensor([float(rank)], device=device)
dist.all_reduce(t)
total = t.item()
"""


def _execute(ws, code, timeout=240):
    """Run ``code`` in the kernel behind websocket ``ws``; return (stdout, error traceback or None)."""
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({"header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex,
                                   "msg_type": "execute_request", "version": "5.3"},
                        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                                    "allow_stdin": False, "stop_on_error": True}}))
    out, error, deadline = [], None, time.monotonic() + timeout
    while time.monotonic() < deadline:
        ws.settimeout(max(1.0, deadline - time.monotonic()))
        msg = json.loads(ws.recv())
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "stream":
            out.append(msg["content"]["text"])
        elif kind == "error":
            error = "\n".join(msg["content"]["traceback"])
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            return "".join(out), error
    raise TimeoutError(f"the cell did not finish in {timeout} s; output so far: {''.join(out)}")


def _learner_runs(hub, name):
    """What one learner does: open a kernel on their server, run a 2-rank launch and a %%ranks cell."""
    import websocket

    kernel = hub.call("POST", f"/user/{name}/api/kernels", {"name": "python3"})
    ws = websocket.create_connection(f"ws://127.0.0.1:{hub.base.rsplit(':', 1)[1]}/user/{name}/api/kernels/"
                                     f"{kernel['id']}/channels", header=[f"Authorization: token {hub.token}"])
    try:
        out, error = _execute(ws, LAUNCH)
        assert error is None, f"{name}: {error}"
        _, load_error = _execute(ws, "%load_ext utils")
        assert load_error is None, f"{name}: {load_error}"
        magic_out, magic_error = _execute(ws, MAGIC)
        assert magic_error is None, f"{name}: {magic_error}"
        total_out, _ = _execute(ws, "print('TOTAL', total)")
        probe_out, probe_error = _execute(ws, PROBE)
        assert probe_error is None, f"{name}: {probe_error}"
    finally:
        ws.close()
    result = json.loads(out.split("RESULT ", 1)[1])
    return dict(result, launch_line=out.split("RESULT", 1)[0], magic=magic_out, total=total_out.strip(),
                probe=json.loads(probe_out.split("PROBE ", 1)[1]))


@pytest.mark.slow
def test_four_learners_run_ranks_at_once_through_the_hub(tmp_path):
    pytest.importorskip("jupyterhub", reason="the teacher extra: `make test-hub` installs JupyterHub")
    pytest.importorskip("websocket", reason="websocket-client (a jupyter_server dependency)")
    from utils.workshop.hub import write_config
    from utils.workshop.sandbox import available
    from utils.workshop.student import build_release

    port, hub_port, proxy_api_port = _free_ports(3)
    state = tmp_path / "hub"
    release = build_release(tmp_path / "student", engine="builtin")["release"]
    boxed = available() is None  # each learner's server in the sandbox where bubblewrap runs
    config = write_config(state, users=LEARNERS, port=port, ip="127.0.0.1", hub_port=hub_port,
                          proxy_api_port=proxy_api_port, course=str(release), sandboxed=boxed)
    token, proxy_token = uuid.uuid4().hex, uuid.uuid4().hex
    env = dict(os.environ, COURSE_HUB_API_TOKEN=token, CONFIGPROXY_AUTH_TOKEN=proxy_token)
    env.pop("HUB_PASSWORD", None)  # the dummy authenticator: nobody logs in, the service token drives it
    log = open(tmp_path / "hub.log", "w")
    start = time.monotonic()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "jupyterhub"), "-f", str(config)], cwd=state,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    hub, seen = Hub(port, proxy_api_port, token, proxy_token), set()
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                hub.call("GET", "/hub/api/")
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "hub.log").read_text()[-3000:]
                time.sleep(0.3)
        hub_start = time.monotonic() - start
        for name in LEARNERS:
            hub.call("POST", f"/hub/api/users/{name}/server")
        deadline = time.monotonic() + 240
        for name in LEARNERS:
            hub.wait_ready(name, deadline)
        servers_ready = time.monotonic() - start
        with concurrent.futures.ThreadPoolExecutor(len(LEARNERS)) as pool:
            futures = {name: pool.submit(_learner_runs, hub, name) for name in LEARNERS}
            time.sleep(1)
            seen |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
            runs = {name: f.result(timeout=400) for name, f in futures.items()}
        seen |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        all_done = time.monotonic() - start
        routes = hub.call("GET", "/api/routes", base=hub.proxy_api, token=proxy_token)
    finally:
        for name in LEARNERS:
            try:
                hub.call("DELETE", f"/hub/api/users/{name}/server")
            except OSError:
                pass
        os.killpg(proc.pid, signal.SIGTERM)  # the hub stops its proxy and (cleanup_servers) every server
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    stopped = time.monotonic() - start
    print(f"\nhub up in {hub_start:.1f} s · 4 servers ready at {servers_ready:.1f} s · 4 learners' launches done "
          f"at {all_done:.1f} s · all stopped at {stopped:.1f} s")
    seats = {s.learner: s for s in deal_seats(LEARNERS, available_cores())}
    for name, run in runs.items():
        print(f"{name}: {run['launch_line'].strip()}")
        assert run["sums"] == [1.0, 1.0], f"{name}: the 2-rank all-reduce of 0 + 1 gave {run['sums']}"
        assert "[launch] 2 ranks" in run["launch_line"] and f"your seat: {name}, learner" in run["launch_line"]
        assert run["affinity"] == [list(seats[name].cores)] * 2, f"{name}'s ranks left the seat's cores"
        assert run["threads"] == [max(1, len(seats[name].cores) // 2)] * 2
        assert run["tmp"] == str(state / "home" / name / ".tmp"), "each learner has their own temporary folder"
        assert "TOTAL [1.0, 1.0]" in run["total"], run["magic"] + run["total"]
        # the student release, not the teacher's checkout: its utils, and (in the sandbox) no solution by its path
        assert run["probe"]["utils"].startswith(str(release)), run["probe"]
        if boxed:
            assert not (run["probe"]["solutions"] or run["probe"]["keys"] or run["probe"]["checkout_utils"]), run
    notebook = json.loads((state / "home" / LEARNERS[0] / "labs" / "03_zero_lab.ipynb").read_text())
    assert "teaching" not in notebook["metadata"].get("course", {}), "a learner's copy holds the teacher's notes"
    # no clash: distinct rank processes, kernels, temp folders and server ports
    pids = [p for run in runs.values() for p in run["pids"]]
    if boxed:  # each server has its own process namespace: the numbers repeat between learners, not within one
        assert all(len(set(run["pids"]) | {run["kernel"]}) == 3 for run in runs.values()), runs
    else:
        assert len(set(pids)) == 8 and len({run["kernel"] for run in runs.values()}) == 4
    assert len({run["tmp"] for run in runs.values()}) == 4
    targets = {route: info["target"] for route, info in routes.items() if route.startswith("/user/")}
    assert len(targets) == 4 and len(set(targets.values())) == 4, targets
    # nothing left behind: every process the hub started has ended, no rendezvous folder is left
    assert len(seen) >= 4 * 3 + 1, f"expected a proxy, and a server, a kernel, a rank server per learner: {seen}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and [p for p in seen if psutil.pid_exists(p)]:
        time.sleep(0.5)
    left = [p for p in seen if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"still running after the hub stopped: {[psutil.Process(p).cmdline() for p in left]}"
    assert not list(state.glob("home/*/.tmp/run_ranks-*")), "a rendezvous folder was left behind"
    assert not list(state.glob("home/.sandbox-*")), "a sandbox's own folder was left behind"
