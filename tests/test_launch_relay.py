"""The relay (utils.launch.relay) and the seal (utils.launch.seal): every message between a checker's ranks passes
through the launcher, which writes it down, and a sealed rank has no other way to a peer (issue 37, part 3)."""

import os
import socket
import threading

import pytest
import torch
import torch.distributed as dist

from utils.launch import RankError, RankTimeoutError, run_ranks
from utils.launch.seal import available

SEALABLE = available() is None
LANDLOCK = SEALABLE and __import__("ctypes").CDLL(None).syscall(444, None, 0, 1) >= 1  # its ABI version, or -1


def _talks():
    """Every call the relay carries, on 3 ranks: its results, for the test to check."""
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    got = torch.empty(5, dtype=torch.int64)
    works = [dist.isend(torch.arange(5) + rank, (rank + 1) % n), dist.irecv(got, (rank - 1) % n)]
    for work in works:
        work.wait()
    mine = torch.empty(2)
    dist.reduce_scatter(mine, [torch.full((2,), 10.0 * rank + v) for v in range(n)])
    gathered = [torch.empty(1) for _ in range(n)]
    dist.all_gather(gathered, torch.tensor([float(rank)]))
    root = torch.tensor([float(rank)])
    dist.broadcast(root, src=2)
    pair = None
    if rank in (0, 2):  # a group of two, made by its members only
        group = dist.new_group([0, 2], use_local_synchronization=True)
        pair = torch.tensor([rank + 1.0])
        dist.all_reduce(pair, group=group)
    work = dist.all_reduce(torch.tensor([1.0]), async_op=True)  # a work's future holds the tensors, as gloo's
    then = work.get_future().then(lambda f: f.value()[0].item()).wait()
    return dict(total=total.item(), got=got.tolist(), mine=mine.tolist(), gathered=[g.item() for g in gathered],
                root=root.item(), pair=None if pair is None else pair.item(), backend=dist.get_backend(), then=then)


def test_the_relay_carries_and_records_every_message():
    traffic = []  # bytes as CommLedger counts a payload: an all-gather's output, every other call's input
    out = run_ranks(_talks, world_size=3, backend="relay", traffic=traffic, verbose=False, timeout=60)
    for rank, r in enumerate(out):
        assert r["total"] == 6 and r["got"] == [(rank - 1) % 3 + i for i in range(5)], r
        assert r["mine"] == [sum(10.0 * k + rank for k in range(3))] * 2, r  # chunk `rank` of the sum
        assert r["gathered"] == [0.0, 1.0, 2.0] and r["root"] == 2.0 and r["backend"] == "relay", r
        assert r["pair"] == (4.0 if rank in (0, 2) else None) and r["then"] == 3.0, r
    assert traffic[1] == [("collective", "barrier", 0), ("collective", "sum_all", 4), ("send", 2, 40),
                          ("collective", "sum_scatter", 24), ("collective", "gather_all", 12),
                          ("collective", "from_root", 4), ("collective", "sum_all", 4)], traffic[1]
    assert traffic[0][-2:] == traffic[2][-2:] == [("collective", "sum_all", 4)] * 2, traffic  # the pair's, then all


def _both_send_first():
    dist.send(torch.ones(3), 1 - dist.get_rank())  # a blocking send waits for the peer's receive, as gloo's does
    return "sent"


def test_a_blocking_send_waits_for_its_receive():
    traffic = []
    with pytest.raises(RankTimeoutError):
        run_ranks(_both_send_first, world_size=2, backend="relay", traffic=traffic, verbose=False, timeout=8)
    assert traffic == [[("send", 1, 12)], [("send", 0, 12)]], traffic  # the record is there after a timeout too


def _one_ends():
    if dist.get_rank() == 1:
        os._exit(3)
    dist.recv(torch.empty(2), 1)


def test_a_peer_that_ends_fails_its_partners_wait_as_a_closed_connection():
    with pytest.raises(RankError) as failed:
        run_ranks(_one_ends, world_size=2, backend="relay", verbose=False, timeout=30)
    assert failed.value.rank == 1, failed.value
    assert failed.value.reports[0]["secondary"] and "closed by peer" in failed.value.reports[0]["message"], \
        failed.value.reports


def _short_receive():
    if dist.get_rank() == 0:
        dist.send(torch.ones(4), 1)
    else:
        dist.recv(torch.empty(3), 0)  # smaller than the message: gloo aborts the process, and so does the relay


def test_a_receive_smaller_than_its_message_aborts_as_gloo_does():
    with pytest.raises(RankError) as failed:
        run_ranks(_short_receive, world_size=2, backend="relay", verbose=False, timeout=30)
    assert "SIGABRT" in failed.value.reports[1]["message"], failed.value.reports


def test_the_relays_arguments_are_checked():
    with pytest.raises(ValueError, match="process_group=False"):
        run_ranks(_talks, world_size=2, backend="relay", process_group=False)
    with pytest.raises(ValueError, match="traffic= is the relay's record"):
        run_ranks(_talks, world_size=2, backend="gloo", traffic=[])


def _refused(name, call):
    try:
        call()
    except PermissionError:
        return name, "refused"
    except OSError as err:
        return name, f"OSError {err.errno}"
    return name, "allowed"


def _tries(folder):
    """What a sealed rank may and may not do (each other way to a peer), from inside it."""
    import ctypes
    import fcntl

    libc = ctypes.CDLL(None, use_errno=True)

    def prctl(option, value):
        if libc.prctl(option, value, 0, 0, 0):
            raise OSError(ctypes.get_errno(), "prctl")

    pids = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(pids, torch.tensor([os.getpid()]))  # through the relay: each rank learns its peer's number
    peer = int(pids[1 - dist.get_rank()]) if dist.get_world_size() > 1 else os.getppid()
    seen, later = {}, []
    thread = threading.Thread(target=lambda: later.append(_refused("a thread's socket", socket.socket)))
    thread.start()
    thread.join()
    readable = open(f"{folder}/readable")
    read_end, write_end = os.pipe()
    for name, call in [
        ("socket", socket.socket),
        ("socketpair", socket.socketpair),
        ("write a file", lambda: open(f"{folder}/written", "w")),
        ("append to a file", lambda: open(f"{folder}/readable", "a")),
        ("make a folder", lambda: os.mkdir(f"{folder}/made")),
        ("rename", lambda: os.rename(f"{folder}/readable", f"{folder}/renamed")),
        ("remove", lambda: os.remove(f"{folder}/readable")),
        ("re-time", lambda: os.utime(f"{folder}/readable")),
        ("change a mode", lambda: os.fchmod(readable.fileno(), 0o600)),
        ("flock", lambda: fcntl.flock(readable, fcntl.LOCK_SH)),
        ("fcntl lock", lambda: fcntl.lockf(readable, fcntl.LOCK_SH)),
        ("a pipe's signal to a peer", lambda: fcntl.fcntl(write_end, fcntl.F_SETOWN, peer)),
        ("signal a peer", lambda: os.kill(peer, 0)),
        ("join a peer's group", lambda: os.setpgid(0, peer)),
        ("a name for /proc", lambda: prctl(15, b"r1-says-42")),
        ("dumpable again", lambda: prctl(4, 1)),
        ("read a peer's /proc", lambda: open(f"/proc/{peer}/comm").read()),
        ("signal itself", lambda: os.kill(os.getpid(), 0)),
        ("read a file", lambda: open(f"{folder}/readable").read()),
        ("read its own /proc", lambda: open(f"/proc/{os.getpid()}/status").read()),
        ("a pipe", os.pipe),
    ]:
        seen.update([_refused(name, call)])
    child = os.fork()
    if child == 0:  # a child is sealed as its parent
        os._exit(0 if _refused("socket", socket.socket)[1] == "refused" else 1)
    seen["a child's socket"] = "refused" if os.waitpid(child, 0)[1] == 0 else "allowed"
    seen.update(later)
    seen["torch"] = float((torch.ones(3, 3) @ torch.ones(3)).sum())
    return seen


REFUSED = {"socket", "socketpair", "write a file", "append to a file", "make a folder", "rename", "remove", "re-time",
           "change a mode", "flock", "fcntl lock", "a pipe's signal to a peer", "signal a peer", "join a peer's group",
           "a name for /proc", "dumpable again", "a child's socket", "a thread's socket"}


@pytest.mark.skipif(not SEALABLE, reason="the seal is Linux's seccomp, on x86-64 and AArch64")
def test_a_sealed_rank_reaches_no_peer_but_through_the_relay(tmp_path):
    (tmp_path / "readable").write_text("the course's data")
    out = run_ranks(_tries, str(tmp_path), world_size=2, backend="relay", verbose=False, timeout=60)
    for seen in out:
        refused = {k for k, v in seen.items() if v == "refused"} - {"read a peer's /proc"}
        assert refused == REFUSED, (sorted(refused ^ REFUSED), seen)
        # where Linux has Landlock (landlock(7)), a rank's /proc is its own folder: a peer's reads as EACCES
        assert seen["read a peer's /proc"] == ("refused" if LANDLOCK else "allowed"), seen
        assert seen["read a file"] == seen["signal itself"] == seen["a pipe"] == seen["read its own /proc"] == \
            "allowed" and seen["torch"] == 9, seen
    assert (tmp_path / "readable").read_text() == "the course's data" and not (tmp_path / "written").exists()


def test_gloo_ranks_are_not_sealed(tmp_path):
    """The seal is the relay's: a lesson's ranks (gloo) write files and open sockets as ever."""
    (tmp_path / "readable").write_text("x")
    out = run_ranks(_tries, str(tmp_path), world_size=1, verbose=False, timeout=60)
    assert out[0]["socket"] == out[0]["write a file"] == out[0]["read a peer's /proc"] == "allowed", out


def test_the_seal_refuses_another_architectures_system_calls():
    """x32's numbers and a foreign architecture end the process: the filter's first instructions."""
    import platform

    from utils.launch import seal

    if available() is not None:
        pytest.skip(available())
    code = seal.program(platform.machine(), 1234)
    assert code[0] == (seal.LD_W_ABS, 0, 0, seal.ARCH), code[0]
    assert code[1] == (seal.JEQ, 0, len(code) - 3, seal.AUDIT_ARCH[platform.machine()]), code[1]  # else: killed
    assert code[-1] == (seal.RET, 0, 0, seal.RET_KILL) and code[-2] == (seal.RET, 0, 0, seal.RET_EPERM), code[-2:]
    assert code[3] == (seal.JGE, len(code) - 5, 0, 0x40000000), code[3]  # x32 numbers: to the last, killed


BAD_FRAMES = {  # what rank 1 writes on its link, each a frame no RelayGroup sends
    "an acknowledgement of no message": dict(kind="ack", peer=0, tag=0, gid="0", group=[0, 1, 2]),
    "an acknowledgement carrying bytes": dict(kind="ack", peer=0, tag=7, gid="0", group=[0, 1, 2]),
    "a group it is not in": dict(kind="send", peer=0, tag=0, gid="0", group=[0, 2]),
    "a group name torch never makes": dict(kind="send", peer=0, tag=0, gid="rank1 says 42", group=[0, 1, 2]),
    "a tag out of range": dict(kind="send", peer=0, tag=1 << 40, gid="0", group=[0, 1, 2]),
    "a second collective before the first ended": dict(kind="coll", op="barrier", seq=99, dtype="float32", root=0,
                                                       parts=[], gid="0", group=[0, 1, 2]),
    "NaN": '{"kind": "send", "peer": NaN}',
}


def _hostile_frame(name):
    """Rank 1 writes ``BAD_FRAMES[name]`` (after rank 0's message with tag 7, outstanding, where the frame is an
    acknowledgement carrying bytes), then waits: its link is closed; ranks 0 and 2 still talk, and rank 0 gets
    nothing from it."""
    import json
    import struct
    import time

    from utils.launch import relay

    rank, link = dist.get_rank(), relay._LINK[0]
    if rank == 1:
        frame = BAD_FRAMES[name]
        if name == "a second collective before the first ended":
            link.put(("0", (0, 1, 2)), dict(kind="coll", op="barrier", seq=98, dtype="float32", root=0, parts=[]))
        if name == "an acknowledgement carrying bytes":
            time.sleep(0.5)  # rank 0's message is on its way, not yet received
        head = (frame if isinstance(frame, str) else json.dumps(frame)).encode()
        link.outbox.put(struct.pack("<I", len(head)) + head + (b"hidden" if "bytes" in name else b""))
        time.sleep(1.0)
        return str(link.closed)
    if rank == 0:
        if name == "an acknowledgement carrying bytes":
            dist.isend(torch.ones(2), 1, tag=7)  # never received: rank 1 acknowledges it with bytes instead
        got = torch.zeros(3)
        dist.recv(got, 2)
        return got.tolist()
    dist.send(torch.ones(3), 0)
    return "sent"


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_a_frame_no_relay_group_sends_closes_that_ranks_link(name):
    traffic = []
    out = run_ranks(_hostile_frame, name, world_size=3, backend="relay", traffic=traffic, verbose=False, timeout=30)
    assert out[0] == [1.0, 1.0, 1.0] and out[2] == "sent", out
    assert "relay closed this rank's link" in out[1], out[1]
    assert [e for e in traffic[1] if e[0] == "send"] == [] and traffic[2] == [("send", 0, 12)], traffic
