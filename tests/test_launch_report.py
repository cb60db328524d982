"""utils.launch.report, the one-line-per-rank reading of a failed launch that labs 11a and 11b print."""

import pytest
import torch
import torch.distributed as dist

from utils import RankError, RankTimeoutError
from utils.launch.report import run_broken, summary, where

pytestmark = pytest.mark.usefixtures("no_children_left")

STACK = '''Thread 0x00007f (most recent call first):
  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 4200 in barrier
  File "/x/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "{file}", line {line} in program_A
  File "/x/utils/launch/rank.py", line 90 in main
'''


def test_where_names_the_torch_call_and_the_programs_line(tmp_path):
    program = tmp_path / "cell.py"
    program.write_text("def program_A():\n    dist.barrier()  # everyone waits here\n")
    said = where(STACK.format(file=program, line=2))
    assert said.split()[:2] == ["in", "barrier"], said
    assert said.endswith("called from program_A: dist.barrier()  # everyone waits here"), said


def test_where_and_summary_without_frames():
    assert where("") == "?" and where("no frames here\nat all") == "no frames here"
    assert summary(None) == "finished without error"
    err = RankTimeoutError("the ranks did not finish in 5 s", {0: "", 1: "stuck"})
    assert summary(err).splitlines() == ["the ranks did not finish in 5 s", "  rank 0: ?", "  rank 1: stuck"]


def rank_1_skips_the_sum():
    t = torch.ones(1)
    if dist.get_rank() != 1:
        dist.all_reduce(t)
    dist.barrier()


def rank_1_raises():
    if dist.get_rank() == 1:
        raise ValueError("rank 1 read a bad config")
    dist.barrier()


def test_a_hang_comes_back_as_a_value_with_each_ranks_line():
    err, seconds = run_broken(rank_1_skips_the_sum, world_size=2, timeout=3)
    assert isinstance(err, RankTimeoutError) and seconds >= 3
    lines = summary(err).splitlines()
    assert len(lines) == 3, lines  # the report's first line, then one per rank
    assert "in all_reduce" in lines[1] and "called from rank_1_skips_the_sum: dist.all_reduce(t)" in lines[1], lines
    assert "in barrier" in lines[2] and "dist.barrier()" in lines[2], lines


def test_an_error_comes_back_as_a_value_naming_the_rank():
    err, _ = run_broken(rank_1_raises, world_size=2, timeout=60)
    assert isinstance(err, RankError) and "rank 1 read a bad config" in str(err)
    first, *others = summary(err).splitlines()
    assert first.startswith("rank 1 of 2 failed first") and "bad config" in first, first  # the cause, first
    assert others and all(line.startswith("  rank 0: secondary") for line in others), others  # rank 0's echo
    assert run_broken(dist.get_rank, world_size=2, timeout=60)[0] is None
