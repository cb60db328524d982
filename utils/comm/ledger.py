"""A communication ledger: what did this rank send, how many bytes, and how long did it take?

Derived in notebook 01a (collectives) and 01b (the ring) and used by every later lesson to put *measured* bytes beside
the formulas::

    with CommLedger() as ledger:          # inside a rank
        dist.all_reduce(grad)
    ledger.total("payload_bytes")         # bytes of the tensors handed to the collectives
    ledger.total("wire_bytes")            # bytes this rank puts on the wire (see below)

How it works: while the ``with`` block runs, the functions of ``torch.distributed`` that move data
(``all_reduce``, ``send``, ``isend`` ...) are replaced by thin wrappers that note the call and then
call the original. Nothing in torch is forked; on exit the originals are put back.
``utils.comm.compat``'s three functions (the same collectives under one name on torch 2.11-2.15) are
wrapped too, and a call made *inside* a recorded call is part of it: a compat function that falls
back to another collective is recorded once, under its own name, with its own bytes.
A call that steps around the module's functions (``distributed_c10d.all_reduce``, an ``isend`` imported
before the ledger opened, a ``P2POp`` holding it) is still seen, where every path meets: the process
group's method that does the work (``utils.comm.process_group_calls``). It is recorded under the name
of the function that was called, with the same bytes; its ``seconds`` leave out the wait that a
synchronous call does after the method returns. Only calls made from Python are seen: torch's DDP, for
example, talks to the backend from C++, so notebook 02 routes its gradients through a DDP
*communication hook*, which calls ``dist.all_reduce`` and is therefore seen.

Two byte counts per call:

- ``payload_bytes``: the bytes of the tensor(s) the call was given (for ``all_gather``, the
  output; for ``reduce_scatter``, the input: always the full-sized side).
- ``wire_bytes``: the bytes *this rank sends*. For send/isend that is measured exactly, and for
  recv/irecv it is zero (the bytes are counted once, by the sender). For a collective it is the
  cost of the ring algorithm, the convention of nccl-tests: all-reduce sends 2(n-1)/n of its
  payload, all-gather, reduce-scatter and all-to-all (n-1)/n, broadcast and reduce 1x. A ring
  written from send/recv (notebook 01b) is therefore measured, not modelled. One exception, counted
  exactly: ``all_to_all_single`` given ``input_split_sizes`` (uneven rows, as a mixture of experts
  sends, notebook 15) sends every row but its own split's: payload minus that split's bytes.

And one reading that is not a model at all: ``loopback_bytes()``, the byte counter of the
machine's loopback network interface, which gloo ranks on one machine talk through (notebook 02
uses it to check what torch's DDP really sends).
"""

import dataclasses
import threading
import time

import psutil
import torch.distributed as dist

from . import compat
from .process_group_calls import observe, payload_bytes, tensor_bytes

# Multiplier on payload_bytes giving the bytes one rank sends under a ring algorithm (n ranks).
RING_WIRE_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_gather_into_tensor": lambda n: (n - 1) / n,
    "all_gather_single": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "reduce_scatter_single": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "all_to_all_single": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0 if n > 1 else 0.0,
    "reduce": lambda n: 1.0 if n > 1 else 0.0,
    "gather": lambda n: 1 / n,
    "scatter": lambda n: (n - 1) / n,
    "send": lambda n: 1.0,
    "isend": lambda n: 1.0,
    "recv": lambda n: 0.0,
    "irecv": lambda n: 0.0,
    "barrier": lambda n: 0.0,
}


@dataclasses.dataclass
class CommRecord:
    """One call: which operation, how many ranks took part, bytes, and seconds spent in the call."""

    op: str
    world_size: int
    payload_bytes: int
    wire_bytes: float
    seconds: float  # for async calls (isend, async_op=True) only the time to *start* the operation


def _unwrapping_p2p_op(p2p_op_class):
    """A P2POp that accepts the ledger's wrapped isend/irecv by handing torch the originals."""

    class P2POp(p2p_op_class):
        def __new__(cls, op, *args, **kwargs):
            return super().__new__(cls, getattr(op, "ledger_original", op), *args, **kwargs)

        def __init__(self, op, *args, **kwargs):
            super().__init__(getattr(op, "ledger_original", op), *args, **kwargs)

    return P2POp


def _payload(op, args, kwargs):
    """The full-sized tensor argument of each operation (see the module docstring)."""
    first = args[0] if args else next(iter(kwargs.values()), None)
    if op in ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "scatter",
              "all_to_all_single"):
        names = ("input_list", "input_tensor_list", "input", "scatter_list")  # torch's keyword for that side
        second = args[1] if len(args) > 1 else next((kwargs[k] for k in names if k in kwargs), None)
        return tensor_bytes(second) if op != "scatter" else tensor_bytes(second or first)
    return tensor_bytes(first)


def _split_wire_bytes(op, args, kwargs, group):
    """Exact bytes leaving this rank for ``all_to_all_single`` with ``input_split_sizes``; else None."""
    splits = kwargs.get("input_split_sizes", args[3] if len(args) > 3 else None)
    if op != "all_to_all_single" or not splits:
        return None
    tensor = args[1] if len(args) > 1 else kwargs["input"]
    row_bytes = tensor[0].numel() * tensor.element_size() if len(tensor) else 0
    return (sum(splits) - splits[dist.get_rank(group)]) * row_bytes  # every split but this rank's own


class CommLedger:
    """Context manager that records every data-moving ``torch.distributed`` call of this rank."""

    def __init__(self):
        self.records: list[CommRecord] = []
        self._originals, self._compat_originals = {}, {}
        self._inside = threading.local()  # .call is True while this thread is in a recorded call
        self._watching = None  # the process group's methods, for the calls that step around the wrappers

    def __enter__(self):
        for op in RING_WIRE_FACTOR:
            if hasattr(dist, op):
                self._originals[op] = getattr(dist, op)
                setattr(dist, op, self._wrap(op, self._originals[op]))
        for op in compat.__all__:
            self._compat_originals[op] = getattr(compat, op)
            setattr(compat, op, self._wrap(op, self._compat_originals[op]))
        # batch_isend_irecv takes P2POp(dist.isend, ...) objects, and torch insists on its own
        # isend/irecv in them: hand it the originals, and record the batch's ops ourselves.
        self._originals["P2POp"], self._originals["batch_isend_irecv"] = dist.P2POp, dist.batch_isend_irecv
        dist.P2POp = _unwrapping_p2p_op(dist.P2POp)
        dist.batch_isend_irecv = self._wrap_batch(self._originals["batch_isend_irecv"])
        self._watching = observe(self._stepped_around)
        self._watching.__enter__()
        return self

    def __exit__(self, *exc):
        self._watching.__exit__(None, None, None)
        for op, fn in self._originals.items():
            setattr(dist, op, fn)
        for op, fn in self._compat_originals.items():
            setattr(compat, op, fn)
        self._originals.clear()
        self._compat_originals.clear()
        return False

    def _wrap(self, op, fn):
        def recorded(*args, **kwargs):
            if getattr(self._inside, "call", False):  # part of a recorded call (a compat fallback)
                return fn(*args, **kwargs)
            group = kwargs.get("group")
            n = dist.get_world_size(group)
            self._inside.call = True
            start = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            finally:
                self._inside.call = False
            seconds = time.perf_counter() - start
            payload = _payload(op, args, kwargs)
            wire = _split_wire_bytes(op, args, kwargs, group)
            wire = payload * RING_WIRE_FACTOR[op](n) if wire is None else wire
            self.records.append(CommRecord(op, n, payload, wire, seconds))
            return result

        recorded.ledger_original = getattr(fn, "ledger_original", fn)  # torch's own, however many ledgers are open
        recorded.__name__ = op
        return recorded

    def _stepped_around(self, call):
        """A process group's method was called, not from inside one of this ledger's wrappers: record it here."""
        if getattr(self._inside, "call", False):
            return  # the wrapper around it records it, with its own name and time
        n, payload = call.size, payload_bytes(call)
        wire = None
        if call.op == "all_to_all_single" and len(call.args) > 3 and call.args[3]:  # input split sizes
            tensor, splits = call.args[1], call.args[3]
            row_bytes = tensor[0].numel() * tensor.element_size() if len(tensor) else 0
            wire = (sum(splits) - splits[call.group.rank()]) * row_bytes
        wire = payload * RING_WIRE_FACTOR[call.op](n) if wire is None else wire
        self.records.append(CommRecord(call.op, n, payload, wire, call.seconds))

    def _wrap_batch(self, fn):
        def recorded_batch(p2p_ops):
            start = time.perf_counter()
            self._inside.call = True  # its isends and irecvs are recorded below, once
            try:
                works = fn(p2p_ops)
            finally:
                self._inside.call = False
            seconds = (time.perf_counter() - start) / max(1, len(p2p_ops))
            for p in p2p_ops:
                isend = self._originals["isend"]
                op = "isend" if p.op is getattr(isend, "ledger_original", isend) else "irecv"  # P2POp holds torch's own
                payload = tensor_bytes(p.tensor)
                n = dist.get_world_size(p.group)
                self.records.append(CommRecord(op, n, payload, payload * RING_WIRE_FACTOR[op](n), seconds))
            return works

        return recorded_batch

    def total(self, field="wire_bytes", op=None):
        """Sum of a field ("payload_bytes", "wire_bytes", "seconds") over all calls, or one op's."""
        return sum(getattr(r, field) for r in self.records if op is None or r.op == op)

    def summary(self):
        """{op: {"calls", "payload_bytes", "wire_bytes", "seconds"}}, for a table."""
        out = {}
        for r in self.records:
            row = out.setdefault(r.op, {"calls": 0, "payload_bytes": 0, "wire_bytes": 0.0, "seconds": 0.0})
            row["calls"] += 1
            row["payload_bytes"] += r.payload_bytes
            row["wire_bytes"] += r.wire_bytes
            row["seconds"] += r.seconds
        return out

    def clear(self):
        self.records.clear()


def loopback_bytes():
    """Bytes sent so far through this machine's loopback interface, by all processes; None if unknown.

    Ranks on one machine running gloo talk over loopback, so two readings taken around a few steps
    (after a barrier), divided by the number of ranks, give what each rank really put on the wire,
    protocol headers included. Any other local traffic in that window counts too: keep it short.
    Under NCCL the bytes travel over NVLink or PCIe instead, and this counter does not see them.
    """
    counters = psutil.net_io_counters(pernic=True)
    for name in ("lo", "lo0"):  # Linux, macOS
        if name in counters:
            return counters[name].bytes_sent
    return None
