"""Helpers for the distributed-training course, one folder per idea a learner looks for.

Each module holds one idea and names the notebook that derives it; each folder's ``__init__`` lists its modules, and
this map names every folder and every module (a test holds both to it).

- ``utils.launch``: ``run_ranks`` and the ``%%ranks N`` magic, the launcher behind every multi-rank cell: a package
  whose files each run in one process: ``plan``, ``kernel``, ``server_handle``, ``errors``, ``report`` and ``magic``
  in the kernel, ``server`` in the rank server, ``rank`` in each rank (notebook 00); ``children`` (a command run
  with a timeout, its whole tree killed) and ``scripts`` (a lesson script under ``torchrun`` from a notebook or a
  test, ``run_script``; notebook 10).
- ``utils.hardware``: what this machine has, said out loud (notebook 00).
- ``utils.torch_versions``: the torch releases the course runs on (``make setup SYSTEM_TORCH=1``, ``make preflight``).
- ``utils.models``: ``ToyNet``, the course model with a frozen parameter, a buffer and a tied weight, ``make_model``
  (seeded) and ``train_reference``, the one-process run every strategy is checked against (notebook 02a; 02b, 04,
  06, 10).
- ``utils.datasets``: small real data sets shipped inside packages, e.g. ``digits()`` and ``batch`` (a step's global
  batch; notebook 02a), and ``AugmentedDigits``, augmented in pure Python (notebooks 08a and 08b).
- ``utils.comm``: collectives and what they send: ``ledger`` (``CommLedger``, notebook 01b), ``p2p`` (``sendrecv``,
  notebook 01a), ``compat``, ``subgroup`` (torch's reduce-scatter on some of the ranks, in ``tensor_split``'s chunks;
  lab 01b).
- ``utils.data_parallel``: ``scratch`` (lesson 02's DDP from scratch; notebooks 02a and 02b), ``torch_ddp`` (torch
  DDP with a Python all-reduce hook, and the loop lesson 02's ``torchrun`` script runs; notebooks 02b and 10),
  ``buckets`` (torch DDP's and DeepSpeed's bucket rules; labs 02 and 03) and ``overlap`` (torch DDP's communication
  during backward, timed; notebook 02a).
- ``utils.sharding``: what a rank holds and sharding it: ``memory`` (notebook 03; used by 04 and 07), ``adam``,
  ``groups`` (lesson 03's ``ZeroDP``, lab 03), ``activation_memory`` (notebook 07c; used by 08b), ``recompute``
  (activation recomputation run, not only modelled: none, full and selective checkpointing on the capstone's layers,
  the bytes kept and the FLOPs spent; notebook 09c), ``fsdp2`` (the course model's FSDP2 plan, lesson 04's batch
  slices and the loop its ``torchrun`` script runs; notebooks 04 and 08) and ``fsdp2_controls`` (FSDP2's prefetch,
  resharding and gradient accumulation, counted; notebook 04c).
- ``utils.tensor_parallel``: ``degrees`` (which degrees fit a model, ``check_tp_degree``), ``communications``
  (Megatron's f and g), ``sequence_parallel``, ``transformer``, ``layers`` (column- and row-parallel linears, the
  plan applied from outside), ``compare`` (against the unsplit model) and ``toy_plan`` (``ToyNet``'s split; 08c)
  (notebooks 05a, 05b).
- ``utils.pipeline``: ``schedules`` (GPipe, 1F1B, interleaved as op lists, their simulator, the bubble; re-exported
  by the package), ``timeline`` (a schedule run on stage ranks, timed, drawn), ``pipelining`` (the course model cut
  by ``torch.distributed.pipelining``, and the loop lesson 06's ``torchrun`` script runs) and ``zero_bubble`` (the
  backward split in two, ZB-H1; 06c) (notebooks 06a, 06b).
- ``utils.deepspeed``: DeepSpeed without a compiler (``cpu``), its config checked (``schema``, ``config``), lesson
  07's shared launch pieces (``training``) and the ZeRO optimizer's partitions (``partitions``) (notebooks 07a-07c).
- ``utils.perf``: timing and MFU, one way for every lesson: ``measure`` (``stopwatch`` for one interval, the
  warm-up / synchronise / time loop, ``best_seconds``, ``one_thread``), ``peaks`` (the data sheets' dense bf16
  peaks, one table, and a measured peak), ``mfu``, ``configs`` (a Llama built from the planner's ``ModelShape``)
  (most lessons time with ``stopwatch`` and ``measure``; MFU and peaks in 08b, 08d, 09a-09c).
- ``utils.lightning``: ``toy`` (``LitToy`` and its runs), ``ddp_notebook``, ``compile_check``, ``gpt_benchmark``
  (notebooks 02, 08a, 08b), ``accumulation``, ``model_parallel`` and ``gpu_strategies`` (08c).
- ``utils.mesh``: ``mesh3d``, ``plan3d``, ``parallelize3d`` and ``mfu``: the 3-D mesh, a run of the tiny Llama as the
  planner's ``Plan``, the model trained on it, a bf16 compiled Llama's MFU (notebook 09, lab 09); ``context4d``, the
  capstone with context parallelism (the course's ring attention) as a fourth dimension (notebook 14).
- ``utils.precision``: ``fp8`` (FP8 formats, scales, delayed scaling, a Float8 linear simulated in fp32) and
  ``fp8_training`` (the recipes in training, torchao's float8 timed on a GPU) (notebook 08d).
- ``utils.planner`` (``shapes``, ``costs``, ``cp_ep``, ``estimate``): memory per rank, bytes per mesh dimension,
  bubble, step time and MFU of a 3-D plan, validated against lesson 09's measurements and published figures (notebook
  09, lab 09).
- ``utils.scale_out``: ``torchrun`` (inside a lesson script under torchrun: join, report, leave; notebook 10) and
  ``resume``
  (kill and resume bit for bit; notebook 11a).
- ``utils.fx``: ``tiny_gpt`` (the small GPT lesson 12 traces), ``cost`` (a cost model read off a ``torch.fx`` graph,
  the balanced pipeline split; notebook 12a) and ``passes`` (Megatron's MLP split as a graph rewrite; notebook 12b).
- ``utils.frameworks``: ``tf_toynet``, the course model in TensorFlow, and ``reference``, the torch step it is checked
  against (notebooks 13a and 13b, optional ``[frameworks]`` extra).
- ``utils.context_parallel``: ``ring`` (ring attention from scratch, the online-softmax ``merge``, causal layouts)
  and ``ulysses`` (DeepSpeed-Ulysses' all-to-all from sequence to head sharding) (notebook 14, lab 14).
- ``utils.experts``: ``router`` (top-k gate, capacity, Switch's load-balancing loss), ``layer`` (a mixture of experts
  in one process), ``dispatch`` (experts sharded over ranks, tokens by all-to-all), ``hybrid`` (with data
  parallelism on a 2-D mesh) (notebook 15).
- ``utils.widgets``: the ipywidgets front ends: ``memory`` (notebook 03), ``pipeline`` (06b), ``planner`` (09).
- ``utils.course``: the maintainers' tools, no lesson's: ``notebook_runner`` (``make course``, and the suite's
  notebooks), ``minutes`` and ``teaching_guide`` (``make minutes``, ``make guide``), ``claims``, ``shown_source``
  and ``changes`` (``make shown``, ``make test-quick``), ``robustness`` (``make robust``), ``torch_suite`` (``make
  test-torch``), ``bench_launch`` (``make bench``); each runs as ``python -m utils.course.NAME``.
- ``utils.checkers``: the labs' checkers, one module per lab named like ``labs/solutions/``, and ``common``
  (``LabCheckFailed``, ``CheckResult``, ``fail``, tolerances).
- ``utils.workshop``: a teacher's tools, no lesson's: ``seats`` (cores and GPUs dealt to learners), ``hub``
  (``make hub``, optional ``[teacher]`` extra), ``slurm`` (the cluster recipe), ``preflight`` (``make preflight``),
  ``student`` and ``student_files`` (the learners' release, ``make student``), ``grade`` and ``gradebook`` (``make
  grade``).

Importing ``utils`` starts nothing, seeds nothing and prints nothing. It sets one environment
variable, ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (unless you set it): ``torch.cuda.is_available()``
then asks the driver instead of initialising CUDA, which would leave this process unable to
hand CUDA to a child. On a CUDA build of torch with no NVIDIA driver it also sets
``CUDA_VISIBLE_DEVICES=""`` (unless you set it; ``utils.hardware.hide_cuda_without_driver`` says why).
"""

import os

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # before anything asks torch.cuda

from .hardware import describe_machine, hide_cuda_without_driver

hide_cuda_without_driver()  # before anything asks torch.cuda, as the line above
from .datasets import digits
from .launch import RankError, RankTimeoutError, rank_device, run_ranks
from .comm.ledger import CommLedger, loopback_bytes
from .models import ToyNet


def load_ipython_extension(ipython):
    """``%load_ext utils`` registers the ``%%ranks`` cell magic."""
    from .launch.magic import RanksMagics

    ipython.register_magics(RanksMagics)


__all__ = ["run_ranks", "rank_device", "RankError", "RankTimeoutError", "describe_machine", "CommLedger", "loopback_bytes",
           "ToyNet", "digits"]
