"""A memory ledger: how many bytes does this rank hold, and in what?

Derived in notebook 03 (ZeRO from scratch), where each ZeRO stage's per-rank bytes are put
beside the paper's formulas; used again by notebooks 04 (FSDP2) and 07b (DeepSpeed). Two measurements that work for *any* library, ours or FSDP2 or
DeepSpeed, because they look at what the process actually holds rather than at one API:

- ``live_tensor_bytes()``: the bytes of every tensor alive in this process, found through Python's
  garbage collector and counted once per storage (views and aliases share one), on one device;
- ``peak_rss_bytes()``: the operating system's high-water mark of this process's memory, which also
  includes the Python interpreter, torch's own code and the allocator's caches.

And the two sides of notebook 03's comparison, the formula and the count:

- ``zero_bytes_per_rank(psi, world_size, stage, param_bytes, grad_bytes, optim_bytes)``: the ZeRO
  paper's per-rank bytes of model states (plain DP and stages 1-3), general in bytes per number;
  ``bytes_per_param(dtype, optimizer)`` gives those bytes, e.g. (2, 2, 12) for the paper's
  mixed-precision Adam and (4, 4, 8) for fp32 Adam. The notebook's calculator widget calls it too;
- ``memory_ledger(params, optimizer, grads=None)``: the same three numbers counted from the tensors
  a rank really holds (each storage once), with ``peak_rss`` beside them.
"""

import contextlib
import gc
import os
import resource
import sys

import torch


def live_tensor_bytes(device="cpu"):
    """Bytes of all live tensors on ``device`` (type, e.g. "cpu" or "cuda"), each storage counted once.

    Slow-ish (it walks every Python object): call it between steps, not inside one. Tensors held
    only by C++ (e.g. inside an autograd graph) are invisible to it.
    """
    gc.collect()  # garbage waiting in reference cycles is not memory anyone holds
    seen, total = set(), 0
    for obj in gc.get_objects():
        try:
            if not issubclass(type(obj), torch.Tensor) or obj.device.type != device or obj.is_meta:  # type(): no proxies
                continue
            storage = obj.untyped_storage()
            key = storage.data_ptr()
        except Exception:  # noqa: BLE001, S112 - objects that raise on access; a DTensor's wrapper has no storage
            continue
        if key in seen or storage.nbytes() == 0:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def parameter_grad_bytes():
    """Bytes of the ``.grad`` of every ``nn.Parameter`` alive in this process (a DTensor's local shard), each storage
    once. ``live_tensor_bytes`` can miss them: autograd creates a gradient in C++, and the garbage collector lists
    it only once Python has touched it. Lesson 04c uses it for the unsharded gradients FSDP2 keeps on its own
    (private) unsharded parameters while ``set_requires_gradient_sync(False)`` skips the reduce-scatter."""
    from torch.distributed.tensor import DTensor

    gc.collect()
    grads = []
    for obj in gc.get_objects():
        try:  # isinstance, not type(): a DTensor parameter's type is DTensor, marked a parameter by ``_is_param``
            if issubclass(type(obj), torch.Tensor) and isinstance(obj, torch.nn.Parameter) and obj.grad is not None:
                grads.append(obj.grad)
        except Exception:  # noqa: BLE001, S112 - objects that raise on access
            continue
    return storage_bytes(g.to_local() if isinstance(g, DTensor) else g for g in grads)


def peak_rss_bytes():
    """This process's peak resident memory so far, in bytes (Linux and macOS report different units)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# --- The formula: bytes of model states per rank, ZeRO paper (Rajbhandari et al., arXiv 1910.02054) ---

#: bytes per *optimizer state* number, per optimizer (Adam keeps two: exp_avg and exp_avg_sq)
OPTIMIZER_STATES = {"sgd": 0, "sgd+momentum": 1, "adam": 2}


def bytes_per_param(dtype="fp32", optimizer="adam"):
    """(param_bytes, grad_bytes, optim_bytes K) per trainable number, for a precision and an optimizer.

    ``"fp32"``: fp32 parameters, gradients and optimizer state (what notebook 03's ZeRO trains):
    Adam gives (4, 4, 8). ``"mixed"``: fp16/bf16 parameters and gradients, plus an fp32 master copy
    of the parameters inside the optimizer state (the paper's mixed-precision Adam): (2, 2, 12).
    """
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"unknown optimizer {optimizer!r}; use one of {sorted(OPTIMIZER_STATES)}")
    states = OPTIMIZER_STATES[optimizer]
    if dtype == "fp32":
        return 4, 4, 4 * states
    if dtype == "mixed":
        return 2, 2, 4 + 4 * states  # fp32 master weights + fp32 states
    raise ValueError(f"unknown dtype {dtype!r}; use 'fp32' or 'mixed' (fp16/bf16 with an fp32 master copy)")


def zero_bytes_per_rank(num_params, world_size, stage, param_bytes=2, grad_bytes=2, optim_bytes=12):
    """Bytes of parameters, gradients and optimizer state that one rank holds, by the ZeRO paper.

    ``stage`` 0 is plain data parallelism (everything replicated); stage 1 (P_os) shards the
    optimizer state over the ``world_size`` ranks, stage 2 (P_os+g) also the gradients, stage 3
    (P_os+g+p) also the parameters. ``num_params`` is Psi, the number of trainable parameters (a count
    of values, not bytes). With the paper's mixed-precision Adam (2, 2, 12 bytes per parameter):

        stage 0: 16 Psi      stage 1: 4 Psi + 12 Psi/N      stage 2: 2 Psi + 14 Psi/N      stage 3: 16 Psi/N

    Model states only: activations, temporary buffers and fragmentation come on top. Returns a dict
    of floats (bytes) with keys params, grads, optim, total. DeepSpeed's own estimators budget more
    (for stage 2, 2 Psi + 18 Psi/N bytes: a transient fp32 gradient slice too); notebook 07b calls them.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0 (plain DP), 1, 2 or 3, not {stage!r}")
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: the model states are sharded over at least 1 rank")
    n = world_size
    out = {
        "params": param_bytes * num_params / (n if stage >= 3 else 1),
        "grads": grad_bytes * num_params / (n if stage >= 2 else 1),
        "optim": optim_bytes * num_params / (n if stage >= 1 else 1),
    }
    out["total"] = out["params"] + out["grads"] + out["optim"]
    return out


# --- The ledger: the same three numbers, counted from the tensors a rank really holds ---


def storage_bytes(tensors, seen=None):
    """Bytes of the storages behind ``tensors``, each storage counted once (views and aliases share it).

    ``seen`` (a set of storage addresses) lets several calls share the "counted once" rule. A storage
    resized to zero (a freed ZeRO-3 parameter) counts zero bytes.
    """
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def optimizer_state_tensors(optimizer):
    """Every tensor of a torch optimizer's state (Adam: exp_avg, exp_avg_sq and the step counter)."""
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def local_tensors(tensors):
    """This rank's part of each tensor: a DTensor's local shard, a plain tensor itself; ``None`` left out."""
    from torch.distributed.tensor import DTensor

    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors if t is not None]


def state_bytes(params, optimizer=None, grads=None, optim_tensors=(), by="storage"):
    """{"params", "grads", "optim", "total"}: the bytes of model states this rank holds, counted from the tensors.

    ``params``: the parameter tensors this rank holds (``model.parameters()``, flat buffers, shards; a DTensor
    counts its local shard); ``grads``: their gradients (default: the ``.grad`` of ``params``); ``optimizer``: a
    torch optimizer whose state is counted, plus any extra ``optim_tensors`` (e.g. fp32 master weights).
    ``by="storage"``: the storages behind the tensors, each storage once across the three groups (what the
    process holds: a view of a padded buffer counts the whole buffer); ``by="tensor"``: each distinct tensor's
    numel x element size (what a formula such as the planner's counts)."""
    if by not in ("storage", "tensor"):
        raise ValueError(f"by={by!r}: count by 'storage' (what the process holds) or 'tensor' (what a formula counts)")
    params = list(dict.fromkeys(params))  # a tied weight once
    grads = [p.grad for p in params] if grads is None else list(grads)
    optim = (optimizer_state_tensors(optimizer) if optimizer is not None else []) + list(optim_tensors)
    groups = {"params": local_tensors(params), "grads": local_tensors(grads), "optim": local_tensors(optim)}
    if by == "storage":
        seen = set()
        out = {name: storage_bytes(tensors, seen) for name, tensors in groups.items()}
    else:
        out = {name: sum(t.numel() * t.element_size() for t in tensors) for name, tensors in groups.items()}
    out["total"] = out["params"] + out["grads"] + out["optim"]
    return out


def memory_ledger(params, optimizer=None, grads=None, optim_tensors=()):
    """Per-rank bytes of parameters, gradients and optimizer state, counted from the storages (``state_bytes``),
    and the process's peak resident memory (``peak_rss``), which includes everything else (interpreter,
    activations, caches)."""
    out = state_bytes(params, optimizer, grads, optim_tensors)
    out["peak_rss"] = peak_rss_bytes()
    return out


# --- torch.profiler without its start/stop chatter (lesson 04c) ---


@contextlib.contextmanager
def _stderr_silenced():
    """The process's file descriptor 2 pointed at /dev/null for a moment (C++ writes there, past Python)."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def quiet_profile():
    """``torch.profiler.profile`` of CPU activity, yielding the profiler, without the two lines its Kineto library
    prints to stderr as it starts and stops ("USDT: ... profiler_start"): on a dozen profiled steps of four ranks
    they would bury a notebook's output. Only the start and the stop are silenced, never the profiled code.
    Kineto reads ``KINETO_LOG_LEVEL`` once, when torch is loaded, which a rank cannot change afterwards."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU])
    with _stderr_silenced():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _stderr_silenced():
            prof.__exit__(None, None, None)
