"""utils.sharding.fsdp2's batches (lessons 04a, 04b and 04c): equal slices that add up to the global batch, and the
one-process reference they are checked against (``utils.models.train_reference``) trained on exactly those batches."""

import pytest
import torch
import torch.nn.functional as F

from utils.models import make_model, train_reference
from utils.sharding.fsdp2 import FSDP_BATCH, FSDP_LR, fsdp_batch


def test_fsdp_batch_slices_are_equal_and_cover_the_global_batch():
    x, y = fsdp_batch(2)  # one process: the whole global batch
    assert x.shape == (FSDP_BATCH, 64) and y.shape == (FSDP_BATCH,)
    for n in (2, 3, 4, 5, 6, 8):
        pieces = [fsdp_batch(2, r, n) for r in range(n)]
        assert {p[0].shape[0] for p in pieces} == {FSDP_BATCH // n}
        assert torch.equal(torch.cat([p[0] for p in pieces]), x) and torch.equal(torch.cat([p[1] for p in pieces]), y)


def test_fsdp_batch_refuses_unequal_slices():
    with pytest.raises(ValueError, match="multiple of 7"):
        fsdp_batch(0, 0, 7)


def test_the_reference_trains_on_lesson_04s_batches():
    """``train_reference(..., "adam", ordered=False)`` is one process on ``fsdp_batch``'s whole global batches."""
    state, losses = train_reference(3, FSDP_BATCH, "adam", FSDP_LR, hidden=32, ordered=False)
    model = make_model(hidden=32)
    opt = torch.optim.Adam(model.parameters(), lr=FSDP_LR)
    expected = []
    for step in range(3):
        x, y = fsdp_batch(step)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        expected.append(loss.item())
    assert losses == expected  # the same model, batches and Adam: bit for bit
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_full_tensor_unremarked_drops_only_the_all_gather_note():
    """torch's own warning function, driven with a stand-in mesh (it reads only its hash and dimension names): inside
    the context the all_gather note is dropped, a reduce_scatter note and any other message pass; outside it, all."""
    import logging

    from torch.distributed.tensor import _redistribute

    from utils.sharding.fsdp2 import full_tensor_unremarked

    class Mesh:  # a new object each call, kept alive (its hash is its id): a key torch has not warned about yet
        mesh_dim_names = ("dp", "tp")

    meshes = []

    def note(collective):
        meshes.append(Mesh())
        _redistribute._warn_flatten_optimization_not_possible(
            meshes[-1], (1, 0), ("_StridedShard(dim=0)", "Shard(dim=0)"), ("Replicate()", "Replicate()"), 2, collective,
            "non_ascending_mesh_dims")

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    log, handler = _redistribute.logger, Keep()
    assert log.name == "torch.distributed.tensor._redistribute"  # the logger full_tensor_unremarked filters
    log.addHandler(handler)
    try:
        with full_tensor_unremarked():
            note("all_gather")
            note("reduce_scatter")
            log.warning("another message")
        note("all_gather")
    finally:
        log.removeHandler(handler)
    assert len(seen) == 3, seen
    assert seen[0].startswith("While redistributing from") and "2 sequential reduce_scatter operations" in seen[0]
    assert seen[1] == "another message" and "sequential all_gather operations" in seen[2], seen
