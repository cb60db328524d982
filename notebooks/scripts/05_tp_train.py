"""Tensor (and sequence) parallelism as a script for torchrun: lesson 09's tiny Llama split over all processes.

    python -m torch.distributed.run --standalone --nproc-per-node 2 notebooks/scripts/05_tp_train.py --steps 3

Lesson 05 builds Megatron's column- and row-parallel layers by hand and then with DTensor; this script trains a
model with the DTensor version only: ``utils.mesh.parallelize3d``'s ``tp_plan`` (``parallelize_module`` with
Megatron's plan and sequence parallelism) on a mesh of one dimension, tp = the number of processes (2 or 4:
it must divide the 4 heads). It is ``09_3d_train.py`` with dp = pp = 1.
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("train_3d", Path(__file__).with_name("09_3d_train.py"))
_train_3d = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_train_3d)

if __name__ == "__main__":
    _train_3d.main(tp_only=True)
