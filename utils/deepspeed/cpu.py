"""DeepSpeed on CPU ranks (and on GPUs) without waiting for a C++ compiler: one call in the kernel.

Derived in notebook 07a (DeepSpeed, part 1), whose first DeepSpeed cell is
``deepspeed, ext_dir = import_deepspeed(WORLD_SIZE)``; the script ``notebooks/scripts/07_deepspeed_train.py``
calls ``avoid_op_builds()`` itself. Why any of this is needed:

DeepSpeed compiles some of its C++ ops *the first time they are used* (a JIT build with ninja into
``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``): on a fresh 2-core machine
``deepspeed_shm_comm`` takes over two minutes, ``fused_adam`` about 150 s and ``cpu_adam`` about
80 s. Training needs none of them:

- ``deepspeed.initialize`` builds ``deepspeed_shm_comm`` when it creates its communication backend
  on CPU, though the op only serves *inference* all-reduces. ``avoid_op_builds()`` marks it
  unavailable in DeepSpeed's own table of compatible ops, which is what DeepSpeed does by itself
  on a platform without it: collectives then go through ``torch.distributed``. Only the CPU
  accelerator has this op; the CUDA accelerator has no shared-memory builder and never builds it,
  so there ``avoid_op_builds()`` leaves the table alone (the same question DeepSpeed asks).
- ``"optimizer": {"type": "Adam"}`` in the config builds ``fused_adam`` (``cpu_adam`` with
  optimizer offload). Hand ``deepspeed.initialize`` a torch optimizer instead, with
  ``"zero_allow_untested_optimizer": true`` (and ``"zero_force_ds_cpu_optimizer": false`` when
  offloading the optimizer to the CPU).

The other slow first call is Python imports. ``deepspeed.initialize`` imports torch's compiler
stack lazily (torch._dynamo when the first torch optimizer is built, and DeepSpeed's optional Muon
optimizer, which calls ``torch.compile`` at import): measured 8-15 s *per rank* on 2 cores, paid
again by every launch, because a rank's imports die with it. Importing them once in the kernel
makes the launcher's rank server import them too (``utils/launch/server_handle.py``, ``HEAVY_MODULES``),
so every rank it forks afterwards starts with them: a launch then takes about a second. After
importing, the kernel calls ``gc.freeze()``, as the rank server does: the ~400k objects of torch and
DeepSpeed leave the garbage collector's sight, so a ``gc.collect()`` (DeepSpeed calls it; so does
``utils.sharding.memory.live_tensor_bytes``) walks only what the lesson created.

``import_deepspeed(world_size)`` does all of that in the kernel, before any rank starts: it picks
DeepSpeed's accelerator the way ``run_ranks`` picks the device (``"cuda"`` when the ranks get GPUs,
else ``"cpu"``), imports DeepSpeed and the modules ``deepspeed.initialize`` would import in every
rank, freezes the garbage collector, quiets DeepSpeed's per-rank INFO lines and points
``TORCH_EXTENSIONS_DIR`` at a fresh, empty folder that the ranks inherit with the kernel's
environment. The ``deepspeed`` it returns is the module itself, seen through a thin stand-in
(``DeepSpeedForRanks``) with one extra behaviour: when a rank function that uses it is sent to the
ranks (by value, with cloudpickle), the stand-in arrives by calling ``avoid_op_builds()`` in the
rank, so no lesson cell has to. ``built_ops(folder)`` lists what was compiled anyway (the lesson
asserts it is empty).
"""

import gc
import logging
import os
import tempfile
import warnings

SHM_OP = "deepspeed_shm_comm"  # DeepSpeed's inference-only shared-memory all-reduce (CPU accelerator only)
SHM_BUILDER = "ShareMemCommBuilder"  # the class that builds it, asked for by deepspeed.comm.torch.build_shm_op
WARM_MODULES = (  # imported lazily by deepspeed.initialize / the pipeline engine (DeepSpeed 0.19)
    "torch._dynamo",  # the first torch.optim optimizer built imports it
    "deepspeed.runtime.zero.muon.muon_optimizer",  # is_zero_supported_optimizer imports it; it calls torch.compile
    "deepspeed.runtime.engine", "deepspeed.runtime.zero.stage_1_and_2", "deepspeed.runtime.zero.stage3",
    "deepspeed.runtime.bf16_optimizer", "deepspeed.runtime.pipe.engine", "deepspeed.module_inject.auto_ep_config",
)


class DeepSpeedForRanks:
    """The ``deepspeed`` module, plus one thing: arriving in a rank switches off the shm op there.

    Every attribute is the module's own (``deepspeed.initialize`` is DeepSpeed's function). Only
    pickling differs: a rank function that names ``deepspeed`` carries this object, which unpickles
    by calling ``_deepspeed_in_rank(folder)``, i.e. ``avoid_op_builds(folder)`` before the function runs.
    """

    def __init__(self, module, folder):
        self._module, self._folder = module, folder

    def __getattr__(self, name):  # only called for names this object lacks: everything of DeepSpeed's
        return getattr(self._module, name)

    def __dir__(self):
        return dir(self._module)

    def __repr__(self):
        return f"<deepspeed {self._module.__version__} for ranks: no shm op built, extensions in {self._folder}>"

    def __reduce__(self):  # how it travels to a rank
        return _deepspeed_in_rank, (self._folder,)


def _deepspeed_in_rank(folder):
    """Runs in the rank, while its function is being unpickled: the rank's ``deepspeed``, ops avoided."""
    import deepspeed

    avoid_op_builds(folder)
    return DeepSpeedForRanks(deepspeed, folder)


def import_deepspeed(world_size, quiet=True, warm=True):
    """In the kernel: DeepSpeed set up for ``run_ranks(world_size=...)``; returns (deepspeed, folder).

    ``DS_ACCELERATOR`` must be set before the import, and is only set if you have not set it.
    ``warm``: also import ``WARM_MODULES`` here, once, instead of in every rank of every launch.
    ``folder``: the empty extensions folder every rank compiles into (``built_ops(folder)`` checks it).
    """
    import importlib

    from ..launch import plan_launch

    if world_size < 1:
        raise ValueError(f"world_size={world_size}: DeepSpeed needs at least 1 rank; pass the WORLD_SIZE of run_ranks")
    os.environ.setdefault("DS_ACCELERATOR", plan_launch(world_size).device)  # "cpu" (gloo) or "cuda" (NCCL)
    import deepspeed

    for name in WARM_MODULES if warm else ():
        try:
            importlib.import_module(name)
        except ImportError:  # moved in another DeepSpeed version: only the warm-up is lost, ranks import it
            pass
    gc.freeze()  # torch's and DeepSpeed's objects: never collected, so gc.collect() walks only ours

    if quiet:  # its INFO lines print the whole config, once per rank; "untested optimizer": a torch one, on purpose
        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    folder = tempfile.mkdtemp(prefix="ds_torch_extensions_")  # EMPTY: any op DeepSpeed compiles lands here
    os.environ["TORCH_EXTENSIONS_DIR"] = folder  # each rank gets the kernel's environment of the moment
    return DeepSpeedForRanks(deepspeed, folder), folder


def avoid_op_builds(folder=None, quiet=True):
    """Inside a rank, before ``deepspeed.initialize``: no inference-only shm op, no deprecation noise,
    and (``quiet``) no INFO lines, which print the whole config once per rank.

    We ask the current accelerator for its shm builder, as ``deepspeed.comm.torch.build_shm_op``
    does: the CPU accelerator has one (we mark its op unavailable), the CUDA accelerator has none
    (nothing would be built, and its table of ops has no such name: nothing to do).
    """
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    if folder:
        os.environ["TORCH_EXTENSIONS_DIR"] = folder
    if quiet:
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*is deprecated. Please use", category=FutureWarning)  # old torch names
    accelerator = get_accelerator()
    builder = accelerator.create_op_builder(SHM_BUILDER)
    if builder is None:  # e.g. CUDA: DeepSpeed builds no shm op there
        return
    compatible = deepspeed.ops.__compatible_ops__
    if builder.NAME not in compatible:
        raise RuntimeError(f"DeepSpeed {deepspeed.__version__}'s {accelerator.device_name()} accelerator would build "
                           f"{builder.NAME!r}, which its table of compatible ops does not list: update "
                           "utils/deepspeed/cpu.py (look for 'shm' in deepspeed.ops.__compatible_ops__)")
    compatible[builder.NAME] = False  # not built; gloo collectives are used instead


def built_ops(folder):
    """Names of the ops compiled into ``folder`` (an empty list when DeepSpeed compiled nothing)."""
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []
