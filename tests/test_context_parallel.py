"""utils.context_parallel: ring attention and Ulysses (lesson 14, notebook 14_context_parallelism).

The lesson's own asserts run these at its sizes and at 2-4 ranks; here, small and fast: on 2 and 3 ranks the ring
(contiguous and zig-zag, full and causal) and Ulysses give the outputs and the gradients of q, k and v of one process's
``scaled_dot_product_attention``, send the bytes of the formulas, and the ring's causal work is ``causal_work``'s; in
one process, the online-softmax merge is exact in any order; a sequence or a head count that does not split is
refused with the numbers."""

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import utils
import utils.context_parallel as cp

B, H, S, D = 1, 6, 12, 4  # 6 heads: 2 and 3 ranks; 12 tokens: 2n chunks for n = 2 and 3
TOL = dict(rtol=1e-4, atol=1e-5)  # float32, sums in another order


def _tensors():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, S, D, generator=g) for _ in range(4)]  # q, k, v, upstream gradient w


def _one_process(causal):
    q, k, v, w = _tensors()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    (out * w).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]


def _on_rank(method, layout, causal):
    rank, n = dist.get_rank(), dist.get_world_size()
    q, k, v, w = (cp.shard(t, rank, n, layout).to(utils.rank_device()).requires_grad_() for t in _tensors())
    stats = {}
    with utils.CommLedger() as ledger:
        if method == "ring":
            out = cp.ring_attention(q, k, v, causal=causal, layout=layout, stats=stats)
        else:
            out = cp.ulysses_attention(q, k, v, causal=causal)
        (out * w.detach()).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad], ledger.summary(), stats


CASES = [("ring", "contiguous", False), ("ring", "contiguous", True), ("ring", "zigzag", True),
         ("ulysses", "contiguous", True)]


@pytest.mark.parametrize("n", [2, 3])
def test_split_attention_equals_one_process(n):
    for method, layout, causal in CASES:
        results = utils.run_ranks(_on_rank, method, layout, causal, world_size=n, verbose=False, timeout=120)
        for i, ref in enumerate(_one_process(causal)):
            torch.testing.assert_close(cp.unshard([r[0][i] for r in results], layout), ref, **TOL)
        local = B * H * (S // n) * D * 4  # bytes of one rank's q (or k, v, output)
        for tensors, summary, stats in results:
            if method == "ring":  # K and V, n-1 passes forward and n-1 back
                assert summary["isend"]["calls"] == 2 * (n - 1)
                assert summary["isend"]["wire_bytes"] == 2 * (n - 1) * 2 * local
            else:  # 4 all-to-alls forward, 4 backward, (n-1)/n of each leaves the rank
                assert summary["all_to_all"]["calls"] == 8
                assert math.isclose(summary["all_to_all"]["wire_bytes"], 8 * local * (n - 1) / n)
        if method == "ring" and causal:
            assert [r[2]["unmasked"] for r in results] == cp.causal_work(S, n, layout)


def test_causal_work_formula():
    assert sum(cp.causal_work(48, 4)) == 48 * 49 // 2 == sum(cp.causal_work(48, 4, "zigzag"))
    assert len(set(cp.causal_work(48, 4, "zigzag"))) == 1  # zig-zag: the same on every rank
    work = cp.causal_work(48, 4)
    assert work == sorted(work) and work[-1] > 1.5 * work[0]  # contiguous: the last rank the most


def test_merge_is_exact_in_any_order():
    q, k, v, _ = _tensors()
    blocks = list(zip(k.split(4, dim=-2), v.split(4, dim=-2)))
    acc = None
    for kb, vb in blocks[::-1]:
        acc = cp.merge(acc, cp.ring.block_attention(q, kb, vb))
    torch.testing.assert_close(acc[0], F.scaled_dot_product_attention(q, k, v), **TOL)


def test_merge_is_finite_where_exp_overflows():
    """Scores in the hundreds (e^l is inf in float32 above ~88.7): the merge still equals attention over both blocks."""
    q, k, v, _ = _tensors()
    q = q * 60  # log-sum-exps in the hundreds
    (o1, l1), (o2, l2) = (cp.ring.block_attention(q, kb, vb) for kb, vb in zip(k.chunk(2, -2), v.chunk(2, -2)))
    assert not torch.isfinite(torch.exp(torch.maximum(l1, l2))).all()
    o, l = cp.merge((o1, l1), (o2, l2))  # noqa: E741
    scores = (q.double() @ k.double().transpose(-2, -1)) / q.shape[-1] ** 0.5
    torch.testing.assert_close(l.double(), torch.logsumexp(scores, -1, keepdim=True), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(o.double(), torch.softmax(scores, -1) @ v.double(), **TOL)


def test_shard_and_unshard_round_trip():
    x = torch.arange(24.0).reshape(1, 1, 24, 1)
    for layout in cp.ring.LAYOUTS:
        pieces = [cp.shard(x, r, 3, layout) for r in range(3)]
        assert torch.equal(cp.unshard(pieces, layout), x)
    assert cp.positions(0, 3, 24, "zigzag").tolist() == [0, 1, 2, 3, 20, 21, 22, 23]  # chunks 0 and 5


def test_refusals_name_the_numbers():
    with pytest.raises(ValueError, match=r"sequence length 50 .* 2 x 4 = 8 chunks.*48 or 56"):
        cp.check_sequence(50, 4, "zigzag")
    with pytest.raises(ValueError, match=r"sequence length 10 .* 3 chunks.*9 or 12"):
        cp.check_sequence(10, 3)
    with pytest.raises(ValueError, match=r"12 attention heads .* 5 ranks.*use 2, 3, 4, 6"):
        cp.check_heads(12, 5)
    with pytest.raises(ValueError, match="layout 'striped'"):
        cp.ring.chunk_ids(0, 2, "striped")
    assert cp.check_sequence(48, 4, "zigzag") == 6 and cp.check_heads(12, 4) == 3
