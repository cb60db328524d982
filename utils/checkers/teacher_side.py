"""The teacher's side of a checker: a module of ``labs/solutions/`` loaded by its path, where the course holds it.

A shipped checker judges an answer by its results (against one process, against torch's own collective, against a
stored table of expected outputs), never by carrying the answer's algorithm (issue 37). What computes those tables,
and a diagnosis that needs the algorithm, lives beside the reference solutions in ``labs/solutions/``, which the
student release leaves out and the grader's sandbox hides: lab 09's search (``plan_3d.teacher_search``), labs 01a
and 01b's plans (``halving_doubling_tables.teacher_plans``). ``teacher_module(path)`` loads such a module by its path,
once (it is kept in ``sys.modules`` as ``labs.solutions.<name>``), and returns None where the file is not there: the
checker then gives its generic verdict.
"""

import importlib.util
import sys
from pathlib import Path

__all__ = ["teacher_module"]


def teacher_module(path):
    """The module at ``path`` (a file of ``labs/solutions/``), loaded once; None where the course does not hold it
    (the student release, the grader's sandbox)."""
    path = Path(path)
    if not path.is_file():
        return None
    name = f"labs.solutions.{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]
