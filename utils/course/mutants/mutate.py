"""The mutants of a lab's reference solution: one small wrong edit each, in the code the lab asks a learner to write.

A solution module (``labs/solutions/<x>.py``) has no answer markers: the code a learner writes is the top-level
functions and classes named in the lab's table (``utils.checkers.labs.LABS[...].answers``), and the module-level
helpers they call (``_train`` of lab 11b, ``divisors`` of lab 09). Only those are mutated; the module's imports and
docstrings stay. Each mutant changes one AST node, in one of these kinds:

- ``operator``: ``+ -``, ``* /``, ``/ //``, ``// % /``, ``<< >>``, ``& | ^`` (binary and augmented assignments);
- ``comparison``: ``< <=``, ``> >=``, ``== !=``, ``is``/``is not``, ``in``/``not in``;
- ``constant``: an integer constant + 1 and - 1 (off-by-one; booleans left alone);
- ``arguments``: two neighbouring positional arguments of a call swapped;
- ``boolean``: ``and`` <-> ``or``;
- ``dropped``: a statement of a function body removed (``pass`` where it was the only one).

Error messages (f-strings, the argument of ``raise``) are not mutated: they compute nothing the checker grades.
Mutants are whole module texts (``ast.unparse``, so comments are gone); each compiles, and two edits that give the
same text are one mutant.
"""

import ast
import dataclasses

__all__ = ["Mutant", "mutants", "target_names"]

BINARY = {ast.Add: (ast.Sub,), ast.Sub: (ast.Add,), ast.Mult: (ast.Div,), ast.Div: (ast.FloorDiv, ast.Mult),
          ast.FloorDiv: (ast.Div, ast.Mod), ast.Mod: (ast.FloorDiv,), ast.Pow: (ast.Mult,),
          ast.LShift: (ast.RShift,), ast.RShift: (ast.LShift,), ast.BitAnd: (ast.BitOr,), ast.BitOr: (ast.BitAnd,),
          ast.BitXor: (ast.BitOr,)}
COMPARE = {ast.Lt: (ast.LtE, ast.Gt), ast.LtE: (ast.Lt, ast.GtE), ast.Gt: (ast.GtE, ast.Lt),
           ast.GtE: (ast.Gt, ast.LtE), ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,), ast.Is: (ast.IsNot,),
           ast.IsNot: (ast.Is,), ast.In: (ast.NotIn,), ast.NotIn: (ast.In,)}
BOOLEAN = {ast.And: ast.Or, ast.Or: ast.And}
KINDS = ("operator", "comparison", "constant", "arguments", "boolean", "dropped")


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One edit: ``kind`` (one of KINDS), ``line`` of the solution, the statement ``before`` and ``after`` it
    (one line each, as ``ast.unparse`` writes them), and ``source``: the whole mutated module."""

    index: int
    kind: str
    line: int
    before: str
    after: str
    source: str

    @property
    def diff(self):
        return f"line {self.line}: {self.before}  ->  {self.after}"


def target_names(tree, answers):
    """The top-level definitions to mutate: the ``answers`` and the module-level functions they use, by name."""
    defined = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    names, todo = set(), [name for name in answers if name in defined]
    while todo:
        name = todo.pop()
        if name in names:
            continue
        names.add(name)
        todo += [n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name) and n.id in defined]
    return [name for name in defined if name in names]


def _message_nodes(root):
    """ids of the nodes inside error messages: f-strings and what ``raise`` raises."""
    skip = set()
    for node in ast.walk(root):
        if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Raise) and node.exc is not None):
            skip |= {id(n) for n in ast.walk(node.exc if isinstance(node, ast.Raise) else node)}
    return skip


def _docstring(statement):
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
        and isinstance(statement.value.value, str)


def _edits(root):
    """(kind, node, apply, undo) for every edit inside ``root``, in the order ast.walk meets the nodes."""
    skip = _message_nodes(root)
    for node in ast.walk(root):
        if id(node) in skip:
            continue
        if isinstance(node, (ast.BinOp, ast.AugAssign)):
            old = node.op
            for new in BINARY.get(type(old), ()):
                yield "operator", node, lambda n=node, v=new: setattr(n, "op", v()), lambda n=node, o=old: setattr(n, "op", o)
        elif isinstance(node, ast.Compare):
            for i, old in enumerate(node.ops):
                for new in COMPARE.get(type(old), ()):
                    def apply(n=node, i=i, v=new):
                        n.ops[i] = v()

                    def undo(n=node, i=i, o=old):
                        n.ops[i] = o
                    yield "comparison", node, apply, undo
        elif isinstance(node, ast.BoolOp):
            old = node.op
            yield "boolean", node, lambda n=node, o=old: setattr(n, "op", BOOLEAN[type(o)]()), \
                lambda n=node, o=old: setattr(n, "op", o)
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            for step in (1, -1):
                yield "constant", node, lambda n=node, s=step: setattr(n, "value", n.value + s), \
                    lambda n=node, o=node.value: setattr(n, "value", o)
        elif isinstance(node, ast.Call):
            positional = [a for a in node.args if not isinstance(a, ast.Starred)]
            if len(positional) == len(node.args):
                for i in range(len(node.args) - 1):
                    def swap(n=node, i=i):
                        n.args[i], n.args[i + 1] = n.args[i + 1], n.args[i]
                    yield "arguments", node, swap, swap
        if isinstance(node, (ast.FunctionDef, ast.For, ast.While, ast.If, ast.With, ast.Try)):
            for field in ("body", "orelse", "finalbody"):
                body = getattr(node, field, None) or []
                for i, statement in enumerate(body):
                    if _docstring(statement) or isinstance(statement, (ast.FunctionDef, ast.Pass)):
                        continue

                    def drop(b=body, i=i, s=statement):
                        if len(b) == 1:
                            b[i] = ast.Pass(lineno=s.lineno, col_offset=s.col_offset)
                        else:
                            del b[i]

                    def keep(b=body, i=i, s=statement):
                        if len(b) == 1 and isinstance(b[0], ast.Pass) and b[0] is not s:
                            b[0] = s
                        else:
                            b.insert(i, s)
                    yield "dropped", statement, drop, keep


def _statements(root):
    """{id(node): the innermost statement holding it}, for every node under ``root``."""
    holder = {}

    def visit(node, statement):
        statement = node if isinstance(node, ast.stmt) else statement
        holder[id(node)] = statement
        for child in ast.iter_child_nodes(node):
            visit(child, statement)
    visit(root, None)
    return holder


def _one_line(node):
    text = ast.unparse(node) if node is not None else ""
    head = text.splitlines()[0] if text else "(nothing)"
    return head + (" ..." if "\n" in text else "")


def mutants(source, answers):
    """Every mutant of ``source`` (a solution module's text) in the definitions of ``answers`` (and their helpers),
    deduplicated, each compiling, numbered in the order they are found. Raises ValueError when the module defines none of ``answers``."""
    tree = ast.parse(source)
    names = target_names(tree, answers)
    if not names:
        raise ValueError(f"the solution defines none of {', '.join(answers)}: nothing to mutate")
    original = ast.unparse(tree)
    seen, out = {original}, []
    for root in (node for node in tree.body if getattr(node, "name", None) in names):
        holder = _statements(root)
        for kind, node, apply, undo in list(_edits(root)):
            statement = holder[id(node)]
            before = _one_line(statement)
            apply()
            try:
                text = ast.unparse(tree)
                after = "(dropped)" if kind == "dropped" else _one_line(statement)
            finally:
                undo()
            if text in seen:
                continue
            seen.add(text)
            try:
                compile(text, "<mutant>", "exec")
            except SyntaxError:
                continue
            out.append(Mutant(len(out), kind, getattr(statement, "lineno", 0), before, after, text))
    return out
