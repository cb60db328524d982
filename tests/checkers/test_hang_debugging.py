"""Lab 11's checker (hang debugging, labs 11a and 11b) accepts the reference answers and rejects planted wrong ones,
each with its hint.

The wrong answers are what a learner in a hurry writes: the wrong bug named, the broken program handed in
unchanged (it still hangs, and must be stopped by the checker's timeout, not hang the test), a "fix" that
avoids the hang by removing the communication, one that computes every rank's part on every rank, and fixes
that run but compute the wrong numbers. The lab notebooks themselves run in tests/test_notebooks.py; here, that
each shows and grades its own three programs.
"""

import json
import re
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from lab_grading import expect_raised, expect_rejection, graded_in_sandbox
from utils.course.notebook_runner import ROOT
from utils import rank_device
from utils.checkers.hang_debugging import BUG_KINDS, LABS, PROGRAMS, check_diagnosis, check_fix, make_data, references
from utils.workshop.sandbox import available

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions import hang_debugging as reference  # noqa: E402

HANG_TIMEOUT = 8.0  # seconds the checker gives a fix that still hangs: as short as a loaded machine allows


# ------------------------------------------------------------------ planted answers

def still_ordered_differently(data):  # program C handed in unchanged: rank 0 broadcasts first, the others last
    rank, n = dist.get_rank(), dist.get_world_size()
    grad, lr = data["grads"][rank].clone(), data["lr"].clone() if rank == 0 else torch.zeros(1)
    if rank == 0:
        dist.broadcast(lr, src=0)
        dist.all_reduce(grad)
    else:
        dist.all_reduce(grad)
        dist.broadcast(lr, src=0)
    return {"lr": lr, "update": lr * grad / n}


def mean_without_all_reduce(data):  # program A with the all_reduce deleted: no hang, each rank its own mean
    x = data[dist.get_rank()]
    return x.sum() / max(len(x), 1)


def mean_of_everything_everywhere(data):  # every rank reads every rank's part: right number, no communication
    return torch.cat(data).mean()


def everything_everywhere_then_a_barrier(data):  # a barrier moves no data: still no communication
    mean = torch.cat(data).mean()
    dist.barrier()
    return mean


def everything_everywhere_and_a_token_sum(data):  # one leftover collective, but each rank reads every part
    dist.all_reduce(torch.zeros(1))
    return torch.cat(data).mean()


def lr_read_on_every_rank(data):  # program C without the broadcast: only rank 0 holds the learning rate
    rank, n = dist.get_rank(), dist.get_world_size()
    grad = data["grads"][rank].clone()
    dist.all_reduce(grad)
    return {"lr": data["lr"].clone(), "update": data["lr"] * grad / n}


def mean_of_sums_divided_by_ranks(data):  # communicates, but averages the sums over ranks, not over samples
    x = data[dist.get_rank()]
    total = x.sum().reshape(1)
    dist.all_reduce(total)
    dist.barrier()
    return total[0] / dist.get_world_size()


def counts_before_the_sum(data):  # program B with minlength, but it returns this rank's counts, not the sum
    labels = data["labels"][dist.get_rank()]
    counts = torch.bincount(labels, minlength=data["num_classes"])
    summed = counts.clone()
    dist.all_reduce(summed)
    return counts


def ddp_still_on_the_wrong_device(data):  # program E with the model moved, but device_ids still [rank]
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(rank_device())
    DDP(model, device_ids=[rank])
    return {k: v.detach() for k, v in model.state_dict().items()}


def train_alone(data):  # program F without DDP: no hang, but each rank trains a model of its own
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=data["lr"])
    for x, y in data["batches"][rank::n]:
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def one_step_only(data):  # program F "fixed" by training one step on every rank: no hang, work skipped
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=data["lr"])
    x, y = data["batches"][rank]
    F.mse_loss(ddp(x), y).backward()
    opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def _ddp_f(data, batches, join):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=data["lr"])
    with ddp.join(enable=join):
        for x, y in batches:
            opt.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def joined(data):  # the third accepted fix of program F: DDP's join context
    return _ddp_f(data, data["batches"][dist.get_rank()::dist.get_world_size()], join=True)


def padded(data):  # the second: DistributedSampler's padding (its default, drop_last=False)
    from torch.utils.data import DistributedSampler
    return _ddp_f(data, [data["batches"][i] for i in DistributedSampler(data["batches"], shuffle=False)], join=False)


# ------------------------------------------------------------------ the tests

@pytest.mark.parametrize("fix", [joined, padded], ids=lambda f: f.__name__)
def test_every_usual_fix_of_uneven_data_passes(fix):
    result = check_fix("F", "skipped", fix, world_sizes=(2, 3))
    assert {"joined": "join()", "padded": "padding"}[fix.__name__] in str(result)


def test_two_programs_share_a_kind_and_one_kind_is_a_decoy():
    """Naming the kinds by elimination must not work: a kind used twice, one used by no program."""
    assert sorted(PROGRAMS) == sorted(reference.DIAGNOSES) and set(reference.DIAGNOSES.values()) < set(BUG_KINDS)
    assert len(set(reference.DIAGNOSES.values())) == len(BUG_KINDS) - 1 == len(PROGRAMS) - 1


def test_the_diagnoses_are_judged_on_the_teachers_side_only(monkeypatch, tmp_path):
    """Where the course holds the teacher's answers (labs/solutions/), the planted kind passes and every other is
    wrong_diagnosis. The student release holds no form of them (a digest of six kinds a program is undone by six
    hashes): there check_diagnosis and check_fix's line say the same for every kind, so the checker is no oracle, and
    the checker's source names no program's kind."""
    import utils.checkers.hang_debugging as hang

    for program in PROGRAMS:
        right = reference.DIAGNOSES[program]
        assert "is the bug planted" in check_diagnosis(program, right)
        for kind in set(BUG_KINDS) - {right}:
            expect_rejection(check_diagnosis, program, kind, mistake="wrong_diagnosis")
    monkeypatch.setattr(hang, "SOLUTION", tmp_path / "hang_debugging.py")  # as released: no labs/solutions/
    for program in PROGRAMS:
        said = {check_diagnosis(program, kind).replace(repr(kind), "KIND") for kind in BUG_KINDS}
        assert len(said) == 1 and "not judged here" in said.pop(), said
    source = (ROOT / "utils" / "checkers" / "hang_debugging.py").read_text()
    for program, kind in reference.DIAGNOSES.items():
        assert f'"{program}": "{kind}"' not in source and f"'{program}': '{kind}'" not in source
    assert not re.search(r"\b[0-9a-f]{16,}\b", source), "a digest in the shipped checker"


def lab_code(lab):
    path = next((ROOT / "labs").glob(f"{lab}_*_lab.ipynb"))
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")


@pytest.mark.parametrize("lab", sorted(LABS))
def test_each_lab_shows_and_grades_its_own_three_programs(lab):
    """Labs 11a and 11b split the six programs; in each, all six kinds are offered for three programs, so at least
    three kinds fit none of its programs and naming them by elimination does not work there either."""
    assert sorted(p for programs in LABS.values() for p in programs) == sorted(PROGRAMS)  # each program in one lab
    code = lab_code(lab)
    for program in PROGRAMS:
        shown = f"def program_{program}(" in code and f"def fixed_{program}(" in code
        graded = f'"{program}": (diagnosis_{program}, fixed_{program})' in code
        assert shown == graded == (program in LABS[lab]), (lab, program, shown, graded)
    assert len(BUG_KINDS) - len({reference.DIAGNOSES[p] for p in LABS[lab]}) >= 3
    assert "BUG_KINDS" in code and "DIAGNOSES[k] for k in" in code


@pytest.mark.parametrize("lab", sorted(LABS))
def test_each_labs_grading_cell_prints_the_panel_of_a_failed_program(lab, capsys):
    """The grading cell catches each program's failure to grade the others too: it prints the panel a failed check
    shows (the mistake's name, what the checker saw, the hint), not only the message, and the cell still fails."""
    from lab_grading import expect_panel
    from utils.checkers.feedback import verdict

    path = next((ROOT / "labs").glob(f"{lab}_*_lab.ipynb"))
    cells = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    cell = next(c for c in cells if "not_yet = {}" in c)
    programs = LABS[lab]
    wrong = {p: "not a kind" for p in programs}

    def rejecting(name, diagnosis, fixed, **_):
        check_diagnosis(name, diagnosis)

    names = {f"diagnosis_{p}": wrong[p] for p in programs} | {f"fixed_{p}": None for p in programs}
    with pytest.raises(AssertionError, match="not yet right"):
        exec(cell, dict(names, check_fix=rejecting, verdict=verdict, CHECK_SIZES=(2,), FIX_TIMEOUT=1))
    printed = capsys.readouterr().out
    with pytest.raises(AssertionError) as failure:
        check_diagnosis(programs[0], "not a kind")
    assert verdict(failure.value) in printed, printed
    assert expect_panel(failure.value).splitlines()[1] == "✗ Not yet: not_a_kind"
    assert printed.count("✗ Not yet: not_a_kind") == len(programs), printed


def test_wrong_diagnosis_is_rejected_with_what_the_report_shows():
    expect_rejection(check_fix, "C", "skipped", reference.fixed_C, mistake="wrong_diagnosis",
                     phrase="rank by rank, the calls")
    expect_rejection(check_diagnosis, "F", "order", mistake="wrong_diagnosis", phrase="through the loop")
    expect_rejection(check_diagnosis, "D", "too_slow", mistake="wrong_diagnosis", phrase="which call of which rank")
    expect_rejection(check_diagnosis, "A", "deadlock", mistake="not_a_kind", phrase="'unmatched_send'")
    with pytest.raises(NotImplementedError, match="set its diagnosis"):
        check_diagnosis("A", None)


@pytest.mark.slow
def test_a_fix_that_still_hangs_is_stopped_and_rejected():
    expect_rejection(check_fix, "C", "order", still_ordered_differently, world_sizes=(2,), timeout=HANG_TIMEOUT,
                     mistake="deadlock", phrase="TORCH_DISTRIBUTED_DEBUG=DETAIL")


@pytest.mark.parametrize("program, fix, phrase", [
    ("A", mean_without_all_reduce, "seen by CommLedger"),
    ("A", mean_of_everything_everywhere, "removing the collective"),
    ("A", everything_everywhere_then_a_barrier, "seen by CommLedger"),
    ("F", train_alone, "through DistributedDataParallel"),
    ("A", everything_everywhere_and_a_token_sum, "read what it should have received"),
    ("C", lr_read_on_every_rank, "read what it should have received"),
], ids=["collective deleted", "every rank computes everything", "only a barrier", "DDP removed",
        "a leftover collective", "only rank 0 holds the input"])
def test_a_fix_without_communication_is_rejected(program, fix, phrase):
    expect_rejection(check_fix, program, reference.DIAGNOSES[program], fix, world_sizes=(2,), mistake="no_communication",
                     phrase=phrase)


@pytest.mark.parametrize("program, fix", [
    ("A", mean_of_sums_divided_by_ranks),
    ("B", counts_before_the_sum),
    ("F", one_step_only),
], ids=["mean over ranks", "local counts", "work skipped"])
def test_a_fix_with_wrong_numbers_is_rejected(program, fix):
    rejected = expect_rejection(check_fix, program, reference.DIAGNOSES[program], fix, world_sizes=(3,), mistake="wrong_result",
                                phrase="one process computes")
    assert rejected.world_size == 3


def test_a_fix_that_crashes_is_rejected_with_its_traceback():
    expect_rejection(check_fix, "E", "wrong_device", ddp_still_on_the_wrong_device, world_sizes=(2,),
                     mistake="raised", phrase="device_ids")


def test_references_of_uneven_data_differ():
    """The three accepted fixes of program F give three different models: each is a real alternative."""
    wanted = references("F", make_data("F", 3), 3)
    weights = [per_rank[0]["weight"] for per_rank in wanted.values()]
    assert len(weights) == 3
    assert all(not torch.allclose(a, b) for i, a in enumerate(weights) for b in weights[i + 1:])


# ------------------------------------------------------------------ an exception in the answer's own code


def index_error(data):
    return data[len(data)]  # planted: IndexError


def test_an_exception_in_the_fix_is_named_with_its_line():
    expect_raised(check_fix, "A", reference.DIAGNOSES["A"], index_error, world_sizes=(2,),
                  line="return data[len(data)]  # planted")


# ------------------------------------------------------------------ a stub that replaces the checker's rank function

# Issue 37, part 3: the rank function runs in the rank, beside the answer's code, which can replace it and report what
# it likes. Each rank is given only its own part of a data set made from the checker's secret seed, and the checker
# computes the references itself: what one rank computes alone is wrong, and a report of another shape is refused.
FORGER = '''import utils.checkers.hang_debugging as _hang

def _forged(fn, ddp, data):
    import torch.distributed as dist
    from utils.checkers.hang_debugging import make_data, references
    rank, n = dist.get_rank(), dist.get_world_size()
    value = next(iter(references("A", FROM, n).values()))[rank]  # one process's result, from what this rank holds
    return REPORT

class _Patch:  # in the rank: the checker's own rank function replaced
    _hang._on_rank.__code__ = _forged.__code__

diagnosis_A = DIAGNOSIS

def fixed_A(data):
    raise NotImplementedError("a stub")
'''.replace("DIAGNOSIS", repr(reference.DIAGNOSES["A"]))
REPORT = "dict(value=value, error=None, calls=1, ddp_forwards=0)"
FORGED_RANKS = {  # name: (source, the mistake it gets)
    # right when each rank holds the whole data set (the second run, a diagnosis), wrong with its own part only
    "the_result_from_its_own_part": (FORGER.replace("FROM", "data").replace("REPORT", REPORT), "no_communication"),
    # a data set of its own making: not the checker's, whose seed no rank holds
    "the_result_from_data_it_made": (FORGER.replace("FROM", "make_data('A', n)").replace("REPORT", REPORT),
                                     "wrong_result"),
    "no_report": (FORGER.replace("FROM", "data").replace("REPORT", "[]"), "not_a_report"),
    "other_fields": (FORGER.replace("FROM", "data").replace("REPORT", f"dict({REPORT}, passed=True)"),
                     "not_a_report"),
}


@pytest.mark.skipif(available() is not None, reason="the ranks in the sandbox: bubblewrap does not run here")
@pytest.mark.parametrize("kind", sorted(FORGED_RANKS))
def test_a_stub_that_replaces_the_checkers_rank_function_does_not_pass(tmp_path, kind):
    """Graded as the workshop grades (the judge outside the sandbox, the ranks inside). A stub whose rank function
    were not replaced would say 'not written yet' (its NotImplementedError): each mistake below is the forger's."""
    source, wanted = FORGED_RANKS[kind]
    lab = "11a_collective_hangs_lab"
    verdict = graded_in_sandbox(tmp_path, lab, {"fixed_A": source})
    assert (verdict.verdict, verdict.mistake) == ("mistake", wanted), (verdict.label, verdict.message[:2000],
                                                                       verdict.output[-2000:])
