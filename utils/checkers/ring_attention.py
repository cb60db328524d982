"""The checker of lab 14 (ring attention): the learner's online-softmax merge and causal block rule, in the ring.

Used by ``labs/14_ring_attention_lab.ipynb``. Lesson 14 runs ``utils.context_parallel.ring_attention``; the lab has
the learner write its two pieces:

- ``merge(o1, l1, o2, l2) -> (o, l)``: two partial attention results (normalised output, log-sum-exp) over
  disjoint key blocks, combined exactly;
- ``causal_block(q_rank, q_part, k_rank, k_part, world_size, layout) -> "full" | "diagonal" | "skip"``: what a causal
  mask keeps of a (query chunk, key chunk) pair, for the contiguous and zig-zag layouts.

Same conventions as ``utils.checkers.common``. In order:

1. **own work**: the lesson's ring module (``utils.context_parallel.ring``: its ``merge``, its own causal rule
   ``_pair``, ``chunk_ids``, ``shard``...) and ``F.scaled_dot_product_attention`` are off limits: a call into either
   while the learner's functions run is refused (``used_library``), seen by the profile hook and by the guard that
   trips them in place (``utils.checkers.guard``: an alias, a ``partial``, a thread's target or a pool's task too);
2. **merge**, in this process, float32: at moderate scores against attention over both blocks, then at scores whose
   log-sum-exps exceed ~88.7, where e^l overflows float32 (the range is printed): the merge must not overflow;
3. **causal_block** on every pair of 2, 3, 4 ranks and both layouts, against the rule on global chunk indices;
4. **the ring** on 2, 3, 4 (and WORLD_SIZE) CPU ranks with the learner's pieces inside
   ``ring_attention(merge_fn=, block_rule=)``, causal, both layouts, and full attention: outputs and the gradients
   of q, k, v equal one process's attention. The q, k, v are random, new at every check, and each rank gets its own
   tokens of them only (``rank_secrets``: in its ``rank_args``, never in what every rank gets), so no rank can compute
   its output and gradients alone: an answer that replaces this module's rank function still has to pass the keys and
   values between its ranks. The checker computes the attention itself; the ranks report only what they observed.
"""

import math

import torch

from ..context_parallel import ring as ring_module
from ..context_parallel.ring import chunk_ids, ring_attention, shard, unshard
from ..launch import rank_device
from .answer_side import answer_side
from .common import CheckResult, caught, close, fail, first_error, launch_answer, raise_if_error, watched_call
from .rank_secrets import generator, new_seeds, refuse, report_each, tensors_like
from .guard import Guard, Refused, code_key, module_functions
from .harness import is_learners
from .watch import Watcher, refuse_tampering

RING_HINTS = {  # each names the mistake and points to the idea; none gives the formula or the chunk map
    "used_library": "write the merge and the rule yourself: the lesson's ring module (utils.context_parallel: its "
                    "merge, its causal rule, chunk_ids, shard) and F.scaled_dot_product_attention compute the answer "
                    "for you and are off limits in this lab.",
    "not_pair": "merge must return a pair (o, l): o shaped like o1, l shaped like l1.",
    "lse_max": "l is not max(l1, l2): the smaller block still holds part of the softmax mass. l is the log of the "
               "softmax's denominator over both blocks; Step 1 says what that denominator is.",
    "lse_wrong": "l is not the log-sum-exp over both blocks: reread Step 1 for the softmax's denominator over both, "
                 "and take its log.",
    "averaged": "the outputs are not averaged: each block's output counts by the share of the softmax mass its "
                "block holds, and the two shares sum to 1.",
    "weights": "l is right but o is not: weight each block's output by its block's share of the denominator over "
               "both blocks (Step 1); the two weights must sum to 1.",
    "overflow": "an exponential overflowed float32 (above ~88.7) at scores this large: your merge forms a number "
                "as large as e^l on the way. The weights you need are ratios of such numbers and lie between 0 and "
                "1: can you write them so that no huge number is ever formed?",
    "not_finite": "your merge returned inf or nan at moderate scores, where no exponential overflows: look for "
                  "a log of 0 or of a negative number (a difference where Step 1 has a sum?) or a division by 0.",
    "not_kind": "causal_block returns one of the strings \"full\", \"diagonal\" or \"skip\".",
    "off_by_one_chunk": "your rule is off by one chunk, at the diagonal: which key chunk holds a query chunk's own "
                        "tokens, and which is the first that it sees in full?",
    "zigzag_second_chunk": "right except on the zig-zag layout's part 1: a rank's second chunk does not sit at the "
                           "rank's own place in the sequence. Compare the chunks' places in the sequence, not the "
                           "ranks (Step 2 prints where each part sits).",
    "causal_rule": "your rule gives the wrong kind for the pair below, on both layouts or on the contiguous one: "
                   "find both chunks' places in the sequence for the layout (Step 2), and decide from those places "
                   "what the causal mask keeps.",
    "wrong_output": "the ring's output differs from one process's attention although merge and the rule pass "
                    "the checks above (in float32): the ring runs in float64; does merge keep its inputs' dtype "
                    "and use nothing but its four arguments?",
    "wrong_gradient": "the outputs agree but the gradients of q, k, v do not: keep merge differentiable, o and l "
                      "computed from its four arguments by operations autograd records (no detach, no torch.no_grad).",
    "deadlock": "the ring never finished: your functions must return on every rank without waiting for anything.",
}
LAYOUTS = ("contiguous", "zigzag")
ANSWER_TOL = dict(rtol=1e-4, atol=1e-5)
RING_TOL = dict(rtol=1e-6, atol=1e-8)  # float64 ring vs float64 attention


def _guard():
    """The ring module's functions tripped, and SDPA replaced where torch exposes it: refused when the learner's code
    (or a thread, a pool) calls them, run when the course's code does (the lesson's ring runs the learner's merge)."""
    import torch.nn.functional as F

    functions = [(f, f"the lesson's {f.__qualname__} (utils.context_parallel.ring)")
                 for f in module_functions(ring_module)]
    sdpa = [(owner, "scaled_dot_product_attention", "F.scaled_dot_product_attention") for owner in (F, torch._C._nn)]
    return Guard(functions, sdpa, allow_from=(ring_module.__file__, __file__))  # the ring itself, this checker


@answer_side
def _own(fn, *args):
    """``fn(*args)``, refused when it called into the lesson's ring module or scaled_dot_product_attention."""
    __tracebackhide__ = True
    lesson = ring_module.__file__.replace("\\", "/")

    def forbidden(frame, event, arg):
        where = frame.f_code.co_filename.replace("\\", "/")
        if event == "call" and where == lesson:  # merge, _pair, chunk_ids, shard, ...: the lesson's ring module
            return f"the lesson's {frame.f_code.co_name} (utils.context_parallel.ring)"
        if event == "c_call" and "scaled_dot_product_attention" in getattr(arg, "__name__", ""):
            return "F.scaled_dot_product_attention"

    if hasattr(fn, "__code__") and code_key(fn.__code__) == code_key(ring_module.merge.__code__):  # or a copy
        fail(RING_HINTS, "used_library", "your merge is the lesson's merge from utils.context_parallel.")
    out, seen = watched_call(fn, args, forbidden, where=f"{getattr(fn, '__name__', 'your function')}(...)",
                             hints=RING_HINTS, guard=_guard())
    if seen:
        fail(RING_HINTS, "used_library", f"{getattr(fn, '__name__', 'your function')} called {seen}.")
    return out


def _partials(scale, seed):
    """Two real partial results (o, l) of 6 queries over two blocks of 5 and 7 keys, float32; and the exact pair."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    k = torch.cat([k, torch.randn(2, 6, 8, generator=g, dtype=torch.float64)], 1)  # 12 keys
    v = torch.cat([v, torch.randn(2, 6, 8, generator=g, dtype=torch.float64)], 1)
    scores = q @ k.transpose(-2, -1) * scale
    scores[..., 5:] += scale  # the second block's scores sit higher: unequal weights
    parts = []
    for sl in (slice(0, 5), slice(5, 12)):  # uneven blocks: 5 and 7 keys
        l = torch.logsumexp(scores[..., sl], -1, keepdim=True)  # noqa: E741
        parts.append((torch.exp(scores[..., sl] - l) @ v[..., sl, :], l))
    l = torch.logsumexp(scores, -1, keepdim=True)  # noqa: E741
    exact = (torch.exp(scores - l) @ v, l)
    return [(o.float(), l.float()) for o, l in parts], exact


def check_merge(merge):
    """The merge alone, in this process: moderate scores, then scores whose exponentials overflow float32."""
    __tracebackhide__ = True
    lines = []
    for scale, what in ((1.0, "moderate scores"), (40.0, "large scores (e^l overflows float32 above ~88.7)")):
        ((o1, l1), (o2, l2)), (o, l) = _partials(scale, seed=int(scale))
        what = f"{what}, l1 in [{l1.min():.1f}, {l1.max():.1f}], l2 in [{l2.min():.1f}, {l2.max():.1f}]"
        out = _own(merge, o1, l1, o2, l2)
        if not isinstance(out, tuple | list) or len(out) != 2 or not all(isinstance(t, torch.Tensor) for t in out) \
                or out[0].shape != o1.shape or out[1].shape != l1.shape:
            fail(RING_HINTS, "not_pair", f"merge returned {type(out).__name__}; expected (o {tuple(o1.shape)}, "
                                         f"l {tuple(l1.shape)}).")
        got_o, got_l = (t.double() for t in out)
        if not (torch.isfinite(got_o).all() and torch.isfinite(got_l).all()):
            fail(RING_HINTS, "overflow" if scale > 1 else "not_finite", f"at {what}, your merge returned "
                                         f"{int((~torch.isfinite(got_o)).sum())} non-finite entries of o and "
                                         f"{int((~torch.isfinite(got_l)).sum())} of l.")
        if not close(got_l, l, ANSWER_TOL):
            mistake = "lse_max" if close(got_l, torch.maximum(l1, l2).double(), ANSWER_TOL) else "lse_wrong"
            fail(RING_HINTS, mistake, f"at {what}: l[0, 0] = {got_l[0, 0, 0]:.4f}, log(e^l1 + e^l2) = "
                                      f"{l[0, 0, 0]:.4f} (l1 = {l1[0, 0, 0]:.4f}, l2 = {l2[0, 0, 0]:.4f}).")
        if not close(got_o, o, ANSWER_TOL):
            mistake = "averaged" if close(got_o, (o1 + o2).double() / 2, ANSWER_TOL) else "weights"
            fail(RING_HINTS, mistake, f"at {what}: o differs from attention over both blocks by up to "
                                      f"{(got_o - o).abs().max():.3g}.")
        lines.append(f"merge at {what}: o and l equal attention over both blocks (max error "
                     f"{(got_o - o).abs().max():.1e})")
    return lines


def _chunk(rank, part, n, layout):
    return chunk_ids(rank, n, layout)[part]


def _rule(i, j, length=3):
    """What a causal mask keeps of query chunk i x key chunk j, read off the mask itself: tokens at positions
    i*length.. and j*length.., a query seeing the keys at or before its place."""
    kept = torch.arange(i * length, (i + 1) * length)[:, None] >= torch.arange(j * length, (j + 1) * length)[None, :]
    return "full" if kept.all() else "skip" if not kept.any() else "diagonal"


def check_causal_block(causal_block, world_sizes=(2, 3, 4)):
    """The rule on every (query rank, part, key rank, part) of each world size and layout."""
    __tracebackhide__ = True
    pairs = 0
    for n in world_sizes:
        for layout in LAYOUTS:
            parts = range(len(chunk_ids(0, n, layout)))
            wrong = []
            for qr in range(n):
                for qp in parts:
                    for kr in range(n):
                        for kp in parts:
                            got = _own(causal_block, qr, qp, kr, kp, n, layout)
                            if got not in ("full", "diagonal", "skip"):
                                fail(RING_HINTS, "not_kind", f"causal_block({qr}, {qp}, {kr}, {kp}, {n}, "
                                                             f"{layout!r}) returned {got!r}.")
                            i, j = _chunk(qr, qp, n, layout), _chunk(kr, kp, n, layout)
                            pairs += 1
                            if got != _rule(i, j):
                                wrong.append((qr, qp, kr, kp, i, j, got))
            if wrong:
                qr, qp, kr, kp, i, j, got = wrong[0]
                what = (f"{len(wrong)} pairs wrong on {n} ranks, {layout}; first: causal_block({qr}, {qp}, {kr}, "
                        f"{kp}, {n}, {layout!r}) = {got!r}, query chunk {i} x key chunk {j} is {_rule(i, j)!r}.")
                if layout == "zigzag" and all(w[1] == 1 or w[3] == 1 for w in wrong):
                    fail(RING_HINTS, "zigzag_second_chunk", what)
                if all(abs(w[4] - w[5]) <= 1 for w in wrong):
                    fail(RING_HINTS, "off_by_one_chunk", what)
                fail(RING_HINTS, "causal_rule", what)
    return [f"causal_block: {pairs} (query chunk, key chunk) pairs right on {list(world_sizes)} ranks, "
            f"contiguous and zig-zag"]


def _full_attention(q, k, v, causal):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[-2]
        scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, -1) @ v


def _case(seed, index, n):
    """Case ``index``'s q, k, v and the gradient of the output, from the checker's ``seed`` (``rank_secrets``)."""
    g = generator(seed, index)
    s = 4 * n  # 2n zig-zag chunks of 2 tokens
    return [torch.randn(2, 2, s, 8, generator=g, dtype=torch.float64) * 2 for _ in range(4)]  # q, k, v, dout


def _called_by_answer(frame, event, arg):
    """In the ranks, where the ring itself is the lesson's: a call into it (or to SDPA) made *from* the answer."""
    lesson = ring_module.__file__.replace("\\", "/")
    if event == "call" and frame.f_code.co_filename.replace("\\", "/") == lesson and frame.f_back is not None \
            and is_learners(frame.f_back.f_code.co_filename):
        return f"the lesson's {frame.f_code.co_name} (utils.context_parallel.ring)"
    if event == "c_call" and "scaled_dot_product_attention" in getattr(arg, "__name__", "") \
            and is_learners(frame.f_code.co_filename):
        return "F.scaled_dot_product_attention"


RING_REPORT = dict(error=(tuple, type(None)), results=list, seen=(str, type(None)), tampered=list)  # what _ring reports


def _ring(merge, causal_block, cases, shards):
    """Runs on every rank: each case's ring with the learner's pieces, watched (the calls the answer makes, on every
    thread); this rank's output and gradients. ``shards``: this rank's own tokens of each case's q, k, v and output
    gradient (``rank_args``). Reports what it saw (``RING_REPORT``); the expected values are the checker's."""
    out = {"error": None, "results": [], "seen": None, "tampered": []}
    guard = _guard()
    try:
        with guard, Watcher(_called_by_answer) as watcher:
            _ring_cases(merge, causal_block, cases, shards, out)
    except Refused:  # recorded: named from the record below
        pass
    except Exception as exc:  # noqa: BLE001
        out["error"] = caught(exc, "the ring with your merge and causal_block")
    out["seen"], out["tampered"] = (guard.records + watcher.seen or [None])[0], watcher.tampered
    return out


def _ring_cases(merge, causal_block, cases, shards, out):
    for (causal, layout), mine in zip(cases, shards):
        device = rank_device()  # a GPU per rank where there are enough (NCCL carries CUDA tensors only), else CPU
        mine = [t.to(device).clone().requires_grad_(i < 3) for i, t in enumerate(mine)]
        o = ring_attention(*mine[:3], causal=causal, layout=layout, merge_fn=merge, block_rule=causal_block)
        o.backward(mine[3])
        out["results"].append([t.cpu() for t in [o.detach()] + [torch.zeros_like(t) if t.grad is None else t.grad
                                                                for t in mine[:3]]])


def _results(per_rank, cases, shards, n):
    """The ranks' results (each rank's report checked by ``rank_secrets.report_each``, none with an error), checked
    where the checker reads them: one a case, each [output, dq, dk, dv], the gradients like the q, k, v the rank was
    given (``shards``; autograd gives them their shape and dtype). An output of another shape is the answer's
    (``wrong_output``)."""
    __tracebackhide__ = True
    for rank, (r, mine) in enumerate(zip(per_rank, shards)):
        if len(r["results"]) != len(cases):
            refuse(f"{len(r['results'])} results for {len(cases)} cases, and no error", f"rank {rank}", n)
        for c, (result, given) in enumerate(zip(r["results"], mine)):
            what = f"rank {rank}, case {c}"
            if not isinstance(result, list) or len(result) != 4:
                refuse(f"a {type(result).__name__}, where the checker's rank function reports [output, dq, dk, dv]",
                       what, n)
            tensors_like(dict(zip(("output", "dq", "dk", "dv"), result)), dict(zip(("dq", "dk", "dv"), given)), what,
                         n)
            if not isinstance(result[0], torch.Tensor):
                refuse(f"an output that is a {type(result[0]).__name__}", what, n)
            if result[0].shape != given[0].shape:
                fail(RING_HINTS, "wrong_output", f"rank {rank}'s output is {tuple(result[0].shape)}, its queries "
                                                 f"{tuple(given[0].shape)}.", n)
    return per_rank


def check_ring_attention(merge, causal_block, world_sizes=(2, 3, 4), timeout=60.0):
    """Check ``merge`` and ``causal_block`` alone, then in the ring on each of ``world_sizes`` ranks (gloo on CPU
    ranks, or NCCL on a GPU each where the machine has enough)."""
    __tracebackhide__ = True
    lines = check_merge(merge) + check_causal_block(causal_block, sorted({2, 3, 4, *world_sizes}))
    cases = [(True, "contiguous"), (True, "zigzag"), (False, "contiguous")]
    for n in world_sizes:
        seed = new_seeds(1)[0]  # new q, k, v at every check, one set a case
        data = [_case(seed, c, n) for c in range(len(cases))]
        shards = [[[shard(t, rank, n, layout) for t in whole] for whole, (_, layout) in zip(data, cases)]
                  for rank in range(n)]  # rank r's tokens of each case: in its rank_args, to it alone
        ranks = launch_answer(_ring, (merge, causal_block, cases), n, timeout, "the ring", RING_HINTS["deadlock"],
                              rank_args=[(mine,) for mine in shards])
        for rank, r in enumerate(report_each(ranks, RING_REPORT, n)):  # the answer's own calls, on every rank
            if not all(isinstance(t, str) for t in r["tampered"]):
                refuse(f"tampered {r['tampered']!r:.200}, where the checker's rank function reports what switched "
                       "its watcher off, in words", f"rank {rank}", n)
            refuse_tampering(r["tampered"], f"rank {rank}: merge or causal_block", n)
            if r["seen"]:
                fail(RING_HINTS, "used_library", f"rank {rank}: your merge or causal_block called {r['seen']}.", n)
        raise_if_error(first_error(ranks), n, RING_HINTS)
        _results(ranks, cases, shards, n)
        for c, (causal, layout) in enumerate(cases):
            q, k, v, dout = (t.clone().requires_grad_(i < 3) for i, t in enumerate(data[c]))
            want = _full_attention(q, k, v, causal)
            want.backward(dout)
            got = [unshard([r["results"][c][t] for r in ranks], layout) for t in range(4)]
            label = f"{'causal' if causal else 'full'} attention, {layout}, s={q.shape[-2]}"
            if not close(got[0], want.detach(), RING_TOL):
                fail(RING_HINTS, "wrong_output", f"{label}: output off by {(got[0] - want).abs().max():.3g}.", n)
            for name, g, t in zip("qkv", got[1:], (q, k, v)):
                if not close(g, t.grad, RING_TOL):
                    fail(RING_HINTS, "wrong_gradient", f"{label}: d{name} off by {(g - t.grad).abs().max():.3g}.", n)
        lines.append(f"on {n} ranks: causal (contiguous, zig-zag) and full ring attention with your pieces = one "
                     f"process's attention, output and dq, dk, dv")
    return CheckResult("merge and causal_block in ring attention", lines)
