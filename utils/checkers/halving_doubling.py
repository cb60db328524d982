"""The checker of lab 01 (Rabenseifner's all-reduce): run the learner's answer on ranks and explain what is wrong.

Used by ``labs/01_halving_doubling_lab.ipynb``, which derives what is checked here. Same conventions as every
lab (``utils.checkers.common``). Values alone let through answers that reach the sum another way (a ring, a
gather to rank 0, whole tensors doubled round), so three kinds of evidence:

- **values**, compared with ``dist.all_reduce``. Inputs are small positive integers, so sums are exact in
  float32, and a wrong answer often *looks like* a known mistake (the sum divided by n; elements still
  holding the rank's input because no half contained them);
- **the pattern**, from ``PeerLog`` below: to whom each rank sends, and how many messages. Recursive halving
  and doubling talks only to partners whose virtual ranks differ in one bit, 2 log2 p times;
- **bytes**, from ``CommLedger``: 2(p-1) tensors in all over the p ranks, plus two per folded pair.
"""

import torch
import torch.distributed as dist

from ..launch import rank_device
from ..comm.ledger import RING_WIRE_FACTOR, CommLedger
from .common import CheckResult, LabCheckFailed, caught, first_error, launch_answer, raise_if_error

COLLECTIVES = set(RING_WIRE_FACTOR) - {"send", "isend", "recv", "irecv", "barrier"}  # all but point-to-point

HINTS = {
    "deadlock": "two partners both wait in a blocking dist.send (or isend(...).wait()) for a receive the other has "
                "not posted: gloo's send waits for the matching recv, at any size. Post both halves of an exchange "
                "first (works = [dist.isend(...), dist.irecv(...)]), then wait on both.",
    "used_collective": "build it from point-to-point calls only (dist.isend / dist.irecv, or send / recv): calling "
                       "a collective hides the algorithm this lab is about.",
    "averaged": "all-reduce with SUM must leave the plain sum, as dist.all_reduce does; do not divide by the "
                "world size (DDP divides afterwards, lesson 02).",
    "not_in_place": "write the result into the tensor you were given (work on flat = tensor.view(-1) and its "
                    "slices, which are views); the caller ignores the return value.",
    "uncovered": "some elements were never summed: the two halves of a segment [lo, hi) must cover it exactly, "
                 "mid = lo + (hi - lo + 1) // 2, halves [lo, mid) and [mid, hi).",
    "doubling_missing": "after recursive halving each rank owns ONE complete segment. The recursive-doubling "
                        "phase must swap complete segments with the same partners, in reverse order.",
    "not_power_of_two": "on a world size that is not a power of two, fold the extra ranks first: with p the "
                        "largest power of two <= n and rem = n - p, each even rank below 2*rem sends its whole "
                        "tensor to the odd rank after it and sits out; the odd ranks and the ranks from 2*rem on "
                        "run the algorithm as virtual ranks 0..p-1; at the end each odd rank sends the result back.",
    "not_unfolded": "the ranks that ran the algorithm are right; the folded ones (the even ranks below 2*rem) are "
                    "not: at the end each odd rank below 2*rem must send the complete sum back to the even rank "
                    "before it, which receives it into its tensor.",
    "wrong": "compare your segments with the table in the lab: at distance d, the rank whose virtual rank has bit d "
             "clear keeps the lower half and sends the upper one; its partner does the opposite.",
    "too_many_messages": "recursive halving and doubling takes log2 p steps per phase, ONE message to ONE partner "
                         "per step: 2 log2 p messages per rank (a ring takes 2(n-1), a gather to one rank n-1 on "
                         "that rank). Exchange halves with the partner at distance d = p/2, p/4, ..., 1, then back.",
    "wrong_partner": "at each step a rank exchanges with the rank whose virtual rank differs in exactly one bit, "
                     "v XOR d; a ring (rank + 1) or a root (rank 0) is a different algorithm.",
    "too_many_bytes": "each step must send HALF of the segment this rank still holds (p/2, p/4, ... of the "
                      "tensor), not the whole tensor: that is what makes it 2(p-1)/p of the tensor per rank.",
    "too_few_bytes": "call dist.isend / dist.irecv (or send / recv) through the dist module, so the checker sees "
                     "them.",
}


class PeerLog:
    """Inside a rank: note the destination and bytes of every send, isend and batched isend.

    ``CommLedger`` counts bytes but not who they go to; this context adds that. Enter it *inside*
    a ledger (``with CommLedger() as ledger, PeerLog() as peers:``), so that both see every call.
    """

    def __enter__(self):
        self.sends, self._saved = [], {op: getattr(dist, op) for op in ("send", "isend", "batch_isend_irecv")}
        self._torch_isend = getattr(dist.isend, "ledger_original", dist.isend)
        for op in ("send", "isend"):
            setattr(dist, op, self._wrap(self._saved[op]))
        batch = self._saved["batch_isend_irecv"]

        def batch_isend_irecv(p2p_ops):
            for p in p2p_ops:
                if p.op is self._torch_isend or getattr(p.op, "ledger_original", None) is self._torch_isend:
                    self.sends.append((p.peer, p.tensor.numel() * p.tensor.element_size()))
            return batch(p2p_ops)

        dist.batch_isend_irecv = batch_isend_irecv
        return self

    def _wrap(self, fn):
        def logged(tensor, *args, **kwargs):
            peer = args[0] if args else kwargs.get("dst", kwargs.get("group_dst"))
            self.sends.append((peer, tensor.numel() * tensor.element_size()))
            return fn(tensor, *args, **kwargs)

        logged.ledger_original = getattr(fn, "ledger_original", fn)  # so dist.P2POp(dist.isend, ...) still works
        return logged

    def __exit__(self, *exc):
        for op, fn in self._saved.items():
            setattr(dist, op, fn)
        return False


def cases(world_size):
    """(numel, dtype) cases: 1 element, fewer elements than ranks, divisible, not, and a large one (last)."""
    sizes = sorted({1, max(1, world_size - 1), 4 * world_size, 4 * world_size + 1, 25_003})
    return [(numel, dtype) for dtype in (torch.int64, torch.float32) for numel in sizes]


def plan(n):
    """What the algorithm sends on n ranks: {rank: (allowed destinations, messages, tensors' worth of bytes)}.

    p = the largest power of two <= n, rem = n - p. Even ranks below 2 rem send once, to the odd rank
    after them; the others exchange with real(v XOR d) for every d = 1, 2, ..., p/2, twice each
    (halving, doubling), and the odd ranks below 2 rem also send their partner the result.
    """
    p = 1 << (n.bit_length() - 1)
    rem, steps = n - p, p.bit_length() - 1  # steps = log2 p
    real = lambda u: 2 * u + 1 if u < rem else u + rem
    out = {}
    for rank in range(n):
        if rank < 2 * rem and rank % 2 == 0:
            out[rank] = ({rank + 1}, 1, 1.0)
            continue
        v = rank // 2 if rank < 2 * rem else rank - rem
        allowed = {real(v ^ (1 << j)) for j in range(steps)}
        folded = rank < 2 * rem
        out[rank] = (allowed | ({rank - 1} if folded else set()), 2 * steps + folded, 2 * (p - 1) / p + folded)
    return out


def _on_rank(fn, cases):
    """Runs on every rank: each case on a fresh tensor, inside a ledger and a peer log; stops at the first error."""
    rank, device, out = dist.get_rank(), rank_device(), []
    for numel, dtype in cases:
        original = ((rank + 1) * 100 + torch.arange(numel, device=device) % 13 + 1).to(dtype)  # > 0, exact
        expected = original.clone()
        dist.all_reduce(expected)  # torch's answer, outside the ledger
        tensor, returned, error = original.clone(), None, None
        with CommLedger() as ledger, PeerLog() as peers:
            try:
                returned = fn(tensor)
            except Exception as exc:  # noqa: BLE001 - reported to the learner in the kernel
                error = caught(exc, "halving_doubling_all_reduce")
        out.append(dict(original=original, expected=expected, got=tensor, error=error, sends=peers.sends,
                        returned=returned if isinstance(returned, torch.Tensor) else None,
                        sent=ledger.total("wire_bytes"), ops=sorted({r.op for r in ledger.records} & COLLECTIVES)))
        if error:
            break
    return out


def _values(n, ranks):
    """Which mistake the values of one case look like, on all ranks (None when they are right)."""
    got, exp, orig = ([r[k] for r in ranks] for k in ("got", "expected", "original"))
    if all(torch.equal(g, e) for g, e in zip(got, exp)):
        return None
    if all(torch.allclose(g, e / n) if g.is_floating_point() else torch.equal(g, e // n) for g, e in zip(got, exp)):
        return "averaged"
    if all(torch.equal(g, o) and r["returned"] is not None and torch.equal(r["returned"], e)
           for g, o, e, r in zip(got, orig, exp, ranks)):
        return "not_in_place"
    if all(torch.equal(g[g != e], o[g != e]) for g, e, o in zip(got, exp, orig)):
        return "uncovered"  # every wrong element still holds this rank's input: no half contained it
    return "wrong"


def _check_case(n, label, numel, ranks, wanted):
    """Raise LabCheckFailed for the first mistake this case shows."""
    __tracebackhide__ = True
    used = sorted({op for r in ranks for op in r["ops"]})
    if used:
        raise LabCheckFailed("used_collective", f"{label}: called {used}.", HINTS["used_collective"], n)
    error = first_error(ranks)
    mistake = _values(n, ranks) if len(ranks) == n and not error else None
    size = numel * ranks[0]["got"].element_size()
    ideal, sent = sum(b for _, _, b in wanted.values()) * size, sum(r["sent"] for r in ranks)
    p = 1 << (n.bit_length() - 1)
    folded = set(range(0, 2 * (n - p), 2))  # the even ranks that sit out on a world size not a power of two
    wrong_ranks = {k for k, rk in enumerate(ranks) if not torch.equal(rk["got"], rk["expected"])} if mistake else set()
    if wrong_ranks and wrong_ranks <= folded:
        mistake = "not_unfolded"  # every rank of the p is right: only the folded ones lack the result
    elif mistake in ("wrong", "uncovered") and abs(sent - (ideal - (p - 1) * size)) < 1:
        mistake = "doubling_missing"  # the halving phase's bytes only
    if mistake:
        r = next(k for k, rk in enumerate(ranks) if not torch.equal(rk["got"], rk["expected"]))
        got, exp = ranks[r]["got"], ranks[r]["expected"]
        bad = (got != exp).nonzero().flatten()
        raise LabCheckFailed(mistake, f"{label}: rank {r} is wrong at {bad.numel()} of {numel} elements, first at "
                             f"index {bad[0].item()}: got {got[bad[0]].item()}, expected {exp[bad[0]].item()} (the sum "
                             "of the ranks' inputs).", HINTS[mistake], n)
    raise_if_error(error, n, HINTS)
    for rank, r in enumerate(ranks):
        allowed, messages, _ = wanted[rank]
        if len(r["sends"]) > messages:
            raise LabCheckFailed("too_many_messages", f"{label}: the values are right, but rank {rank} sent "
                                 f"{len(r['sends'])} messages (to ranks {[d for d, _ in r['sends']]}); recursive "
                                 f"halving and doubling sends {messages} on this rank.", HINTS["too_many_messages"], n)
        strangers = sorted({d for d, _ in r["sends"]} - allowed)
        if strangers:
            raise LabCheckFailed("wrong_partner", f"{label}: the values are right, but rank {rank} sent to ranks "
                                 f"{strangers}; its partners are ranks {sorted(allowed)}.", HINTS["wrong_partner"], n)
    # Halves of uneven segments round: each step may send one element more or fewer than the exact share.
    slack = 2 * p.bit_length() * ranks[0]["got"].element_size()
    worst = max(range(n), key=lambda k: ranks[k]["sent"] - wanted[k][2] * size)
    if abs(sent - ideal) >= 1 or ranks[worst]["sent"] > wanted[worst][2] * size + slack:
        mistake = "too_many_bytes" if sent >= ideal else "too_few_bytes"
        raise LabCheckFailed(mistake, f"{label}: the values are right, but the ranks sent {sent:,.0f} bytes in all, "
                             f"{sent / ideal:.2f}x the algorithm's {ideal:,.0f} (rank {worst}: "
                             f"{ranks[worst]['sent']:,.0f} bytes, formula {wanted[worst][2] * size:,.0f}).",
                             HINTS[mistake], n)


def check_halving_doubling(fn, world_sizes=(2, 3, 4), timeout=20.0):
    """Check ``fn(tensor) -> None``, an in-place SUM all-reduce by recursive halving and doubling.

    Powers of two are checked first. On each world size n, runs every case of ``cases(n)`` and
    demands: (1) no collective is called; (2) every rank's tensor equals ``dist.all_reduce``'s;
    (3) no rank sends more messages than ``plan(n)`` says, nor to a rank that is not one of its
    partners; (4) the bytes sent add up to exactly 2(p-1) tensors plus 2 per folded pair, and no
    rank sends more than its share (give or take rounding). Once the powers of two have passed, a
    failure on another size is reported as the fold that is missing. Returns a ``CheckResult``;
    raises ``LabCheckFailed`` with a hint.
    """
    __tracebackhide__ = True
    lines, passed_power = [], False
    for n in sorted(world_sizes, key=lambda k: (k & (k - 1) != 0, k)):  # powers of two first
        if n < 2:
            raise ValueError(f"world size {n}: an all-reduce between ranks needs at least 2; use 2 to 8.")
        wanted, power = plan(n), n & (n - 1) == 0
        try:
            per_rank = launch_answer(_on_rank, (fn, cases(n)), n, timeout, "halving_doubling_all_reduce",
                                     HINTS["deadlock"])
            for i, (numel, dtype) in enumerate(cases(n)):
                ranks = [r[i] for r in per_rank if i < len(r)]
                _check_case(n, f"a {numel:,}-element {str(dtype).replace('torch.', '')} tensor", numel, ranks, wanted)
        except LabCheckFailed as err:
            if power or not passed_power or err.mistake not in ("wrong", "uncovered", "crash", "deadlock"):
                raise
            raise LabCheckFailed("not_power_of_two", f"right on {sorted(k for k in world_sizes if k & (k - 1) == 0)} "
                                 f"ranks, but not on {n}:\n{err}", HINTS["not_power_of_two"], n) from None
        passed_power |= power
        last = [r[-1] for r in per_rank]
        size = cases(n)[-1][0] * last[0]["got"].element_size()
        lines.append(f"world_size={n}: {len(per_rank[0])} cases equal dist.all_reduce; on {cases(n)[-1][0]:,} elements "
                     f"the ranks sent {min(len(r['sends']) for r in last)}-{max(len(r['sends']) for r in last)} "
                     f"messages each (a ring: {2 * (n - 1)}), {sum(r['sent'] for r in last) / size:.4f} tensors in all "
                     f"(formula {sum(b for _, _, b in wanted.values()):.4f}), only to their partners")
    return CheckResult("halving_doubling_all_reduce", lines)
