"""Every call that reaches a process group from Python, seen where all of ``torch.distributed``'s paths meet.

``CommLedger`` once counted bytes by replacing the functions of the ``torch.distributed`` module. A call that
does not look the name up there at call time stepped around it: ``distributed_c10d.all_reduce``, or an
``isend`` imported with ``from torch.distributed import isend`` before the ledger opened. All of them end in
one place, read in ``torch/distributed/distributed_c10d.py`` (torch 2.11-2.15): a method of the
``ProcessGroup`` object (``group.send([tensor], dst, tag)``, ``group.allreduce([tensor], opts)``, ...),
which is a pybind class, ``torch._C._distributed_c10d.ProcessGroup``, whose attributes can be replaced.
So ``observe(callback)`` replaces those methods (and the same ones of the ``Backend`` class, reached by
``group._get_backend(device)``) while a callback is registered, and tells it of every call, with:

- ``op``: the ``torch.distributed`` function the calling code entered (the outermost one of torch's frames,
  through its logging and deprecation decorators: ``all_gather_into_tensor``, not the ``all_gather_single`` it
  calls; ``isend`` inside ``batch_isend_irecv``), or the method's own collective when called directly
  (``group.allreduce`` is ``all_reduce``). None when the call is torch's own machinery: an object collective
  (``all_gather_object``), ``new_group``, FSDP, DDP's constructor: those went unrecorded before, and still do;
- ``group`` (its ``size()`` is the number of ranks), ``method``, ``args`` and ``seconds`` in the method (for a
  synchronous collective, the wait that ``torch.distributed`` does after it is not included);
- ``work``, what the method returned (the ``Work`` that ``async_op=True`` hands to the caller), and ``async_op``,
  the value of that argument in the frame of the ``torch.distributed`` function the caller entered (read from the
  frame, so however it was passed), or None for a method called directly, whose work the caller always gets.

What C++ calls by itself (torch DDP's reducer) is not seen, as by any Python wrapper.
"""

import contextlib
import dataclasses
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

__all__ = ["ProcessGroupCall", "observe", "payload_bytes", "watch_class"]

# method -> (the collective it runs when called directly, the argument that holds the full-sized side).
# The sides are CommLedger's convention: all-gather the output, reduce-scatter / all-to-all / gather the input.
METHODS = {
    "allreduce": ("all_reduce", 0), "allreduce_coalesced": ("all_reduce", 0), "broadcast": ("broadcast", 0),
    "reduce": ("reduce", 0), "allgather": ("all_gather", 0), "allgather_coalesced": ("all_gather", 0),
    "_allgather_base": ("all_gather_single", 0), "all_gather_single": ("all_gather_single", 0),
    "allgather_into_tensor_coalesced": ("all_gather_single", 0),
    "all_gather_single_coalesced": ("all_gather_single", 0), "reduce_scatter": ("reduce_scatter", 1),
    "_reduce_scatter_base": ("reduce_scatter_single", 1), "reduce_scatter_single": ("reduce_scatter_single", 1),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_single", 1),
    "reduce_scatter_single_coalesced": ("reduce_scatter_single", 1), "alltoall": ("all_to_all", 1),
    "alltoall_base": ("all_to_all_single", 1), "all_to_all_single": ("all_to_all_single", 1),
    "gather": ("gather", 1), "scatter": ("scatter", 1), "send": ("isend", 0), "recv": ("irecv", 0),
    "recv_anysource": ("irecv", 0), "barrier": ("barrier", None),
}
# the torch.distributed functions a call may enter by (CommLedger's table), and the one that calls them for you
OPS = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
       "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single", "broadcast", "reduce",
       "gather", "scatter", "send", "isend", "recv", "irecv", "barrier")
ENTRIES = frozenset(OPS) | {"batch_isend_irecv"}
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_TORCH_DIST = os.path.dirname(os.path.abspath(dist.__file__)) + os.sep
_DECORATORS = ("typing_extensions.py", "warnings.py", "functools.py", "contextlib.py")  # between torch's frames
_LOGGER = os.path.join("distributed", "c10d_logger.py")  # _exception_logger, _time_logger: they wrap every op
_CLASSES = [cls for cls in (getattr(torch._C._distributed_c10d, name, None) for name in ("ProcessGroup", "Backend"))
            if cls is not None]


@dataclasses.dataclass
class ProcessGroupCall:
    """One call of a process group's (or backend's) method that the calling code made (see the module docstring)."""

    op: str
    method: str
    group: object
    args: tuple
    seconds: float
    work: object = None
    async_op: bool | None = None

    @property
    def size(self):
        return self.group.size()


def tensor_bytes(obj):
    """Bytes of a tensor, or of the tensors in a (nested) list or tuple; 0 for anything else."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(o) for o in obj)
    return 0


def payload_bytes(call):
    """Bytes of the full-sized side of ``call`` (scatter: the inputs on the source rank, else the output)."""
    side = METHODS[call.method][1]
    if side is None or len(call.args) <= side:
        return 0
    return tensor_bytes(call.args[side]) or (tensor_bytes(call.args[0]) if call.method == "scatter" else 0)


def _entered(frame, method):
    """The torch.distributed function the caller entered (see the module docstring), or None for torch's own.

    The walk goes up through torch's frames (all of torch: DDP's Python side lives in torch/nn/parallel) and
    the decorators between them, and stops at the first frame of other code: the answer, a lesson, a hook."""
    outermost, op = None, None
    while frame is not None:
        filename, name = frame.f_code.co_filename, frame.f_code.co_name
        if filename.startswith(_TORCH):
            if not filename.endswith(_LOGGER) and name != "wrapper":  # the logging decorators, whatever their name
                outermost = name if filename.startswith(_TORCH_DIST) else f"torch's {name}"
                op = name if name in OPS and filename.startswith(_TORCH_DIST) else op
        elif not filename.endswith(_DECORATORS):
            break
        frame = frame.f_back
    if outermost is None:
        return METHODS[method][0]  # group.allreduce(...) called by the answer itself
    return op if outermost in ENTRIES else None


def _async_op(frame, op):
    """``async_op`` of the ``torch.distributed`` function ``op`` whose frame is above ``frame``; None if none is."""
    while frame is not None:
        if frame.f_code.co_name == op and frame.f_code.co_filename.startswith(_TORCH_DIST):
            return bool(frame.f_locals.get("async_op"))  # torch runs a falsy one (None too) synchronously
        frame = frame.f_back
    return None


_observers, _lock, _originals = [], threading.Lock(), {}


def _patched(method, original):
    def call(self, *args, **kwargs):
        if not _observers:
            return original(self, *args, **kwargs)
        start = time.perf_counter()
        result = original(self, *args, **kwargs)
        seconds = time.perf_counter() - start
        op = _entered(sys._getframe(1), method)
        if op is not None:
            seen = ProcessGroupCall(op, method, self, args + tuple(kwargs.values()), seconds, result,
                                    _async_op(sys._getframe(1), op))
            for observer in list(_observers):
                replaced = observer(seen)
                result = result if replaced is None else replaced  # a checker's held work (utils.checkers.ddp)
        return result

    call.__name__ = method
    return call


def watch_class(cls):
    """Watch the methods of ``cls`` too, a process group written in Python (``utils.launch.relay``), whose methods
    replace the pybind class's: from the next ``observe`` on."""
    with _lock:
        if cls not in _CLASSES:
            _CLASSES.append(cls)


@contextlib.contextmanager
def observe(observer):
    """While the block runs, ``observer(ProcessGroupCall)`` is told of every call the code makes to a process group.
    An observer returns None, or what the caller gets instead of the method's result (a ``Work`` that completes later
    than the real one: lab 02's checker).

    The methods are replaced when the first observer comes and put back when the last one leaves."""
    with _lock:
        if not _observers:
            for cls in _CLASSES:
                for method in METHODS:
                    if method in cls.__dict__:
                        _originals[cls, method] = cls.__dict__[method]
                        setattr(cls, method, _patched(method, _originals[cls, method]))
        _observers.append(observer)
    try:
        yield
    finally:
        with _lock:
            _observers.remove(observer)
            if not _observers:
                for (cls, method), original in _originals.items():
                    setattr(cls, method, original)
                _originals.clear()
