"""The checker of lab 11 (hang debugging): six broken programs, their data, their right answers, and the grading.

Lab 11 comes in two parts that grade themselves (``LABS``): ``labs/11a_collective_hangs_lab.ipynb`` shows programs
A, B and C failing, ``labs/11b_send_and_ddp_hangs_lab.ipynb`` programs D, E and F. Both offer the same six
``BUG_KINDS``; over the two labs one kind is planted twice and one in no program. Same conventions as
every lab (``utils.checkers.common``). Every program takes the *whole* data set, the same on every rank (as a
script loads its data set), and picks its own part by rank. The data set is random, from a seed the checker draws
and keeps (``rank_secrets``). The checker grades a learner's answer to one program on two counts:

- **the diagnosis**: one of ``BUG_KINDS``, compared with the bug planted in that program, which only the teacher's
  side holds (the reference solution's ``DIAGNOSES``, ``SOLUTION``: in the course's checkout and ``make grade``'s
  judge). The student release holds no form of it, not even a digest (six kinds a program: six hashes would
  undo one), so there the diagnosis is left to the teacher's grading and only the fix is judged;
- **the fix**: run on ranks with a timeout (a fix that still hangs is stopped and reported), then
  (1) every rank must still *communicate*: a ``CommLedger`` sees the ``torch.distributed`` calls that move
  data (a barrier moves none); torch's DDP talks from C++, so for the DDP programs the checker counts forward
  passes through ``DistributedDataParallel`` instead. A "fix" that removes the collectives, or computes
  everything on every rank from the whole data set, is not a distributed program any more;
  (2) every rank's result must equal a single-process reference computed here, in the kernel, from the same
  data (``torch.testing.assert_close``; the uneven-data program accepts each of the three usual fixes).

Each rank gets its own copy of the data set with the other ranks' parts hidden (``hide_others``), through
``run_ranks``'s ``rank_args``: no rank holds what another one's result needs, nor the seed to make it. The rank
function reports what it saw (``REPORT``); the references are computed here, never taken from a rank. So a fix, or
code that replaces the rank function, reaches the right result only by moving data between the ranks.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from ..comm.ledger import CommLedger
from ..launch.scripts import ROOT
from .common import CheckResult, LabCheckFailed, caught, close, fail, first_error, launch_answer, raise_if_error
from .rank_secrets import generator, new_seeds, report_each
from .teacher_side import teacher_module

BUG_KINDS = {
    "order": "the ranks call the same collectives in different orders",
    "skipped": "a rank skips a collective that the others call (or calls one more than the others)",
    "shape": "the ranks hand a collective tensors of different shapes",
    "unmatched_send": "a send has no matching receive",
    "wrong_device": "a tensor or module is on another device than the one the rank should use",
    "too_slow": "every rank makes the same calls, but one rank's work outlasts the timeout",
}
# Two programs share a kind and one kind is planted in none: naming the kinds by elimination does not work. Each lab
# offers all six kinds for its three programs, so there too three kinds fit none of them.
PROGRAMS = ("A", "B", "C", "D", "E", "F")
# The teacher's answers (the kind planted in each program), where the course holds them: never in what ships
SOLUTION = ROOT / "labs" / "solutions" / "hang_debugging.py"
LABS = {"11a": ("A", "B", "C"), "11b": ("D", "E", "F")}  # which lab shows (and grades) which programs
SYNC_ONLY = ("barrier", "monitored_barrier")  # calls that move no data: not evidence that the ranks communicate
DDP_PROGRAMS = ("E", "F")  # their communication happens inside torch's DDP, in C++
NUM_CLASSES = 8  # program B's labels
TOL = dict(rtol=1e-5, atol=1e-6)  # float32 sums in another order differ by ~1e-7; a wrong answer by far more

HINTS = {
    "not_a_kind": f"name the bug with one of these keys: {sorted(BUG_KINDS)}.",
    "deadlock": "the fixed program still hangs: every rank must call the same collectives, in the same order, with "
                "tensors of the same shape, and every send needs a matching recv. Run it with "
                "TORCH_DISTRIBUTED_DEBUG=DETAIL (the lab's run_with_detail) or add dist.monitored_barrier to see who "
                "is missing.",
    "raised": "the fixed program must run on every rank without error: read the exception and the line shown.",
    "no_communication": "the ranks no longer send each other what they must: removing the collective, or reading "
                        "the other ranks' parts of the data set (a real job's ranks hold different data in "
                        "different processes), avoids the hang. A collective left in the program is not enough: "
                        "the checker hides the other ranks' parts from each rank, and a rank's result must come "
                        "from what the others sent it (the value only rank 0 holds, too).",
    "wrong_result": "it runs, but the numbers are not those of one process on the whole data set: compare your result "
                    "with the broken program's intent (the docstring), rank by rank.",
}


# ------------------------------------------------------------------ the data of each program, as a function of n

def make_data(program, world_size, seed=None):
    """The data set of ``program`` ("A".."F") on ``world_size`` ranks, the same on every rank: random, from ``seed``
    (None: a fresh one, ``rank_secrets.new_seeds``). The checker draws the seed and keeps it, so a rank cannot make
    the data set itself; each planted bug shows whatever the seed."""
    if program not in PROGRAMS:
        raise ValueError(f"no program {program!r}: the lab's programs are {sorted(PROGRAMS)}.")
    g = generator(new_seeds(1)[0] if seed is None else seed, ord(program), world_size)
    n = world_size
    if program == "A":  # rank r holds 3r samples: rank 0 holds none
        return [torch.randint(1, 10, (3 * r,), generator=g).float() for r in range(n)]
    if program == "B":  # rank r has labels 0 .. r+1 only, of NUM_CLASSES classes, and r+1 among them: histograms
        labels = []     # of different lengths on every seed
        for r in range(n):
            top = min(r + 1, NUM_CLASSES - 1)
            x = torch.randint(0, top + 1, (6,), generator=g)
            x[torch.randint(0, 6, (1,), generator=g)] = top
            labels.append(x)
        return {"labels": labels, "num_classes": NUM_CLASSES}
    if program == "C":
        return {"lr": torch.tensor([0.5]), "grads": torch.randint(-5, 6, (n, 4), generator=g).float()}
    if program == "D":
        return torch.randint(1, 10, (n,), generator=g).float()
    if program in ("E", "F"):  # batches of 4 samples, 4 features, a linear target; F: one batch too many
        count = 2 * n + (1 if program == "F" else 0)
        x = torch.randn(count, 4, 4, generator=g)
        y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(count, 4, 1, generator=g)
        return {"batches": [(x[i], y[i]) for i in range(count)], "lr": 0.1}


def hide_others(program, data, rank, seed):
    """``data`` as ``rank`` should use it: the parts that belong to the other ranks replaced by other numbers, as
    if each rank had loaded only its own. A fix must get the other ranks' contributions by communicating.

    The other numbers come from ``seed`` (the checker's, never a rank's), so a rank cannot undo them; each sum a fix
    could take of them differs from the true one (noise of 1 to 4 added; program B's labels redrawn until the
    counts differ), so a fix that reads them is never right by chance."""
    g = generator(seed, 1000, rank)

    def junk(t):
        return t + torch.randint(1, 5, t.shape, generator=g).to(t.dtype)

    if program == "A":
        return [x if r == rank else junk(x) for r, x in enumerate(data)]
    if program == "B":
        labels, others = list(data["labels"]), [r for r in range(len(data["labels"])) if r != rank]

        def counts(chosen):
            return sum((torch.bincount(chosen[r], minlength=NUM_CLASSES) for r in others), torch.zeros(NUM_CLASSES))

        true = counts(labels)
        while others and torch.equal(counts(labels), true):
            for r in others:
                labels[r] = (data["labels"][r] + torch.randint(1, NUM_CLASSES, (6,), generator=g)) % NUM_CLASSES
        return dict(data, labels=labels)
    if program == "C":  # only rank 0 holds the learning rate
        grads = torch.stack([x if r == rank else junk(x) for r, x in enumerate(data["grads"])])
        return {"lr": data["lr"] if rank == 0 else junk(data["lr"]), "grads": grads}
    if program == "D":
        return torch.stack([x if r == rank else junk(x) for r, x in enumerate(data)])
    # E and F: a rank's batches are rank::n; F's right fixes read those, and padding like DistributedSampler reads
    # one more, of another rank (the sampler's own indices: it needs no process group given num_replicas and rank)
    n = len(data["batches"]) // 2
    own = set(range(rank, len(data["batches"]), n))
    if program == "F":
        own |= set(DistributedSampler(range(len(data["batches"])), num_replicas=n, rank=rank, shuffle=False))
    return dict(data, batches=[b if i in own else (junk(b[0]), junk(b[1])) for i, b in enumerate(data["batches"])])


def _train_reference(batches_per_round, lr, scales=None):
    """One process: SGD on Linear(4, 1) from seed 0, one step per round on the round's batches concatenated.

    ``scales``: per round, a factor on the gradient (DDP's join divides by the initial world size)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for i, round_ in enumerate(batches_per_round):
        opt.zero_grad()
        x, y = torch.cat([b[0] for b in round_]), torch.cat([b[1] for b in round_])
        (F.mse_loss(model(x), y) * (scales[i] if scales else 1.0)).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def references(program, data, world_size):
    """{name: [rank 0's result, rank 1's, ...]}: the right results, from one process. Several names when several
    fixes are right (program F: dropping the extra batch, padding like DistributedSampler, or DDP's join)."""
    n = world_size
    if program == "A":
        mean = torch.cat(data).mean()
        return {"mean": [mean] * n}
    if program == "B":
        counts = sum(torch.bincount(lab, minlength=data["num_classes"]) for lab in data["labels"])
        return {"counts": [counts] * n}
    if program == "C":
        update = data["lr"] * data["grads"].sum(0) / n
        return {"lr and mean gradient": [{"lr": data["lr"], "update": update}] * n}
    if program == "D":
        prefix = data.cumsum(0)
        return {"prefix sums": [{"prefix": prefix[r:r + 1], "total": prefix[-1:] if r == 0 else None}
                                for r in range(n)]}
    batches, lr = data["batches"], data["lr"]
    if program == "E":
        rounds = [batches[s * n:(s + 1) * n] for s in range(len(batches) // n)]
        return {"one process": [_train_reference(rounds, lr)] * n}
    full = len(batches) // n  # program F: rank 0 has one batch more than the others
    rounds = [batches[s * n:(s + 1) * n] for s in range(full)]
    padded = [batches[full * n:] + batches[:n - (len(batches) - full * n)]]  # DistributedSampler's wrap-around
    return {"drop_last": [_train_reference(rounds, lr)] * n,
            "padding (DistributedSampler)": [_train_reference(rounds + padded, lr)] * n,
            "join()": [_train_reference(rounds + [batches[full * n:]], lr,
                                        [1.0] * full + [(len(batches) - full * n) / n])] * n}


def _same(got, want):
    """Results compare as tensors (assert_close), dicts of them, or None."""
    if want is None or got is None:
        return got is None and want is None
    if isinstance(want, dict):
        return isinstance(got, dict) and set(got) == set(want) and all(_same(got[k], want[k]) for k in want)
    if not isinstance(got, torch.Tensor):
        got = torch.as_tensor(got, dtype=want.dtype) if isinstance(got, (int, float)) else got
    return isinstance(got, torch.Tensor) and close(got.to(want.dtype).reshape(want.shape) if got.numel() == want.numel()
                                                   else got, want, TOL)


# ------------------------------------------------------------------ inside the ranks

REPORT = dict(value=None, error=(tuple, type(None)), calls=int, ddp_forwards=int)  # what _on_rank reports: no reference


def _on_rank(fn, ddp, data):
    """Runs on every rank: the fixed program inside a ledger (and a DDP forward counter); errors come back as data.
    ``data``: this rank's own (``rank_args``, the others' parts hidden), or the whole data set for every rank. Reports
    what it saw (``REPORT``); the references are the checker's (``references``)."""
    forwards = [0]
    saved = torch.nn.parallel.DistributedDataParallel.forward

    def counted(self, *args, **kwargs):
        forwards[0] += 1
        return saved(self, *args, **kwargs)

    if ddp:
        torch.nn.parallel.DistributedDataParallel.forward = counted
    value, error = None, None
    try:
        with CommLedger() as ledger:
            value = fn(data)
    except Exception as exc:  # noqa: BLE001 - reported to the learner in the kernel
        error = caught(exc, getattr(fn, "__name__", "the fixed program"))
    finally:
        torch.nn.parallel.DistributedDataParallel.forward = saved
    moved = [r for r in ledger.records if r.op not in SYNC_ONLY]
    return dict(value=value, error=error, calls=len(moved), ddp_forwards=forwards[0])


# ------------------------------------------------------------------ in the kernel

def planted(program):
    """The kind planted in ``program``, from the teacher's answers; None where the course does not hold them (the
    student release, the grader's sandbox)."""
    answers = teacher_module(SOLUTION)
    return None if answers is None else answers.DIAGNOSES[program]


def check_diagnosis(program, diagnosis):
    """Is ``diagnosis`` (one of ``BUG_KINDS``) the bug planted in ``program``? Raises ``LabCheckFailed`` if not.
    Returns a line to print: "right", or, where the teacher's answers are not (the student release), that it was
    not judged here; it never tells one kind from another there (no oracle)."""
    __tracebackhide__ = True
    if program not in PROGRAMS:
        raise ValueError(f"no program {program!r}: the lab's programs are {sorted(PROGRAMS)}.")
    if diagnosis is None:
        raise NotImplementedError(f"program {program}: set its diagnosis to one of {sorted(BUG_KINDS)} "
                                  "(read its report above first), then run this cell again.")
    if diagnosis not in BUG_KINDS:
        fail(HINTS, "not_a_kind", f"program {program}: {diagnosis!r} is not one of the bug kinds.")
    kind = planted(program)
    if kind is None:
        return (f"program {program}: diagnosis {diagnosis!r} not judged here: this copy of the course holds no answer; "
                "your teacher's grading judges it")
    if diagnosis != kind:
        raise LabCheckFailed("wrong_diagnosis", f"program {program}: not {diagnosis!r} ({BUG_KINDS[diagnosis]}).",
                             teacher_module(SOLUTION).CLUES[program])
    return f"program {program}: diagnosis {diagnosis!r} is the bug planted"


def check_fix(program, diagnosis, fixed, world_sizes=(2, 3), timeout=30.0):
    """Check the learner's answer to ``program``: the diagnosis, then the fixed program ``fixed(data)`` on each
    world size: it must finish within ``timeout`` seconds, communicate on every rank, and return on every rank
    what one process computes from the whole data set. Returns a ``CheckResult``; raises ``LabCheckFailed``."""
    __tracebackhide__ = True
    judged = planted(program) is not None
    check_diagnosis(program, diagnosis)
    lines = [f"diagnosis {diagnosis!r}: {BUG_KINDS[diagnosis]}" + ("" if judged else " (not judged here: this copy "
             "of the course holds no answer; your teacher's grading judges it)")]
    for n in world_sizes:
        if n < 2:
            raise ValueError(f"world size {n}: these bugs need at least 2 ranks; use 2 to 6.")
        seed = new_seeds(1)[0]  # the checker's alone: no rank can make the data set, or undo what hides it
        data, ddp = make_data(program, n, seed), program in DDP_PROGRAMS
        hidden = [(hide_others(program, data, r, seed),) for r in range(n)]  # each rank its own, sent to it alone
        ranks = report_each(launch_answer(_on_rank, (fixed, ddp), n, timeout, f"program {program}'s fix",
                                          HINTS["deadlock"], rank_args=hidden), REPORT, n)
        raise_if_error(first_error(ranks), n, HINTS)
        calls = [rk["ddp_forwards"] if ddp else rk["calls"] for rk in ranks]
        what = "DDP forward passes" if ddp else "torch.distributed calls"
        silent = [r for r, c in enumerate(calls) if c == 0]
        if silent:
            fail(HINTS, "no_communication", f"program {program}: rank(s) {silent} made no {what} "
                 f"({'through DistributedDataParallel' if ddp else 'seen by CommLedger'}).", n)
        wanted = references(program, data, n)
        match = next((name for name, per_rank in wanted.items()
                      if all(_same(rk["value"], w) for rk, w in zip(ranks, per_rank))), None)
        if match is None:  # wrong with each rank's own part only: wrong also with the whole data set on every rank?
            whole = report_each(launch_answer(_on_rank, (fixed, ddp, data), n, timeout, f"program {program}'s fix",
                                              HINTS["deadlock"]), REPORT, n)
            if first_error(whole) is None and any(all(_same(rk["value"], w) for rk, w in zip(whole, per_rank))
                                                  for per_rank in wanted.values()):
                fail(HINTS, "no_communication", f"program {program}: right when every rank can read the whole data "
                     f"set, wrong when the other ranks' parts are hidden from each rank: a rank read what it should "
                     f"have received.", n)
            name, per_rank = next(iter(wanted.items()))
            r = next(r for r, rk in enumerate(ranks) if not _same(rk["value"], per_rank[r]))
            fail(HINTS, "wrong_result", f"program {program}: rank {r} returned {_show(ranks[r]['value'])}, one process "
                 f"computes {_show(per_rank[r])} ({name}).", n)
        lines.append(f"world_size={n}: finished; every rank communicated ({min(calls)}-{max(calls)} {what} each); "
                     f"results equal one process ({match}), each rank given only its own part of the data"
                     + (" (and the batch DistributedSampler's padding reads)" if program == "F" else ""))
    return CheckResult(f"program {program}", lines)


def _show(value, width=200):
    if isinstance(value, dict):
        text = "{" + ", ".join(f"{k!r}: {_show(v)}" for k, v in value.items()) + "}"
    elif isinstance(value, torch.Tensor):
        text = str(value.detach().flatten()[:8].tolist())
    else:
        text = repr(value)
    return text if len(text) <= width else text[:width] + "..."
