"""utils.scale_out.resume, the loop of lesson 11a: its bookkeeping, its refusals, and a resume that is bitwise exact."""

import pytest
import torch.distributed as dist

from utils import run_ranks
from utils.scale_out.resume import join_losses, latest_checkpoint, store_generation, train

pytestmark = pytest.mark.usefixtures("no_children_left")


def test_join_losses_keeps_one_value_per_step_and_refuses_disagreement():
    first = [{"attempt": 0, "step": s, "loss": f"0x1.{s}p+0"} for s in (1, 2, 3)]
    second = [{"attempt": 1, "step": s, "loss": f"0x1.{s}p+0"} for s in (3, 4)]
    assert join_losses(first + second) == ["0x1.1p+0", "0x1.2p+0", "0x1.3p+0", "0x1.4p+0"]
    with pytest.raises(AssertionError, match="step 3 computed twice"):
        join_losses(first + [{"attempt": 1, "step": 3, "loss": "0x1.9p+0"}])


def test_store_generation_is_shared_by_the_workers_of_a_generation():
    store = dist.HashStore()
    # two generations of 3 workers, whatever order they start in within a generation
    assert [store_generation(store, 3) for _ in range(6)] == [0, 0, 0, 1, 1, 1]


def test_latest_checkpoint_skips_a_save_cut_short(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    for step in (4, 8, 12):
        (tmp_path / f"step_{step:05d}").mkdir()
    for step in (4, 8):  # step 12 has no .metadata: DCP writes it last, so that save was interrupted
        (tmp_path / f"step_{step:05d}" / ".metadata").write_bytes(b"")
    assert latest_checkpoint(tmp_path).name == "step_00008"


def test_train_refuses_a_kill_before_the_first_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="kill_step=4 comes before the first checkpoint"):
        train(10, tmp_path, 4, kill_rank=1, kill_step=4)
    with pytest.raises(ValueError, match="needs a ckpt_root"):
        train(10, None, 4)


def _full_then_resumed(root, steps, ckpt_every, resume_from):
    full = train(steps, root + "/full", ckpt_every)
    half = train(resume_from, root + "/half", ckpt_every)  # stops at a checkpoint ...
    rest = train(steps, root + "/half", ckpt_every)  # ... and a second call goes on from it
    no_rng = train(steps, root + "/full", 0, resume=resume_from, restore_rng=False)
    no_data = train(steps, root + "/full", 0, resume=resume_from, restore_data=False)
    return full, half + rest, no_rng, no_data


@pytest.mark.slow
def test_resume_is_bitwise_and_omissions_are_not(tmp_path):
    full, joined, no_rng, no_data = run_ranks(_full_then_resumed, str(tmp_path), 10, 2, 6, world_size=2,
                                              backend="gloo", timeout=300, verbose=False)[0]
    assert len(full) == 10 and joined == full  # float.hex strings: bitwise
    assert no_rng[0] != full[6] and no_data[0] != full[6]  # each omission changes the very next step
