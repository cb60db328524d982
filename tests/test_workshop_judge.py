"""Issue 37, part 3: a verdict no answer can write.

The grader's judge (``utils.workshop.grade.grade_one``) reads a notebook without running it and decides the verdict
from what the answer's processes send back, read as data and tensors (``utils.launch.restricted``); the answer's code
runs only in its ranks and its answer process, in the sandbox (``utils.checkers.answer_side``). Each answer below
tried, and under the old grader managed, to write its own verdict; each must get the verdict of what it really is.
"""

import os
import pickle
import time
import uuid
from pathlib import Path

import pytest

from lab_grading import graded_in_sandbox

from utils.launch.restricted import RESTRICTED_ENV, Unsendable, dumps_tensors, loads_plain, loads_tensors
from utils.workshop import grade as grader
from utils.workshop.gradebook import cell
from utils.workshop.sandbox import available

SANDBOX = available() is None
LAB, NAME = "06_pipeline_lab", "interleaved_one_f_one_b"
SIGNATURE = f"def {NAME}(rank, ranks, microbatches, chunks):\n"
STUB = SIGNATURE + "    raise NotImplementedError('write it')\n"
REFUSES = "    if microbatches % ranks:\n        raise ValueError(f'{microbatches} micro-batches, {ranks} ranks')\n"
MARK = f"/tmp/judge-test-{uuid.uuid4().hex}"  # a file the reader of a result would create if it ran the result's code


class _Evil:
    def __reduce__(self):
        return os.system, (f"touch {MARK}",)


def test_restricted_readers_run_no_code():
    evil = pickle.dumps(("ok", _Evil()))
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        loads_plain(evil)
    with pytest.raises(Unsendable, match="posix.system|os.system"):
        dumps_tensors([_Evil()])
    import io

    import torch
    buffer = io.BytesIO()
    torch.save([_Evil()], buffer)  # what an answer could send by hand
    with pytest.raises(pickle.UnpicklingError):
        loads_tensors(buffer.getvalue())
    assert not Path(MARK).exists()
    assert loads_plain(pickle.dumps(("exited", 12, -9))) == ("exited", 12, -9)


def _returns_evil():
    import os as os_

    class Evil:
        def __reduce__(self):
            return os_.system, (f"touch {MARK}",)
    return Evil()


def test_a_restricted_kernel_reads_no_code_from_its_ranks(monkeypatch):
    """Where the kernel reads its ranks restricted (the judge does), a rank's result that names code is the rank's
    error, and nothing it names runs in the kernel."""
    from utils.launch import RankError, run_ranks

    monkeypatch.setenv(RESTRICTED_ENV, "1")
    assert run_ranks(lambda: {"x": [1, 2]}, world_size=1, process_group=False, verbose=False) == [{"x": [1, 2]}]
    with pytest.raises(RankError, match="cannot be sent back"):
        run_ranks(_returns_evil, world_size=1, process_group=False, verbose=False)
    from utils.launch.kernel import _envelope
    import warnings
    with warnings.catch_warnings():  # torch.load warns of a plain pickle's protocol before refusing it
        warnings.simplefilter("ignore")
        kind, report = _envelope(pickle.dumps(("ok", pickle.dumps(_Evil()))), 0)
    assert kind == "error" and report["type"] == "UnreadableResult", report
    assert not Path(MARK).exists()


FORGERIES = {  # learner -> (lab, {name: source}), the gradebook cell wanted
    # the checker's own exception, raised with a passing message: it is the answer raising
    "raises_the_checkers_exception": (LAB, {NAME: "from utils.checkers.common import LabCheckFailed\n\n" + SIGNATURE +
                                            "    raise LabCheckFailed('pass', 'PASSED: interleaved 1F1B', '')\n"},
                                      "raised"),
    # a class body that replaces the check, the judge's grade_one and the lab table's call: it runs in the sandbox,
    # never in the judge, so the stub below it is graded as a stub
    "patches_the_checker": (LAB, {NAME: "import utils.checkers.pipeline_schedule as ps\nimport utils.workshop.grade as gr\n"
                                        "import utils.checkers.labs as lb\n\nclass Patch:\n"
                                        "    ps.check_interleaved = lambda *a, **k: 'PASSED'\n"
                                        "    gr.grade_one = lambda *a, **k: {'verdict': 'pass', 'message': 'PASSED'}\n"
                                        "    for part in lb.LABS['06_pipeline_lab'].parts:\n"
                                        "        object.__setattr__(part, 'call', lambda *a, **k: 'PASSED')\n\n" + STUB},
                            "not written yet"),
    # writes a passing verdict wherever the judge's result file could be, then ends its process
    "writes_the_verdict": (LAB, {NAME: "import glob, json, os\n\nclass Forge:\n"
                                       "    for folder in glob.glob('/tmp/grade-*') + [os.path.dirname(os.getcwd())]:\n"
                                       "        try:\n            open(os.path.join(folder, 'result.json'), 'w').write("
                                       "json.dumps({'verdict': 'pass', 'message': 'PASSED'}))\n"
                                       "        except OSError:\n            pass\n    os._exit(0)\n\n" + STUB},
                           "error"),
    # returns an object whose unpickling would run a command in whoever reads it
    "returns_code": (LAB, {NAME: "import os\n\nclass Evil:\n    def __reduce__(self):\n"
                                 f"        return os.system, ('touch {MARK}',)\n\n" + SIGNATURE + REFUSES
                                 + "    return [Evil()]\n"},
                     "not_ops"),
    # names a mistake of its choosing ("pass") from outside its function's call: a metaclass that raises it when the
    # check reads the answer's name (lab 14's _own, in the answer's process, before it calls the answer)
    "names_its_mistake": ("14_ring_attention_lab",
                          {"block_backward": "import sys\nfrom utils.checkers.common import LabCheckFailed\n\n"
                           "class Forged(type):\n    def __getattribute__(cls, name):\n"
                           "        if name == '__name__' and sys._getframe(1).f_code.co_name == '_own':\n"
                           "            raise LabCheckFailed('pass', 'PASSED', '')\n"
                           "        return type.__getattribute__(cls, name)\n\n"
                           "class block_backward(metaclass=Forged):\n    pass\n"},
                          "error"),
}


@pytest.mark.parametrize("learner", sorted(FORGERIES))
def test_an_answer_cannot_write_its_verdict(learner, tmp_path):
    lab, sources, want = FORGERIES[learner]
    verdict = graded_in_sandbox(tmp_path, lab, sources, learner=learner, sandbox=SANDBOX)
    assert cell([verdict]) == want, (verdict.label, verdict.message[:2000], verdict.output[-2000:])
    assert not Path(MARK).exists(), "the answer's code ran where its result was read"
    if learner == "names_its_mistake":
        assert "which no checker names" in verdict.message, verdict.message


def test_a_restricted_kernel_refuses_a_result_too_large_unread(monkeypatch):
    """An answer's rank cannot fill the judge's memory: a message over RESULT_LIMIT is refused before it is read."""
    import torch

    from utils.launch import RankError, kernel, run_ranks

    monkeypatch.setenv(RESTRICTED_ENV, "1")
    monkeypatch.setattr(kernel, "RESULT_LIMIT", 10_000)
    assert run_ranks(lambda: torch.zeros(10).sum().item(), world_size=1, process_group=False, verbose=False) == [0.0]
    with pytest.raises(RankError, match="more than 10,000 bytes"):
        run_ranks(lambda: torch.zeros(100_000), world_size=1, process_group=False, verbose=False)


def _hangs():
    import time as time_

    time_.sleep(600)  # where a hang report must find each rank


@pytest.mark.skipif(not SANDBOX, reason="the rank server in a sandbox of its own")
def test_a_sandboxed_servers_ranks_are_signalled_by_the_server(tmp_path, monkeypatch):
    """The ranks of a server in a sandbox are numbered in its own process namespace: the kernel asks the server to
    signal them (a hang's stack dump, the kill), never signals those numbers itself, which are other processes here
    (review of issue 37: a judge killed the teacher's process groups 3, 4 and 5)."""
    from utils.launch import RankTimeoutError, run_ranks, server_handle
    from utils.workshop import sandbox

    bystander = __import__("subprocess").Popen(["sleep", "600"], start_new_session=True)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(server_handle, "SERVER_WRAPPER", lambda argv: sandbox.sandboxed(argv, work,
                                                                                       readable=[grader.ROOT]))
    monkeypatch.chdir(work)
    monkeypatch.setenv("TMPDIR", str(work))
    monkeypatch.setattr("tempfile.tempdir", None)
    server_handle.stop_rank_server()
    try:
        with pytest.raises(RankTimeoutError) as stuck:
            run_ranks(_hangs, world_size=2, process_group=False, verbose=False, timeout=8)
    finally:
        server_handle.stop_rank_server()
    assert str(stuck.value).count("in _hangs") == 2, str(stuck.value)[-3000:]  # each rank's stack, dumped
    assert bystander.poll() is None, "a process outside the sandbox was signalled"
    bystander.kill()


# ---- review of issue 37, part 3: what a hostile reader found, planted ------------------------------------------
ESCAPE = '''import os, utils
class _Plant:  # where the definitions run first (the probe rank): links where the sandbox's own folders once were
    _root = os.path.dirname(os.path.dirname(utils.__file__))
    for _name, _target in ((".sandbox-tmp", _root + "/labs/solutions"), (".sandbox-shm", HOST),
                           (".sandbox-empty", VICTIM)):
        _path = os.path.join(os.getcwd(), _name)
        if os.path.isdir(_path) and not os.path.islink(_path):
            os.rename(_path, _path + "-old")
        elif os.path.isfile(_path) and not os.path.islink(_path):
            os.remove(_path)
        if not os.path.lexists(_path):
            os.symlink(_target, _path)

def make_buckets(params, bucket_numel):
    import importlib.util
    if os.path.exists("/tmp/zero.py"):  # the answer process's /tmp would be labs/solutions
        open("/dev/shm/WRITTEN", "w").write("from the sandbox")
        spec = importlib.util.spec_from_file_location("stolen", "/tmp/zero.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.make_buckets(params, bucket_numel)
    raise NotImplementedError("a stub")
'''
BOMB = '''import utils.launch.rank as _r

def _leave(result, message, code, _orig=_r._leave):
    nested = []
    for _ in range(24):
        nested = [nested, nested]  # a few bytes pickled; as a string, 2**24 leaves
    return _orig(result, ("error", dict(time=0.0, type="X", message=nested, traceback="t", secondary=False)), 1)

class _Patch:
    _r._leave = _leave

def halving_reduce_scatter(tensor):
    raise NotImplementedError("a stub")
'''
FORGER = '''import utils.checkers.halving_doubling as _hd

def _forged(fn, kind, cases, name, seed):
    import torch
    import torch.distributed as dist
    from utils.checkers.halving_reduce_scatter import halving_plan
    from utils.checkers.halving_doubling import inputs
    rank, n, out = dist.get_rank(), dist.get_world_size(), []
    for numel, dtype in cases:
        got = inputs(rank, numel, dtype, seed)
        FORGE
        dests, elements = halving_plan(numel, n)[rank]
        out.append(dict(got=got, error=None, sends=[(d, 0) for d in dests], returned=None,
                        sent=elements * got.element_size(), ops=[], calls=[]))
    return REPORT

class _Patch:  # in the rank: the checker's own rank function replaced
    _hd.on_rank.__code__ = _forged.__code__

def halving_reduce_scatter(tensor):
    raise NotImplementedError("a stub")
'''
# A stub that replaces the checker's rank function (issue 37, part 3): each rank reports what it likes. The checker
# computes the sum itself from seeds only one rank each holds (utils.checkers.rank_secrets), so reporting its own input
# as the sum is a mistake, and a report of another shape is not a report.
FORGED_RANKS = {
    "its_input_as_the_sum": (FORGER.replace("FORGE", "pass").replace("REPORT", "out"), "mistake"),
    "no_case": (FORGER.replace("FORGE", "pass").replace("REPORT", "[]"), "not_a_report"),
    "other_fields": (FORGER.replace("FORGE", "pass").replace("REPORT", "[dict(c, passed=True) for c in out]"),
                     "not_a_report"),
}
# Summing another way and reporting the messages the plan would send (issue 37, part 3): the ranks talk through the
# launcher's relay, sealed (utils.launch.relay, utils.launch.seal), so the reports are held to what the relay carried,
# and no other way between the ranks is open: each route, planted.
FORGED_WITH_TORCH = FORGER.replace("FORGE", "dist.all_reduce(got)").replace("REPORT", "out")
ROUTES = {  # a forger that moves the data by another route; each must fail, whatever the route does
    "torch_all_reduce": "dist.all_reduce(got)",
    "gathered_by_sends": """if rank:
            dist.send(got, 0)
            dist.recv(got, 0)
        else:
            parts = [torch.empty_like(got) for _ in range(n - 1)]
            for k, part in enumerate(parts, 1):
                dist.recv(part, k)
            got += sum(parts)
            for k in range(1, n):
                dist.send(got, k)""",
    "own_gloo_group": """import datetime
        store = dist.TCPStore("127.0.0.1", 29611 + len(out), n, rank == 0, timeout=datetime.timedelta(seconds=20))
        group = dist.ProcessGroupGloo(dist.PrefixStore("forged", store), rank, n)
        group.allreduce([got]).wait()""",
    "a_socket": """import socket
        if rank == 0:  # the others send rank 0 their inputs; it sums and sends the sum back
            with socket.create_server(("127.0.0.1", 29711 + len(out))) as server:
                peers = [server.accept()[0] for _ in range(n - 1)]
            parts = [torch.frombuffer(bytearray(p.recv(got.numel() * got.element_size(), socket.MSG_WAITALL)),
                                      dtype=got.dtype) for p in peers]
            got += sum(parts)
            for p in peers:
                p.sendall(got.numpy().tobytes())
        else:
            import time
            time.sleep(0.5)
            peer = socket.create_connection(("127.0.0.1", 29711 + len(out)))
            peer.sendall(got.numpy().tobytes())
            got.copy_(torch.frombuffer(bytearray(peer.recv(got.numel() * got.element_size(), socket.MSG_WAITALL)),
                                       dtype=got.dtype))""",
    "a_shared_file": """import os, time
        for where in ("/dev/shm", "/tmp", "."):  # each rank writes its input; each sums all the files
            open(f"{where}/forged-{rank}-{numel}-{got.dtype}", "wb").write(got.numpy().tobytes())
        time.sleep(0.5)
        got.copy_(sum(torch.frombuffer(bytearray(open(f"/dev/shm/forged-{k}-{numel}-{got.dtype}", "rb").read()),
                                       dtype=got.dtype) for k in range(n)))""",
    "a_peer_signalled": """import os, signal
        for pid in range(2, 64):  # the sandbox numbers its processes from 1: the peer is among these
            if pid != os.getpid():
                os.kill(pid, signal.SIGUSR2)""",
}
HOSTILE = {
    "escapes_by_link": ("03_zero_lab", "make_buckets", ESCAPE, "not written yet"),
    "exits_200": ("03_zero_lab", "make_buckets", "import os\n\ndef make_buckets(params, bucket_numel):\n    os._exit(200)\n",
                  "crash"),
    "unhashable_literal": ("03_zero_lab", "make_buckets", "BAD = {[1]}\n\ndef make_buckets(params, bucket_numel):\n"
                           "    raise NotImplementedError('a stub')\n", "does not parse"),
    "sends_a_string_bomb": ("01a_halving_reduce_scatter_lab", "halving_reduce_scatter", BOMB, "error"),
}


@pytest.mark.skipif(not SANDBOX, reason="the sandbox's own folders, and its limits")
@pytest.mark.parametrize("learner", sorted(HOSTILE))
def test_what_a_hostile_reader_planted(learner, tmp_path):
    lab, name, source, want = HOSTILE[learner]
    host, victim = tmp_path / "host", tmp_path / "victim.txt"
    host.mkdir()
    victim.write_text("the teacher's file")
    source = source.replace("HOST", repr(str(host))).replace("VICTIM", repr(str(victim)))
    start = time.perf_counter()
    verdict = graded_in_sandbox(tmp_path, lab, {name: source}, learner=learner)
    assert cell([verdict]) == want, (verdict.label, verdict.message[:2000], verdict.output[-2000:])
    assert not list(host.iterdir()) and victim.read_text() == "the teacher's file", "the sandbox was left"
    assert time.perf_counter() - start < 120, "a message took the judge minutes to read"


def _forged_verdict(tmp_path, source):
    return graded_in_sandbox(tmp_path, "01a_halving_reduce_scatter_lab", {"halving_reduce_scatter": source})


@pytest.mark.skipif(not SANDBOX, reason="the ranks in the sandbox")
@pytest.mark.parametrize("kind", sorted(FORGED_RANKS))
def test_a_stub_that_replaces_the_checkers_rank_function_does_not_pass(tmp_path, kind):
    source, wanted = FORGED_RANKS[kind]
    verdict = _forged_verdict(tmp_path, source)
    assert verdict.verdict != "pass", verdict
    assert (verdict.verdict if wanted == "mistake" else verdict.mistake) == wanted, verdict


@pytest.mark.skipif(not SANDBOX, reason="the ranks in the sandbox")
def test_a_stub_that_sums_with_torch_and_forges_the_messages_does_not_pass(tmp_path):
    """Its reports say the plan's messages; the relay carried an all-reduce: not a report (issue 37, part 3)."""
    verdict = _forged_verdict(tmp_path, FORGED_WITH_TORCH)
    assert verdict.verdict == "mistake" and verdict.mistake == "not_a_report", verdict
    assert "the relay carried" in verdict.message, verdict.message


@pytest.mark.skipif(not SANDBOX, reason="the ranks in the sandbox")
def test_a_stub_that_sums_with_torch_and_reports_its_true_messages_does_not_pass(tmp_path):
    """Its messages told as the relay carried them (none), its all-reduce left out of its report: the collectives
    differ (review of issue 37)."""
    verdict = _forged_verdict(tmp_path, FORGER.replace("FORGE", "dist.all_reduce(got)").replace(
        "REPORT", "[dict(c, sends=[], sent=0) for c in out]"))
    assert verdict.verdict == "mistake" and verdict.mistake == "not_a_report", verdict
    assert "collective call(s) and the relay carried 1" in verdict.message, verdict.message
    # the same, its all-reduce reported as a reduce-scatter of as many bytes: the kinds differ, not the count
    verdict = _forged_verdict(tmp_path / "renamed", FORGER.replace("FORGE", "dist.all_reduce(got)").replace(
        "REPORT", "[dict(c, sends=[], sent=0, ops=[('reduce_scatter', c['got'].numel() * c['got'].element_size())]) "
                  "for c in out]"))
    assert verdict.verdict == "mistake" and verdict.mistake == "not_a_report", verdict
    assert "differ at call 0: reported [('sum_scatter'" in verdict.message, verdict.message


@pytest.mark.skipif(not SANDBOX, reason="the ranks in the sandbox")
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_stub_that_moves_the_data_another_way_does_not_pass(tmp_path, route):
    """Each other way between the ranks: sends that are not the plan's (held to the relay's record), torch's gloo
    over a store of its own, a socket, a shared file, a signal (each refused by the seal, ``EPERM``)."""
    verdict = _forged_verdict(tmp_path, FORGER.replace("FORGE", ROUTES[route]).replace("REPORT", "out"))
    assert verdict.verdict != "pass", verdict
    if route in ("torch_all_reduce", "gathered_by_sends"):
        assert verdict.mistake == "not_a_report", verdict
    else:  # the seal refused the call (seccomp: EPERM; Landlock: EACCES): an error in the rank, never the sum
        said = verdict.message + verdict.output
        assert "Operation not permitted" in said or "Permission denied" in said, (verdict.message, said[-2000:])


def test_the_judge_quotes_only_the_lines_it_holds(tmp_path, monkeypatch):
    """A rank's traceback may name any file (the solutions, a classmate's notebook, a file an earlier answer wrote
    in the judge's folder): a judge never opens it to quote a line; it quotes the answer's own cells, which
    ``judge_one`` puts in ``linecache`` after clearing what an earlier answer left there (review of issue 37)."""
    import linecache

    from utils.launch.restricted import quoted_line

    secret = tmp_path / "solution.py"
    secret.write_text("the reference's line\n")
    assert quoted_line(str(secret), 1) == "the reference's line"  # a notebook kernel reads it, as before
    monkeypatch.setenv(RESTRICTED_ENV, "1")
    linecache.clearcache()
    assert quoted_line(str(secret), 1) == ""
    linecache.cache["06_pipeline_lab.ipynb, cell 3"] = (10, None, ["x = 1\n", "y = 2\n"], "06_pipeline_lab.ipynb, cell 3")
    assert quoted_line("06_pipeline_lab.ipynb, cell 3", 2) == "y = 2" and quoted_line("06_pipeline_lab.ipynb, cell 3", 9) == ""


def test_the_teachers_environment_reaches_a_judge_by_name_only(monkeypatch):
    """The ranks get their judge's environment (run_ranks), and an answer's code may print it into a verdict: only
    what Python, torch and the course read gets there, never a password the teacher's shell holds (issue 37)."""
    monkeypatch.setenv("HUB_PASSWORD", "the hub's password")
    monkeypatch.setenv("SOME_API_TOKEN", "a token")
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    env = grader.judge_env()
    assert "HUB_PASSWORD" not in env and "SOME_API_TOKEN" not in env, sorted(env)
    assert env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL" and env["OMP_NUM_THREADS"] == "2", sorted(env)
    assert env["PATH"] and str(grader.ROOT) in env["PYTHONPATH"].split(os.pathsep)
