"""A mutation score for every lab's checker (``make mutants``; a benchmark, not part of ``make test``).

Each lab's reference solution (``labs/solutions/``) is mutated, one small wrong edit at a time, in the code the lab
asks a learner to write (``mutate``); the lab's checker runs on every mutant, all parts at the world sizes
``tests/test_every_lab.py`` uses (``SMOKE``), then, for a mutant those accept, as the learner's own check runs them
(the notebook's ``WORLD_SIZE``, without ``SMOKE``: 6 ranks where the lab accepts them), each in a fresh process with a
timeout (``run``, ``trial``); a mutant the checker still accepts goes to a one-process oracle (``oracle``): the same results as expected on the checker's inputs and larger
ones make it equivalent, anything else is a miss. ``python -m utils.course.mutants`` prints a table per lab and
writes ``build/mutants/<lab>.json`` with every mutant's outcome and each miss's diff line.

Why not mutmut 3.8.1 or cosmic-ray 8.7.0: both judge a mutant by the exit code of a test command run over an
importable, mutated copy of the package (mutmut also rewrites every function into a trampoline that reads an
environment variable), so neither can tell a named rejection (``LabCheckFailed.mistake``) from a crash, nor hand
an accepted mutant to an oracle, and their per-mutant overhead is a whole test run; an AST mutator of our own is
enough for one module's functions.
"""

from .mutate import KINDS, Mutant, mutants, target_names
from .run import LabScore, choose, run_lab

__all__ = ["KINDS", "Mutant", "mutants", "target_names", "LabScore", "choose", "run_lab"]
