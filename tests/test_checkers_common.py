"""The harness every checker calls learner code through (utils/checkers/harness.py, watch.py).

- An exception the answer raises is the mistake ``raised``, with the answer's line and no checker frame; a stub's
  NotImplementedError stays itself (each lab's own planted exception: tests/checkers/test_<lab>.py).
- The watcher of forbidden calls sees a call made in a thread the answer starts, and refuses an answer that
  switches it off (``tampered``). Lab 06's checker is the example: torch's schedules, and the checker's own
  ``_torch_rank_orders``, compute the order the lab asks for.
"""

import sys
import threading

import pytest
import torch.distributed.pipelining  # noqa: F401 - what lab 06's checker imports: not under a profile hook, in a test

from lab_grading import expect_rejection
from utils.checkers.common import LabCheckFailed, learner_call
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


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (torch_order_in_a_thread, "used_torch", "write the order yourself"),
    (switches_the_watcher_off, "tampered", "sys.setprofile"),
    (restores_the_watcher_afterwards, "tampered", "sys.getprofile"),
], ids=["forbidden call in a thread", "sys.setprofile(None)", "hook taken and put back"])
def test_the_watcher_cannot_be_stepped_around(wrong, mistake, phrase):
    expect_rejection(check_interleaved, wrong, world_sizes=(), mistake=mistake, phrase=phrase)


def test_the_watcher_is_removed_from_every_thread_it_covered():
    before = sys.getprofile(), threading.getprofile()
    with Watcher(lambda frame, event, arg: None) as watcher:
        pass  # (asking for the hook in here is what a tampering answer does)
    assert (sys.getprofile(), threading.getprofile()) == before and not watcher.tampered


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
