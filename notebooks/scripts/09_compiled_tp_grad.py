"""Lesson 09: do compiled tensor-parallel blocks train like one process? Gradients on 2 CPU ranks, tp = 2.

    .venv/bin/python notebooks/scripts/09_compiled_tp_grad.py

Trains lesson 09's tiny Llama (``utils.mesh.parallelize3d``) on the mesh (dp, pp, tp) = (1, 1, 2) with every block
compiled by ``aot_eager``, and prints each parameter's largest gradient difference against one process.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `utils`
import utils  # noqa: E402 - after the path
from utils.mesh.parallelize3d import LR, reference, train  # noqa: E402
from utils.mesh.plan3d import mesh_plan  # noqa: E402


def compiled(ac):
    plan = mesh_plan(1, 1, 2, checkpointing="full" if ac else "none")  # (dp, pp, tp) = (1, 1, 2)
    return train(plan, 1, lr=LR, compile_backend="aot_eager", measure_step=-1)


if __name__ == "__main__":
    _, ref = reference(1, lr=LR)
    for ac in (False, True):
        got = utils.run_ranks(compiled, ac, world_size=2, verbose=False, timeout=600)[0]["grads"]
        diffs = {k: (got[k] - ref[k]).abs().max().item() for k in ref}
        worst = max(diffs, key=diffs.get)
        print(f"ac={ac}: largest |grad - one process| {diffs[worst]:.2e} on {worst}; "
              f"above 1e-5: {[k for k, v in diffs.items() if v > 1e-5] or 'none'}")
