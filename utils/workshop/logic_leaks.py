"""Find a lab's answer in the student release by its logic, not its text: renamed copies count (issue 37).

``student.leaks`` finds a solution's *text* (its folder, its flag, an import of it). A checker that carries the
answer's algorithm under other names leaks it as surely: a learner copies the function, renames it, and passes.
So this module compares code by shape. Each statement of a reference answer (``labs/solutions/``, the functions a
lab asks for and those they call: ``utils.course.mutants.target_names``) is turned into a *canonical* form: its
AST with docstrings dropped and every name the code binds or reads (variables, arguments, functions of its own)
renamed in order of first appearance (``a0``, ``a1``...), attributes and constants kept (``dist.isend`` and
``2`` are what the code does, ``partner`` is only what someone called it). The release's Python files and its
notebooks' code cells are read the same way, and a leak is

- a run of ``WINDOW`` consecutive statements of an answer, of at least ``MIN_NODES`` AST nodes in all, found as
  consecutive statements anywhere in the release; or
- one expression of an answer of at least ``MIN_EXPRESSION`` nodes (a formula: a warm-up count, a causal rule)
  found anywhere in the release.

Short, common code (``rank = dist.get_rank()``) is below both sizes. ``find(release)`` returns the leaks as
``Leak`` rows naming the answer, its line, and where in the release the same logic is.

What it does not find (a bound on what the release test proves, not a promise): the same logic with a statement
put between two of the answer's (a dummy line breaks every window); a loop rewritten as a comprehension, or ``if``
as a conditional expression (another AST); a formula split over several assignments, each under
``MIN_EXPRESSION``; constants changed by an equivalent (``n // 2`` for ``n >> 1``). A teacher's review of what
``utils/checkers`` ships stays the check for those.
"""

import ast
import copy
import json
from dataclasses import dataclass
from pathlib import Path

WINDOW = 2           # consecutive statements compared at once
MIN_NODES = 25       # a window smaller than this is common code, not an answer's logic
MIN_EXPRESSION = 16  # an expression (a formula) this large is an answer's own: lab 14's causal rule has 16 nodes


@dataclass(frozen=True)
class Leak:
    answer: str     # "labs/solutions/plan_3d.py:42 (choose_plan)"
    found_in: str   # "utils/checkers/plan_3d.py:88"
    kind: str       # "statements" or "expression"
    code: str       # the answer's code, one line

    def __str__(self):
        return f"{self.answer} -> {self.found_in} ({self.kind}): {self.code[:120]}"


class _Canonical(ast.NodeTransformer):
    """Names renamed in order of first appearance; docstrings and type comments dropped."""

    def __init__(self):
        self.names = {}

    def _name(self, name):
        return self.names.setdefault(name, f"a{len(self.names)}")

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id=self._name(node.id), ctx=node.ctx), node)

    def visit_arg(self, node):
        return ast.copy_location(ast.arg(arg=self._name(node.arg)), node)

    def visit_FunctionDef(self, node):
        node.name = self._name(node.name)
        if ast.get_docstring(node) is not None:
            node.body = node.body[1:] or [ast.Pass()]
        node.returns, node.type_comment = None, None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef


def canonical(node):
    """The canonical dump of an AST node (a module of statements, or an expression): names renamed, positions
    dropped."""
    return ast.dump(_Canonical().visit(copy.deepcopy(node)), annotate_fields=False, include_attributes=False)


def size(node):
    return sum(1 for _ in ast.walk(node))


def _bodies(tree):
    """Every statement list in the tree (a module's, a function's, a loop's...), in order."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                yield stmts
        for handler in getattr(node, "handlers", []) or []:
            yield handler.body


def _windows(tree):
    """(canonical form, first statement, nodes) of every run of WINDOW consecutive statements (or a lone one)."""
    for stmts in _bodies(tree):
        stmts = [s for s in stmts if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        for i in range(len(stmts) and max(1, len(stmts) - WINDOW + 1)):
            run = stmts[i:i + WINDOW]
            yield canonical(ast.Module(body=run, type_ignores=[])), run[0], sum(size(s) for s in run)


def _expressions(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.expr) and not isinstance(node, (ast.Constant, ast.Name)) and size(node) >= MIN_EXPRESSION:
            yield canonical(node), node


def answer_trees(solutions, labs):
    """(file, name, tree, lab) of every answer function (and the module functions it calls) of every lab's
    reference."""
    from utils.course.mutants.mutate import target_names

    found = []
    for lab in labs.values():
        path = Path(solutions) / f"{lab.solution}.py"
        tree = ast.parse(path.read_text())
        names = target_names(tree, lab.answers)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
                found.append((f"labs/solutions/{path.name}", node.name, node, lab.name))
    return found


def _forms(sources):
    """{canonical form: where} of every window and every large expression of ``sources`` ((where, tree) pairs)."""
    windows, expressions = {}, {}
    for where, tree in sources:
        for form, first, _ in _windows(tree):
            windows.setdefault(form, f"{where}:{first.lineno}")
        for form, node in _expressions(tree):
            expressions.setdefault(form, f"{where}:{node.lineno}")
    return windows, expressions


def release_sources(release):
    """(where, tree) of every Python file and every notebook code cell of the release."""
    release = Path(release)
    for path in sorted(release.rglob("*.py")):
        try:
            yield str(path.relative_to(release)), ast.parse(path.read_text())
        except SyntaxError:
            continue
    for path in sorted(release.rglob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        for k, cell in enumerate(cells):
            if cell["cell_type"] != "code":
                continue
            text = "\n".join(line for line in "".join(cell["source"]).split("\n")
                             if not line.lstrip().startswith(("%", "!")))
            try:
                yield f"{path.relative_to(release)}, cell {k}", ast.parse(text)
            except SyntaxError:
                continue


def find(release, solutions, labs):
    """Every leak of a lab's answer logic into ``release`` (see the module's docstring). What the lab's own notebook
    in the release holds is given to the learner (a stub's set-up lines, the buggy programs a hang lab asks to fix),
    not an answer: those forms are never leaks."""
    release = Path(release)
    sources = list(release_sources(release))
    windows, expressions = _forms(sources)
    leaks = []
    for file, name, node, lab in answer_trees(solutions, labs):
        given_windows, given_expressions = _forms(
            (where, tree) for where, tree in sources if where.startswith(f"labs/{lab}.ipynb"))
        seen = set()
        for form, first, nodes in _windows(node):
            if (nodes >= MIN_NODES and form in windows and form not in given_windows
                    and first.lineno not in seen):
                seen.add(first.lineno)
                leaks.append(Leak(f"{file}:{first.lineno} ({name})", windows[form], "statements",
                                  ast.unparse(first).split("\n")[0]))
        for form, expr in _expressions(node):
            if form in expressions and form not in given_expressions and expr.lineno not in seen:
                seen.add(expr.lineno)
                leaks.append(Leak(f"{file}:{expr.lineno} ({name})", expressions[form], "expression",
                                  ast.unparse(expr)))
    return leaks


def main(argv=None):
    import argparse

    from utils.checkers.labs import LABS
    from utils.course.notebook_runner import ROOT

    parser = argparse.ArgumentParser(prog="python -m utils.workshop.logic_leaks", description=__doc__.split("\n")[0])
    parser.add_argument("release", nargs="?", default=str(ROOT / "build" / "student" / "release"),
                        help="a student release (make student)")
    args = parser.parse_args(argv)
    leaks = find(args.release, ROOT / "labs" / "solutions", LABS)
    for leak in leaks:
        print(leak)
    print(f"{len(leaks)} piece(s) of an answer's logic in {args.release}")
    return 1 if leaks else 0


if __name__ == "__main__":
    raise SystemExit(main())
