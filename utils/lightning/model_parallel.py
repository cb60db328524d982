"""Tensor parallelism (and FSDP2 beside it) under Lightning's ``ModelParallelStrategy`` (notebook 08c).

``ModelParallelStrategy(data_parallel_size=d, tensor_parallel_size=t)`` builds, in every rank, a 2-D
``DeviceMesh`` of shape (d, t) named ("data_parallel", "tensor_parallel") on the rank's device type
(``lightning/fabric/strategies/model_parallel.py``, ``_setup_device_mesh``: it raises unless
d * t = world size), over gloo on a CPU (``_get_default_process_group_backend_for_device``), and hands
it to ``configure_model`` as ``self.device_mesh``. Lightning applies no parallelism itself: the
module does, from outside the model, in a fixed order (torchtitan's): tensor parallelism on the
"tensor_parallel" sub-mesh first, then FSDP2 on the "data_parallel" one (when d > 1).

``utils.tensor_parallel.toy_plan.apply_toy_tp`` is Megatron's split of lesson 05 applied to the course's
``ToyNet`` with ``parallelize_module``: every matrix is split across the t ranks, the hidden activations
travel split along their features, and the tied ``mix1``/``mix2`` weight is split the *same* way in both
layers, so it can stay one tensor. ``LitToyTP`` is ``LitToy`` with that ``configure_model`` and a
loader that splits the data over the data-parallel ranks only (every tensor-parallel rank of a
group must see the same samples). ``fit_tp_in_ranks`` runs it inside ``run_ranks``.
"""

import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, DistributedSampler

from ..sharding.fsdp2 import full_tensor_unremarked, shard_with_fsdp2
from ..tensor_parallel.toy_plan import apply_toy_tp
from .toy import LitToy, quiet_trainer

__all__ = ["LitToyTP", "fit_tp_in_ranks"]


class LitToyTP(LitToy):
    """``LitToy`` under ``ModelParallelStrategy``: TP on the "tensor_parallel" mesh, FSDP2 on "data_parallel"."""

    def configure_model(self):  # every rank, once the 2-D mesh exists; torchtitan's order: TP, then FSDP
        if self.device_mesh is None:
            raise RuntimeError("LitToyTP needs Trainer(strategy=ModelParallelStrategy(...)): no device mesh here")
        if isinstance(self.net.embed.weight, DTensor):
            return  # already split (configure_model may be called again, e.g. for a test after fit)
        apply_toy_tp(self.net, self.device_mesh["tensor_parallel"])
        if self.device_mesh["data_parallel"].size() > 1:
            shard_with_fsdp2(self.net, self.device_mesh["data_parallel"])

    def _loader(self, data, batch, shuffle, workers=0):  # split over data-parallel ranks only
        dp = self.device_mesh["data_parallel"]
        n, r = dp.size(), dp.get_local_rank()
        if batch % n:
            raise ValueError(f"global batch {batch} is not divisible by {n} data-parallel ranks; use a multiple of {n}")
        sampler = DistributedSampler(data, num_replicas=n, rank=r, shuffle=shuffle, seed=0)
        return DataLoader(data, batch_size=batch // n, sampler=sampler, num_workers=workers)


def fit_tp_in_ranks(train_data, tp_size, steps, global_batch, lr):
    """In every rank of ``run_ranks``: ``steps`` SGD steps of ``LitToyTP`` under
    ``ModelParallelStrategy(data_parallel_size=world/tp_size, tensor_parallel_size=tp_size)``, on CPU.

    Returns this rank's losses (of its data-parallel group's slice), its data-parallel rank, the full final weights (``DTensor.full_tensor()``), what each
    parameter is on this rank (placements, local shape) and the bytes it holds.
    """
    import warnings

    from lightning.pytorch.strategies import ModelParallelStrategy

    from .toy import quiet_lightning

    quiet_lightning()
    # FSDP2 (data-parallel size > 1) warns that a module returned a view, which an in-place op could spoil;
    # ToyNet adds out of place (h = h + ...), so the warning is about a bug this model does not have
    warnings.filterwarnings("ignore", ".*returned a view tensor.*")
    world = dist.get_world_size()
    if world % tp_size:
        raise ValueError(f"{world} ranks do not split into tensor-parallel groups of {tp_size}; use a divisor of {world}")
    strategy = ModelParallelStrategy(data_parallel_size=world // tp_size, tensor_parallel_size=tp_size)
    model = LitToyTP(train_data, global_batch=global_batch, lr=lr)
    trainer = quiet_trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=steps,
                            enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(model)
    state = model.net.state_dict()
    with full_tensor_unremarked():  # a 2-D (FSDP2 x TP) parameter gathers in two steps: torch's note on it dropped
        full = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu() for k, v in state.items()}
    layout = {k: (str(tuple(v.placements)), tuple(v.to_local().shape)) if isinstance(v, DTensor) else ("plain", tuple(v.shape))
              for k, v in state.items()}
    return dict(losses=model.losses, dp_rank=strategy.device_mesh["data_parallel"].get_local_rank(), state=full, layout=layout, bytes=model.held_bytes(),
                mesh=dict(zip(strategy.device_mesh.mesh_dim_names, strategy.device_mesh.shape)),
                backend=dist.get_backend(), tied=model.net.mix2.weight is model.net.mix1.weight)
