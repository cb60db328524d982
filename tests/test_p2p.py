"""utils.comm.p2p.sendrecv (notebook 01a): a ring shift that a ring of blocking sends would deadlock, empty messages
skipped on both sides, and every send seen by CommLedger."""

import pytest
import torch
import torch.distributed as dist

from utils import CommLedger, run_ranks
from utils.comm.p2p import sendrecv


def _shift(numel):
    rank, n = dist.get_rank(), dist.get_world_size()
    mine, theirs = torch.full((numel,), float(rank)), torch.empty(numel)
    with CommLedger() as ledger:
        sendrecv(mine, (rank + 1) % n, theirs, (rank - 1) % n)
    return theirs.tolist(), [record.op for record in ledger.records]


@pytest.mark.parametrize("n", [2, 3])
def test_ring_shift_receives_the_left_neighbours_tensor(n):
    got = run_ranks(_shift, 3, world_size=n, verbose=False, timeout=30)
    for rank, (values, ops) in enumerate(got):
        assert values == [float((rank - 1) % n)] * 3
        assert ops.count("isend") == 1, ops


def test_empty_messages_are_skipped_on_both_sides():
    got = run_ranks(_shift, 0, world_size=2, verbose=False, timeout=30)
    assert all(values == [] and "isend" not in ops for values, ops in got)
