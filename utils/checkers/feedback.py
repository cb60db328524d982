"""A lab check's verdict as a panel: what a learner reads under the check cell instead of a traceback.

A rejected answer raises ``LabCheckFailed`` (``utils.checkers.harness``), and the exception is kept: papermill
fails a run on the cell's ``error`` output and the workshop grader (``utils.workshop.grade``) reads ``.mistake``.
Only its display changes. IPython asks an exception for ``_render_traceback_()`` before it formats any frame
(``InteractiveShell.showtraceback`` in IPython/core/interactiveshell.py), and ipykernel sends the lines it returns
as the ``traceback`` of the ``error`` message, which JupyterLab shows with its ANSI colours. So a failed check
shows ``panel_lines(err)``: the mistake's name, the evidence
(world size, rank, index, got and expected, where the checker measured them), the hint and what to try next,
and no frame of checker code. ``str(err)`` stays the plain message the grader and the tests read.
"""

import textwrap

__all__ = ["panel_lines", "verdict", "TRY_NEXT", "AGAIN"]

WIDTH = 100  # JupyterLab breaks output lines anywhere (word-break: break-all): wrap at words first
TRY_NEXT = ("change your code between ## YOUR CODE and ## END OF YOUR CODE as the hint says, run that cell, "
            "then run this check cell again (it runs every case again).")
AGAIN = "; or, if your code did not change, run the check again (a machine's crash or a timeout on a loaded machine)."
RED, BOLD, DIM, RESET = "\x1b[31m", "\x1b[1m", "\x1b[2m", "\x1b[0m"
EVIDENCE_ORDER = ("world_size", "rank", "index", "got", "expected")


def _field(label, text, colour=""):
    """``label`` in a column of 11, ``text`` wrapped beside it, one line per paragraph of ``text``."""
    lines = []
    for paragraph in str(text).splitlines() or [""]:
        lines += textwrap.wrap(paragraph, WIDTH - 13, break_long_words=False, break_on_hyphens=False) or [""]
    head = f"  {colour}{label:<11}{RESET if colour else ''}"
    return [head + lines[0]] + [" " * 13 + line for line in lines[1:]]


def evidence_line(err):
    """"world_size=4 · rank 1 · index 3 · got 6 · expected 10": what the checker measured, in the panel's order."""
    evidence = {"world_size": err.world_size, **getattr(err, "evidence", {})}
    parts = [f"world_size={evidence['world_size']}" if evidence.get("world_size") else None]
    parts += [f"{key} {evidence[key]}" for key in EVIDENCE_ORDER[1:] if evidence.get(key) is not None]
    parts += [f"{key} {value}" for key, value in evidence.items() if key not in EVIDENCE_ORDER and value is not None]
    return " · ".join(p for p in parts if p)


def panel_lines(err):
    """The lines IPython shows for ``err`` (a ``LabCheckFailed``): the verdict as a panel, no checker frame."""
    rule = DIM + "─" * WIDTH + RESET
    measured = evidence_line(err)
    lines = [rule, f"{RED}{BOLD}✗ Not yet: {err.mistake}{RESET}"]
    if measured:
        lines += _field("evidence", measured, BOLD)
    lines += _field("what", err.what, BOLD)
    lines += _field("hint", err.hint, BOLD)
    again = err.mistake in ("crash", "deadlock")
    lines += _field("try next", TRY_NEXT.rstrip(".") + AGAIN if again else TRY_NEXT, BOLD)
    return lines + [rule]


def verdict(err):
    """What a cell that catches ``err`` and goes on prints: the panel of a ``LabCheckFailed`` (anything with a
    ``mistake``), "Type: message" for anything else (a stub's NotImplementedError)."""
    if getattr(err, "mistake", None) is not None:
        return "\n".join(panel_lines(err))
    return f"{type(err).__name__}: {err}"
