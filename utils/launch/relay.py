"""A process group whose every message passes through the kernel: what the ranks sent, seen outside them.

``run_ranks(..., backend="relay", traffic=log)`` gives each rank a Unix socket to the kernel and no other way to reach
its peers: no store they share, no gloo connections. ``RelayGroup`` (in each rank) is a process group written in
Python on that socket: ``send``/``recv`` (so ``isend``, ``irecv``, ``batch_isend_irecv``) go to one peer, and the few
collectives a checker needs (``barrier``, ``all_reduce``, ``reduce_scatter``, ``all_gather``, ``broadcast``, each a
sum or a copy) are computed by the kernel's ``Relay`` from every member's contribution. The ``Relay`` (a thread of the
kernel) forwards each message and writes down, for each rank, in order, what it carried: ``("send", peer, bytes)`` or
``("collective", kind, bytes)`` (bytes as ``CommLedger`` counts a call's payload: an all-gather's output). That
record is the kernel's own: code in a rank can report what it likes, it cannot change what the relay saw. What the
record does not hold is what a message says: its bytes, its tag and its group's name reach the peer unread, so an
answer whose messages have the plan's peers and sizes may still put anything in them (a checker judges the values
that result). ``utils.launch.seal`` closes the other ways a rank could reach a peer (sockets, files, signals, shared
memory), before any code of the learner's runs.

What it keeps of gloo, so that a verdict is the one a notebook would get: a ``send`` completes when the peer has
posted the matching ``recv`` (a blocking send to a peer that sends first hangs, as gloo's does); messages from one
peer with one tag on one group arrive in order; a message larger than its receive aborts the receiving process
(SIGABRT), a smaller one fills the receive's first elements; a peer that ends fails what waits on it as a closed
connection; a collective whose sizes differ between ranks aborts them (and the relay cuts their links); a work's
future holds the tensors, as gloo's. What it does not: it sums in one go where gloo may round at each step (float16,
bfloat16), completes every collective before returning (``async_op=True`` too), takes one collective of a rank at a
time (a second, from another thread, before the first ended, ends the rank's link), and refuses what a checker does not call (gather, scatter, reduce, all-to-all, a receive from any source,
an operation but a sum).

Nothing a rank sends is unpickled here: a frame is a JSON header (numbers, strings, lists; no NaN) and raw bytes, and
a collective's bytes are read only as the tensor dtypes of ``DTYPES``. A frame that is not what ``RelayGroup``
sends closes that rank's link, as if it had ended: a group the rank is not in, of more ranks than the launch, or
with a name torch would not give it (``GROUP_NAME``); a peer out of the group; a tag out of 32 bits; an
acknowledgement of no message the relay carried, or one with bytes; a second collective before the first ended; a
contribution whose size is not its parts'. The relay never blocks on one rank but to write to it.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import re
import socket
import struct
import sys
import threading
from multiprocessing.connection import Connection, wait

import torch

__all__ = ["Relay", "RelayGroup", "join", "FRAME_LIMIT"]

FRAME_LIMIT = 1 << 26  # bytes of one frame (64 MiB; a check's largest message is 200 KB): a longer one ends the link
TAG_LIMIT = 1 << 31
GROUP_NAME = re.compile(r"\w{1,80}", re.ASCII)  # torch names a group by a counter, or a hash of its ranks (new_group)
DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16,
                                                    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                                                    torch.bool)}
KINDS = ("barrier", "sum_all", "sum_scatter", "gather_all", "from_root")  # what a collective computes


def _frame(header, data=b""):
    head = json.dumps(header).encode()
    return struct.pack("<I", len(head)) + head + data


def _refuse_constant(name):
    raise ValueError(f"{name} in a frame")


def _unframe(buf):
    (size,) = struct.unpack_from("<I", buf)
    header = json.loads(bytes(buf[4:4 + size]), parse_constant=_refuse_constant)
    if not isinstance(header, dict):
        raise ValueError("a frame's header is an object")
    return header, memoryview(buf)[4 + size:]


def _int(value, low, high, what):
    if type(value) is not int or not low <= value < high:
        raise ValueError(f"{what}: {value!r:.40}")
    return value


# ---- the kernel's side -------------------------------------------------------------------------------------------

class Relay:
    """The kernel's end: one socket pair a rank, a thread that forwards and records. ``fd(k)``: the end rank k gets
    (the server hands it on); ``traffic``: a list that gets one list a rank, filled as the messages pass."""

    def __init__(self, world_size, traffic=None):
        self.world_size = world_size
        self.traffic = traffic if traffic is not None else []
        self.traffic[:] = [[] for _ in range(world_size)]
        pairs = [socket.socketpair() for _ in range(world_size)]
        self._theirs = [theirs for _, theirs in pairs]
        self._conns = [Connection(os.dup(mine.fileno())) for mine, _ in pairs]
        for mine, _ in pairs:
            mine.close()
        self._open = set(range(world_size))
        self._pending = {}  # (group, members, seq) -> {rank: (header, data)}: each rank's one collective under way
        self._unacknowledged = collections.Counter()  # (sender, receiver, group, tag) -> messages not yet received
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)

    def fd(self, rank):
        return self._theirs[rank].fileno()

    def start(self):
        for theirs in self._theirs:  # the ranks hold them now (handed on by the server)
            theirs.close()
        self._thread.start()

    def close(self):
        os.write(self._stop_w, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for conn in self._conns:
            conn.close()
        for theirs in self._theirs:
            theirs.close()
        os.close(self._stop_r), os.close(self._stop_w)

    def _run(self):
        by_handle = {conn: k for k, conn in enumerate(self._conns)}
        while self._open:
            ready = wait([self._stop_r, *(self._conns[k] for k in self._open)])
            if self._stop_r in ready:
                return
            for conn in ready:
                k = by_handle[conn]
                try:
                    header, data = _unframe(conn.recv_bytes(FRAME_LIMIT))
                    self._serve(k, header, data)
                except Exception:  # noqa: BLE001 -- ended, or said what no RelayGroup says: its link is closed
                    self._gone(k)

    def _gone(self, k):
        """Rank k's link is closed: its peers hear so (as gloo's ranks see a connection closed), and a collective it was
        part of fails on the others."""
        if k not in self._open:
            return
        self._open.discard(k)
        self._conns[k].close()
        for m in sorted(self._open):
            self._put(m, dict(kind="gone", peer=k, group=[]))

    def _put(self, k, header, data=b""):
        if k in self._open:
            try:
                self._conns[k].send_bytes(_frame(header, data))
            except OSError:
                self._gone(k)

    def _members(self, header, k):
        """The frame's group (its name and members), checked: rank k among them, each a rank of this launch, once."""
        gid, members = header["gid"], header["group"]
        if type(gid) is not str or not GROUP_NAME.fullmatch(gid) or type(members) is not list or not 0 < len(members) \
                <= self.world_size:
            raise ValueError("a group")
        members = tuple(_int(m, 0, self.world_size, "a member") for m in members)
        if len(set(members)) != len(members) or k not in members:
            raise ValueError(f"rank {k}: a group it is not in")
        return gid, members

    def _serve(self, k, header, data):
        kind = header["kind"]
        gid, members = self._members(header, k)
        if kind in ("send", "ack"):
            peer, tag = _int(header["peer"], 0, self.world_size, "a peer"), _int(header["tag"], -TAG_LIMIT,
                                                                                   TAG_LIMIT, "a tag")
            if peer not in members:
                raise ValueError(f"rank {k}: a peer out of its group")
            if kind == "send":
                self.traffic[k].append(("send", peer, len(data)))
                self._unacknowledged[k, peer, gid, members, tag] += 1
            else:  # an acknowledgement carries nothing, and answers one message the relay carried
                if data or not self._unacknowledged[peer, k, gid, members, tag]:
                    raise ValueError(f"rank {k}: an acknowledgement of no message")
                self._unacknowledged[peer, k, gid, members, tag] -= 1
                data = b""
            self._put(peer, dict(kind=kind, peer=k, tag=tag, gid=gid, group=list(members)), data)
        elif kind == "coll":
            op, dtype, root = header["op"], header["dtype"], _int(header["root"], 0, len(members), "a root")
            parts = [_int(p, 0, FRAME_LIMIT, "a part") for p in header["parts"]]
            if op not in KINDS or dtype not in DTYPES or any(k in key[1] for key in self._pending if k in
                                                             self._pending[key]):
                raise ValueError(f"rank {k}: a collective no RelayGroup sends")
            pieces = {"barrier": 0, "sum_scatter": len(members)}.get(op, 1)
            if len(parts) != pieces or len(data) != sum(parts) * DTYPES[dtype].itemsize:
                raise ValueError(f"rank {k}: a contribution whose size is not its parts'")
            key = (gid, members, _int(header["seq"], 0, 1 << 62, "a sequence number"))
            self._pending.setdefault(key, {})[k] = (dict(op=op, dtype=dtype, root=root, parts=parts), bytes(data))
            # bytes as CommLedger counts a call's payload: an all-gather's output, every other's input
            self.traffic[k].append(("collective", op, len(data) * (len(members) if op == "gather_all" else 1)))
            if len(self._pending[key]) == len(members):
                self._collect(members, key, self._pending.pop(key))
        else:
            raise ValueError(kind)

    def _collect(self, members, key, given):
        """Every member's contribution is here: compute each one's result and send it; contributions that differ
        (another collective, size or dtype on one rank) fail the collective on every member, as gloo raises."""
        first = given[members[0]][0]
        reply = dict(kind="result", gid=key[0], group=list(members), seq=key[2])
        if first["op"] == "barrier" and all(h["op"] == "barrier" for h, _ in given.values()):
            given = {m: (first, b"") for m in given}  # a barrier carries nothing: no field of its is compared
        if any(h != first for h, _ in given.values()):
            for m in members:  # each aborts, as gloo's ranks do; a rank that does not is cut off all the same
                self._put(m, dict(reply, error="the ranks called different collectives, or on tensors of different "
                                               "sizes or dtypes"))
            for m in members:
                self._gone(m)
            return
        op, dtype, parts = first["op"], DTYPES[first["dtype"]], first["parts"]
        if op == "barrier":
            for m in members:
                self._put(m, reply)
            return
        values = {m: torch.frombuffer(bytearray(d), dtype=dtype) if d else torch.empty(0, dtype=dtype)
                  for m, (_, d) in given.items()}
        if op in ("sum_all", "sum_scatter"):
            total = torch.stack([values[m] for m in members]).sum(0).to(dtype)
            out = dict(zip(members, total.split(parts))) if op == "sum_scatter" else {m: total for m in members}
        elif op == "gather_all":
            whole = torch.cat([values[m] for m in members])
            out = {m: whole for m in members}
        else:  # from_root
            out = {m: values[members[first["root"]]] for m in members}
        for m in members:
            self._put(m, reply, out[m].contiguous().view(-1).view(torch.uint8).numpy().tobytes() if out[m].numel()
                      else b"")


# ---- the rank's side ---------------------------------------------------------------------------------------------

class _Link:
    """A rank's socket to the relay: a thread that files what arrives, and one that writes what this rank sends (so
    that the first never waits on the second: an acknowledgement is sent while the relay may be writing to us).
    A group is known by its name and members, ``(gid, members)``."""

    def __init__(self, fd, rank):
        self.rank, self.conn = rank, Connection(fd)
        self.state = threading.RLock()  # re-entered where filing a frame fails (``_fail``, from ``_listen``)
        self.mail = collections.defaultdict(collections.deque)  # (group, src, tag) -> data not yet received
        self.posted = collections.defaultdict(collections.deque)  # (group, src, tag) -> (tensor, future) waiting
        self.acks = collections.defaultdict(collections.deque)  # (group, dst, tag) -> (tensor, future) of sends
        self.results = {}  # (group, seq) -> a future of a collective's result, its bytes
        self.gone = set()  # peers whose link closed
        self.closed = None
        self.outbox = queue.SimpleQueue()
        threading.Thread(target=self._listen, name="relay-link", daemon=True).start()
        threading.Thread(target=self._write, name="relay-writer", daemon=True).start()

    def put(self, group, header, data=b""):
        gid, members = group
        self.outbox.put(_frame(dict(header, gid=gid, group=list(members)), data))

    def flush(self, timeout=5.0):
        """Wait until what this rank has sent so far is written (its last acknowledgements before it exits)."""
        written = threading.Event()
        self.outbox.put(written)
        written.wait(timeout)

    def _write(self):
        while True:
            frame = self.outbox.get()
            if isinstance(frame, threading.Event):
                frame.set()
                continue
            try:
                self.conn.send_bytes(frame)
            except OSError as err:
                self._fail(RuntimeError(f"the relay closed this rank's link ({type(err).__name__}): the launcher "
                                        "stopped"))
                return

    def _listen(self):
        while True:
            try:
                header, data = _unframe(self.conn.recv_bytes(FRAME_LIMIT))
                self._file(header, data)
            except Exception as err:  # noqa: BLE001 -- EOF (the launcher stopped us), or what no relay sends
                self._fail(RuntimeError(f"the relay closed this rank's link ({type(err).__name__}): a peer or the "
                                        "launcher stopped"))
                return

    def _file(self, header, data):
        done = []
        if header["kind"] == "gone":
            with self.state:
                done = self._lost(header["peer"])
            _complete(done)
            return
        group = (header["gid"], tuple(header["group"]))
        with self.state:
            if header["kind"] == "send":
                key = (group, header["peer"], header["tag"])
                if self.posted[key]:
                    done = [self._deliver(key, *self.posted[key].popleft(), bytes(data))]
                else:
                    self.mail[key].append(bytes(data))
            elif header["kind"] == "ack":
                waiting = self.acks[(group, header["peer"], header["tag"])]
                if waiting:
                    tensor, future = waiting.popleft()
                    done = [(future, [tensor])]
            elif header["kind"] == "result":
                arrived = self.results.pop((group, header["seq"]))
                if header.get("error"):  # gloo aborts the process when a collective's sizes differ between ranks
                    print(f"relay: {header['error']}: aborting, as gloo does", file=sys.stderr, flush=True)
                    os.abort()
                done = [(arrived, bytes(data))]
        _complete(done)  # outside the lock: a callback (``get_future().then``) may send

    def _deliver(self, key, tensor, future, data):
        """A message for a posted receive (under ``state``): fill it, tell the sender; returns (future, value) to
        complete. A message larger than the receive aborts this process, as gloo does (SIGABRT, every thread's stack
        on stderr: ``faulthandler``); a smaller one fills the receive's first elements, as gloo's does."""
        group, src, tag = key
        if len(data) > tensor.numel() * tensor.element_size():
            print(f"relay: rank {src} sent {len(data)} bytes to rank {self.rank}, whose receive holds "
                  f"{tensor.numel() * tensor.element_size()} ({tuple(tensor.shape)} {tensor.dtype}): aborting, as gloo "
                  "does", file=sys.stderr, flush=True)
            os.abort()
        _fill([tensor.view(-1)[:len(data) // max(1, tensor.element_size())]], data)
        self.put(group, dict(kind="ack", peer=src, tag=tag))
        return future, [tensor]

    def _lost(self, peer):
        """Peer ``peer`` ended (under ``state``): what waits on it fails, as gloo's "connection closed by peer";
        returns the (future, error) pairs to complete."""
        self.gone.add(peer)
        err = _closed(peer)
        failing = [f for (_, src, _), q in self.posted.items() if src == peer for _, f in q]
        failing += [f for (_, dst, _), q in self.acks.items() if dst == peer for _, f in q]
        failing += [f for (group, _), f in self.results.items() if peer in group[1]]
        for key in [key for key in self.posted if key[1] == peer]:
            del self.posted[key]
        for key in [key for key in self.acks if key[1] == peer]:
            del self.acks[key]
        for key in [key for key in self.results if peer in key[0][1]]:
            del self.results[key]
        return [(future, err) for future in failing]

    def check(self, peers):
        """Raise (under ``state``) where this link or one of ``peers`` is gone."""
        if self.closed:
            raise self.closed
        for peer in peers:
            if peer in self.gone:
                raise _closed(peer)

    def _fail(self, err):
        with self.state:
            self.closed = err
            waiting = [f for q in self.posted.values() for _, f in q] + [f for q in self.acks.values() for _, f in q]
            waiting += list(self.results.values())
            self.posted.clear(), self.acks.clear(), self.results.clear()
        _complete([(future, err) for future in waiting])


def _complete(done):
    for future, value in done:
        if not future.done():
            if isinstance(value, BaseException):
                future.set_exception(value)
            else:
                future.set_result(value)


def _closed(peer):
    return RuntimeError(f"relay: connection closed by peer: rank {peer} has ended")


def _bytes(tensor):
    return tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() \
        else b""


def _fill(outputs, data):
    """Copy ``data`` into the tensors ``outputs``, one after another: as a collective's own copy, which autograd does
    not see (this thread is not the caller's, whose ``no_grad`` does not reach it: a parameter is filled here too)."""
    offset = 0
    with torch.no_grad():
        for out in outputs:
            size = out.numel() * out.element_size()
            if size:
                chunk = torch.frombuffer(bytearray(data[offset:offset + size]), dtype=out.dtype).view(out.shape)
                out.copy_(chunk)
            offset += size


class _Work(torch.distributed.Work):
    """A ``Work`` whose ``wait`` raises what failed (torch's work made from a future returns True instead)."""

    def __init__(self, future):
        super().__init__()
        self.future = future

    def wait(self, timeout=None):
        self.future.wait()
        return True

    def is_completed(self):
        return self.future.done()

    def is_success(self):
        if not self.future.done():
            raise RuntimeError("the work has not completed")
        try:
            self.future.value()
        except Exception:  # noqa: BLE001
            return False
        return True

    def get_future(self):
        return self.future

    def result(self):
        return self.future.value()


class RelayGroup(torch.distributed.ProcessGroup):
    """A process group whose messages all pass through the kernel's ``Relay`` (see the module docstring)."""

    def __init__(self, link, rank, size, members, gid):
        super().__init__(rank, size)
        self.link, self.members, self.seq = link, list(members), 0
        self.key = (str(gid), tuple(members))

    def getBackendName(self):
        return "relay"

    def size(self):
        return len(self.members)

    # point to point
    def send(self, tensors, dst, tag=0):
        (tensor,) = tensors
        future = torch.futures.Future()
        with self.link.state:
            self.link.check([self.members[dst]])
            self.link.acks[(self.key, self.members[dst], int(tag))].append((tensor, future))
        self.link.put(self.key, dict(kind="send", peer=self.members[dst], tag=int(tag)), _bytes(tensor))
        return _Work(future)

    def recv(self, tensors, src, tag=0):
        (tensor,) = tensors
        future, key, done = torch.futures.Future(), (self.key, self.members[src], int(tag)), []
        with self.link.state:
            if self.link.mail[key]:  # a message that came before its sender ended is still there to receive
                done = [self.link._deliver(key, tensor, future, self.link.mail[key].popleft())]
            else:
                self.link.check([self.members[src]])
                self.link.posted[key].append((tensor, future))
        _complete(done)
        return _Work(future)

    def recv_anysource(self, tensors, tag=0):
        raise NotImplementedError("the checker's relay receives from a named rank only: pass src= to recv/irecv")

    # collectives, computed by the relay
    def _collective(self, op, inputs, outputs, parts, root=0):
        """Send this rank's contribution, wait for the relay's result and write it into ``outputs`` here, in the
        caller's thread (so that no thread of ours holds an answer's tensor: lab 03 counts the tensors Python objects
        hold); a completed work, whose future's value is ``outputs``, as gloo's."""
        dtype = inputs[0].dtype if inputs else torch.float32
        if str(dtype).removeprefix("torch.") not in DTYPES:
            raise NotImplementedError(f"the checker's relay sums and copies {sorted(DTYPES)}, not {dtype}")
        arrived = torch.futures.Future()  # the result's bytes: filled in here, by the caller's thread
        with self.link.state:
            self.link.check(self.members)
            self.seq += 1
            self.link.results[(self.key, self.seq)] = arrived
            seq = self.seq
        self.link.put(self.key, dict(kind="coll", op=op, seq=seq, dtype=str(dtype).removeprefix("torch."),
                                     root=root, parts=parts), b"".join(_bytes(t) for t in inputs))
        _fill(outputs, arrived.wait())
        future = torch.futures.Future()
        future.set_result(list(outputs))  # gloo's value: the output tensors
        return _Work(future)

    def _sizes(self, what, got, want):
        if got != want:
            raise ValueError(f"invalid tensor size (gloo's words): {what}: {got}, expected {want} on this group of "
                             f"{self.size()} ranks")

    def barrier(self, opts=None):
        return self._collective("barrier", [], [], [])

    def allreduce(self, tensors, opts=None):
        _sum_only(opts)
        return self._collective("sum_all", tensors, tensors, [tensors[0].numel()])

    def reduce_scatter(self, outputs, input_lists, opts=None):
        _sum_only(opts)
        (output,), (inputs,) = outputs, input_lists
        self._sizes("reduce_scatter's input list: tensors", len(inputs), self.size())
        me = self.members.index(_LINK[0].rank)
        self._sizes("reduce_scatter's output size", output.numel(), inputs[me].numel())  # chunks may differ (gloo)
        return self._collective("sum_scatter", [torch.cat([t.reshape(-1) for t in inputs])], [output],
                                [t.numel() for t in inputs])

    def reduce_scatter_single(self, output, input, opts=None):
        _sum_only(opts)
        self._sizes("reduce_scatter_tensor's input size", input.numel(), output.numel() * self.size())
        return self._collective("sum_scatter", [input], [output], [output.numel()] * self.size())

    def allgather(self, output_lists, inputs, opts=None):
        (outputs,), (tensor,) = output_lists, inputs
        self._sizes("all_gather's output list: sizes", [t.numel() for t in outputs], [tensor.numel()] * self.size())
        return self._collective("gather_all", [tensor], outputs, [tensor.numel()])

    def all_gather_single(self, output, input, opts=None):
        self._sizes("all_gather_into_tensor's output size", output.numel(), input.numel() * self.size())
        return self._collective("gather_all", [input], [output], [input.numel()])

    _reduce_scatter_base, _allgather_base = reduce_scatter_single, all_gather_single  # their names before torch 2.12

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        return self._collective("from_root", tensors, tensors, [tensors[0].numel()], root=root)

    def _refused(self, *args, **kwargs):
        raise NotImplementedError("the checker's relay carries point-to-point messages, barrier, all_reduce, "
                                  "reduce_scatter, all_gather and broadcast only")

    gather = scatter = reduce = alltoall = alltoall_base = allreduce_coalesced = _refused


def _sum_only(opts):
    if opts is not None and getattr(opts, "reduceOp", torch.distributed.ReduceOp.SUM) != torch.distributed.ReduceOp.SUM:
        raise NotImplementedError("the checker's relay sums only (ReduceOp.SUM)")


_LINK = [None]


def flush():
    """Inside a rank, before it exits: what it has sent the relay is written (a no-op without a relay)."""
    if _LINK[0] is not None:
        _LINK[0].flush()


def _create(opts, _backend_options=None):
    members = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    return RelayGroup(_LINK[0], opts.group_rank, opts.group_size, members, opts.group_id)


def join(fd, rank, world_size, timeout):
    """Inside a rank: make the relay this process's default process group (its link on ``fd``)."""
    import torch.distributed as dist

    from ..comm import process_group_calls

    _LINK[0] = _Link(fd, rank)
    if "RELAY" not in dist.Backend._plugins:
        dist.Backend.register_backend("relay", _create, extended_api=True, devices=["cpu"])
    process_group_calls.watch_class(RelayGroup)  # the ledger and the peer log see its calls, as gloo's
    os.environ["TORCH_DIST_INIT_BARRIER"] = "0"  # no barrier through a store: the store is this process's alone
    dist.init_process_group("relay", store=dist.HashStore(), rank=rank, world_size=world_size, timeout=timeout)
