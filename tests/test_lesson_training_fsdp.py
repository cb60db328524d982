"""utils.lesson_training.fsdp_batch and fsdp_reference (lessons 04a and 04b): equal slices that add up to the
global batch, and a one-process reference equal to the losses the course's other reference computes."""

import pytest
import torch

from utils import lesson_training as lt


def test_fsdp_batch_slices_are_equal_and_cover_the_global_batch():
    x, y = lt.fsdp_batch(2)  # one process: the whole global batch
    assert x.shape == (lt.FSDP_BATCH, 64) and y.shape == (lt.FSDP_BATCH,)
    for n in (2, 3, 4, 5, 6, 8):
        pieces = [lt.fsdp_batch(2, r, n) for r in range(n)]
        assert {p[0].shape[0] for p in pieces} == {lt.FSDP_BATCH // n}
        assert torch.equal(torch.cat([p[0] for p in pieces]), x) and torch.equal(torch.cat([p[1] for p in pieces]), y)


def test_fsdp_batch_refuses_unequal_slices():
    with pytest.raises(ValueError, match="multiple of 7"):
        lt.fsdp_batch(0, 0, 7)


def test_fsdp_reference_matches_reference_losses():
    state, losses = lt.fsdp_reference(range(3), hidden=32)
    expected = lt.reference_losses(3, lt.FSDP_BATCH, "adam", lt.FSDP_LR, hidden=32, ordered=False)
    assert losses == expected  # the same model, batches and Adam: bit for bit
    assert set(state) == set(lt.make_model(hidden=32).state_dict())
