"""Every lab in one table: its notebook, the names a learner writes, and the checks that grade them.

The table is the one place that says what a lab asks for and how it is graded. The lab notebooks
call the same checkers in their check cells; the tests run every lab through this table (the
reference solution passes, the notebook's stubs raise their own "not written yet" error), and the
workshop's grader runs each learner's answers through it.

    lab = LABS["02_ddp_lab"]
    answers = answers_from_notebook(lab.path(root))   # the notebook's stubs, or a learner's answers
    for part in lab.parts:
        print(part.run(answers, world_size=4))           # CheckResult, or raises LabCheckFailed

``answers_from_notebook`` runs no cell: it keeps, from every code cell, the imports, the function
and class definitions and the assignments of plain values (the parameters, ``diagnosis_A = "order"``),
and executes only those, so a notebook's training loops, plots and rank launches are left out, and
so is the cell that imports the reference solution for the tests.
"""

import ast
import dataclasses
import importlib
import linecache
from pathlib import Path

from .boundaries import check_world_sizes

__all__ = ["Part", "Lab", "LABS", "answers_from_notebook", "defined_names", "lab_of"]


@dataclasses.dataclass(frozen=True)
class Part:
    """One graded part of a lab: ``needs`` the learner's names, ``check`` "module:function" of utils.checkers.

    ``call(check_function, answers, world_size, smoke)`` calls the checker the way the lab's check
    cell does, with the world sizes the notebook derives from its WORLD_SIZE. ``timeout``: the seconds
    a grader gives one answer to this part, wall clock, start-up included (``utils.workshop.grade``);
    several times what a right answer takes at WORLD_SIZE=4 on a loaded 2-core machine, and more than
    the checker's own launch timeouts, so that a hang inside the checker is reported by the checker.
    """

    name: str
    needs: tuple
    check: str
    call: object
    timeout: float = 120.0

    def checker(self):
        module, function = self.check.split(":")
        return getattr(importlib.import_module(f"utils.checkers.{module}"), function)

    def run(self, answers, world_size, smoke=False):
        missing = [name for name in self.needs if name not in answers]
        if missing:
            raise NameError(f"{self.name}: the answer defines no {', '.join(missing)}; the lab asks for "
                            f"{', '.join(self.needs)} (keep the names of the notebook's stubs)")
        return self.call(self.checker(), answers, world_size, smoke)


@dataclasses.dataclass(frozen=True)
class Lab:
    """A lab: ``name`` is the notebook's stem (labs/<name>.ipynb); ``solution`` names its checker's module, its tests
    and its reference solution's module (which the tests have; a student release does not)."""

    name: str
    solution: str
    parts: tuple

    @property
    def answers(self):
        """The names a learner writes, in the order the parts need them."""
        return tuple(dict.fromkeys(name for part in self.parts for name in part.needs))

    def path(self, root="."):
        return Path(root) / "labs" / f"{self.name}.ipynb"


def _sizes(*fixed, accepted=range(2, 7)):
    """The lab's check-cell rule (``boundaries.world_sizes``): these world sizes, the notebook's WORLD_SIZE and, unless
    SMOKE, the smallest non-power-of-two above 4 the lab accepts."""
    return lambda world_size, smoke: check_world_sizes(fixed, world_size, smoke, accepted)


def _fix(program):  # lab 11a/11b: check_fix(program, diagnosis, fixed, world_sizes, timeout)
    def call(check, a, n, smoke):
        sizes = check_world_sizes((2,) if smoke else (2, 3), n, smoke, range(2, 9))
        return check(program, a[f"diagnosis_{program}"], a[f"fixed_{program}"], world_sizes=sizes, timeout=30)
    return Part(f"program {program}", (f"diagnosis_{program}", f"fixed_{program}"), "hang_debugging:check_fix", call,
                timeout=240)


LABS = {lab.name: lab for lab in (
    Lab("01a_halving_reduce_scatter_lab", "halving_doubling", (
        Part("recursive-halving reduce-scatter", ("halving_reduce_scatter",),
             "halving_reduce_scatter:check_halving_reduce_scatter",
             lambda check, a, n, smoke: check(a["halving_reduce_scatter"], world_sizes=_sizes(2, 4, accepted=(2, 4, 8))(n, smoke), timeout=30)),
    )),
    Lab("01b_doubling_all_gather_lab", "halving_doubling", (
        Part("recursive-doubling all-gather", ("doubling_all_gather",), "doubling_all_gather:check_doubling_all_gather",
             lambda check, a, n, smoke: check(a["doubling_all_gather"], world_sizes=_sizes(2, 3, 4, accepted=range(2, 9))(n, smoke), timeout=30)),
        Part("the folded all-reduce", ("halving_doubling_all_reduce", "doubling_all_gather"),
             "folded_all_reduce:check_halving_doubling_all_reduce",
             lambda check, a, n, smoke: check(a["halving_doubling_all_reduce"], world_sizes=_sizes(2, 3, 4, accepted=range(2, 9))(n, smoke),
                                              timeout=30), timeout=150),
    )),
    Lab("02_ddp_lab", "ddp", (
        Part("BucketedDDP", ("BucketedDDP",), "ddp:check_ddp",
             lambda check, a, n, smoke: check(a["BucketedDDP"], world_sizes=_sizes(2, 3, accepted=range(1, 9))(n, smoke), steps=2 if smoke else 3),
             timeout=240),
    )),
    Lab("03_zero_lab", "zero", (
        Part("make_buckets", ("make_buckets",), "zero_buckets:check_make_buckets",
             lambda check, a, n, smoke: check(a["make_buckets"]), timeout=60),
        Part("BucketedZeRO2", ("BucketedZeRO2", "make_buckets"), "zero:check_bucketed_zero2",
             lambda check, a, n, smoke: check(a["BucketedZeRO2"], a["make_buckets"], world_sizes=_sizes(2, 3)(n, smoke),
                                              bucket_numels=sorted({a.get("BUCKET_NUMEL", 1_000), 5_000})),
             timeout=240),
    )),
    Lab("05_tensor_parallel_lab", "tensor_parallel", (
        Part("VocabParallelCrossEntropy", ("VocabParallelCrossEntropy",),
             "tensor_parallel:check_vocab_parallel_cross_entropy",
             lambda check, a, n, smoke: check(a["VocabParallelCrossEntropy"], world_sizes=_sizes(2)(n, smoke)), timeout=120),
    )),
    Lab("06_pipeline_lab", "pipeline_schedule", (
        Part("interleaved 1F1B", ("interleaved_one_f_one_b",), "pipeline_schedule:check_interleaved",
             lambda check, a, n, smoke: check(a["interleaved_one_f_one_b"], world_sizes=_sizes(2)(n, smoke)), timeout=180),
    )),
    Lab("09_plan_3d_lab", "plan_3d", (
        Part("choose_plan", ("choose_plan",), "plan_3d:check_choose_plan",
             lambda check, a, n, smoke: check(a["choose_plan"]), timeout=60),
        Part("the plan, trained", ("choose_plan",), "plan_3d:check_plan_run",
             lambda check, a, n, smoke: check(a["choose_plan"], n, steps=1 if smoke else 2), timeout=360),
    )),
    Lab("11a_collective_hangs_lab", "hang_debugging", tuple(_fix(p) for p in "ABC")),
    Lab("11b_send_and_ddp_hangs_lab", "hang_debugging", tuple(_fix(p) for p in "DEF")),
    Lab("14_ring_attention_lab", "ring_attention", (
        Part("block_backward in the fused ring", ("block_backward",),
             "ring_attention:check_ring_attention",
             lambda check, a, n, smoke: check(a["block_backward"],
                                              world_sizes=check_world_sizes((2, 3) if smoke else (2, 3, 4), n, smoke),
                                              timeout=60), timeout=240),
    )),
)}


def lab_of(notebook):
    """The table's entry for a notebook path or stem (``labs/02_ddp_lab.ipynb``, ``02_ddp_lab``)."""
    stem = Path(notebook).stem
    if stem not in LABS:
        raise KeyError(f"{notebook}: not a lab of the course; the labs are {', '.join(LABS)}")
    return LABS[stem]


def _plain(node):
    try:
        ast.literal_eval(node)
        return True
    except ValueError:
        return False


def _kept(tree):
    """The statements of a cell that define something and run nothing else."""
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node
        elif isinstance(node, ast.Assign) and _plain(node.value):
            yield node


def _code_cells(path):
    """(filename, source, syntax tree) of every code cell of the nbformat-4 notebook at ``path``, its IPython magics
    (``%``, ``!`` lines) left out; read as JSON (nbformat's import alone takes half a second, and a grader's every
    rank reads the notebook: ``answer_side``). Raises SyntaxError naming the cell that does not parse."""
    import json

    cells = json.loads(Path(path).read_text(encoding="utf-8")).get("cells")
    if not isinstance(cells, list):
        raise ValueError(f"{Path(path).name}: no list of cells: not an nbformat-4 notebook (save it again in Jupyter)")
    for index, cell in enumerate(cells):
        if not (isinstance(cell, dict) and cell.get("cell_type") == "code"):
            continue
        text = cell.get("source", "")
        text = "".join(text) if isinstance(text, list) else str(text)
        source = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!")))
        filename = f"{Path(path).name}, cell {index}"
        try:
            tree = ast.parse(source, filename=filename)
        except SyntaxError as err:
            raise SyntaxError(f"{Path(path).name}, code cell {index} does not parse: {err.msg} (line {err.lineno})") \
                from None
        yield filename, source, tree


def answers_from_notebook(path, namespace=None):
    """The names a lab notebook defines (its stubs, or a learner's answers), without running its cells.

    Raises SyntaxError naming the cell when a cell does not parse. Imports execute (they are the
    lab's own: torch, utils); a class body executes, as Python does when it defines a class.
    """
    namespace = {"__name__": f"lab_{Path(path).stem}"} if namespace is None else namespace
    for filename, source, tree in _code_cells(path):
        module = ast.Module(body=list(_kept(tree)), type_ignores=[])
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # a checker quotes the line
        exec(compile(module, filename, "exec"), namespace)
    return namespace


def defined_names(path):
    """What ``answers_from_notebook`` would define, read without executing anything: name -> ("value", v) for a plain
    value (``diagnosis_A = "order"``, a parameter), ("import", module) for a name an import binds, ("def", kind) for a
    function or class. The last definition of a name wins, as when the cells run in order. The grader's judge
    (``utils.workshop.grade``) reads a notebook this way, so that no line of it runs where the verdict is decided.
    Raises SyntaxError naming the cell, as ``answers_from_notebook`` does."""
    names = {}
    for _, _, tree in _code_cells(path):
        for node in _kept(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = ("def", type(node).__name__)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    names[alias.asname or alias.name.split(".")[0]] = ("import", alias.name)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name != "*":
                        names[alias.asname or alias.name] = ("import", "." * node.level + (node.module or ""))
            else:  # a plain value: ast.literal_eval evaluates literals only, never a call
                value = ast.literal_eval(node.value)
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        names[target.id] = ("value", value)
                    elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (tuple, list)) \
                            and len(value) == len(target.elts):
                        names.update({t.id: ("value", v) for t, v in zip(target.elts, value) if isinstance(t, ast.Name)})
    return names
