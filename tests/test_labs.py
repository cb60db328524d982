"""The lab checkers accept the reference solutions and reject planted wrong answers, each with its hint.

A checker that accepts nonsense is worse than no checker: every classic mistake a lab names is
planted here, and the test asserts the checker recognises it (``LabCheckFailed.mistake``) and says
the key phrase of its hint. The labs' notebooks themselves run in tests/test_notebooks.py.
"""

import sys

import pytest
import torch
import torch.distributed as dist

from lab_grading import expect_rejection
from notebook_runner import ROOT
from utils.checkers.ddp import check_ddp
from utils.checkers.ring_all_reduce import check_ring_all_reduce

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.ddp import average_gradients, broadcast_parameters  # noqa: E402
from solutions.ring_all_reduce import ring_all_reduce  # noqa: E402


# ------------------------------------------------------------------ ring all-reduce: wrong answers

def _exchange(send, recv, right, left):
    reqs = [dist.isend(send, right), dist.irecv(recv, left)]
    for req in reqs:
        req.wait()


def ring_passing_whole_tensors(tensor):
    """Correct sums, but each step sends the whole tensor: (n-1) x numel per rank instead of 2(n-1)/n."""
    rank, n = dist.get_rank(), dist.get_world_size()
    passing, total = tensor.clone(), tensor.clone()
    for _ in range(n - 1):
        incoming = torch.empty_like(passing)
        _exchange(passing, incoming, (rank + 1) % n, (rank - 1) % n)
        total += incoming
        passing = incoming
    tensor.copy_(total)


def _ring(tensor, chunks, all_gather=True, blocking=False, average=False):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        send, recv = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        incoming = torch.empty_like(recv)
        if blocking:  # every rank sends first: each waits for a recv nobody has posted
            dist.send(send, right)
            dist.recv(incoming, left)
        else:
            _exchange(send, incoming, right, left)
        recv += incoming
    for step in range(n - 1 if all_gather else 0):
        _exchange(chunks[(rank + 1 - step) % n], chunks[(rank - step) % n], right, left)
    if average:
        tensor /= n


def ring_off_by_one(tensor):
    """Chunks of numel // n elements: the last numel % n elements belong to no chunk."""
    n, size = dist.get_world_size(), tensor.numel() // dist.get_world_size()
    _ring(tensor, [tensor.view(-1)[i * size:(i + 1) * size] for i in range(n)])


def ring_blocking_send(tensor):
    _ring(tensor, torch.tensor_split(tensor.view(-1), dist.get_world_size()), blocking=True)


def ring_reduce_scatter_only(tensor):
    _ring(tensor, torch.tensor_split(tensor.view(-1), dist.get_world_size()), all_gather=False)


def ring_averaging(tensor):
    _ring(tensor, torch.tensor_split(tensor.view(-1), dist.get_world_size()), average=True)


def ring_calling_all_reduce(tensor):
    dist.all_reduce(tensor)


def ring_stub(tensor):
    raise NotImplementedError("ring_all_reduce: not written yet")


def test_ring_reference_passes():
    result = check_ring_all_reduce(ring_all_reduce, world_sizes=(2, 3, 4))
    assert "2(n-1)/n = 1.5000" in str(result)


@pytest.mark.parametrize("wrong, world_sizes, mistake, phrase", [
    (ring_passing_whole_tensors, (2, 3), "too_many_bytes", "ONE chunk"),
    (ring_off_by_one, (3,), "uncovered", "never summed"),
    (ring_reduce_scatter_only, (2,), "reduce_scatter_only", "all-gather"),
    (ring_reduce_scatter_only, (4,), "reduce_scatter_only", "all-gather"),
    (ring_averaging, (2,), "averaged", "do not divide"),
    (ring_calling_all_reduce, (2,), "used_collective", "point-to-point"),
], ids=lambda v: getattr(v, "__name__", None))
def test_ring_rejects(wrong, world_sizes, mistake, phrase):
    expect_rejection(check_ring_all_reduce, wrong, world_sizes=world_sizes, mistake=mistake, phrase=phrase)


def test_ring_rejects_deadlock():
    expect_rejection(check_ring_all_reduce, ring_blocking_send, world_sizes=(2,), timeout=5, mistake="deadlock", phrase="waits for the matching recv")


def test_ring_stub_raises_its_own_error():
    with pytest.raises(NotImplementedError, match="not written yet"):
        check_ring_all_reduce(ring_stub, world_sizes=(2,))


# ------------------------------------------------------------------ DDP: wrong answers

def average_without_dividing(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


def average_frozen_too(model):  # p.grad is None for the frozen parameter: crashes
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def average_frozen_zeros(model):  # no crash, but reduces zeros for the frozen parameter
    for p in model.parameters():
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(grad)
        grad /= dist.get_world_size()


def average_tied_twice(model):
    for _, p in model.named_parameters(remove_duplicate=False):
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def broadcast_parameters_only(model):
    for p in model.parameters():
        dist.broadcast(p.data, src=0)


def broadcast_nothing(model):
    pass


def broadcast_trainable_only(model):
    for p in model.parameters():
        if p.requires_grad:
            dist.broadcast(p.data, src=0)
    for b in model.buffers():
        dist.broadcast(b, src=0)


def test_ddp_reference_passes():
    result = check_ddp(broadcast_parameters, average_gradients, world_sizes=(2, 4), steps=3)
    assert "world_size=4" in str(result)


@pytest.mark.parametrize("broadcast, average, mistake, phrase", [
    (broadcast_parameters, average_without_dividing, "not_divided", "divide by dist.get_world_size()"),
    (broadcast_parameters, average_frozen_too, "frozen_reduced", "skip it"),
    (broadcast_parameters, average_frozen_zeros, "frozen_reduced", "skip it"),
    (broadcast_parameters, average_tied_twice, "tied_twice", "remove_duplicate=False"),
    (broadcast_parameters_only, average_gradients, "buffers", "buffers"),
    (broadcast_nothing, average_gradients, "no_broadcast", "src=0"),
    (broadcast_trainable_only, average_gradients, "frozen_not_broadcast", "trainable or not"),
], ids=lambda v: getattr(v, "__name__", None))
def test_ddp_rejects(broadcast, average, mistake, phrase):
    expect_rejection(check_ddp, broadcast, average, world_sizes=(2,), steps=2, mistake=mistake, phrase=phrase)
