"""utils.CommLedger: the byte counts every later lesson puts beside its formulas."""

import pytest
import torch
import torch.distributed as dist

from utils import CommLedger, run_ranks


def _traffic():
    n, rank = dist.get_world_size(), dist.get_rank()
    original = dist.all_reduce
    with CommLedger() as ledger:
        dist.all_reduce(torch.ones(1000))  # 4000 payload bytes
        gathered = [torch.empty(10) for _ in range(n)]
        dist.all_gather(gathered, torch.ones(10))  # output: n * 40 bytes
        dist.reduce_scatter_tensor(torch.empty(10), torch.ones(10 * n))  # input: n * 40 bytes
        dist.broadcast(torch.ones(8), src=0)
        if rank == 0:
            dist.send(torch.ones(5), 1)
        elif rank == 1:
            dist.recv(torch.empty(5), 0)
        dist.barrier()
    assert dist.all_reduce is original, "the ledger puts torch's functions back on exit"
    dist.all_reduce(torch.ones(1))  # after the with-block: not recorded
    return ledger.summary(), len(ledger.records)


@pytest.mark.parametrize("n", [2, 4])
def test_payload_and_ring_wire_bytes(n):
    results = run_ranks(_traffic, world_size=n, verbose=False)
    s, count = results[0]
    assert count == 6  # all_reduce, all_gather, reduce_scatter_tensor, broadcast, send, barrier
    assert s["all_reduce"]["payload_bytes"] == 4000
    assert s["all_reduce"]["wire_bytes"] == pytest.approx(4000 * 2 * (n - 1) / n)
    assert s["all_gather"]["payload_bytes"] == 40 * n
    assert s["all_gather"]["wire_bytes"] == pytest.approx(40 * n * (n - 1) / n)
    assert s["reduce_scatter_tensor"]["payload_bytes"] == 40 * n
    assert s["send"] == {"calls": 1, "payload_bytes": 20, "wire_bytes": 20.0, "seconds": s["send"]["seconds"]}
    receiver = results[1][0]["recv"]
    assert receiver["payload_bytes"] == 20 and receiver["wire_bytes"] == 0.0  # counted once, by the sender


def test_totals_filter_by_op():
    def run():
        with CommLedger() as ledger:
            dist.all_reduce(torch.ones(100))
            dist.all_reduce(torch.ones(100, dtype=torch.float64))
        return ledger.total("payload_bytes", op="all_reduce"), ledger.total("payload_bytes", op="send")

    assert run_ranks(run, world_size=2, verbose=False) == [(1200, 0), (1200, 0)]


def test_loopback_counter_sees_gloo_send_ring_bytes():
    from utils import loopback_bytes

    def measure(numel):
        t = torch.ones(numel)
        dist.all_reduce(t)  # warm the connections
        dist.barrier()
        before = loopback_bytes()
        dist.all_reduce(t)
        dist.barrier()
        return None if before is None else loopback_bytes() - before

    n, numel = 2, 2**20
    total = run_ranks(measure, numel, world_size=n, verbose=False)[0]
    if total is None:
        pytest.skip("no loopback counter on this machine")
    per_rank = total / n
    assert per_rank == pytest.approx(2 * numel * 4 * (n - 1) / n, rel=0.05)


def test_batch_isend_irecv_works_and_is_recorded():
    def ring_shift():
        rank, n = dist.get_rank(), dist.get_world_size()
        send, recv = torch.full((6,), float(rank)), torch.empty(6)
        with CommLedger() as ledger:
            ops = [dist.P2POp(dist.isend, send, (rank + 1) % n), dist.P2POp(dist.irecv, recv, (rank - 1) % n)]
            assert isinstance(ops[0], dist.P2POp)
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return recv[0].item(), ledger.total("wire_bytes"), [r.op for r in ledger.records]

    results = run_ranks(ring_shift, world_size=3, verbose=False)
    assert [r[0] for r in results] == [2.0, 0.0, 1.0]
    assert results[0][1:] == (24.0, ["isend", "irecv"])


@pytest.mark.skipif(not hasattr(dist, "all_gather_single"), reason="this torch predates all_gather_single")
def test_single_tensor_collectives_are_recorded():
    def run():
        n = dist.get_world_size()
        with CommLedger() as ledger:
            dist.all_gather_single(torch.empty(4 * n), torch.ones(4))
            dist.reduce_scatter_single(torch.empty(4), torch.ones(4 * n))
        return ledger.summary()

    s = run_ranks(run, world_size=2, verbose=False)[0]
    assert s["all_gather_single"]["payload_bytes"] == s["reduce_scatter_single"]["payload_bytes"] == 32


# names imported before any ledger opens: the ledger must count calls through them too (utils.comm.process_group_calls)
from torch.distributed import distributed_c10d  # noqa: E402
from torch.distributed import irecv as early_irecv, isend as early_isend  # noqa: E402


def test_calls_that_step_around_the_module_are_counted_once_under_their_name():
    def run():
        rank, n = dist.get_rank(), dist.get_world_size()
        send, recv = torch.ones(6), torch.empty(6)
        with CommLedger() as ledger:
            distributed_c10d.all_reduce(torch.ones(100))  # not torch.distributed's attribute
            works = [early_isend(send, (rank + 1) % n), early_irecv(recv, (rank - 1) % n)]  # imported before
            for work in works:
                work.wait()
            ops = [dist.P2POp(early_isend, send, (rank + 1) % n), dist.P2POp(early_irecv, recv, (rank - 1) % n)]
            for work in distributed_c10d.batch_isend_irecv(ops):  # torch's own batch, with torch's own isend
                work.wait()
            dist.all_reduce(torch.ones(10))  # through the wrapper: once, not again at the process group
            dist.all_gather_object([None] * n, rank)  # torch's machinery, unrecorded before and now
        return [(r.op, r.payload_bytes, r.wire_bytes) for r in ledger.records]

    records = run_ranks(run, world_size=2, verbose=False)[0]
    assert records == [("all_reduce", 400, 400.0), ("isend", 24, 24.0), ("irecv", 24, 0.0), ("isend", 24, 24.0),
                       ("irecv", 24, 0.0), ("all_reduce", 40, 40.0)]


def test_a_ledger_inside_another_records_a_batchs_isend_as_a_send():
    def run():
        peer = 1 - dist.get_rank()
        ops = [dist.P2POp(dist.isend, torch.ones(4), peer), dist.P2POp(dist.irecv, torch.empty(4), peer)]
        with CommLedger() as outer, CommLedger() as inner:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return [(r.op, r.payload_bytes, r.wire_bytes) for r in inner.records], [r.op for r in outer.records]

    (inner, outer), _ = run_ranks(run, world_size=2, verbose=False)
    assert inner == [("isend", 16, 16.0), ("irecv", 16, 0.0)], inner
    assert outer == ["isend", "irecv"], outer
