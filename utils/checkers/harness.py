"""How a checker calls the learner's code: what the answer raises becomes a named verdict, never a checker traceback.

Every checker calls into learner code in two places: in the notebook's kernel (``make_buckets``, a schedule, a
merge), and inside the ranks (a DDP class, a loss, a fixed program). Either way the learner must read *their*
mistake, not a traceback that runs through ``utils/checkers``. So:

- in the kernel, ``learner_call(fn, *args, where=..., hints=...)`` calls ``fn``; an exception it raises becomes
  ``LabCheckFailed`` with the mistake ``raised`` (or one the lab's ``phrases`` name), whose message gives the
  exception's type and message and the answer's own line (``answer_line``);
- inside a rank, the checker's rank function catches the exception and returns it as data, ``caught(exc, where)``
  (the same line included); the checker raises it in the notebook with ``raise_if_error``;
- a stub that was never filled in raises its own ``NotImplementedError`` again, in both places, so a learner who
  runs a check too early is told to write code, not graded.

``answer_line`` picks the deepest frame of the traceback whose file is the learner's: not under ``utils/``, not
in torch or any installed package, not the standard library. A notebook cell's frame (``/tmp/ipykernel_.../12.py``,
``<ipython-input-...>``, or ``02_ddp_lab.ipynb, cell 3`` when the workshop reads a notebook) shows its source
through ``linecache``, where IPython, the launcher (``utils.launch``) and ``answers_from_notebook`` put it.
A rank that dies or hangs is ``launch_answer``'s business (``common``); the watcher of forbidden calls is
``watch``'s.
"""

import os
import sys
import sysconfig

import torch
import torch.distributed as dist

from ..launch.restricted import quoted_line

__all__ = ["LabCheckFailed", "RAISED_HINT", "answer_line", "is_learners", "is_utils", "learner_call", "caught",
           "first_error", "raise_if_error"]

RAISED_HINT = ("your code raised the exception above, at the line shown: read its message there, fix that line, "
               "and run the check again.")
GENERIC_HINT = "your code must run on every rank without error; read the message."

_UTILS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # this course's utils/
_NOT_THE_LEARNERS = tuple({_UTILS, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
                           *(os.path.abspath(p) + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")
                             if (p := sysconfig.get_paths().get(key)))})


class LabCheckFailed(AssertionError):
    """A lab answer was rejected. ``.mistake``: a short key (e.g. "averaged"); ``.what``: what the checker saw;
    ``.hint``: the fix; ``.evidence``: what it measured, by name (rank, index, got, expected), when it has that.

    In a notebook it shows as a panel, not a traceback (``_render_traceback_``, ``utils.checkers.feedback``);
    ``str()`` stays the plain message, for the grader and the tests."""

    def __init__(self, mistake, what, hint, world_size=None, evidence=None):
        where = f" (world_size={world_size})" if world_size else ""
        super().__init__(f"Not yet{where}: {what}\nHint: {hint}")
        self.mistake, self.what, self.hint, self.world_size = mistake, what, hint, world_size
        self.evidence = dict(evidence or {})

    def _render_traceback_(self):
        """What IPython shows instead of the traceback: the verdict as a panel (``feedback.panel_lines``)."""
        from .feedback import panel_lines  # feedback imports nothing of the harness: no cycle, only the display
        return panel_lines(self)


def is_learners(filename):
    """Is ``filename`` (a code object's) the learner's: a cell, a solution, a test's planted answer; not the course's
    utils, torch, an installed package or the standard library?"""
    if filename.startswith("<frozen") or filename.startswith("<string>"):
        return False
    if filename.startswith("<"):  # <ipython-input-...>
        return True
    return not os.path.abspath(filename).startswith(_NOT_THE_LEARNERS) and "site-packages" not in filename


def is_utils(filename):
    """Is ``filename`` (a code object's) under this course's ``utils/``?"""
    return not filename.startswith("<") and os.path.abspath(filename).startswith(_UTILS)


def answer_line(exc):
    """"file, line N: source" of the deepest frame of ``exc``'s traceback in the learner's code, or None."""
    found, tb = None, exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_learners(code.co_filename):
            found = (code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    if found is None:
        return None
    filename, line = found
    source = quoted_line(filename, line)
    return f"{filename}, line {line}" + (f": {source}" if source else "")


NO_LINE = "(no line of your code in the traceback: it was raised in a library your code called)"


def _told(exc, where):
    line = answer_line(exc)
    return f"in {where}: {exc}\n  " + (f"at {line}" if line else NO_LINE)


def caught(exc, where):
    """Inside a rank: what to report when the learner's code raised, as (rank, exception type, message).

    The message names ``where`` (e.g. "BucketedDDP.finish"), the exception's message and the learner's line."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else None
    return rank, type(exc).__name__, _told(exc, where)


def first_error(ranks):
    """The report of the lowest rank that caught an error (``ranks``: dicts with an "error" entry), or None.

    An error raised in the learner's own code comes first: when rank 1's answer raises, rank 0, waiting for it
    in a collective, fails too ("Connection reset by peer"), and that is not the learner's line to read."""
    errors = [r["error"] for r in ranks if r.get("error")]
    return next((e for e in errors if NO_LINE not in e[2]), errors[0] if errors else None)


def raise_if_error(error, world_size, hints, phrases=(), mistake_of=None):
    """In the notebook: re-raise a stub's NotImplementedError as itself, anything else as a named mistake.

    ``phrases``: (phrase, mistake) pairs; the first phrase found in the message names the mistake
    (e.g. torch's "shapes cannot be multiplied" for a weight split along the wrong dimension),
    otherwise it is ``raised``. ``hints``: the lab's mistake -> hint table (``RAISED_HINT`` when it has none).
    """
    __tracebackhide__ = True

    if error is None:
        return
    rank, kind, message = error
    if kind == "NotImplementedError":
        on = "" if rank is None else f"raised on rank {rank}: "
        raise NotImplementedError(f"{message}\n({on}write your code between the ## YOUR CODE markers, then run this "
                                  "cell again)")
    mistake = mistake_of or next((m for phrase, m in phrases if phrase in message), "raised")
    hint = hints.get(mistake, RAISED_HINT if mistake == "raised" else GENERIC_HINT)
    who = "your code" if rank is None else f"rank {rank}"
    raise LabCheckFailed(mistake, f"{who} raised {kind} {message}", hint, world_size)


def learner_call(fn, *args, where, hints, phrases=(), let_through=(), mistake_of=None, world_size=None, **kwargs):
    """In the kernel: ``fn(*args, **kwargs)``; an exception it raises is ``LabCheckFailed``, with the learner's line.

    ``where``: how the message names the call ("make_buckets(params, 1,000)"); ``hints``, ``phrases``: as for
    ``raise_if_error``; ``let_through``: exception classes the check itself expects and catches (lab 06's
    ValueError); ``mistake_of(exc)``: a lab's own name for an exception, or None (lab 09: a ValueError the
    planner raised is the "divisibility" mistake). NotImplementedError (a stub) is re-raised as itself.
    """
    __tracebackhide__ = True
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except let_through:
        raise
    except Exception as exc:  # noqa: BLE001 - the learner's, whatever it is: named, with their line
        error = (None, type(exc).__name__, _told(exc, where))
        mistake = mistake_of(exc) if mistake_of else None
    raise_if_error(error, world_size, hints, phrases, mistake_of=mistake)
