"""Helpers for the distributed-training course.

Each module holds one idea and names the notebook that derives it:

- ``utils.launch``: ``run_ranks`` and the ``%%ranks N`` magic, the launcher behind every multi-rank
  cell: a package whose files each run in one process (kernel, rank server, rank) (notebook 00).
- ``utils.hardware``: what this machine has, said out loud (notebook 00).
- ``utils.compat``: the collectives whose names or gloo support changed between torch 2.11 and 2.13.
- ``utils.ledger``: ``CommLedger``, bytes and time of every collective a rank calls (notebook 01).
- ``utils.models``: ``ToyNet``, the course model with a frozen parameter, a buffer and a tied
  weight (notebook 02).
- ``utils.datasets``: small real data sets shipped inside packages, e.g. ``digits()`` (notebook 02), and
  ``AugmentedDigits``, augmented in pure Python (notebooks 08a and 08b).
- ``utils.lightning_toy``: ``LitToy``, lesson 08's LightningModule, importable by name so that forked and
  spawned ranks find it, ``quiet_lightning()``, and the runs both parts make: ``fit_in_ranks``,
  ``early_stopping_run`` (notebooks 08a and 08b, and lesson 08's script).
- ``utils.speedups``: timing that holds on a shared machine, ``best_seconds`` and ``one_thread`` (notebook 08b).
- ``utils.gpt_benchmark``: a GPT-2-small-sized model timed on a GPU in four precisions, tokens/s and MFU (notebook 08b).
- ``utils.compile_check``: did ``torch.compile`` compile a DDP model, and do its all-reduces still overlap
  the backward (notebook 08b).
- ``utils.ddp_notebook``: Lightning's ``ddp_notebook`` with its ranks forked from a fresh process, not the kernel
  (notebooks 02 and 08).
- ``utils.memory``: bytes a rank holds (counted from tensors, or every live tensor) and the ZeRO
  paper's formulas beside them (notebook 03; used by 04 and 07).
- ``utils.adam``: Adam's update rule written out, ``adam_update`` (lesson 03, lab 03 and its checker).
- ``utils.checkers``: the labs' checkers, one module per lab named like ``labs/solutions/``: ``common``
  (``LabCheckFailed``, ``CheckResult``, ``fail``, tolerances), ``halving_doubling`` (lab 01), ``ddp``
  (lab 02), ``zero`` (lab 03), ``tensor_parallel`` (lab 05), ``pipeline_schedule`` (lab 06), ``plan_3d`` (lab 09),
  ``hang_debugging`` (lab 11).
- ``utils.tensor_parallel``: which tensor-parallel degrees fit a model, ``check_tp_degree`` (notebook 05).
- ``utils.pipeline``: pipeline schedules as op lists (GPipe, 1F1B, interleaved), their simulator, the
  bubble formula and the plan checks (notebook 06).
- ``utils.timeline``: ``run_stage``, a schedule run on stage ranks that records every op, and
  ``draw_gantt`` (notebook 06).
- ``utils.mesh3d``: a dp x pp x tp ``DeviceMesh`` checked against the model, collectives filed by mesh
  dimension (``MeshCommLedger``), the bytes of local shards (notebook 09, lab 09).
- ``utils.parallelize3d``: lesson 09's tiny Llama split into pipeline stages, tensor-parallel and
  FSDP2-sharded on a mesh, trained, and its one-process reference (notebook 09, lab 09).
- ``utils.planner`` (``shapes``, ``costs``, ``estimate``): memory per rank, bytes per mesh dimension, bubble, step time and MFU of a 3-D plan,
  validated against lesson 09's measurements and published figures; ``best_plans`` (notebook 09, lab 09).
- ``utils.planner_widget``: ipywidgets controls for the planner (notebook 09).
- ``utils.mfu``: model FLOPs utilisation on one rank: a measured matmul peak, and a bf16 compiled Llama's MFU with
  the planner's FLOPs (notebook 09).
- ``utils.memory_widget``: the ZeRO memory calculator's controls around lesson 03's text function (notebook 03).
- ``utils.pipeline_widget``: the pipeline schedule explorer's controls around lesson 06's figure function (notebook 06).
- ``utils.lesson_training``: the training loops of lessons 02 (DDP), 04 (FSDP2) and 06 (pipeline) as functions their
  ``torchrun`` scripts call, and their one-process ``reference_losses`` (notebooks 02, 04, 06, 10).
- ``utils.torchrun``: a lesson script under ``torchrun`` from a notebook: one agent or two as two nodes, a timeout that
  kills the whole process group, losses read back bitwise (``LOSSES_HEX``); ``init_from_env`` for the scripts (notebook 10).
- ``utils.resume``: lesson 11's training run that checkpoints model, optimizer, each rank's RNG and the data
  position with DCP and resumes bit for bit (``train``), the restart generation counted by the store
  (``store_generation``), the attempts' losses joined (``join_losses``) (notebook 11 and its script).
- ``utils.fx_cost``: a cost model read off a ``torch.fx`` graph (FLOPs, parameter, output and saved-activation
  bytes per node), the balanced pipeline split it gives, stages cut with ``split_module`` and timed in CPU seconds
  (notebook 12).
- ``utils.fx_passes``: Megatron's ``f`` and ``g``, and tensor parallelism of every MLP as a rewrite of a traced graph
  (notebook 12).
- ``utils.tf_toynet``: ``TFToyNet``, the course model in TensorFlow built from a torch ``state_dict``, and ``dp_step``,
  one data-parallel step for any ``tf.distribute`` strategy; imports TensorFlow only when called (notebook 13,
  optional ``[frameworks]`` extra).
- ``utils.deepspeed_cpu``: DeepSpeed set up in one call, ``import_deepspeed(WORLD_SIZE)``, with no C++ op
  compiled and its slow imports done once in the kernel (notebooks 07a and 07b).
- ``utils.ds_schema``: what the installed DeepSpeed accepts in its config, learned from DeepSpeed (notebook 07a).
- ``utils.ds_config``: ``check_config``, every problem of a DeepSpeed config at every level (notebook 07a).
- ``utils.ds_training``: what lesson 07's launches share: ``make_model``, ``zero_config``, ``batch`` (notebooks 07a
  and 07b).
- ``utils.ds_partitions``: what DeepSpeed's ZeRO optimizer holds on one rank, read from its partitions (notebook 07a).
- ``utils.activation_memory``: ``saved_bytes``, what autograd keeps for backward (notebook 07b; used by 08b).

Importing ``utils`` starts nothing, seeds nothing and prints nothing. It sets one environment
variable, ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (unless you set it): ``torch.cuda.is_available()``
then asks the driver instead of initialising CUDA, which would leave this process unable to
hand CUDA to a child.
"""

import os

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # before anything asks torch.cuda

from .hardware import describe_machine
from .datasets import digits
from .launch import RankError, RankTimeoutError, rank_device, run_ranks
from .ledger import CommLedger, loopback_bytes
from .models import ToyNet


def load_ipython_extension(ipython):
    """``%load_ext utils`` registers the ``%%ranks`` cell magic."""
    from .launch.magic import RanksMagics

    ipython.register_magics(RanksMagics)


__all__ = ["run_ranks", "rank_device", "RankError", "RankTimeoutError", "describe_machine", "CommLedger", "loopback_bytes",
           "ToyNet", "digits"]
