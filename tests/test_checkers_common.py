"""The harness every checker calls learner code through (utils/checkers/harness.py, watch.py).

- An exception the answer raises is the mistake ``raised``, with the answer's line and no checker frame; a stub's
  NotImplementedError stays itself (each lab's own planted exception: tests/checkers/test_<lab>.py).
- The watcher of forbidden calls sees a call made in a thread the answer starts, and refuses an answer that
  switches it off (``tampered``). Lab 06's checker is the example: torch's schedules, and the checker's own
  ``_torch_rank_orders``, compute the order the lab asks for.
- The guard (utils/checkers/guard.py) trips those targets in place: the hook switched off where it cannot see it
  (a ``partial`` of sys.setprofile, in a thread too) hides no call, and every ``__code__`` is put back.
"""

import functools
import re
import sys
import threading

import pytest
import torch.distributed.pipelining  # noqa: F401 - what lab 06's checker imports: not under a profile hook, in a test

from lab_grading import expect_rejection
from utils.checkers import pipeline_schedule
from utils.checkers.common import LabCheckFailed, learner_call
from utils.checkers.guard import Guard, Refused, module_functions
from utils.checkers.pipeline_schedule import _torch_rank_orders, check_interleaved
from utils.checkers.watch import Watcher


def _refuses_uneven(ranks, microbatches):
    if microbatches % ranks:
        raise ValueError(f"{microbatches} micro-batches on {ranks} ranks: use a multiple of {ranks}")


def deep_index_error(items):
    return {"first": items[len(items)]}  # planted: IndexError, one call below the answer's entry


def answer(items):
    return deep_index_error(items)


def test_learner_call_names_the_exception_and_the_answers_deepest_line():
    with pytest.raises(LabCheckFailed) as failure:
        learner_call(answer, [1, 2], where="answer([1, 2])", hints={})
    err = failure.value
    assert err.mistake == "raised" and err.__context__ is None and err.__cause__ is None
    text = str(err)
    assert "IndexError" in text and "list index out of range" in text and "answer([1, 2])" in text
    assert 'return {"first": items[len(items)]}  # planted' in text and "utils/checkers" not in text


def test_learner_call_leaves_a_stub_and_expected_exceptions_alone():
    def stub():
        raise NotImplementedError("write the function")

    with pytest.raises(NotImplementedError, match="write the function"):
        learner_call(stub, where="stub()", hints={})
    with pytest.raises(ValueError):
        learner_call(_refuses_uneven, 3, 4, where="fn", hints={}, let_through=ValueError)


def torch_order_in_a_thread(rank, ranks, microbatches, chunks):
    """Lab 06's order, computed by the checker's own function, in a worker thread: sys.setprofile alone misses it."""
    _refuses_uneven(ranks, microbatches)
    out = []
    worker = threading.Thread(target=lambda: out.append(_torch_rank_orders(ranks, microbatches, chunks)[rank]))
    worker.start()
    worker.join()
    return out[0]


def switches_the_watcher_off(rank, ranks, microbatches, chunks):
    _refuses_uneven(ranks, microbatches)
    sys.setprofile(None)
    return _torch_rank_orders(ranks, microbatches, chunks)[rank]


def restores_the_watcher_afterwards(rank, ranks, microbatches, chunks):
    _refuses_uneven(ranks, microbatches)
    hook = sys.getprofile()
    list(map(sys.setprofile, [None]))  # a call from C: no c_call event for it
    order = _torch_rank_orders(ranks, microbatches, chunks)[rank]
    list(map(sys.setprofile, [hook]))
    return order


def _hook_off_unseen(rank, ranks, microbatches, chunks):
    """Bypass 1: builtins called from C (a partial) emit no c_call: the hook taken, switched off and put back."""
    hook = functools.partial(sys.getprofile)()
    functools.partial(sys.setprofile, None)()
    try:
        return _torch_rank_orders(ranks, microbatches, chunks)[rank]
    finally:
        functools.partial(sys.setprofile, hook)()


def hook_off_unseen(rank, ranks, microbatches, chunks):
    _refuses_uneven(ranks, microbatches)
    return _hook_off_unseen(rank, ranks, microbatches, chunks)


def hook_off_in_a_thread(rank, ranks, microbatches, chunks):
    """Bypass 2: the same in a thread the answer starts; the main thread's hook stays in place."""
    _refuses_uneven(ranks, microbatches)
    out = []
    worker = threading.Thread(target=lambda: out.append(_hook_off_unseen(rank, ranks, microbatches, chunks)))
    worker.start()
    worker.join()
    return out[0]


def catches_the_refusal(rank, ranks, microbatches, chunks):
    """Whatever the answer makes of the refusal, the record names the mistake."""
    _refuses_uneven(ranks, microbatches)
    try:
        return _torch_rank_orders(ranks, microbatches, chunks)[rank]
    except BaseException:  # noqa: BLE001 - planted: the answer hides the refusal
        raise ValueError("nothing to see here") from None


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (torch_order_in_a_thread, "used_torch", "write the order yourself"),
    (switches_the_watcher_off, "tampered", "sys.setprofile"),
    (restores_the_watcher_afterwards, "tampered", "sys.getprofile"),
    (hook_off_unseen, "used_torch", "_torch_rank_orders (pipeline_schedule.py)"),
    (hook_off_in_a_thread, "used_torch", "_torch_rank_orders (pipeline_schedule.py)"),
    (catches_the_refusal, "used_torch", "write the order yourself"),
], ids=["forbidden call in a thread", "sys.setprofile(None)", "hook taken and put back", "hook off by a partial",
        "hook off by a partial, in a thread", "refusal caught"])
def test_the_watcher_cannot_be_stepped_around(wrong, mistake, phrase):
    from torch.distributed.pipelining import schedules

    codes = {f: f.__code__ for m in (schedules, pipeline_schedule) for f in module_functions(m)}
    expect_rejection(check_interleaved, wrong, world_sizes=(), mistake=mistake, phrase=phrase)
    assert [f for f, code in codes.items() if f.__code__ is not code] == []  # every target put back
    assert sys.getprofile() is None or "coverage" in type(sys.getprofile()).__module__


def _target(x, scale=2, *, shift=0):
    return x * scale + shift + len(_target.__name__)


def _closure_target():
    offset = 3

    def inner(x):
        return x + offset
    return inner


def test_the_guard_trips_every_alias_and_puts_the_code_back():
    """A name, a partial, a thread target, a pool task: each runs the stub, whoever calls it (the harness too); a
    function with free variables is tripped too, and all is restored after a raise."""
    from concurrent.futures import ThreadPoolExecutor

    inner = _closure_target()
    codes = _target.__code__, inner.__code__
    alias = _target
    for call in (lambda: alias(1), functools.partial(_target, 1), lambda: inner(1),
                 lambda: ThreadPoolExecutor(1).submit(_target, 1).result(),
                 lambda: learner_call(_target, 1, where="t", hints={}),  # the course's harness: refused too
                 lambda: exec("f(1)", {"f": _target})):
        with pytest.raises(Refused), Guard([(_target, "target"), (inner, "inner")]) as guard:
            call()
        assert guard.records and (_target.__code__, inner.__code__) == codes
    assert _target(1, 3, shift=1) == 11 and _target(1) == 9 and inner(1) == 4  # defaults and closure, back


@pytest.mark.skipif(not hasattr(threading, "setprofile_all_threads"),
                    reason="Python 3.12+: before it, a thread already running never gets the hook")
def test_the_watcher_is_removed_from_every_thread_it_covered():
    """Python 3.12+ sets the hook on the running threads too (setprofile_all_threads): it must go from them too."""
    go, seen = threading.Event(), []
    running = threading.Thread(target=lambda: (go.wait(5), seen.append(sys.getprofile())))
    running.start()
    before = sys.getprofile(), threading.getprofile()
    with Watcher(lambda frame, event, arg: None) as watcher:
        pass  # (asking for the hook in here is what a tampering answer does)
    go.set()
    running.join()
    assert (sys.getprofile(), threading.getprofile()) == before and not watcher.tampered
    assert seen == [before[0]]


def test_a_graded_notebooks_line_is_quoted(tmp_path):
    """The workshop grades a notebook read by answers_from_notebook: its cells' lines are quoted from linecache."""
    import nbformat

    from utils.checkers.labs import LABS, answers_from_notebook

    cell = ("def interleaved_one_f_one_b(rank, ranks, microbatches, chunks):\n"
            "    if microbatches % ranks:\n"
            "        raise ValueError(f'{microbatches} micro-batches on {ranks} ranks')\n"
            "    return [][rank]  # planted in a notebook\n")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    path = tmp_path / "06_pipeline_lab.ipynb"
    nbformat.write(notebook, str(path))
    rejected = expect_rejection(LABS["06_pipeline_lab"].parts[0].run, answers_from_notebook(path), world_size=2,
                                mistake="raised", phrase="06_pipeline_lab.ipynb, cell 0, line 4: return [][rank]")
    assert "utils/checkers" not in str(rejected)


def _sends_seen():
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import isend as early_isend  # bound before the log opens

    from utils.checkers.halving_doubling import PeerLog

    rank = dist.get_rank()
    with PeerLog() as peers:
        if rank == 0:
            dist.send(torch.ones(3), 1)                 # the decorated synchronous send
            dist.isend(torch.ones(5), 1).wait()         # through the module
            early_isend(torch.ones(7), 1).wait()        # a name taken before
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(2), 1)]):
                work.wait()
        else:
            for numel in (3, 5, 7, 2):
                dist.recv(torch.empty(numel), 0)
    return peers.sends


def test_the_peer_log_sees_every_send_however_it_is_named():
    """PeerLog counts at the process group (utils.comm.process_group_calls): on another torch, a renamed decorator
    or call path that hid a send would fail right answers of labs 01a/01b, so the four ways are pinned here."""
    from utils import run_ranks

    sent, received = run_ranks(_sends_seen, world_size=2, verbose=False)
    assert sent == [(1, 12), (1, 20), (1, 28), (1, 8)], sent
    assert received == [], received


def shown_in_ipython(source, namespace):
    """What an IPython shell prints for a cell: a failing check's displayed traceback, a pass's printout."""
    import contextlib
    import io

    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance(colors="nocolor")
    shell.user_ns.update(namespace)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = shell.run_cell(source)
    return result, re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())


def test_a_failing_check_shows_a_panel_not_checker_frames_and_a_pass_says_what_was_checked():
    """Lab 01a's first trap typed into a cell: IPython shows the panel (``_render_traceback_``): the mistake's name,
    the evidence (world size, rank, index, got, expected), the hint and what to do next, and no checker frame; the
    cell still fails with the exception, as papermill and the grader need. The reference passes and says what."""
    from checkers.test_halving_doubling import halving_elements, halving_reduce_scatter
    from utils.checkers.feedback import TRY_NEXT
    from utils.checkers.halving_reduce_scatter import HINTS, check_halving_reduce_scatter

    ns = dict(check=check_halving_reduce_scatter, wrong=halving_elements, right=halving_reduce_scatter)
    result, shown = shown_in_ipython("check(wrong, world_sizes=(4,), timeout=30)", ns)
    err = result.error_in_exec
    assert isinstance(err, LabCheckFailed) and err.mistake == "halved_elements", shown
    assert set(err.evidence) == {"rank", "index", "got", "expected"}, err.evidence
    flat = " ".join(shown.split())
    assert "Not yet: halved_elements" in shown and "world_size=4" in shown, shown
    evidence = (f"rank {err.evidence['rank']} · index {err.evidence['index']} · got {err.evidence['got']} · "
                f"expected {err.evidence['expected']}")
    assert evidence in flat and " ".join(HINTS["halved_elements"].split()) in flat and TRY_NEXT in flat, shown
    assert "Traceback" not in shown and "utils/checkers" not in shown and "raise LabCheckFailed" not in shown, shown
    assert "skipping hidden" not in shown and 'File "' not in shown, shown

    result, shown = shown_in_ipython("print(check(right, world_sizes=(2,), timeout=30))", ns)
    assert result.success, shown
    assert shown.startswith("PASSED: halving_reduce_scatter\n  - world_size=2: every case's chunk v on rank v equals "
                            "the sum's"), shown
    assert "(p-1)/p = 0.5000" in shown and "only to v XOR d, d = 1 first" in shown, shown


def test_papermill_still_fails_a_run_on_a_rejected_answer_and_shows_the_panel(tmp_path):
    """The panel changes only the display: the cell's ``error`` output still fails papermill's run (as it fails
    the test suite and ``make course``), with the exception's name and message, and the panel as its traceback."""
    import nbformat
    import papermill

    from utils.course.notebook_runner import ROOT

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "from utils.checkers.common import LabCheckFailed\n"
        "raise LabCheckFailed('averaged', 'rank 1 is wrong', 'do not divide', 4, dict(rank=1, got=0.5, expected=2))")]
    nbformat.write(nb, tmp_path / "in.ipynb")
    with pytest.raises(papermill.PapermillExecutionError) as failure:
        papermill.execute_notebook(tmp_path / "in.ipynb", tmp_path / "out.ipynb", cwd=str(ROOT), kernel_name="python3",
                                   progress_bar=False)
    assert failure.value.ename == "LabCheckFailed" and failure.value.evalue.startswith("Not yet (world_size=4)")
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(failure.value.traceback))
    assert "Not yet: averaged" in shown and "world_size=4 · rank 1 · got 0.5 · expected 2" in shown, shown
    assert "do not divide" in shown and "Traceback" not in shown and 'File "' not in shown, shown
