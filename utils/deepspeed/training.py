"""What lesson 07's DeepSpeed launches share: the course model on a rank's device, a ZeRO config sized
for a small model, and a rank's micro-batch of the digits.

Derived in notebooks/07b_deepspeed_zero.ipynb ("ZeRO in DeepSpeed"), which measures the ZeRO stages
with them; notebooks/07c_deepspeed_features.ipynb trains with the same three in fp32 to check
accumulation, clipping, a client optimizer and checkpoints against one process.
"""

import torch
import torch.distributed as dist

from utils.launch import rank_device
from utils.models import ToyNet

__all__ = ["MICRO", "batch", "make_model", "zero_config"]

MICRO = 16  # samples per rank per micro-step


def make_model(seed=0, *, hidden, dtype=torch.float32):
    """``ToyNet(hidden)`` from ``seed``, on this rank's device, in ``dtype`` (buffers too: DeepSpeed casts params only)."""
    torch.manual_seed(seed)
    return ToyNet(hidden=hidden).to(rank_device(), dtype)


def zero_config(stage, psi, dtype, offload=False, force_ds_cpu_optimizer=False, clip=0.0, gas=1, micro=MICRO):
    """A DeepSpeed config for ZeRO ``stage`` on a model of ``psi`` trainable parameters, in ``dtype``
    ("bf16", "fp16" or "fp32"), with a torch (client) optimizer; ``offload`` moves the optimizer to CPU."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage {stage!r}: DeepSpeed has stages 0, 1, 2 and 3")
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype {dtype!r}: use 'bf16', 'fp16' or 'fp32'")
    bucket = max(psi // 4, 1)  # numbers per bucket; the default 5e8 is sized for billion-parameter models
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
              "gradient_clipping": clip,  # DeepSpeed 0.19 clips at 1.0 unless told: say it explicitly
              "steps_per_print": 10**9, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket,
                                    "stage3_prefetch_bucket_size": bucket, "stage3_param_persistence_threshold": 0}}
    if dtype != "fp32":
        config[dtype] = {"enabled": True}
    if offload:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        config["zero_force_ds_cpu_optimizer"] = force_ds_cpu_optimizer  # False: keep our torch AdamW
    return config


def batch(x_all, y_all, step, micro=MICRO, gas=1, m=0, dtype=torch.float32):
    """This rank's m-th micro-batch of `step` from ``x_all, y_all`` (the digits); the global batch is
    micro x gas x ranks samples in a row. The caller passes the data, so that it exists before any
    memory baseline a rank takes (a lazily loaded copy would count as the model's)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    lo = (step * gas * n + m * n + rank) * micro
    if lo + micro > len(x_all):
        raise ValueError(f"step {step}, micro-batch {m}: samples {lo}-{lo + micro} of {len(x_all)} digits with "
                         f"micro={micro} x gas={gas} x {n} ranks; use fewer steps or smaller batches")
    return x_all[lo:lo + micro].to(rank_device(), dtype), y_all[lo:lo + micro].to(rank_device())
