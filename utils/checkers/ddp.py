"""The checker of lab 02 (data parallelism from scratch): broadcast and gradient averaging, checked on ranks.

Used by ``labs/02_ddp_lab.ipynb``, which derives what is checked here. Same conventions as every lab
(``utils.checkers.common``). Two kinds of evidence: **values**, compared with one process training on the
global batch (n times the mean gradient means a forgotten division), and **bytes**, from ``CommLedger``
(a gradient reduced twice gives the right values and the wrong bill).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..datasets import digits
from ..launch import rank_device
from ..ledger import CommLedger
from ..models import ToyNet
from .common import GRAD_TOL, WEIGHT_TOL, CheckResult, LabCheckFailed, caught, close, first_error, launch_answer, raise_if_error

DDP_HINTS = {
    "deadlock": "some rank makes a collective call that the others skip (a condition that differs between ranks?).",
    "no_broadcast": "each rank built its model from its own random seed: call dist.broadcast(tensor, src=0) on "
                    "every parameter in broadcast_parameters, so all replicas start from rank 0's weights.",
    "frozen_not_broadcast": "a frozen parameter (requires_grad=False, here input_scale) gets no gradient but is "
                            "still state: broadcast every parameter, trainable or not.",
    "buffers": "buffers (model.buffers(): running statistics, here input_shift) are state too: broadcast them as "
               "well as the parameters.",
    "frozen_reduced": "a frozen parameter (requires_grad=False) has .grad None: skip it (if p.grad is None: "
                      "continue) instead of all-reducing it or a zero tensor.",
    "tied_twice": "a tied weight (mix2.weight is mix1.weight) is ONE tensor: iterate model.parameters(), which "
                  "lists it once, not named_parameters(remove_duplicate=False).",
    "not_divided": "all_reduce sums the gradients; divide by dist.get_world_size() to get the mean, which is the "
                   "gradient of the loss on the global batch.",
    "not_reduced": "the gradients still differ between ranks: all-reduce every gradient (dist.all_reduce(p.grad)).",
    "wrong_gradients": "after average_gradients every gradient must equal the mean of the ranks' gradients.",
    "bytes": "reduce each trainable gradient once, through dist.all_reduce (so that CommLedger sees it).",
    "diverged": "the weights drift from single-process training: check that nothing else changes the weights.",
}


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a, b):
    return max((a[k].double() - b[k].double()).abs().max().item() for k in b)


def _ddp_on_rank(broadcast_parameters, average_gradients, x, y, batches, lr, seed):
    """Runs on every rank: a different random init per rank, broadcast, then SGD on a shard."""
    rank, n, device = dist.get_rank(), dist.get_world_size(), rank_device()
    torch.manual_seed(seed + rank)  # every rank starts different, so a missing broadcast shows
    model = ToyNet().to(device)
    out, stage = dict(initial=_state(model), error=None), "broadcast_parameters"
    try:
        with CommLedger() as ledger:
            broadcast_parameters(model)
        out.update(after_broadcast=_state(model), broadcast_bytes=ledger.total("payload_bytes"))
        stage, opt = "average_gradients", torch.optim.SGD(model.parameters(), lr=lr)
        x, y = x.to(device), y.to(device)
        for step, idx in enumerate(batches):
            mine = idx.view(n, -1)[rank]  # this rank's equal share of the global batch
            opt.zero_grad()
            F.cross_entropy(model(x[mine]), y[mine]).backward()
            with CommLedger() as ledger:
                average_gradients(model)
            if step == 0:
                out.update(reduce_bytes=ledger.total("payload_bytes"), grads={
                    k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
            opt.step()
        out["final"] = _state(model)
    except Exception as exc:  # noqa: BLE001 - reported to the learner in the kernel
        out["error"] = caught(exc, stage)
    return out


def _single_process(x, y, batches, lr, seed):
    """The truth: one process, rank 0's init, the whole global batch at every step."""
    torch.manual_seed(seed)
    model = ToyNet()
    opt, grads = torch.optim.SGD(model.parameters(), lr=lr), None
    for idx in batches:
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        grads = grads or {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        opt.step()
    return grads, _state(model)


def check_ddp(broadcast_parameters, average_gradients, world_sizes=(2, 4), steps=5, lr=0.2, timeout=60.0):
    """Check a from-scratch DDP: ``broadcast_parameters(model)`` and ``average_gradients(model)``.

    On each world size n, every rank builds ``ToyNet`` from its own seed, calls
    ``broadcast_parameters``, then trains ``steps`` SGD steps on its 16 samples of a 16n-sample
    global batch of ``digits()``, calling ``average_gradients`` after each backward. Demands:
    (1) after the broadcast every rank holds rank 0's parameters, frozen ones and buffers;
    (2) the all-reduced payload is exactly the trainable gradients' bytes, each tensor once (a
    frozen or tied tensor reduced anyway shows as its exact size in extra bytes); (3) the first
    gradients equal one process's on the global batch (n times them: not divided); (4) the weights
    after ``steps`` steps equal single-process training (tolerances: GRAD_TOL, WEIGHT_TOL).
    """
    __tracebackhide__ = True
    x, y = digits()
    probe = ToyNet()
    buffers = {k for k, _ in probe.named_buffers()}
    frozen = {k for k, p in probe.named_parameters() if not p.requires_grad}
    size = {k: p.numel() * p.element_size() for k, p in probe.named_parameters()}
    trainable, frozen_bytes = sum(size[k] for k in size if k not in frozen), sum(size[k] for k in frozen)
    lines = []
    for n in world_sizes:
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(n))
        batches = order.repeat(1 + steps * 16 * n // len(x))[: steps * 16 * n].view(steps, 16 * n)  # (steps, 16n)
        ranks = launch_answer(_ddp_on_rank, (broadcast_parameters, average_gradients, x, y, batches, lr, 1000), n, timeout,
                        "broadcast_parameters / average_gradients", DDP_HINTS["deadlock"])
        error = first_error(ranks)
        if error and error[2].startswith("in broadcast_parameters"):
            raise_if_error(error, n, DDP_HINTS)
        start = ranks[0]["initial"]
        differ = {k for r in ranks for k in start if not torch.equal(r["after_broadcast"][k], start[k])}
        for mistake, keys in (("no_broadcast", differ - buffers - frozen), ("buffers", differ & buffers),
                              ("frozen_not_broadcast", differ & frozen)):
            if keys:
                raise LabCheckFailed(mistake, f"after broadcast_parameters, {sorted(keys)} differ from rank 0's "
                                     "initial values on some rank.", DDP_HINTS[mistake], n)
        raise_if_error(error, n, DDP_HINTS, phrases=[("NoneType", "frozen_reduced")])
        extra, tied = ranks[0]["reduce_bytes"] - trainable, size["mix1.weight"]  # a known tensor's exact size?
        for mistake, waste in (("tied_twice", tied), ("frozen_reduced", frozen_bytes),
                               ("tied_twice", tied + frozen_bytes)):
            if extra == waste:
                raise LabCheckFailed(mistake, f"the values may be right, but average_gradients reduced {extra:,} "
                                     f"bytes more than the {trainable:,} bytes of trainable gradients.",
                                     DDP_HINTS[mistake], n)
        ref_grads, ref_final = _single_process(x, y, batches, lr, 1000)
        grads = ranks[0]["grads"]
        if grads.keys() != ref_grads.keys() or any(_max_diff(r["grads"], grads) > 0 for r in ranks):
            raise LabCheckFailed("not_reduced", f"the gradients of {sorted(grads)} differ between ranks (one process "
                                 f"has gradients for {sorted(ref_grads)}).", DDP_HINTS["not_reduced"], n)
        diff = _max_diff(grads, ref_grads)
        if not close(grads, ref_grads, GRAD_TOL):
            mistake = "not_divided" if _max_diff(grads, {k: n * g for k, g in ref_grads.items()}) < 1e-4 else \
                "wrong_gradients"
            raise LabCheckFailed(mistake, f"the gradients after average_gradients differ from one process on the "
                                 f"global batch by up to {diff:.3g}.", DDP_HINTS[mistake], n)
        if extra:
            raise LabCheckFailed("bytes", f"average_gradients reduced {ranks[0]['reduce_bytes']:,} bytes, not the "
                                 f"{trainable:,} bytes of trainable gradients.", DDP_HINTS["bytes"], n)
        drift = max(_max_diff(r["final"], ref_final) for r in ranks)
        if not all(close(r["final"], ref_final, WEIGHT_TOL) for r in ranks):
            raise LabCheckFailed("diverged", f"after {steps} steps the weights differ from single-process training "
                                 f"by up to {drift:.3g}.", DDP_HINTS["diverged"], n)
        lines.append(f"world_size={n}: replicas = rank 0 after broadcast ({ranks[0]['broadcast_bytes']:,} bytes); "
                     f"gradients = one process (max diff {diff:.1e}); all-reduced {trainable:,} bytes per step = the "
                     f"trainable gradients, once; weights after {steps} steps = one process (max diff {drift:.1e})")
    return CheckResult("broadcast_parameters + average_gradients", lines)
