"""Which ``utils`` functions and classes a notebook prints as source, and which of them a change edits.

    python -m utils.course.shown_source                   # the shows as the notebooks make them; is the list stale?
    python -m utils.course.shown_source --write           # rewrites shown_source.json, the list tests keep current
    python -m utils.course.shown_source --changed [REV]   # shown objects whose source changed since REV (default HEAD;
                                                   # A..B for a range) and the notebooks whose text that changes

A lesson shows a utils object with ``Code(inspect.getsource(obj), language="python")`` or
``print(inspect.getsource(obj))``: editing ``obj`` edits the lesson. The shows are read statically: each code cell
is parsed with ``ast`` and the argument of ``inspect.getsource`` / ``getsourcelines`` / ``getdoc`` (and IPython's
``%psource`` / ``%pdoc`` / ``obj??``) is resolved through the imports of the cells before it, then followed to the
module that defines it (``utils.pipeline.one_f_one_b_order`` is ``utils.pipeline.schedules.one_f_one_b_order``). The
notebook's own functions and other packages' objects (torch, DeepSpeed) are not ours and not listed. A show that
cannot be resolved (a loop variable, ``getsource(obj.method)`` of an instance) is an error naming the notebook and
cell: write it with a name imported from utils, or list that cell's objects by hand under ``by_hand``.
"""

import argparse
import ast
import json
import re
import sys
from pathlib import Path

from .changes import ROOT, changed_files, text_at

LIST = Path(__file__).with_name("shown_source.json")
SHOW_CALLS = {"inspect.getsource", "inspect.getsourcelines", "inspect.getdoc"}
WRITE = "python -m utils.course.shown_source --write"
LOCAL = "<the notebook's own>"  # a def or class of the notebook: shown, but no utils source
UNKNOWN = None                  # bound by an assignment, a loop, a with: not resolvable statically


def course_notebooks():
    """Lessons and labs (labs/solutions are .py files, which show nothing)."""
    return sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))


def _working_tree(path):
    file = ROOT / path
    return file.read_text() if file.is_file() else None


# --- where a utils name is defined ------------------------------------------------------------------------------

def _module_path(module, text_of):
    """utils.comm.ledger -> utils/comm/ledger.py (or .../__init__.py) if ``text_of`` has it, else None."""
    base = module.replace(".", "/")
    return next((p for p in (f"{base}.py", f"{base}/__init__.py") if text_of(p) is not None), None)


def _statements(body):
    """A module's top-level statements, those under ``if`` / ``try`` included (they bind module names too)."""
    for node in body:
        if isinstance(node, (ast.If, ast.Try)):
            yield from _statements(node.body + node.orelse + getattr(node, "finalbody", [])
                                   + [s for h in getattr(node, "handlers", []) for s in h.body])
        else:
            yield node


def _binding(tree, name, package):
    """What binds ``name`` in a module, the last binding winning: its def/class node, (module, [attributes]) for an
    import, or UNKNOWN (an assignment, or nothing)."""
    found = UNKNOWN
    for node in _statements(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = node
        elif isinstance(node, ast.ImportFrom):
            found = next(((_absolute(node, package), [a.name]) for a in node.names if (a.asname or a.name) == name),
                         found)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if (alias.asname or alias.name.split(".")[0]) == name:
                    found = (alias.name, []) if alias.asname else (name, [])
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                found = UNKNOWN
    return found


def _absolute(node, package):
    """The module an ``ImportFrom`` reads, relative imports made absolute against ``package``."""
    if not node.level:
        return node.module
    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def locate(key, text_of=_working_tree):
    """A listed key, ``utils.module.qualname`` (the module: the longest prefix that is a file), as ``resolve``."""
    parts = key.split(".")
    end = next((end for end in range(len(parts), 0, -1) if _module_path(".".join(parts[:end]), text_of)), None)
    return None if end is None else resolve(".".join(parts[:end]), parts[end:], text_of)


def resolve(module, attrs, text_of=_working_tree, _hops=0):
    """``getattr(module, attrs...)`` read statically -> (canonical key ``module.qualname``, file, its source as
    getsource prints it), or None where that is no def, class or module. Imports are followed to the defining
    module, as Python follows them (``from .compare import compare`` in a package makes ``compare`` the function)."""
    path = _module_path(module, text_of)
    if path is None or _hops > 20:
        return None
    text = text_of(path)
    if not attrs:
        return module, path, text  # a whole module shown
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    node = _binding(tree, attrs[0], module if path.endswith("__init__.py") else module.rpartition(".")[0])
    if isinstance(node, tuple) and node != (module, attrs[:1]):  # imported here: follow it
        return resolve(node[0], node[1] + attrs[1:], text_of, _hops + 1)
    if not isinstance(node, ast.AST):  # not bound here (or `from . import x`): a submodule, if there is one
        return resolve(f"{module}.{attrs[0]}", attrs[1:], text_of, _hops + 1)
    for part in attrs[1:]:  # a method or a nested class
        if not isinstance(node, ast.ClassDef):
            return None
        node = next((n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
    if node is None:
        return None
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return f"{module}.{'.'.join(attrs)}", path, "".join(text.splitlines(keepends=True)[first - 1:node.end_lineno])


# --- what a notebook shows ----------------------------------------------------------------------------------------

NOT_PYTHON = {"bash", "sh", "script", "writefile", "file", "html", "markdown", "javascript", "js", "latex", "svg",
              "perl", "ruby", "system", "sx"}
MAGIC_SHOW = re.compile(r"^\s*(?:%(?:psource|pdoc|pinfo2?)\s+([\w.]+)|\?\?([\w.]+)|([\w.]+)\?\?)\s*$")


def _python(source):
    """A code cell as Python: a ``%%ranks`` body kept, other cell magics (``%%bash``) dropped, ``%line`` and ``!shell``
    lines made ``pass``. Returns (python, names shown by IPython's ``%psource x`` / ``x??`` lines)."""
    lines, magic_shows = source.split("\n"), []
    if lines and lines[0].startswith("%%"):  # %%ranks, %%time: Python under the magic line
        lines = [] if lines[0][2:].split(" ")[0] in NOT_PYTHON else ["pass"] + lines[1:]
    for i, line in enumerate(lines):
        match = MAGIC_SHOW.match(line)
        if match:
            magic_shows.append(next(g for g in match.groups() if g))
        if re.match(r"\s*[%!]", line) or match:
            lines[i] = line[:len(line) - len(line.lstrip())] + "pass"
    return "\n".join(lines), magic_shows


class _Cells(ast.NodeVisitor):
    """Walks a notebook's cells in order, binding names as the kernel would, and records each show."""

    def __init__(self):
        self.names, self.shows, self.unresolved, self.cell = {}, [], [], None  # cell: (its reference, its label)

    def dotted(self, node):
        """``a.b.c`` through the names bound so far: (module, [attributes]), LOCAL, or UNKNOWN."""
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.insert(0, node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or self.names.get(node.id, UNKNOWN) is UNKNOWN:
            return UNKNOWN
        base = self.names[node.id]
        return base if base == LOCAL else (base[0], base[1] + attrs)

    def show(self, node):
        target, (ref, label), text = self.dotted(node), self.cell, ast.unparse(node)
        if target is UNKNOWN:
            self.unresolved.append((ref, f"{label}: the source of `{text}` is shown, but `{text}` is not a name "
                                         "imported from a module (write it so, or list the cell under by_hand)"))
        elif target != LOCAL and target[0].split(".")[0] == "utils":
            self.shows.append((target, ref, label, text))

    def bind(self, target, value=UNKNOWN):
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                self.names[node.id] = value

    def visit_Import(self, node):
        for alias in node.names:
            top = alias.name.split(".")[0]
            self.names[alias.asname or top] = (alias.name, []) if alias.asname else (top, [])

    def visit_ImportFrom(self, node):
        for alias in node.names:
            if alias.name != "*":
                self.names[alias.asname or alias.name] = (node.module, [alias.name])

    def visit_FunctionDef(self, node):
        self.names[node.name] = LOCAL
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Assign(self, node):
        self.visit(node.value)
        alias = self.dotted(node.value) if isinstance(node.value, (ast.Name, ast.Attribute)) else UNKNOWN
        for target in node.targets:  # `x = utils.a.b` keeps what x is; any other value makes x unknown
            self.bind(target, alias if isinstance(target, ast.Name) else UNKNOWN)

    def visit_For(self, node):
        self.bind(node.target)
        self.generic_visit(node)

    def visit_With(self, node):
        for item in node.items:
            if item.optional_vars is not None:
                self.bind(item.optional_vars)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        self.generic_visit(node)
        self.bind(node.target)

    visit_AugAssign = visit_AnnAssign

    def visit_Call(self, node):
        func = self.dotted(node.func)
        if func not in (UNKNOWN, LOCAL) and ".".join([func[0], *func[1]]) in SHOW_CALLS and node.args:
            self.show(node.args[0])
        self.generic_visit(node)


def notebook_shows(path):
    """One notebook's shows: ([(key, cell)], [(cell, why it cannot be resolved)]); a cell is "notebook#cell-id"."""
    path = Path(path)
    where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    walker, shows, unresolved = _Cells(), [], []
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] != "code":
            continue
        walker.cell = (f"{where}#{cell.get('id')}", f"{where}, cell {index} (id {cell.get('id')})")
        python, magic_shows = _python("".join(cell["source"]))
        try:
            tree = ast.parse(python)
        except SyntaxError as error:
            if re.search(r"getsource|getdoc|\?\?|%psource|%pdoc", python):
                walker.unresolved.append((walker.cell[0], f"{walker.cell[1]}: shows source but does not parse "
                                                          f"({error})"))
            continue
        walker.visit(tree)
        for name in magic_shows:
            walker.show(ast.parse(name, mode="eval").body)
    for (module, attrs), ref, label, text in walker.shows:
        found = resolve(module, attrs)
        if found is None:
            unresolved.append((ref, f"{label}: shows `{text}` = {'.'.join([module, *attrs])}, which is no function, "
                                    "class or module of utils"))
        else:
            shows.append((found[0], ref))
    return shows, walker.unresolved + unresolved


def read_list(path=LIST):
    data = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
    return data.get("shown", {}), data.get("by_hand", {})


def current(notebooks=None, by_hand=None):
    """What the notebooks show now: ({key: [notebooks]}, [problems]). ``by_hand`` ({"notebook#cell-id": [keys]})
    answers the unresolved shows of those cells."""
    by_hand = read_list()[1] if by_hand is None else by_hand
    shown, problems, answered = {}, [], set()
    for notebook in course_notebooks() if notebooks is None else notebooks:
        shows, unresolved = notebook_shows(notebook)
        for cell, message in unresolved:
            if cell in by_hand:
                answered.add(cell)
                shows += [(key, cell) for key in by_hand[cell]]
            else:
                problems.append(message)
        for key, cell in shows:
            shown.setdefault(key, set()).add(cell.rpartition("#")[0])
    problems += [f"by_hand lists {cell}, which has no unresolved show (remove it from {LIST.name})"
                 for cell in sorted(set(by_hand) - answered) if notebooks is None]
    return {key: sorted(nbs) for key, nbs in sorted(shown.items())}, problems


def stale(listed, found, text_of=_working_tree):
    """Why ``listed`` ({key: [notebooks]}, the checked-in list) is not ``found`` (the notebooks now); [] if it is."""
    lines = []
    for key in sorted(set(listed) | set(found)):
        new, old = set(found.get(key, ())), set(listed.get(key, ()))
        lines += [f"{nb} shows {key}, which the list does not say" for nb in sorted(new - old)]
        lines += [f"the list says {nb} shows {key}; it does not" for nb in sorted(old - new)]
    lines += [f"the list names {key}, which is no function, class or module of utils now" for key in sorted(listed)
              if (locate(key, text_of) or (None,))[0] != key]
    return lines


def write(found, by_hand, path=LIST):
    about = ("The utils functions and classes each notebook prints as source (inspect.getsource in a code cell): "
             "editing one edits those lessons' text. Kept by tests/test_course_shown_source.py; rewrite it with `"
             + WRITE + "`. `python -m utils.course.shown_source --changed [REV]` lists the shown objects a change "
             "edits. by_hand: "
             "cells whose show cannot be read statically, 'notebook#cell-id': [the utils objects it shows].")
    def rows(table):  # one object a line, its notebooks on it: a diff of the list reads as a diff of the lessons
        return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in table.items()) + "\n }" if table \
            else "{}"
    Path(path).write_text(f'{{\n "about": {json.dumps(about)},\n "by_hand": {rows(by_hand)},\n'
                          f' "shown": {rows(found)}\n}}\n')


# --- what a change edits --------------------------------------------------------------------------------------

def changed_shown(rev="HEAD", shown=None):
    """[(key, notebooks, how)] for each listed object whose source differs between ``rev`` and the working tree
    (``A..B``: between A and B); how is "edited", "removed" or "added"."""
    old_rev, _, new_rev = rev.partition("..")
    return edited(read_list()[0] if shown is None else shown, lambda p: text_at(old_rev or "HEAD", p),
                  (lambda p: text_at(new_rev, p)) if new_rev else _working_tree, changed_files(rev))


def edited(shown, old, new, files):
    """The listed objects whose source differs between the texts ``old`` and ``new`` give (path -> text or None);
    ``files``, the paths the change touches (utils/course/changes.py's reading of it), spares reading the others."""
    result = []
    for key, notebooks in sorted(shown.items()):
        after = locate(key, new)
        if after is not None and after[1] not in files:
            continue
        before = locate(key, old)
        if before != after:
            result.append((key, notebooks, "removed" if after is None else "added" if before is None else "edited"))
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite {LIST.relative_to(ROOT)}")
    ap.add_argument("--changed", nargs="?", const="HEAD", metavar="REV",
                    help="the shown objects a change since REV (default HEAD; or A..B) edits, and their notebooks")
    args = ap.parse_args(argv)
    if args.changed:
        changes = changed_shown(args.changed)
        for key, notebooks, how in changes:
            print(f"{key} ({how}): shown in {', '.join(notebooks)}")
        print(f"{len(changes)} shown object(s) changed since {args.changed}" if changes else
              f"no shown utils source changed since {args.changed}")
        return 0
    listed, by_hand = read_list()
    found, problems = current(by_hand=by_hand)
    for problem in problems:
        print("cannot resolve:", problem)
    if args.write:
        write(found, by_hand)
        print(f"wrote {LIST.relative_to(ROOT)}: {len(found)} objects shown by "
              f"{len({nb for nbs in found.values() for nb in nbs})} notebooks")
        return 1 if problems else 0
    for key, notebooks in found.items():
        print(f"{key}: {', '.join(notebooks)}")
    differences = stale(listed, found)
    for line in differences:
        print("stale:", line)
    if differences:
        print(f"run `{WRITE}`")
    return 1 if problems or differences else 0


if __name__ == "__main__":
    sys.exit(main())
