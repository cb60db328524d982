"""How a lab grades an answer: run it on ranks, and turn what went wrong into a named mistake with a hint.

Shared by the checker of every lab, one module per lab in ``utils/checkers/``, named like the lab's
reference solution in ``labs/solutions/``: ``halving_doubling`` (labs 01a and 01b, with ``halving_reduce_scatter``,
``doubling_all_gather`` and ``folded_all_reduce``), ``ddp`` (lab 02), ``zero``
(lab 03), ``tensor_parallel`` (lab 05), ``pipeline_schedule`` (lab 06) and ``ring_attention`` (lab 14). A checker returns a
``CheckResult`` (print it: what was checked, what was measured) or raises ``LabCheckFailed``, an
``AssertionError`` whose ``.mistake`` names the classic mistake it recognised and whose ``.hint``
says how to fix it. A stub that was never filled in raises its own ``NotImplementedError`` again,
in the notebook, so a learner who runs the check too early is told to write code, not graded.

Every call into the learner's code goes through the harness (``utils.checkers.harness``, re-exported
here): in the kernel ``learner_call``, which turns an exception the answer raises into the mistake
``raised`` with the answer's own line; inside the ranks, where an exception would end the rank and hide
what the other ranks saw, the checker's rank function catches it and returns it as data,
``caught(exc, where)``, and the checker raises it in the notebook with ``raise_if_error``. Forbidden
calls are refused on every thread by ``watched_call`` (``utils.checkers.watch``, with the targets tripped in
place by ``utils.checkers.guard``). A hang or a crash
outside the learner's code comes back from ``launch_answer`` as a ``LabCheckFailed`` that says what a
hang usually means in that lab.
"""

import dataclasses
import re
import warnings

import torch

from ..launch import RankError, RankTimeoutError, run_ranks
from ..launch.report import FRAME
from ..launch.restricted import quoted_line
from .harness import (GENERIC_HINT, RAISED_HINT, LabCheckFailed, answer_line, caught,  # noqa: F401
                      first_error, is_learners, learner_call, raise_if_error)
from .watch import TAMPER_HINT, watched_call  # noqa: F401 - every checker imports the harness from here

# One set of tolerances for every checker. float32 sums taken in another order (shard means, then over
# ranks; micro-batch gradients summed in another order) differ by ~1e-8 (seen); a few optimizer steps
# accumulate that to ~1e-7. A real mistake (a missing division, a lost micro-batch) is off by far more.
GRAD_TOL = dict(rtol=1e-4, atol=1e-6)
WEIGHT_TOL = dict(rtol=1e-4, atol=1e-5)


def fail(hints, mistake, what, world_size=None):
    """Reject an answer: raise ``LabCheckFailed`` for ``mistake``, with its hint from the lab's ``hints`` table."""
    __tracebackhide__ = True
    raise LabCheckFailed(mistake, what, hints[mistake], world_size)


@dataclasses.dataclass
class CheckResult:
    """A passed check: ``lines`` says what was verified and measured, one line per world size."""

    name: str
    lines: list

    def __str__(self):
        return "\n".join([f"PASSED: {self.name}"] + [f"  - {line}" for line in self.lines])


def launch_answer(fn, args, world_size, timeout, name, hang_hint, rank_args=None, traffic=None):
    """run_ranks, with a hang or a crash that escaped the learner's code turned into a hint. ``rank_args``: each rank's
    own arguments (``rank_secrets``). ``traffic``: a list, for a check of what the ranks sent each other: the ranks
    then talk through the launcher's relay (``backend="relay"``, ``utils.launch.relay``), sealed, and the list gets
    what the relay carried for each rank (``carried``)."""
    __tracebackhide__ = True  # IPython and pytest show the learner's cell, not this frame
    try:
        with warnings.catch_warnings():  # the checker chose the size (boundaries.check_world_sizes), not the learner:
            # more ranks than two a core are slow, not wrong, and the learner has nothing to change
            warnings.filterwarnings("ignore", message=r".*more than this machine can sensibly run")
            relayed = dict(backend="relay", traffic=traffic) if traffic is not None else {}
            return run_ranks(fn, *args, world_size=world_size, timeout=timeout, verbose=False, rank_args=rank_args,
                             **relayed)
    except RankTimeoutError as err:
        stuck = "\n".join(f"rank {r}: {stuck_at(s)}" for r, s in sorted(err.stacks.items())
                          if s != "finished normally")
        raise LabCheckFailed("deadlock", f"the ranks were still running after {timeout:g} s and were stopped; "
                             f"where each stuck rank waited:\n{stuck}", hang_hint, world_size) from None
    except RankError as err:
        if aborted := aborted_message(err):
            raise LabCheckFailed("size_mismatch", aborted, SIZE_MISMATCH_HINT, world_size) from None
        if unpaired := unpaired_message(err):
            raise LabCheckFailed("unpaired", unpaired, UNPAIRED_HINT, world_size) from None
        raise LabCheckFailed("crash", crashed(err), f"{name} must run on every rank without error; the lines "
                             "above are where it stopped in your code.", world_size) from None


# a frame in a Python traceback ('File "f", line 3, in fn') or a faulthandler stack ('File "f", line 3 in fn')
ANY_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<fn>\S+)')


def _frame_text(frame):
    source = quoted_line(frame["file"], int(frame["line"]))
    return f"{frame['fn']}, line {frame['line']}" + (f": {source}" if source else "")


def crashed(err):
    """What a ``RankError`` says to a learner: the first failed rank, its error, and the frames of its traceback in
    the learner's code only (innermost last); no checker, launcher or torch frame."""
    report = err.reports.get(err.rank) or {}
    head = f"rank {err.rank} crashed: {report.get('type', 'error')}: {report.get('message', err)}"
    mine = [_frame_text(f) for f in ANY_FRAME.finditer(report.get("traceback", "")) if is_learners(f["file"])]
    return "\n".join([head] + (mine or ["outside your code"]))


SIZE_MISMATCH_HINT = ("make both sides of every message agree on its size: a receive needs a tensor at least as large "
                      "as what its partner sends, and a collective the same shape on every rank. Print the chunk "
                      "bounds each rank computes at that step, sender and receiver side by side.")


def aborted_message(err):
    """What to tell a learner when a rank was aborted (SIGABRT) rather than raising, or None for another crash.

    gloo aborts the process, with no Python exception to catch, when one message does not fit the tensor it lands
    in: a ``recv``/``irecv`` into a smaller tensor than was sent, a ``broadcast``, ``all_reduce`` or ``all_gather``
    whose tensors differ in size between ranks (each measured, torch 2.13 on CPU). A receive into a larger tensor
    does not abort. So a SIGABRT is named, with where it happened: the torch call and the answer's line."""
    aborted = [(rank, r) for rank, r in sorted(err.reports.items())
               if r.get("type") == "died" and "SIGABRT" in r.get("message", "")]
    if not aborted:  # (the first rank to fail may be its partner, told "Connection closed by peer")
        return None
    rank, report = aborted[0]
    frames = list(ANY_FRAME.finditer(report.get("traceback", "")))
    mine = [_frame_text(f) for f in reversed(frames) if is_learners(f["file"])]  # faulthandler: innermost first
    call = next((f["fn"] for f in frames if "/torch/distributed/" in f["file"] and f["fn"] != "wrapper"), None)
    inside = f"in torch's {call}" if call else "while it waited on a message"
    return "\n".join([f"rank {rank} was aborted (SIGABRT) {inside}, with no Python error: gloo ends a process "
                      "this way when a message does not fit the tensor it is received into (a receive smaller than "
                      "what was sent, or a collective whose tensors differ in size between ranks)"]
                     + (mine or ["outside your code"]))


UNPAIRED_HINT = ("every message needs its partner's matching call, in the same order on both sides: list, for one "
                 "rank and its partner at each step, what each sends and receives and how many times; a rank that "
                 "sends once more, or to another rank, than its partner expects leaves one side waiting.")


def unpaired_message(err):
    """What to tell a learner when some ranks returned while the others failed only because their peers had gone
    (every report a secondary "connection closed"): the answer's messages did not pair up, so the ranks left it at
    different points; or None for another crash. (Found by make mutants: lab 01b's all-gather with a wrong chunk
    start, once an unnamed crash.)"""
    if not err.finished or not err.reports or not all(r.get("secondary") for r in err.reports.values()):
        return None
    waiting = sorted(err.reports)
    return (f"ranks {list(err.finished)} finished while ranks {waiting} were still in a call that needed them "
            "(their connection closed when those ranks ended): the sends and receives of your answer did not pair "
            "up, so the ranks left it at different points")


def stuck_at(stack):
    """"fn, line N: source" of the deepest frame of a hung rank's stack (faulthandler's, most recent call first)
    in the learner's code; when none is, "outside your code, waiting in" the innermost torch call."""
    frames = list(FRAME.finditer(stack))
    mine = next((f for f in frames if is_learners(f["file"])), None)
    if mine is not None:
        return _frame_text(mine)
    torch_call = next((f for f in frames if "/torch/" in f["file"]), None)
    return "outside your code, waiting in " + (f"torch's {torch_call['fn']}" if torch_call else "a call of the course")


def close(a, b, tolerance):
    """``torch.testing.assert_close`` as a yes/no answer, for a checker that goes on to diagnose."""
    try:
        torch.testing.assert_close(a, b, **tolerance)
        return True
    except AssertionError:
        return False
