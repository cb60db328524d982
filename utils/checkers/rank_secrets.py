"""Inputs only one rank holds: what makes a rank's report an observation the checker can verify.

A checker's rank function runs in the rank, beside the learner's code, in one process: whatever it computes there the
learner's code can replace (a class body that patches the checker when the notebook's definitions run). So a checker
does not take its references from a rank. It gives each rank a random seed of its own (``new_seeds``, through
``run_ranks``'s ``rank_args``: each rank's on a pipe of its own, never in the payload every rank gets, and a rank that
holds one is undumpable, so a peer cannot read it from its memory). The rank makes its inputs from its seed
(``generator``), or gets its own share of small data itself in its ``rank_args`` (labs 05 and 14); the checker, which
holds every seed (every share), makes the same inputs and computes the expected result outside the ranks (in the
workshop's grader, in the judge, where no learner code runs; in a notebook, in the kernel). A rank's report is then
checked for its shape (``reports``; ``shaped`` for a report of another form), and the checker adds its own ``expected`` to it. No rank holds the expected result
either, not even for a moment: an answer's code can read its caller's variables (``sys._getframe(1).f_locals``).

What this buys: an answer that moves no data between its ranks does not reach the right values, so a stub that
patches the checker's rank function fails, whatever its ranks report. How the ranks moved the data (their messages,
bytes and collectives) is seen in the rank too, by ``PeerLog`` and ``CommLedger``, beside the answer's code, which
can patch them. So a checker that judges the messages or the collectives (labs 01a, 01b, 02, 03) runs its ranks on the launcher's relay
(``utils.launch.relay``: every message passes through the process that launched them, and each rank is sealed,
``utils.launch.seal``, which says what stays open) and ``carried`` holds the ranks' reports
to what the relay carried: a rank that sums with torch's own all-reduce and reports the messages of the algorithm is
caught (planted in tests/test_workshop_judge.py).

Where a peer could read a seed: the grader's sandbox starts the rank server undumpable (``server.py --sandboxed``), and
its ranks inherit that, so another process of the answer's user can neither ptrace them nor open their memory or
file descriptors through /proc; the server hands the pipes on unread, and it runs no learner code (it is started
with ``-P``: no module of the answer's folder shadows one it imports). In a notebook the ranks stay dumpable (a
debugger may attach): there the only code beside them is the learner's own.
"""

import secrets

import torch

from .common import LabCheckFailed

__all__ = ["HINTS", "new_seeds", "rank_args", "generator", "reports", "fields", "tensors_like", "report_each",
           "refuse", "mismatch", "shaped", "carried", "carried_calls"]

HINTS = {
    "not_a_report": "the ranks sent back something the checker's own rank function never returns (other cases, "
                    "other fields, other types): code in your notebook replaced or changed the checker. Leave "
                    "utils.checkers alone, restart the kernel and run the notebook from the top.",
}


def new_seeds(world_size):
    """One fresh random seed per rank, from the operating system's generator: nothing a rank can guess from its rank,
    the time or its peers' seeds. (62 bits each, of which torch's CPU generator keeps 32: guessing a peer's from
    its data would still need some of that data.)"""
    return [secrets.randbits(62) for _ in range(world_size)]


def rank_args(seeds):
    """``run_ranks``'s ``rank_args`` for these seeds: rank k gets ``seeds[k]``, appended to its arguments."""
    return [(seed,) for seed in seeds]


def generator(seed, *salt):
    """A CPU ``torch.Generator`` for ``seed`` and this case (``salt``: small non-negative integers, e.g. the case's
    element count), the same in the rank and in the checker."""
    mixed = seed
    for value in salt:
        mixed = (mixed * 1_000_003 + int(value)) % (1 << 63)
    return torch.Generator().manual_seed(mixed)


def reports(per_rank, kinds, cases, world_size, label="the ranks"):
    """Check the ranks' reports have the shape the checker's rank function gives them, and return them.

    ``per_rank``: what each rank returned, a list of one dict a case; ``kinds``: {field: spec} of a case, as
    ``mismatch`` reads it (a type, a tuple of types, None for anything); ``cases``: how many the rank ran. A list may be
    shorter only where its last case holds an ``error`` (the rank function stops there). Anything else raises
    ``LabCheckFailed("not_a_report")``."""
    __tracebackhide__ = True
    if not isinstance(per_rank, list) or len(per_rank) != world_size:
        refuse(f"{world_size} reports expected, one a rank; got {type(per_rank).__name__}", label, world_size)
    for k, report in enumerate(per_rank):
        if not isinstance(report, list) or not 1 <= len(report) <= cases:
            refuse(f"rank {k} returned {type(report).__name__} of {len(report) if isinstance(report, list) else '?'} "
                   f"case(s); the checker's rank function returns a list of 1 to {cases}", label, world_size)
        for i, case in enumerate(report):
            fields(case, kinds, f"{label}: rank {k}, case {i}", world_size)
        if len(report) < cases and not report[-1].get("error"):
            refuse(f"rank {k} stopped after {len(report)} of {cases} cases without an error", label, world_size)
    return per_rank


def refuse(what, label, world_size):
    """Raise ``LabCheckFailed("not_a_report")``: ``what`` the ranks sent (``label`` says where) is nothing the
    checker's rank function returns."""
    __tracebackhide__ = True
    raise LabCheckFailed("not_a_report", f"{label}: {what}", HINTS["not_a_report"], world_size)


def fields(record, kinds, label, world_size):
    """Check one record of a report has exactly the fields of ``kinds`` ({field: spec}, as ``mismatch`` reads it),
    each of its kind, and return it; anything else raises ``LabCheckFailed("not_a_report")``."""
    __tracebackhide__ = True
    if (what := mismatch(record, kinds, "the record")) is not None:
        refuse(what, label, world_size)
    return record


def tensors_like(got, want, label, world_size, every=True):
    """Check ``got``, a rank's dict of tensors (a state dict, gradients by name), holds a tensor of the same shape and
    dtype as ``want``'s for each of ``want``'s names (``every``), or for each name both hold (not ``every``: a name
    missing is then the checker's to diagnose), and return it. Names ``want`` lacks are let through. Anything else
    raises ``LabCheckFailed("not_a_report")``, before the checker compares values it could not index."""
    __tracebackhide__ = True
    if not isinstance(got, dict):
        refuse(f"a {type(got).__name__} where a dict of tensors belongs", label, world_size)
    for name, tensor in want.items():
        if name not in got:
            if every:
                refuse(f"no {name}", label, world_size)
            continue
        mine = got[name]
        if not isinstance(mine, torch.Tensor) or mine.shape != tensor.shape or mine.dtype != tensor.dtype:
            what = f"a {tuple(mine.shape)} {mine.dtype} tensor" if isinstance(mine, torch.Tensor) else \
                f"a {type(mine).__name__}"
            refuse(f"{name} is {what}, not {tuple(tensor.shape)} {tensor.dtype}", label, world_size)
    return got


def report_each(per_rank, kinds, world_size, label="the ranks"):
    """``reports`` for a rank function that returns one dict, not a list of cases: the same checks (one dict a rank,
    with the fields of ``kinds``), the same refusal. Returns ``per_rank``."""
    __tracebackhide__ = True
    if not isinstance(per_rank, list) or not all(isinstance(report, dict) for report in per_rank):
        kinds = sorted({type(r).__name__ for r in per_rank}) if isinstance(per_rank, list) else type(per_rank).__name__
        refuse(f"one dict a rank expected; got {kinds}", label, world_size)
    reports([[report] for report in per_rank], kinds, 1, world_size, label)
    return per_rank


def mismatch(value, spec, where="the report"):
    """Where ``value`` is not what ``spec`` describes, in words, or None where it is: the shape check of a report that
    is not a list of cases (``reports``), at any depth. ``spec``: None (anything); a type (``isinstance``); a tuple (any
    one of its specs: a tuple of types is ``isinstance``'s); a dict {field: spec} (a dict of exactly these fields); a
    list [spec] (a list of any length, each item to ``spec``); a list of two or more [spec, spec, ...] (a tuple of as
    many items, each to its own spec)."""
    if spec is None:
        return None
    if isinstance(spec, tuple):
        misses = [mismatch(value, one, where) for one in spec]
        return None if None in misses else misses[-1]
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"{where} is a {type(value).__name__}, not a dict of fields {sorted(spec)}"
        if set(value) != set(spec):
            return f"{where}: fields {sorted(map(str, value))}, expected {sorted(spec)}"
        return next((m for name, one in spec.items() if (m := mismatch(value[name], one, f"{where}[{name!r}]"))), None)
    if isinstance(spec, list):
        if len(spec) == 1:  # a list, each item to the one spec
            if not isinstance(value, list):
                return f"{where} is a {type(value).__name__}, not a list"
            spec = spec * len(value)
        elif not isinstance(value, tuple) or len(value) != len(spec):  # a tuple, item k to spec k
            length = f" of {len(value)}" if isinstance(value, (list, tuple)) else ""
            return f"{where} is a {type(value).__name__}{length}, not a tuple of {len(spec)}"
        return next((m for k, (item, one) in enumerate(zip(value, spec))
                     if (m := mismatch(item, one, f"{where}[{k}]"))), None)
    return None if isinstance(value, spec) else f"{where} is a {type(value).__name__}, not a {spec.__name__}"


def shaped(value, spec, world_size, where="the ranks' report"):
    """``value``, where it is what ``spec`` describes (``mismatch``); ``LabCheckFailed("not_a_report")`` otherwise."""
    __tracebackhide__ = True
    if (what := mismatch(value, spec, where)) is not None:  # ``what`` names where
        refuse(what, "the ranks", world_size)
    return value


def carried(sends, calls, traffic, world_size, label="the ranks"):
    """Hold what each rank reported it sent to what the relay carried for it (``run_ranks(..., traffic=)``), and raise
    ``LabCheckFailed("not_a_report")`` where they differ. ``sends[k]``: rank k's messages as it reported them, in
    order, (peer, bytes) each (all its cases, one after another); ``calls[k]``: its collectives other than barriers,
    (op, payload bytes) each as ``CommLedger`` records them, in order (``carried_calls``' rule). The relay's record is
    the launcher's own: no code in a rank changes it."""
    __tracebackhide__ = True
    for k, (reported, record) in enumerate(zip(sends, traffic)):
        relayed = [(peer, size) for kind, peer, size in record if kind == "send"]
        reported = [tuple(int(x) for x in send) for send in reported]
        if reported != relayed:
            first = next((i for i, (a, b) in enumerate(zip(reported, relayed)) if a != b), min(map(len, (reported,
                                                                                                     relayed))))
            refuse(f"rank {k} reported {len(reported)} message(s) and the relay carried {len(relayed)}; they first "
                   f"differ at message {first}: reported {reported[first:first + 1] or 'none'}, carried "
                   f"{relayed[first:first + 1] or 'none'} (peer, bytes)", label, world_size)
        _same_collectives(k, calls[k], record, label, world_size)


# a torch.distributed call (CommLedger's name for it) -> what the relay computes for it (utils.launch.relay.KINDS)
RELAYED = {"all_reduce": "sum_all", "reduce_scatter": "sum_scatter", "reduce_scatter_tensor": "sum_scatter",
           "reduce_scatter_single": "sum_scatter", "all_gather": "gather_all", "all_gather_into_tensor": "gather_all",
           "all_gather_single": "gather_all", "broadcast": "from_root"}


def carried_calls(calls, traffic, world_size, label="the ranks"):
    """``carried`` for a check that judges collectives: ``calls[k]``, rank k's calls in order, (op, payload bytes)
    each as ``CommLedger`` records them (the checker's own calls outside its ledgers added where they happen), must be
    what the relay carried for rank k: the same collectives in the same order with the same bytes, and as many
    messages as it reported sends. Barriers and receives are not compared. ``LabCheckFailed("not_a_report")``
    otherwise."""
    __tracebackhide__ = True
    for k, (reported, record) in enumerate(zip(calls, traffic)):
        sends = sum(op in ("send", "isend") for op, _ in reported)
        relayed = sum(kind == "send" for kind, _, _ in record)
        if sends != relayed:
            refuse(f"rank {k} reported {sends} message(s) and the relay carried {relayed}", label, world_size)
        _same_collectives(k, reported, record, label, world_size)


def _same_collectives(k, reported, record, label, world_size):
    """Rank k's collectives as reported, (op, payload bytes) each, against the relay's record: the same kinds (what the
    relay computes for each) with the same bytes, in the same order. Barriers and point-to-point calls are left out."""
    __tracebackhide__ = True
    mine = [(RELAYED.get(op, op), int(size)) for op, size in reported if op not in
            ("send", "isend", "recv", "irecv", "barrier")]
    relayed = [(op, size) for kind, op, size in record if kind == "collective" and op != "barrier"]
    if mine != relayed:
        first = next((i for i, (a, b) in enumerate(zip(mine, relayed)) if a != b), min(len(mine), len(relayed)))
        refuse(f"rank {k} reported {len(mine)} collective call(s) and the relay carried {len(relayed)}; they first "
               f"differ at call {first}: reported {mine[first:first + 1] or 'none'}, carried "
               f"{relayed[first:first + 1] or 'none'} (what the relay computes, bytes)", label, world_size)
