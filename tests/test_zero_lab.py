"""The ZeRO lab's checker (utils/checkers/zero.py) accepts the reference and rejects planted wrong answers.

Each classic mistake of labs/03_zero_lab.ipynb is planted here, and the test asserts that the
checker names it (``LabCheckFailed.mistake``) and says the key phrase of its hint. The lab's
notebook itself runs in tests/test_notebooks.py.
"""

import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lab_grading import expect_rejection
from notebook_runner import ROOT
from utils import compat
from utils.adam import adam_update
from utils.checkers.zero import check_shard_bounds, check_zero1, check_zero2

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.zero import shard_bounds, zero1_step, zero2_step  # noqa: E402


# ------------------------------------------------------------------ shard_bounds: wrong answers

def bounds_floor(numel, rank, world_size):
    """numel // n per rank: the last numel % n elements belong to nobody."""
    size = numel // world_size
    return rank * size, (rank + 1) * size


def bounds_overlapping(numel, rank, world_size):
    size = -(-numel // world_size)
    return min(rank * size, numel), min((rank + 1) * size + 1, numel)


def bounds_unclipped(numel, rank, world_size):
    size = -(-numel // world_size)
    return rank * size, (rank + 1) * size


def bounds_tensor_split(numel, rank, world_size):
    """Uneven but covering (torch.tensor_split's sizes): right elements, wrong layout for the collectives."""
    size, extra = divmod(numel, world_size)
    start = rank * size + min(rank, extra)
    return start, start + size + (rank < extra)


def bounds_tensors(numel, rank, world_size):
    start, stop = shard_bounds(numel, rank, world_size)
    return torch.tensor(start), torch.tensor(stop)


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (bounds_floor, "lost_elements", "ceil(numel / n)"),
    (bounds_overlapping, "duplicated_elements", "rank r-1 stops"),
    (bounds_unclipped, "out_of_range", "min(..., numel)"),
    (bounds_tensor_split, "layout", "padded layout"),
    (bounds_tensors, "not_ints", "Python ints"),
], ids=lambda v: getattr(v, "__name__", None))
def test_shard_bounds_rejects(wrong, mistake, phrase):
    expect_rejection(check_shard_bounds, wrong, mistake=mistake, phrase=phrase)


# ------------------------------------------------------------------ the steps: wrong answers

def _bounds(flat):
    return shard_bounds(flat.numel(), dist.get_rank(), dist.get_world_size())


def _gather_parameters(flat_param):
    """The right all-gather, padded: for the wrong answers whose mistake lies elsewhere."""
    n, numel = dist.get_world_size(), flat_param.numel()
    start, stop = _bounds(flat_param)
    size = -(-numel // n)
    shard = flat_param.new_zeros(size)
    shard[: stop - start] = flat_param[start:stop]
    gathered = flat_param.new_empty(size * n)
    compat.all_gather_single(gathered, shard)
    flat_param.copy_(gathered[:numel])


def zero1_not_divided(flat_param, flat_grad, state, lr):
    start, stop = _bounds(flat_param)
    dist.all_reduce(flat_grad)  # the sum, never divided
    adam_update(flat_param[start:stop], flat_grad[start:stop], state, lr=lr)
    _gather_parameters(flat_param)


def zero2_not_divided(flat_param, flat_grad, state, lr):
    n, numel = dist.get_world_size(), flat_param.numel()
    start, stop = _bounds(flat_param)
    size = -(-numel // n)
    grad_shard = flat_grad.new_empty(size)
    compat.reduce_scatter_single(grad_shard, F.pad(flat_grad, (0, size * n - numel)))
    adam_update(flat_param[start:stop], grad_shard[: stop - start], state, lr=lr)
    _gather_parameters(flat_param)


def zero1_full_update(flat_param, flat_grad, state, lr):
    """DDP with extra steps: every rank updates everything, and keeps Adam's state for everything."""
    dist.all_reduce(flat_grad)
    flat_grad /= dist.get_world_size()
    adam_update(flat_param, flat_grad, state, lr=lr)
    _gather_parameters(flat_param)


def zero1_no_gather(flat_param, flat_grad, state, lr):
    start, stop = _bounds(flat_param)
    dist.all_reduce(flat_grad)
    flat_grad /= dist.get_world_size()
    adam_update(flat_param[start:stop], flat_grad[start:stop], state, lr=lr)


def zero2_all_reduce(flat_param, flat_grad, state, lr):
    """Right values, ZeRO-1's bill: the all-reduce was kept."""
    zero1_step(flat_param, flat_grad, state, lr)


def zero1_floor_shards(flat_param, flat_grad, state, lr):
    """Ignores shard_bounds: pieces of numel // n, so the tail is never updated."""
    rank, n = dist.get_rank(), dist.get_world_size()
    size = flat_param.numel() // n
    dist.all_reduce(flat_grad)
    flat_grad /= n
    adam_update(flat_param[rank * size:(rank + 1) * size], flat_grad[rank * size:(rank + 1) * size], state, lr=lr)
    gathered = flat_param.new_empty(size * n)
    compat.all_gather_single(gathered, flat_param[rank * size:(rank + 1) * size].clone())
    flat_param[: size * n] = gathered


def zero1_unpadded_gather(flat_param, flat_grad, state, lr):
    """Gathers shards of different sizes: gloo (and NCCL) want equal pieces."""
    n = dist.get_world_size()
    start, stop = _bounds(flat_param)
    dist.all_reduce(flat_grad)
    flat_grad /= n
    adam_update(flat_param[start:stop], flat_grad[start:stop], state, lr=lr)
    pieces = [flat_param.new_empty(b - a) for a, b in (shard_bounds(flat_param.numel(), r, n) for r in range(n))]
    dist.all_gather(pieces, flat_param[start:stop].clone())
    flat_param.copy_(torch.cat(pieces))


def zero2_unpadded_scatter(flat_param, flat_grad, state, lr):
    """Reduce-scatters Ψ elements into pieces of ceil(Ψ / n): the sizes do not add up without padding."""
    start, stop = _bounds(flat_param)
    grad_shard = flat_grad.new_empty(-(-flat_grad.numel() // dist.get_world_size()))
    compat.reduce_scatter_single(grad_shard, flat_grad)
    grad_shard /= dist.get_world_size()
    adam_update(flat_param[start:stop], grad_shard[: stop - start], state, lr=lr)
    _gather_parameters(flat_param)


HIDDEN_STATE = {}


def zero1_hidden_state(flat_param, flat_grad, state, lr):
    """Right values, but Adam's state lives in a global, where nobody can count (or checkpoint) it."""
    zero1_step(flat_param, flat_grad, HIDDEN_STATE.setdefault(flat_param.numel(), {}), lr)


def zero1_fresh_state(flat_param, flat_grad, state, lr):
    zero1_step(flat_param, flat_grad, {}, lr)


def zero1_broadcast_shards(flat_param, flat_grad, state, lr):
    """n broadcasts, one per shard: right values, n/(n-1) times an all-gather's bytes."""
    n = dist.get_world_size()
    start, stop = _bounds(flat_param)
    dist.all_reduce(flat_grad)
    flat_grad /= n
    adam_update(flat_param[start:stop], flat_grad[start:stop], state, lr=lr)
    for r in range(n):
        a, b = shard_bounds(flat_param.numel(), r, n)
        piece = flat_param[a:b].clone()
        dist.broadcast(piece, src=r)
        flat_param[a:b] = piece


def zero_stub(flat_param, flat_grad, state, lr):
    raise NotImplementedError("zero1_step is not written yet")


def test_references_pass():
    one = check_zero1(zero1_step, shard_bounds, world_sizes=(2, 4), steps=2)
    two = check_zero2(zero2_step, shard_bounds, world_sizes=(2, 3), steps=2)
    assert "3(n-1)/n x 4Ψ = 81,306" in str(one) and "world_size=3" in str(two)
    psi = one.measured[4]["psi"]
    assert one.measured[4]["state_bytes"] == 8 * -(-psi // 4)  # Adam's 8 bytes x rank 0's shard
    assert two.measured[2]["wire_bytes"] == 4 * psi  # 2(n-1)/n x 4Ψ at n=2, 9,034 divisible by 2


@pytest.mark.parametrize("check, wrong, world_sizes, mistake, phrase", [
    (check_zero1, zero1_not_divided, (2,), "not_divided", "dist.get_world_size()"),
    (check_zero2, zero2_not_divided, (3,), "not_divided", "dist.get_world_size()"),
    (check_zero1, zero1_full_update, (2,), "state_not_sharded", "flat_param[start:stop]"),
    (check_zero1, zero1_no_gather, (2,), "not_gathered", "all-gather the updated"),
    (check_zero2, zero2_all_reduce, (2,), "zero2_all_reduce", "reduce-scatter"),
    (check_zero1, zero1_floor_shards, (3,), "lost_elements", "never updated"),
    (check_zero1, zero1_unpadded_gather, (4,), "unequal_pieces", "pad the flat vector"),
    (check_zero2, zero2_unpadded_scatter, (4,), "unequal_pieces", "pad the flat vector"),
    (check_zero1, zero1_fresh_state, (2,), "state_reset", "restarts Adam"),
    (check_zero1, zero1_hidden_state, (2,), "state_hidden", "`state` dict"),
    (check_zero1, zero1_broadcast_shards, (2,), "bytes", "3(n-1)/n x 4Ψ"),
], ids=lambda v: getattr(v, "__name__", None))
def test_steps_reject(check, wrong, world_sizes, mistake, phrase):
    expect_rejection(check, wrong, shard_bounds, world_sizes=world_sizes, steps=2, mistake=mistake, phrase=phrase)


def test_wrong_shard_bounds_is_reported_before_the_step():
    expect_rejection(check_zero1, zero1_step, bounds_floor, world_sizes=(2,), steps=2, mistake="lost_elements")


def test_stub_raises_its_own_error():
    with pytest.raises(NotImplementedError, match="not written yet"):
        check_zero1(zero_stub, shard_bounds, world_sizes=(2,), steps=2)
