"""What every lab test does with a planted wrong answer: expect the checker to reject it, for the right reason;
and the reference solution's answers of a lab, by its names (``reference_answers``).

    rejected = expect_rejection(check_ddp, broadcast, average, world_sizes=(2,), mistake="not_divided",
                                phrase="divide by")

The checker must raise ``LabCheckFailed`` whose ``.mistake`` is ``mistake`` (the classic mistake it
recognised) and whose message contains ``phrase`` (typically words of the hint, so the learner is told
what to fix), and whose panel (``expect_panel``) shows it. Returns the exception, for tests that look further.
``expect_raised``: the answer raised in its own code.
"""

import importlib
import re
import sys
from pathlib import Path

import pytest

from utils.checkers.common import LabCheckFailed
from utils.checkers.feedback import AGAIN, TRY_NEXT


def expect_rejection(check, *args, mistake, phrase=None, **kwargs):
    __tracebackhide__ = True
    with pytest.raises(LabCheckFailed) as failure:
        check(*args, **kwargs)
    assert failure.value.mistake == mistake, f"expected the mistake {mistake!r}, got: {failure.value}"
    if phrase is not None:
        assert phrase in str(failure.value), f"expected {phrase!r} in: {failure.value}"
    expect_panel(failure.value)
    return failure.value


def expect_panel(err):
    """What a notebook shows for ``err`` (IPython's ``_render_traceback_``): the panel, naming the mistake and nothing
    more in its headline, with the world size and what else the checker measured, what it saw, the hint and what to
    try next (after a crash or a hang, also: run it again); no checker frame or file."""
    __tracebackhide__ = True
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err._render_traceback_()))  # as JupyterLab shows it, uncoloured
    flat = " ".join(shown.split())  # the panel wraps its lines
    headline = next(line for line in shown.splitlines() if "Not yet" in line)
    assert headline == f"✗ Not yet: {err.mistake}", f"the headline says more than the mistake: {headline!r}"
    try_next = TRY_NEXT.rstrip(".") + AGAIN if err.mistake in ("crash", "deadlock") else TRY_NEXT
    for part in [err.hint, err.what, try_next] + [str(v) for v in err.evidence.values()]:
        assert " ".join(part.split()) in flat, f"{part!r} not in the panel:\n{shown}"
    if err.world_size:
        assert f"world_size={err.world_size}" in shown, shown
    assert "Traceback" not in shown and "utils/checkers" not in shown and 'File "' not in shown, shown
    return shown


def expect_raised(check, *args, line, **kwargs):
    """The answer raises inside its own code: the checker names it ``raised``, quotes ``line`` (the answer's source
    line, read back through linecache), names no checker file in its message and chains no exception (so no
    traceback of checker code is printed under it; the checker's own frames are hidden by ``__tracebackhide__``,
    which this does not test)."""
    __tracebackhide__ = True
    rejected = expect_rejection(check, *args, mistake="raised", phrase=line, **kwargs)
    assert "utils/checkers" not in str(rejected) and rejected.__cause__ is None and rejected.__context__ is None, \
        f"a checker frame shows in: {rejected}"
    return rejected


def reference_answers(lab, root):
    """The reference solution's answers for ``lab`` (a utils.checkers.labs.Lab; labs/solutions/<lab.solution>.py),
    by the lab's names. Here, not in utils: the checkers ship to learners, the solutions do not."""
    labs_folder = str(Path(root).resolve() / "labs")
    if labs_folder not in sys.path:
        sys.path.insert(0, labs_folder)
    module = importlib.import_module(f"solutions.{lab.solution}")
    answers = {name: getattr(module, name) for name in lab.answers if hasattr(module, name)}
    for name in lab.answers:  # diagnosis_A ... live in the solution's DIAGNOSES table
        if name.startswith("diagnosis_"):
            answers[name] = module.DIAGNOSES[name.removeprefix("diagnosis_")]
    return answers


def graded_in_sandbox(tmp_path, lab, answers, part=0, learner="forger", timeout=240, sandbox=True):
    """The workshop grader's verdict (``grade.run_answer``) on a notebook of ``lab`` whose answer cells are ``answers``
    ({name: source}, ``submissions.notebook_with``), graded as ``make grade --smoke`` grades it, on 2 ranks: the judge
    outside the sandbox and the answer's code inside it (``sandbox``)."""
    import nbformat

    from utils.workshop import grade as grader
    from utils.workshop.submissions import notebook_with

    path = Path(tmp_path) / learner / f"{lab}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook_with(lab, answers), str(path))
    return grader.run_answer(grader.Answer(learner, lab, path, "x"), part, world_size=2, smoke=True, timeout=timeout,
                             sandbox=sandbox)
