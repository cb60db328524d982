"""utils.lightning.ddp_notebook: Lightning's ``ddp_notebook`` ranks forked from a fresh process, never from the caller,
and what ``ddp_notebook`` hands back to its caller copied into the caller's trainer and model."""

import json
import os
import tempfile
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from utils.lightning.ddp_notebook import fit_on_forked_ranks


class Tiny(L.LightningModule):
    def __init__(self, out_dir):
        super().__init__()
        self.net, self.out_dir, self.losses = torch.nn.Linear(4, 1), out_dir, []

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        self.log("loss", loss)
        return loss

    def on_train_end(self):  # each rank says who forked it and how many threads it had
        info = dict(pid=os.getpid(), ppid=os.getppid(), threads=torch.get_num_threads(), losses=self.losses)
        Path(self.out_dir, f"rank{self.global_rank}.json").write_text(json.dumps(info))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(16, 4, generator=g)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


@pytest.mark.parametrize("world_size", [1, 2])
def test_ranks_fork_from_a_fresh_process_and_results_come_back(world_size):
    torch.nn.Linear(8, 8)(torch.randn(64, 8)).sum().backward()  # the kernel has run backward (breaks forks on a GPU box)
    out_dir = tempfile.mkdtemp()
    model = Tiny(out_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = L.Trainer(accelerator="cpu", devices=world_size, strategy="ddp_notebook", max_steps=3, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    threads = torch.get_num_threads()
    assert fit_on_forked_ranks(trainer, model) is None  # as trainer.fit
    ranks = [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("rank*.json"))]
    assert len(ranks) == world_size
    assert all(r["ppid"] != os.getpid() for r in ranks), "a rank was forked from the caller itself"
    assert all(r["threads"] == 1 for r in ranks)
    assert torch.get_num_threads() == threads  # the caller's own setting untouched
    assert not torch.equal(model.net.weight, before["net.weight"]), "rank 0's final weights came back"
    assert trainer.state.finished and "loss" in trainer.callback_metrics
    assert trainer.callback_metrics["loss"].item() == pytest.approx(ranks[0]["losses"][-1], rel=1e-5)
    assert model.losses == []  # the caller's module never trained: only what ddp_notebook returns came back


def test_a_failing_fit_raises_in_the_caller():
    class Broken(Tiny):
        def training_step(self, batch, _):
            raise RuntimeError("a rank failed")

    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_notebook", max_steps=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(Exception, match="a rank failed"):
        fit_on_forked_ranks(trainer, Broken(tempfile.mkdtemp()))


def test_ranks_still_fork_after_the_server_imported_deepspeed():
    """DeepSpeed asks torch for the GPU count at import, and the rank server imports what the caller has
    (``mirror_imports``). On a CUDA build of torch with no NVIDIA driver that question used to leave every
    later fork "in bad fork", and ``ddp_notebook`` refused to start ("Cannot re-initialize CUDA in forked
    subprocess"); ``import utils`` now hides the absent GPUs first (``utils.hardware.hide_cuda_without_driver``).
    On a CPU build or a GPU box this runs as the test above."""
    import deepspeed  # noqa: F401 - the server mirrors it before the launch below

    out_dir = tempfile.mkdtemp()
    model = Tiny(out_dir)
    trainer = L.Trainer(accelerator="cpu", devices=1, strategy="ddp_notebook", max_steps=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    fit_on_forked_ranks(trainer, model)
    assert trainer.state.finished and len(list(Path(out_dir).glob("rank*.json"))) == 1
