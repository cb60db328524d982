"""utils.comm.compat: the same collectives on torch 2.11-2.15, and CommLedger's bytes through its fallbacks.

The fallbacks are what torch 2.11 takes; on a newer torch they are forced by taking the new names
away (``all_gather_single``, ``reduce_scatter_single``) or by making the list ``all_to_all`` refuse
the way 2.11's gloo does.
"""

import contextlib

import pytest
import torch
import torch.distributed as dist

from utils import CommLedger, run_ranks
from utils.comm import compat

GLOO_2_11 = "Backend gloo does not support alltoall"  # torch 2.11's words for the missing list all_to_all


@contextlib.contextmanager
def torch_2_11():
    """Inside a rank: ``dist`` as torch 2.11 has it (no new names, gloo without the list all_to_all)."""
    saved = {name: getattr(dist, name) for name in ("all_gather_single", "reduce_scatter_single", "all_to_all")
             if hasattr(dist, name)}

    def all_to_all(*args, **kwargs):
        raise RuntimeError(GLOO_2_11)

    for name in ("all_gather_single", "reduce_scatter_single"):
        if hasattr(dist, name):
            delattr(dist, name)
    dist.all_to_all = all_to_all
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _collectives(old_torch):
    """Each compat collective once, inside a ledger; returns what arrived and what the ledger saw."""
    rank, n = dist.get_rank(), dist.get_world_size()
    with torch_2_11() if old_torch else contextlib.nullcontext():
        if old_torch:  # on torch 2.11 itself, "this torch" takes the fallbacks too
            assert not hasattr(dist, "all_gather_single")
        with CommLedger() as ledger:
            gathered = torch.empty(4 * n)
            compat.all_gather_single(gathered, torch.full((4,), float(rank)))  # output: 16 n bytes
            scattered = torch.empty(4)
            compat.reduce_scatter_single(scattered, torch.arange(4.0 * n))  # input: 16 n bytes
            sent = [torch.full((2, 3), 10.0 * rank + j) for j in range(n)]  # rank r sends rank j 10 r + j
            received = [torch.empty(2, 3) for _ in range(n)]  # (gloo's list all_to_all wants equal pieces)
            compat.all_to_all(received, sent)
    records = [(r.op, r.payload_bytes, r.wire_bytes) for r in ledger.records]
    return gathered.tolist(), scattered.tolist(), [t.tolist() for t in received], records


@pytest.mark.slow
@pytest.mark.parametrize("old_torch", [False, True], ids=["this torch", "torch 2.11 (fallbacks)"])
def test_compat_collectives_and_their_bytes(old_torch):
    n = 3
    results = run_ranks(_collectives, old_torch, world_size=n, verbose=False)
    for rank, (gathered, scattered, received, records) in enumerate(results):
        assert gathered == [float(r) for r in range(n) for _ in range(4)]
        assert scattered == [n * (4.0 * rank + i) for i in range(4)]  # piece r, summed over n ranks
        assert received == [[[10.0 * j + rank] * 3] * 2 for j in range(n)]
        all_to_all_bytes = n * 6 * 4  # what this rank sends
        # Once per call, under compat's name, whichever route it took: the fallback's inner
        # all_gather_into_tensor / all_to_all_single are part of the call, not extra records.
        assert records == [("all_gather_single", 16 * n, pytest.approx(16 * n * (n - 1) / n)),
                           ("reduce_scatter_single", 16 * n, pytest.approx(16 * n * (n - 1) / n)),
                           ("all_to_all", all_to_all_bytes, pytest.approx(all_to_all_bytes * (n - 1) / n))]


def test_ledger_puts_compat_back():
    before = (compat.all_gather_single, compat.reduce_scatter_single, compat.all_to_all)
    with CommLedger():
        assert compat.all_to_all is not before[2]
    assert (compat.all_gather_single, compat.reduce_scatter_single, compat.all_to_all) == before


def test_old_names_when_the_new_ones_are_missing(monkeypatch):
    calls = []
    monkeypatch.delattr(dist, "all_gather_single", raising=False)
    monkeypatch.delattr(dist, "reduce_scatter_single", raising=False)
    monkeypatch.setattr(dist, "all_gather_into_tensor", lambda *a, **k: calls.append(("gather", a, k)))
    monkeypatch.setattr(dist, "reduce_scatter_tensor", lambda *a, **k: calls.append(("scatter", a, k)))
    out, inp = torch.empty(4), torch.empty(2)
    compat.all_gather_single(out, inp)
    compat.reduce_scatter_single(inp, out, op=dist.ReduceOp.MAX)
    assert calls == [("gather", (out, inp), {"group": None, "async_op": False}),
                     ("scatter", (inp, out), {"op": dist.ReduceOp.MAX, "group": None, "async_op": False})]


def test_all_to_all_raises_other_errors(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("Tensors must be contiguous")

    monkeypatch.setattr(dist, "all_to_all", broken)
    monkeypatch.setattr(dist, "all_to_all_single", lambda *a, **k: pytest.fail("no fallback for other errors"))
    with pytest.raises(RuntimeError, match="contiguous"):
        compat.all_to_all([torch.empty(1)], [torch.empty(1)])
