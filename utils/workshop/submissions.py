"""Learners' lab notebooks for testing and timing the grader (utils/workshop/grade.py), made from the labs themselves.

A submission is the lab's notebook (labs/<lab>.ipynb) with its answer cells edited: the stub left as it is,
replaced by the reference solution (labs/solutions/), or by a planted wrong answer. tests/test_workshop_grade.py
builds its bad submissions with ``notebook_with``; the timing run builds a class:

    python -m utils.workshop.submissions build/class 30   # 30 learners x every lab, nbgrader's layout
    make grade SUBMISSIONS=build/class/submitted

Learner k's answer to lab j is the reference, the stub or a planted wrong answer, in the ratio 3 : 1 : 1.
"""

import ast
import inspect
import sys
from pathlib import Path

import nbformat

from ..checkers.labs import LABS

ROOT = Path(__file__).resolve().parents[2]

# One wrong answer per lab, short and plainly wrong; which mistake the checker names is its own business.
PLANTED = {
    "01a_halving_reduce_scatter_lab": "import torch.distributed as dist\n\n"
                                      "def halving_reduce_scatter(tensor):\n    dist.all_reduce(tensor)\n",
    "01b_doubling_all_gather_lab": "import torch.distributed as dist\n\n"
                                   "def doubling_all_gather(tensor, ranks):\n    dist.all_reduce(tensor)\n",
    "02_ddp_lab": "class BucketedDDP:\n    def __init__(self, model, bucket_cap_bytes=1 << 20):\n"
                  "        self.model = model\n\n    def finish(self):\n        pass\n",
    "03_zero_lab": "def make_buckets(params, bucket_numel):\n    return [[p] for p in params]\n",
    "05_tensor_parallel_lab": "import torch\n\nclass VocabParallelCrossEntropy(torch.autograd.Function):\n"
                              "    @staticmethod\n    def forward(ctx, logits, target):\n"
                              "        return torch.logsumexp(logits, dim=-1)\n\n"
                              "    @staticmethod\n    def backward(ctx, grad):\n        return None, None\n",
    "06_pipeline_lab": "def interleaved_one_f_one_b(rank, ranks, microbatches, chunks):\n"
                       "    f = [('F', m, c) for c in range(chunks) for m in range(microbatches)]\n"
                       "    return f + [('B', m, c) for c in reversed(range(chunks)) for m in range(microbatches)]\n",
    "09_plan_3d_lab": "def choose_plan(model, cluster, n_gpus, global_batch, precision, memory_cap):\n    return None\n",
    "11a_collective_hangs_lab": "diagnosis_A = diagnosis_B = diagnosis_C = 'order'\n",
    "11b_send_and_ddp_hangs_lab": "diagnosis_D = diagnosis_E = diagnosis_F = 'order'\n",
    "14_ring_attention_lab": "import torch\n\ndef block_backward(q, k, v, o, lse, dout, diagonal=False):\n"
                             "    return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)\n",
}


def _defines(source):
    """The names a cell's source defines at top level (functions, classes, assigned names)."""
    lines = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        tree = ast.parse(lines)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def reference_source(lab):
    """The lab's reference solution as one cell: its module's source, and the diagnoses it gives (labs 11a/11b)."""
    sys.path.insert(0, str(ROOT / "labs"))
    import importlib

    module = importlib.import_module(f"solutions.{LABS[lab].solution}")
    source = inspect.getsource(module)
    diagnoses = [f"{name} = {module.DIAGNOSES[name.removeprefix('diagnosis_')]!r}" for name in LABS[lab].answers
                 if name.startswith("diagnosis_")]
    return source + "\n" + "\n".join(diagnoses) + "\n"


def notebook_with(lab, replace=None, append=None):
    """The lab's notebook, each answer cell (one defining a name the lab asks for) whose names are in ``replace``
    (name -> source) replaced by that source, then the cells of ``append`` added at the end."""
    notebook = nbformat.read(str(LABS[lab].path(ROOT)), as_version=4)
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        hit = [name for name in _defines(cell.source) if name in LABS[lab].answers and name in (replace or {})]
        if hit:
            cell.source = replace[hit[0]]
    for source in append or ():
        notebook.cells.append(nbformat.v4.new_code_cell(source))
    return notebook


def reference_notebook(lab):
    source = reference_source(lab)
    return notebook_with(lab, {name: source for name in LABS[lab].answers})


def planted_notebook(lab):
    """The reference, then the planted wrong answer in a cell after it (a later definition wins)."""
    notebook = reference_notebook(lab)
    notebook.cells.append(nbformat.v4.new_code_cell(PLANTED[lab]))
    return notebook


def build_class(folder, learners=30, labs=tuple(LABS)):
    """``learners`` learners' notebooks for ``labs``, nbgrader's layout: folder/submitted/<learner>/<lab>/<lab>.ipynb."""
    made = {"reference": reference_notebook, "stub": lambda lab: notebook_with(lab), "planted": planted_notebook}
    kinds = ["reference", "stub", "reference", "planted", "reference"]
    counts = dict.fromkeys(made, 0)
    for k in range(learners):
        for j, lab in enumerate(labs):
            kind = kinds[(k + j) % len(kinds)]
            counts[kind] += 1
            path = Path(folder) / "submitted" / f"learner{k + 1:02d}" / lab / f"{lab}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(made[kind](lab), str(path))
    return counts


if __name__ == "__main__":
    out, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
    print(f"{n} learners in {out}/submitted:", build_class(out, n))
