"""utils.lightning.toy: lesson 08's LightningModule is importable by name, and says what is wrong at once."""

import logging
import pickle

import pytest
import torch
from torch.utils.data import TensorDataset

from utils.lightning.toy import GLOBAL_BATCH, LitToy, digits_in_order, make_model, quiet_lightning


def test_littoy_travels_by_name():
    """The reason it is a module: a process that unpickles it finds the class by its import path."""
    x, y = digits_in_order()
    model = LitToy(TensorDataset(x[:GLOBAL_BATCH], y[:GLOBAL_BATCH]))
    blob = pickle.dumps(model)
    assert b"utils.lightning.toy" in blob and b"__main__" not in blob
    copy = pickle.loads(blob)
    torch.testing.assert_close(copy.net.state_dict(), model.net.state_dict(), rtol=0, atol=0)


def test_make_model_leaves_the_global_generator_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    a, b = make_model(0), make_model(0)
    assert torch.equal(torch.rand(3), expected), "seed_everything's generator must not be reset"
    torch.testing.assert_close(a.state_dict(), b.state_dict(), rtol=0, atol=0)


def test_digits_in_order_is_fixed():
    (x1, y1), (x2, y2) = digits_in_order(), digits_in_order()
    assert x1.shape == (1797, 64) and torch.equal(x1, x2) and torch.equal(y1, y2)


def test_indivisible_global_batch_names_the_numbers():
    x, y = digits_in_order()
    model = LitToy(TensorDataset(x[:70], y[:70]), global_batch=70)

    class Trainer:
        world_size, global_rank = 3, 0

    model._trainer = Trainer()  # what the Trainer sets when it attaches itself
    with pytest.raises(ValueError, match="global batch 70 is not divisible by 3 ranks; use a multiple of 3"):
        model.train_dataloader()


def test_quiet_lightning_silences_the_banners_and_keeps_lightnings_warnings():
    """Lightning's real loggers: its info lines (the banners) are off, its logged warnings (signal_connector's failed
    SLURM requeue) still print, and of its ``warnings.warn`` ones only the two the lessons make on purpose are off."""
    import warnings

    import lightning_utilities.core.rank_zero as rank_zero  # rank_zero_info's logger: Lightning's, once imported
    from lightning.fabric.utilities import distributed
    from lightning.pytorch.callbacks import model_summary
    from lightning.pytorch.trainer.connectors import signal_connector

    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [log.level for log in loggers]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quiet_lightning()
            for module in (rank_zero, distributed, model_summary, signal_connector):
                assert not module.log.isEnabledFor(logging.INFO), module.log.name  # the banners
                assert module.log.isEnabledFor(logging.WARNING), module.log.name  # a failed requeue, say
            for message in ("The 'train_dataloader' does not have many workers", "LeafSpec is deprecated",
                            "Lightning's other warning"):
                warnings.warn(message, UserWarning)
        assert [str(w.message) for w in caught] == ["Lightning's other warning"]
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)
