"""The training job of lesson 08 (Lightning at scale), written once: ``LitToy`` and its data.

Lesson 08 trains this one ``LightningModule`` under every strategy (``ddp_notebook``, ``ddp`` from
``notebooks/scripts/08_lightning_train.py``, ``ModelParallelStrategy`` with FSDP2) and checks that
each gives the per-step losses of lesson 02's hand-written DDP. It lives in a module, not in the
notebook, for one reason: every process that trains it must be able to *import* it by name. The
ranks that Lightning starts, a script that Lightning runs again once per device, and a process that
unpickles a checkpointed or copied-back module all look ``LitToy`` up as
``utils.lightning.toy.LitToy``; a class defined in a notebook has no such name.

What the module splits, the way Lightning wants it (the table in lesson 08 says who calls each hook):
``configure_model`` applies FSDP2 (parallelism from outside the model), the data loaders build our
own ``DistributedSampler`` inside each rank, ``training_step`` / ``validation_step`` log with
``sync_dist=True`` (so every rank sees the same metric), ``configure_optimizers`` picks SGD or Adam.
Everything else (the loop, backward, the all-reduce, the optimizer step, checkpoints) is the Trainer's.

``quiet_lightning()`` (from ``quiet``, here for the lessons) silences Lightning's banners and two warnings the lesson
triggers on purpose.
The runs both parts of lesson 08 make live here too (derived in notebooks/08a_lightning_strategies.ipynb,
reused by notebooks/08b_lightning_speedups.ipynb): ``quiet_trainer``, ``fit_in_ranks`` (a Trainer in ranks
that already exist) and ``early_stopping_run`` (``ModelCheckpoint`` + ``EarlyStopping`` under ``ddp_notebook``).
"""

import json
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from utils.datasets import digits_in_order
from utils.sharding.memory import state_bytes
from utils.models import make_model as _seeded_model
from utils.perf.measure import stopwatch
from utils.sharding.fsdp2 import shard_with_fsdp2

from .quiet import quiet_lightning  # the lessons import it from here

__all__ = ["GLOBAL_BATCH", "LR", "LitToy", "digits_in_order", "early_stopping_data", "early_stopping_run", "fit_in_ranks",
           "make_model", "quiet_lightning", "quiet_trainer", "read_ranks", "shard_with_fsdp2"]

GLOBAL_BATCH = 240  # samples per optimizer step, split across ranks (lesson 02's value)
LR = 0.5  # plain SGD learning rate (lesson 02's value)


def make_model(seed=0):
    """The course model initialised from ``seed`` (seed 0 is lesson 02's initial model).

    The global random state is left as it was: a module built after ``seed_everything`` must not
    reset the generator that the shuffles and the DataLoader workers' seeds are drawn from.
    """
    with torch.random.fork_rng(devices=[]):  # CPU generator only; restored on exit
        return _seeded_model(seed)  # utils.models' builder, which seeds the generator


class LitToy(L.LightningModule):
    """ToyNet as a LightningModule; every strategy of lesson 08 trains this same class.

    ``train_data``/``val_data``: TensorDatasets. ``shuffle=False`` keeps lesson 02's order (rank r takes
    samples r, r+n, ... of each global batch); the Trainer must get ``use_distributed_sampler=False``
    to say that we shard the data ourselves (Lightning would keep our sampler anyway: it injects its own only into
    a loader without a ``DistributedSampler``). ``shard=True`` applies FSDP2
    in ``configure_model`` (under ``ModelParallelStrategy``). ``num_workers``: DataLoader processes per
    rank. ``out_dir``: each rank writes what it saw there when training ends, because a forked or
    spawned rank's Python objects die with it.
    """

    def __init__(self, train_data, val_data=None, global_batch=GLOBAL_BATCH, lr=LR, optimizer="sgd",
                 shuffle=False, shard=False, out_dir=None, seed=0, num_workers=0):
        super().__init__()
        self.net = make_model(seed)
        self.train_data, self.val_data, self.global_batch, self.lr = train_data, val_data, global_batch, lr
        self.optimizer_name, self.shuffle, self.shard, self.out_dir = optimizer, shuffle, shard, out_dir
        self.num_workers = num_workers  # DataLoader processes per rank (training data only)
        self.losses, self.val_losses, self.eval_modes = [], [], set()
        self.fit_seconds = None

    # --- parallelism, applied from outside the model: the successor of configure_sharded_model ---
    def configure_model(self):  # called in every rank, after the processes and the device mesh exist
        if self.shard:
            if self.device_mesh is None:
                raise RuntimeError("shard=True needs Trainer(strategy=ModelParallelStrategy(...)): no device mesh here")
            shard_with_fsdp2(self.net, self.device_mesh["data_parallel"])

    # --- data: built inside each rank, once the process group exists ---
    def _loader(self, data, batch, shuffle, workers=0):
        n, r = self.trainer.world_size, self.trainer.global_rank
        if batch % n:
            raise ValueError(f"global batch {batch} is not divisible by {n} ranks; use a multiple of {n}")
        sampler = DistributedSampler(data, num_replicas=n, rank=r, shuffle=shuffle, seed=0)
        return DataLoader(data, batch_size=batch // n, sampler=sampler, num_workers=workers)

    def train_dataloader(self):
        return self._loader(self.train_data, self.global_batch, self.shuffle, self.num_workers)

    def val_dataloader(self):  # the whole validation set in one batch per rank
        return self._loader(self.val_data, len(self.val_data), False) if self.val_data is not None else []

    # --- the step: the same few lines under every strategy ---
    def training_step(self, batch, batch_idx):
        x, y = batch  # (B/n, 64), (B/n,): this rank's slice of the global batch
        loss = F.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        self.log("loss", loss, sync_dist=True)  # sync_dist: the mean over ranks lands in callback_metrics
        return loss

    def validation_step(self, batch, batch_idx):
        self.eval_modes.add((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y), sync_dist=True, batch_size=len(y))

    def on_validation_end(self):  # after the epoch's metrics are reduced: record the history
        if not self.trainer.sanity_checking:
            self.val_losses.append(self.trainer.callback_metrics["val_loss"].item())

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def held_bytes(self):
        """Bytes of parameters, gradients and optimizer state THIS rank holds (a DTensor: its local shard),
        each storage once (``utils.sharding.memory.state_bytes``, notebook 03)."""
        trainable = [p for p in self.net.parameters() if p.requires_grad]
        held = state_bytes(trainable, self.trainer.optimizers[0] if self.trainer.optimizers else None)
        return {k: held[k] for k in ("params", "grads", "optim")}

    def on_fit_start(self):
        self._fit_start = time.perf_counter()

    def on_train_end(self):  # runs in every rank: leave what it saw where the caller can read it
        self.fit_seconds = time.perf_counter() - self._fit_start
        if self.out_dir is None:
            return
        ckpt, stop = self.trainer.checkpoint_callback, self.trainer.early_stopping_callback
        best_score = ckpt.best_model_score if ckpt else None
        seen = {"losses": self.losses, "val_losses": self.val_losses, "current_epoch": self.trainer.current_epoch,
                "global_step": self.trainer.global_step, "stopped_epoch": stop.stopped_epoch if stop else None,
                "best_model_path": ckpt.best_model_path if ckpt else None,
                "best_model_score": best_score.item() if best_score is not None else None,
                "bytes": self.held_bytes(), "seconds": self.fit_seconds}
        Path(self.out_dir, f"rank{self.global_rank}.json").write_text(json.dumps(seen))


def quiet_trainer(**kwargs):
    """A ``Trainer`` with the flags every run of lesson 08 shares: our sampler, no bars, summaries or loggers."""
    return L.Trainer(use_distributed_sampler=False,  # keep our sampler: lesson 02's data order
                     enable_progress_bar=False, enable_model_summary=False, logger=False, **kwargs)


def read_ranks(out_dir):
    """What each rank wrote in ``LitToy.on_train_end``: a list of dicts, rank 0 first."""
    return [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("rank*.json"))]


def fit_in_ranks(train_data, strategy, shard=False, steps=3):
    """Runs in every rank of run_ranks: one Trainer per rank, joining the existing process group."""
    from utils.launch import rank_device

    quiet_lightning()  # a rank is a fork of the rank server: the kernel's call does not reach it
    device = rank_device()
    model = LitToy(train_data, shard=shard)
    trainer = quiet_trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=dist.get_world_size(),
                            strategy=strategy, max_steps=steps, enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(model)
    full = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu() for k, v in model.net.state_dict().items()}
    return dict(losses=model.losses, bytes=model.held_bytes(), seconds=model.fit_seconds, state=full,
                strategy=type(trainer.strategy).__name__, param_type=type(model.net.mix1.weight).__name__)


def early_stopping_data():
    """The over-fitting job's data: 240 training digits and the last 600 (never trained on), lesson 02's order."""
    x_all, y_all = digits_in_order()
    return TensorDataset(x_all[:240], y_all[:240]), TensorDataset(x_all[1197:], y_all[1197:])


def early_stopping_run(train, val, stop_early, devices, max_epochs, patience):
    """Adam on ``train`` under ``ddp_notebook`` on ``devices`` CPU ranks, validating every epoch on ``val``;
    ``ModelCheckpoint`` keeps the best, ``EarlyStopping`` (if ``stop_early``) stops ``patience`` epochs after it.

    Returns ``(trainer, what each rank saw, seconds, checkpoint folder)``.
    """
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from utils.lightning.ddp_notebook import fit_on_forked_ranks

    out_dir, ckpt_dir = tempfile.mkdtemp(prefix="lightning-08-es-"), tempfile.mkdtemp(prefix="lightning-08-ckpt-")
    callbacks = [ModelCheckpoint(dirpath=ckpt_dir, monitor="val_loss", mode="min", save_top_k=1,
                                 filename="{epoch}-{val_loss:.4f}")]
    if stop_early:
        callbacks.append(EarlyStopping(monitor="val_loss", mode="min", patience=patience))
    model = LitToy(train, val, global_batch=60, lr=0.01, optimizer="adam", out_dir=out_dir)
    trainer = quiet_trainer(accelerator="cpu", devices=devices, strategy="ddp_notebook", max_epochs=max_epochs,
                            callbacks=callbacks, num_sanity_val_steps=0)
    with stopwatch() as clock:
        fit_on_forked_ranks(trainer, model)  # ranks forked from a clean process (utils/lightning/ddp_notebook.py)
    print(f"  (a fit {'with' if stop_early else 'without'} EarlyStopping: {clock.seconds:.1f} s)", flush=True)
    return trainer, read_ranks(out_dir), clock.seconds, ckpt_dir
