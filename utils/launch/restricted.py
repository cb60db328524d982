"""Reading what a process the reader does not trust sends back: plain data and tensors, never code.

``pickle.loads`` runs whatever the bytes name (any importable function, with any arguments), and cloudpickle
carries functions by value: reading a learner's process's result with either lets that learner's code run in the
reader. The workshop's grader (``utils.workshop.grade``) reads its answers' processes with these two instead:

- ``loads_plain(data)``: tuples, lists, dicts, sets, strings, bytes, numbers, booleans and None: what the
  launcher's own messages hold (a rank's "ok"/"error" envelope, the rank server's "started"/"exited"). Anything
  that names a global (a class, a function) is refused with ``pickle.UnpicklingError``.
- ``dumps_tensors(value)`` / ``loads_tensors(data)``: the same plus tensors, parameters, dtypes, ``torch.Size`` and
  the classes of ``safe_classes()`` (the planner's ``Plan``, which lab 09's ``choose_plan`` returns), through
  ``torch.save`` and ``torch.load(..., weights_only=True)``: torch's own restricted unpickler, the one it
  uses to load checkpoints from strangers. ``dumps_tensors`` checks the value reads back that way and raises
  ``Unsendable`` (its type named) when it does not: a value of a class defined in the notebook, a module, a
  function.

``RESTRICTED_ENV``: when the launching process sets it, its ranks send their results with ``dumps_tensors`` and
``run_ranks`` reads them with ``loads_tensors`` (``kernel.py``, ``rank.py``); a notebook leaves it unset and its
ranks return anything cloudpickle can carry.
"""

from __future__ import annotations

import io
import os
import pickle

__all__ = ["RESTRICTED_ENV", "RESULT_LIMIT", "quoted_line", "safe_classes", "Unsendable", "loads_plain", "dumps_tensors", "loads_tensors", "restricted"]

RESTRICTED_ENV = "COURSE_RESTRICTED_RESULTS"
RESULT_LIMIT = 256 << 20  # bytes of one message a restricted reader takes (a checker's results are a few MB): more
# is refused, not read, so that an answer cannot fill the grader's memory through it


class Unsendable(TypeError):
    """A value that cannot travel as plain data and tensors: ``type_name`` and a short ``text`` of it."""

    def __init__(self, type_name, text):
        super().__init__(f"a {type_name} cannot be sent back as plain data (tensors, numbers, strings, lists, "
                         f"dicts): {text}")
        self.type_name, self.text = type_name, text

    def __repr__(self):
        return f"<a {self.type_name} that could not be sent back as data: {self.text[:200]}>"


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused: the data names {module}.{name}; only plain data is read here")


def loads_plain(data):
    """``pickle.loads`` of plain data only (no class, no function is ever looked up)."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def safe_classes():
    """The course's classes a result may hold: the planner's ``Plan`` (lab 09's ``choose_plan`` returns one)."""
    from ..planner import Plan

    return [Plan]


def loads_tensors(data):
    """Plain data and tensors (``torch.load(weights_only=True)``), plus the classes of ``safe_classes()``."""
    import torch

    with torch.serialization.safe_globals(safe_classes()):
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def dumps_tensors(value):
    """``torch.save`` bytes of ``value``, checked to read back with ``loads_tensors``; else ``Unsendable``."""
    import torch

    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
        data = buffer.getvalue()
        loads_tensors(data)
    except Exception as err:  # noqa: BLE001 -- pickling or the weights-only reader refused it
        raise Unsendable(type(value).__name__, _why(err)) from None
    return data


def _why(err):
    """The line of torch's refusal that names what was refused (its first lines are about torch.load's default)."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    named = [line for line in lines if "GLOBAL" in line or "Unsupported" in line or "Can't" in line]
    line = (named or lines or [type(err).__name__])[0].strip().removeprefix("WeightsUnpickler error: ")
    return line.split(". Please use")[0][:300]  # not torch's advice to allowlist it: the reader trusts no answer


def quoted_line(filename, lineno):
    """Line ``lineno`` of ``filename``, stripped, to quote in a report ("" if unknown). A process that reads its ranks
    restricted (the grader's judge) quotes only what it already holds in ``linecache`` (the answer's notebook cells):
    it never opens a file a rank's traceback names, which could be the solutions, a classmate's notebook, or a file
    an earlier answer planted."""
    import linecache

    if restricted():
        entry = linecache.cache.get(filename)
        lines = entry[2] if entry and len(entry) >= 3 else []
        return lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
    return linecache.getline(filename, lineno).strip()


def restricted():
    """Are results read restricted in this process (its environment has ``RESTRICTED_ENV``)?"""
    return bool(os.environ.get(RESTRICTED_ENV))
