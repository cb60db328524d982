"""utils.ddp_notebook: Lightning's forked ranks get one thread, and the kernel gets its settings back."""

import os

import pytest
import torch

from utils.ddp_notebook import fit_on_forked_ranks


class FakeTrainer:
    def fit(self, model):
        self.seen = (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"), model)
        return "fitted"


@pytest.mark.parametrize("omp", [None, "3"])
def test_fit_runs_on_one_thread_and_restores_the_kernels_settings(monkeypatch, omp):
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    before = torch.get_num_threads()
    trainer = FakeTrainer()
    assert fit_on_forked_ranks(trainer, "model") == "fitted"
    assert trainer.seen == (1, "1", "model")
    assert torch.get_num_threads() == before and os.environ.get("OMP_NUM_THREADS") == omp


def test_settings_come_back_when_fit_raises(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()

    class Broken:
        def fit(self, model):
            raise RuntimeError("a rank failed")

    with pytest.raises(RuntimeError, match="a rank failed"):
        fit_on_forked_ranks(Broken(), None)
    assert torch.get_num_threads() == before and "OMP_NUM_THREADS" not in os.environ
