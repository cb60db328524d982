"""What the checkers of labs 01a and 01b share: Rabenseifner's all-reduce, run on ranks and looked at three ways.

Lab 01a asks for a reduce-scatter by recursive halving (``utils.checkers.halving_reduce_scatter``),
lab 01b for an all-gather by recursive doubling (``utils.checkers.doubling_all_gather``), then the
all-reduce made of a fold, torch's reduce-scatter and that all-gather (``utils.checkers.folded_all_reduce``).
Same conventions as every lab (``utils.checkers.common``). Values alone let through answers that
reach the sum another way (a ring, a gather to rank 0, whole tensors at every step), so each check
looks at three kinds of evidence:

- **values**, compared with the sum the checker computes itself. Inputs are small positive integers, so sums
  are exact in float32, and a wrong answer often *looks like* a known mistake (the sum divided by n, the right
  chunk on the wrong rank, the sum less the folded ranks' inputs). Each rank makes its inputs from a seed only it
  gets (``rank_secrets``), and the checker computes the sum outside the ranks, so an answer that replaces this
  module's rank function still has to move the data between its ranks;
- **the pattern**, from ``PeerLog`` below: to whom each rank sends, in which order, how many messages.
  Recursive halving and doubling talk only to partners whose virtual ranks differ in one bit;
- **bytes**, from ``CommLedger``: each rank's sends, element for element, as ``sent_elements`` computes them.

``PeerLog`` and ``CommLedger`` run in the rank, beside the answer's code, which could change what they report. So the
ranks run on the launcher's relay (``utils.launch.relay``, sealed: see ``utils.launch.seal`` for what stays open), and each rank's
report of its messages and collectives must be what the relay carried (``rank_secrets.carried``) before any of it is
judged.

The pattern and the bytes a rank must send come from the plans of ``utils.checkers.halving_doubling_tables``
(``virtual_ranks``, ``doubling_plan``, imported here; ``halving_plan``; ``folded_plan``): stored outputs, not the
algorithm, which the teacher's side of these checkers computes (issue 37).

The tensor is cut into p chunks as ``torch.tensor_split`` cuts it (``utils.comm.subgroup.chunk_bounds``).
"""

import torch
import torch.distributed as dist

from ..comm.ledger import RING_WIRE_FACTOR, CommLedger
from ..comm.process_group_calls import observe, payload_bytes
from ..comm.subgroup import chunk_bounds, reduce_scatter_chunks
from ..launch import rank_device
from .boundaries import element_counts
from .common import LabCheckFailed, caught, first_error, launch_answer
from .halving_doubling_tables import doubling_plan, virtual_ranks  # noqa: F401 - the plans, stored; imported from here
from .rank_secrets import carried, generator, new_seeds, rank_args, reports

COLLECTIVES = set(RING_WIRE_FACTOR) - {"send", "isend", "recv", "irecv", "barrier"}  # all but point-to-point

HINTS = {
    "deadlock": "two partners both wait in a blocking dist.send (or isend(...).wait()) for a receive the other has "
                "not posted: gloo's send waits for the matching recv, at any size. Post both halves of an exchange "
                "first (works = [dist.isend(...), dist.irecv(...)], or utils.comm.p2p.sendrecv), then wait on both.",
    "used_collective": "build it from point-to-point calls only (dist.isend / dist.irecv, or send / recv): calling "
                       "a collective hides the algorithm this lab is about. In lab 01b the one collective allowed "
                       "is the reduce_scatter you were given, called through its argument.",
    "averaged": "a SUM must leave the plain sum, as dist.all_reduce does; do not divide by the world size (DDP "
                "divides afterwards, lesson 02).",
    "not_in_place": "write the result into the tensor you were given (work on flat = tensor.view(-1) and its "
                    "slices, which are views); the caller ignores the return value.",
    "too_few_bytes": "call dist.isend / dist.irecv (or send / recv) through the dist module, so the checker sees "
                     "them.",
    "wrong_partner": "at each step a rank exchanges with the rank whose virtual rank differs in exactly one bit, "
                     "v XOR d; a ring (rank + 1) or a root (rank 0) is a different algorithm, and a rank that is "
                     "not your partner may never post the matching receive (then the ranks hang).",
    "too_many_messages": "ONE message to ONE partner per step: log2 p messages per rank and phase (a ring takes "
                         "p - 1, a gather to one rank p - 1 on that rank). Send a whole range of chunks at once, "
                         "it is contiguous.",
    "too_many_bytes": "each step sends only the range of chunks the partner lacks (half of the range in halving, "
                      "the range held in doubling), not the whole tensor: that makes (p-1)/p of it per phase.",
}


class PeerLog:
    """Inside a rank: note the destination (global rank) and bytes of every message this rank sends, in order.

    ``CommLedger`` counts bytes but not who they go to; this context adds that. It watches the process group's
    ``send`` (``utils.comm.process_group_calls``), where ``send``, ``isend`` and ``batch_isend_irecv``'s sends all
    arrive, however the answer named them (an ``isend`` imported before the checker started is seen too). Ranks that
    hang never return it: the relay's record tells their sends then (``run_sizes``).
    """

    def __enter__(self):
        self.sends = []
        self._watching = observe(self._sent)
        self._watching.__enter__()
        return self

    def _sent(self, call):
        if call.method == "send":
            peer = call.args[1]
            try:
                peer = dist.get_global_rank(call.group, peer)  # group rank -> global rank
            except (ValueError, RuntimeError, TypeError):  # a backend object, or the default group: as it is
                pass
            self.sends.append((peer, payload_bytes(call)))

    def __exit__(self, *exc):
        self._watching.__exit__(None, None, None)
        return False


def cases(p):
    """(numel, dtype) cases: one that cuts evenly into p chunks first, then the other element counts of
    ``boundaries.element_counts`` (1 element, fewer than p, remainders, large), in increasing order."""
    first, *rest = [numel for numel, _ in element_counts(p)]
    return [(numel, dtype) for dtype in (torch.int64, torch.float32) for numel in [first] + sorted(rest)]


def inputs(rank, numel, dtype, seed, device=None):
    """Rank ``rank``'s input from its ``seed`` (``rank_secrets``): (rank + 1) * 100 plus random integers from 1 to 13,
    positive and small (exact in float32 sums), and no two ranks' alike; another draw for each size and dtype."""
    noise = torch.randint(1, 14, (numel,), generator=generator(seed, numel, dtype.itemsize))
    return ((rank + 1) * 100 + noise).to(dtype=dtype, device=device or rank_device())


def _given_reduce_scatter(calls):
    def reduce_scatter(tensor, ranks):  # the lab's reduce-scatter, noting each call
        calls.append(list(ranks))
        reduce_scatter_chunks(tensor, ranks)
    return reduce_scatter


REPORT = dict(got=torch.Tensor, error=(tuple, type(None)), sends=list, returned=(torch.Tensor, type(None)),
              sent=(int, float), ops=list, calls=list)  # what on_rank reports a case: observations, no reference


def on_rank(fn, kind, cases, name, seed):
    """Runs on every rank: each case on a fresh tensor, inside a ledger and a peer log; stops at the first error.

    ``kind``: "reduce_scatter" (``fn(tensor)``), "all_gather" (``fn(tensor, ranks)``, on the virtual ranks only, from
    chunk v alone) or "all_reduce" (``fn(tensor, reduce_scatter)``). ``seed``: this rank's own (``rank_secrets``).
    Reports
    what it saw (``REPORT``); the expected values are the checker's to compute (``run_sizes``), and no rank holds them:
    an answer's code can read its caller's variables (``sys._getframe(1).f_locals``)."""
    rank, n, out = dist.get_rank(), dist.get_world_size(), []
    ranks = virtual_ranks(n)
    for numel, dtype in cases:
        original = inputs(rank, numel, dtype, seed)
        tensor, returned, error, calls = original.clone(), None, None, []
        dist.barrier()  # outside the ledger: every rank starts each case together, no message crosses into the next
        if kind == "all_gather":
            tensor.fill_(-1)  # never an input (all positive): a chunk never received shows
            if rank in ranks:  # virtual rank v starts with chunk v of its own input
                v = ranks.index(rank)
                b = chunk_bounds(numel, len(ranks))
                tensor[b[v]:b[v + 1]] = original[b[v]:b[v + 1]]
        with CommLedger() as ledger, PeerLog() as peers:
            try:
                if kind == "reduce_scatter":
                    returned = fn(tensor)
                elif kind == "all_gather" and rank in ranks:
                    returned = fn(tensor, list(ranks))
                elif kind == "all_reduce":
                    returned = fn(tensor, _given_reduce_scatter(calls))
            except Exception as exc:  # noqa: BLE001 - reported to the learner in the kernel
                error = caught(exc, name)
        p2p = sum(r.wire_bytes for r in ledger.records if r.op not in COLLECTIVES)
        ops = [(r.op, int(r.payload_bytes)) for r in ledger.records if r.op in COLLECTIVES]
        out.append(dict(got=tensor, error=error, sends=peers.sends, sent=p2p, ops=ops, calls=calls,
                        returned=returned if isinstance(returned, torch.Tensor) else None))
        if error:
            break
    return out


def run_sizes(fn, kind, world_sizes, timeout, name, check_case, other_size, partners=None):
    """Powers of two first; on each world size n, every case through ``check_case(n, label, numel, ranks, every)``
    (``every``: (numel, ranks) of all the cases the ranks ran, for a diagnosis that one case leaves open).

    A failure on a size that is not a power of two, once a power of two has passed, goes through
    ``other_size(n, err)`` (which may name it as the lab's non-power-of-two mistake). ``partners(n, numel)``:
    {rank: its partners}; when the ranks hang, the sends they made before name a wrong
    partner instead of a deadlock (the relay's record, ``traffic``). Returns the per-rank results of the last case on
    each size, for the summary."""
    __tracebackhide__ = True
    passed_power, last = False, {}
    for n in sorted(world_sizes, key=lambda k: (k & (k - 1) != 0, k)):
        if n < 2:
            raise ValueError(f"world size {n}: an exchange between ranks needs at least 2; use 2 to 8.")
        p, power = 1 << (n.bit_length() - 1), n & (n - 1) == 0
        try:
            seeds, traffic = new_seeds(n), []
            try:
                per_rank = launch_answer(on_rank, (fn, kind, cases(p), name), n, timeout, name,
                                         HINTS["deadlock"], rank_args=rank_args(seeds), traffic=traffic)
            except LabCheckFailed as err:
                if err.mistake == "deadlock" and partners:
                    _hung_partners(n, traffic, partners)
                raise
            reports(per_rank, REPORT, len(cases(p)), n)
            carried([[s for case in r for s in case["sends"]] for r in per_rank],
                    [[tuple(op) for case in r for op in case["ops"]] for r in per_rank], traffic, n)
            for case in (case for r in per_rank for case in r):  # the bytes of the messages the relay carried, not
                case["sent"] = sum(int(b) for _, b in case["sends"])  # the ledger's count, which the rank could change
            _references(per_rank, kind, cases(p), seeds)
            every = [(numel, [r[i] for r in per_rank if i < len(r)]) for i, (numel, _) in enumerate(cases(p))]
            for (numel, ranks), (_, dtype) in zip(every, cases(p)):
                check_case(n, f"a {numel:,}-element {str(dtype).replace('torch.', '')} tensor", numel, ranks, every)
        except LabCheckFailed as err:
            if power or not passed_power:
                raise
            other_size(n, err)
            raise
        passed_power |= power
        last[n] = [r[-1] for r in per_rank]
    return last


def _references(per_rank, kind, cases, seeds):
    """Add to each rank's report of each case what the checker computes itself, from the seeds: ``original``, the
    rank's input, and ``expected``: the sum of all the ranks' inputs, or for the all-gather, chunk v of virtual rank
    v's input, for every v."""
    n = len(seeds)
    members = virtual_ranks(n)
    for i, (numel, dtype) in enumerate(cases):
        originals = [inputs(k, numel, dtype, seeds[k], "cpu") for k in range(n)]  # not on a GPU: the checker never is
        if kind == "all_gather":
            b = chunk_bounds(numel, len(members))
            total = torch.cat([originals[m][b[v]:b[v + 1]] for v, m in enumerate(members)])
        else:
            total = torch.stack(originals).sum(0)
        for k, report in enumerate(per_rank):
            if i < len(report):
                report[i].update(original=originals[k], expected=total.clone())


def _hung_partners(n, traffic, partners):
    """The ranks hung: if one had sent to a rank that is none of its partners (the relay's record), say so."""
    __tracebackhide__ = True
    logged = [[(peer, size) for kind, peer, size in record if kind == "send"] for record in traffic]
    if len(logged) != n:
        return  # the ranks never started: nothing to read
    # the record does not say which case hung; the partners are the same at every size, so the largest case's will do
    wanted = partners(n, max(numel for numel, _ in cases(1 << (n.bit_length() - 1))))
    check_partners(n, "the ranks hung and were stopped after the timeout; before that,",
                   [dict(sends=s) for s in logged], wanted, HINTS)


def collectives_and_errors(n, label, ranks, hints, allowed=False):
    """used_collective when a rank called a collective (with ``allowed``: other than the given reduce-scatter's own
    calls), else the first error caught, if any."""
    __tracebackhide__ = True
    for k, r in enumerate(ranks):
        extra = [(op, int(size)) for op, size in r["ops"]]
        given = ("reduce_scatter", r["got"].numel() * r["got"].element_size())  # of the case's tensor, nothing more
        for _ in r["calls"] if allowed else ():  # the given reduce-scatter's own call
            if given in extra:
                extra.remove(given)
        if extra:
            raise LabCheckFailed("used_collective", f"{label}: rank {k} called {sorted({op for op, _ in extra})} "
                                 f"({', '.join(f'{op} of {size:,} bytes' for op, size in extra)}).",
                                 hints["used_collective"], n)
    return first_error(ranks)


def value_mistake(n, got, exp, orig, ranks):
    """The mistakes that values alone show on every kind: averaged, not in place; None when nothing fits."""
    if all(torch.allclose(g, e / n) if g.is_floating_point() else torch.equal(g, e // n) for g, e in zip(got, exp)):
        return "averaged"
    if all(torch.equal(g, o) and r["returned"] is not None for g, o, r in zip(got, orig, ranks)):
        return "not_in_place"
    return None


def wrong_at(n, label, numel, mistake, hints, rank, got, exp, what="the sum of the ranks' inputs"):
    __tracebackhide__ = True
    bad = (got != exp).nonzero().flatten()
    raise LabCheckFailed(mistake, f"{label}: rank {rank} is wrong at {bad.numel()} of {got.numel()} elements, first "
                         f"at index {bad[0].item()}: got {got[bad[0]].item()}, expected {exp[bad[0]].item()} ({what}).",
                         hints[mistake], n, dict(rank=rank, index=bad[0].item(), got=got[bad[0]].item(),
                                                 expected=exp[bad[0]].item()))


def check_partners(n, what, ranks, partners, hints, only=None):
    """wrong_partner when a rank sent to a rank that is none of its partners (``partners[k]``: rank k's, any order).

    Called on right values (then the pattern is all that is wrong), on wrong values (a wrong partner explains them
    better than any guess from the values) and on the peer log of ranks that hung (a wrong partner is a rank that
    never posts the matching receive). ``what`` starts the message; ``only``: check that rank alone."""
    __tracebackhide__ = True
    for k, r in enumerate(ranks):
        if only is not None and k != only:
            continue
        dests = [d for d, _ in r["sends"]]
        strangers = sorted(set(dests) - set(partners[k]))
        if strangers:
            raise LabCheckFailed("wrong_partner", f"{what} rank {k} sent to ranks {strangers} (its sends, in order: "
                                 f"{dests}); its partners are ranks {sorted(set(partners[k]))}.",
                                 hints["wrong_partner"], n)


def pattern(n, label, ranks, partners, sent_elements, hints):
    """Right values: now to whom, how many, in which order and how many bytes each rank sent.

    ``partners[k]``: rank k's destinations, in order (a send that would be empty may be skipped);
    ``sent_elements[k]``: the elements rank k sends in all."""
    __tracebackhide__ = True
    for k, r in enumerate(ranks):
        check_partners(n, f"{label}: the values are right, but", ranks, partners, hints, only=k)
        dests, want = [d for d, _ in r["sends"]], partners[k]
        if len(dests) > len(want):
            raise LabCheckFailed("too_many_messages", f"{label}: the values are right, but rank {k} sent {len(dests)} "
                                 f"messages (to ranks {dests}); the algorithm sends {len(want)} on this rank.",
                                 hints["too_many_messages"], n)
        it = iter(want)
        if not all(d in it for d in dests):  # not a subsequence of the plan: the steps in another order
            raise LabCheckFailed("wrong_order", f"{label}: the values are right, but rank {k} sent to ranks {dests} "
                                 f"in that order; the algorithm's order is {want}.", hints["wrong_order"], n)
        size, sent = r["got"].element_size(), sum(int(b) for _, b in r["sends"])  # the messages the relay carried
        if sent != sent_elements[k] * size:
            mistake = "too_many_bytes" if sent > sent_elements[k] * size else "too_few_bytes"
            raise LabCheckFailed(mistake, f"{label}: the values are right, but rank {k} sent {sent:,} bytes; "
                                 f"the algorithm sends {sent_elements[k] * size:,} on this rank "
                                 f"({sent / max(1, sent_elements[k] * size):.2f}x).", hints[mistake], n)
