"""What went wrong, on which rank: the reports behind ``RankError`` and ``RankTimeoutError``.

When one rank of a distributed job fails, its peers fail a moment later with errors of their own
("Connection closed by peer"), which are only echoes. A launcher that shows whichever error it
saw first often shows an echo. These functions order the reports by time, set the echoes aside
as *secondary*, and turn faulthandler's stack dumps into "where was each rank stuck".

They know nothing of how the ranks were started: the kernel side (``kernel.py``) hands them one
``RankOutcome`` per rank, a plain record of what that rank said and how it ended.
"""

import dataclasses
import re
import signal


class RankError(RuntimeError):
    """A rank raised or died. ``.rank`` is the first rank that failed, ``.reports`` all of them, ``.finished`` the
    ranks that returned normally."""

    def __init__(self, message, rank, reports, finished=()):
        super().__init__(message)
        self.rank = rank
        self.reports = reports
        self.finished = tuple(finished)


class RankTimeoutError(TimeoutError):
    """The ranks did not finish in time. ``.stacks`` maps each rank to where it was stuck."""

    def __init__(self, message, stacks):
        super().__init__(message)
        self.stacks = stacks


@dataclasses.dataclass
class RankOutcome:
    """How one rank ended, as the kernel saw it."""

    rank: int
    report: dict | None = None  # the rank's own error report (type, message, traceback, time, secondary)
    returned: bool = False  # it sent back a value
    killed: bool = False  # the launcher stopped it
    exitcode: int | None = None  # None: still running when the launcher stopped looking
    stderr_tail: list = dataclasses.field(default_factory=list)  # its last lines of stderr
    stack: list | None = None  # faulthandler's dump, when it was asked where it was stuck


def looks_secondary(exc) -> bool:
    """Is this the echo of another rank's failure (its connection closed) rather than a bug here?"""
    text = f"{type(exc).__name__}: {exc}"
    return bool(re.search(r"connection (closed|reset|refused)|broken pipe|closed by peer|"
                          r"DistNetworkError|NCCL communicator was aborted|Socket Timeout", text, re.I))


def exit_text(code):
    if code is not None and code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


def failure_error(ranks):
    """``RankError`` for a launch in which a rank failed; ``ranks`` is one ``RankOutcome`` per rank."""
    reports = {}
    for r in ranks:
        if r.report:
            reports[r.rank] = r.report
        elif not r.returned and not r.killed and r.exitcode not in (None, 0):
            reports[r.rank] = dict(time=float("inf"), type="died", secondary=False,
                                   message=f"rank {r.rank} {exit_text(r.exitcode)} without a Python error",
                                   traceback=fatal_error_stack(r.stderr_tail))
    real = {k: v for k, v in reports.items() if not v["secondary"]} or reports
    first = min(real, key=lambda k: (real[k]["time"], k))
    head = reports[first]
    lines = [f"rank {first} of {len(ranks)} failed first: {head['type']}: {head['message']}", "",
             f"----- traceback of rank {first} -----", head["traceback"].rstrip(), "", "----- the other ranks -----"]
    for r in ranks:
        if r.rank == first:
            continue
        rep = reports.get(r.rank)
        if rep and rep["secondary"]:
            what = f"secondary error, a consequence of rank {first}'s failure: {rep['type']}: {_first_line(rep['message'])}"
        elif rep:
            what = f"also failed: {rep['type']}: {_first_line(rep['message'])}"
        elif r.returned:
            what = "finished normally"
        else:
            what = f"stopped by the launcher after rank {first} failed"
        lines.append(f"rank {r.rank}: {what}")
    return RankError("\n".join(lines), first, reports, [r.rank for r in ranks if r.returned])


def _first_line(text, width=160):
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= width else line[:width] + "..."


def timeout_error(ranks, world_size, timeout):
    """``RankTimeoutError`` for ranks still running at the timeout; ``r.stack`` is set for those."""
    stacks, lines = {}, []
    for r in ranks:
        if r.stack is None:
            stacks[r.rank] = "finished normally"
        else:
            stacks[r.rank] = trim_stack(r.stack) or "(no stack came back: stuck outside Python?)"
        lines += [f"----- rank {r.rank} -----", stacks[r.rank]]
    stuck = [r.rank for r in ranks if r.stack is not None]
    head = (f"rank(s) {stuck} of {world_size} did not finish within timeout={timeout:g} s and were stopped. "
            f"Where each rank was (most recent call first):")
    tail = ("Usual causes: a collective that not every rank calls, a send without its recv, or a cell that "
            "needs longer (pass timeout=... to run_ranks, or --timeout to %%ranks).")
    return RankTimeoutError("\n".join([head, *lines, tail]), stacks)


def fatal_error_stack(stderr_lines):
    """faulthandler's report of a crash ("Fatal Python error: ..."), else the last lines of stderr."""
    starts = [i for i, line in enumerate(stderr_lines) if line.startswith("Fatal Python error")]
    if not starts:
        return "\n".join(stderr_lines[-20:]) + "\n"
    return trim_stack(stderr_lines[starts[-1]:]) + "\n"


def trim_stack(dump):
    """Keep faulthandler's frames down to the rank's entry point; drop the rank server's below it."""
    kept = []
    for line in dump:
        if "in rank_main" in line:  # the rank's entry point (rank.py): below it is the server
            if len(kept) <= 1:  # stuck in the launcher itself (before fn started): say so
                kept.append(line)
            break
        kept.append(line)
    return "\n".join(kept).strip()
