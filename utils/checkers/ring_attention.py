"""The checker of lab 14 (ring attention's fused backward): the learner's gradients of one key block, in the ring.

Used by ``labs/14_ring_attention_lab.ipynb``. ``utils.context_parallel.fused_ring`` keeps only the output and each
query's log-sum-exp from forward and recomputes every block in backward; the lab has the learner write that block's
gradients:

- ``block_backward(q, k, v, o, lse, dout, diagonal=False) -> (dq, dk, dv)``: q, o, dout (.., sq, d) and lse
  (.., sq, 1) are a rank's queries, their output and log-sum-exp over the *whole* sequence and the output's gradient;
  k, v (.., sk, d) one block of keys and values, ``diagonal`` when it is the queries' own chunk (the causal
  triangle). Returns the block's share of dq, and dk, dv of the block's keys and values from these queries.

Nothing in the release computes that: the checker judges it by results, against autograd's gradients of the same
attention, and by a property of the softmax, never by a formula of its own. Same conventions as
``utils.checkers.common``. In order:

1. **own work**: torch's attention (``F.scaled_dot_product_attention``, the ``aten`` attention operators and flex
   attention, whose backward operators and functions compute exactly this) is off limits: a call is refused
   (``used_library``), seen by the profile hook and by the guard (``utils.checkers.guard``: the operators at the
   dispatcher, flex attention's Python functions tripped in place);
2. **block_backward** in this process, float32 inputs: one block holding every key, three uneven blocks, a causal
   pair (an earlier chunk and the diagonal one), and scores whose exponentials overflow float32 (the range is
   printed). Each block's (dq, dk, dv) against autograd's, which computes one leaf copy of q per block
   (``_case``): the diagnosis reads which gradient is wrong and where, and whether the keys' gradients sum to zero
   over a row (shifting every key by one vector changes no softmax);
3. **the ring** on 2, 3, 4 (and WORLD_SIZE) ranks (gloo on CPU; NCCL where there is a GPU per rank),
   ``fused_ring_attention`` with the learner's function, causal in both layouts and full: the output and the
   gradients of q, k, v equal one process's attention. The q, k, v are random, new at every check, each rank's tokens
   from a seed of its own, and each rank gets its own tokens only (``rank_secrets``: in its ``rank_args``), so no rank
   can compute its gradients alone: an answer that replaces this module's rank function still has to pass the keys,
   values and their gradients between its ranks. The checker computes the attention itself; the ranks report only
   what they observed.
"""

import math

import torch

from ..context_parallel.fused_ring import fused_ring_attention
from ..context_parallel.ring import unshard
from ..launch import rank_device
from .answer_side import answer_side
from .common import CheckResult, caught, close, fail, first_error, launch_answer, raise_if_error, watched_call
from .guard import Guard, Refused
from .harness import is_learners
from .rank_secrets import generator, new_seeds, refuse, report_each, tensors_like
from .watch import Watcher, refuse_tampering

RING_HINTS = {  # each names the mistake and points to the idea; none gives the gradients' formulas
    "used_library": "write the gradients yourself: torch's attention (F.scaled_dot_product_attention, the aten "
                    "attention operators and flex attention, whose backward computes exactly this) is off limits "
                    "in this lab.",
    "not_triple": "block_backward returns three tensors (dq, dk, dv): dq shaped like q, dk like k, dv like v.",
    "changed_inputs": "block_backward changed a tensor it was given: the ring hands the same q, o, lse and dout to "
                      "every block, and the same k, v to every rank. Compute into new tensors.",
    "overflow": "inf or nan at scores this large: an exponential overflowed float32 (above ~88.7). The "
                "probabilities you need lie between 0 and 1: form them so that no huge number appears on the way.",
    "not_finite": "inf or nan at moderate scores, where no exponential overflows: look for a log of 0, a division "
                  "by 0, or a mask that leaves -inf where a product or a sum takes it.",
    "probabilities": "dv is wrong already with one block holding every key, where dv comes from the chain rule "
                     "through o = P v alone: the probabilities are. Recompute the scores as the forward did (the "
                     "scale 1/sqrt(d); a mask only when diagonal is true) and turn them into the whole row's "
                     "softmax with what the forward saved.",
    "swapped": "your dk is autograd's dv and your dv its dk: return them in the order (dq, dk, dv).",
    "large_scores": "right at moderate scores, wrong (though finite) at these large ones: a number loses its "
                    "precision on the way, such as a difference or a ratio of two huge numbers. Every probability "
                    "lies between 0 and 1: form it from numbers of that size.",
    "block_lse": "right with one block, wrong with several: each block's probabilities must be its entries of the "
                 "whole row's softmax, not a softmax over the block alone. The forward saved what normalises over "
                 "the whole row.",
    "mask": "right on full blocks, wrong on the diagonal one: there a query sees only the keys at or before its own "
            "place, and the masked entries must have probability 0.",
    "softmax_gradient": "dv is right but the keys' gradients do not sum to zero: shifting every key by the same "
                        "vector adds the same number to a query's every score, which changes no softmax, so they "
                        "must. The gradient through a softmax needs one number per query over its whole row, which "
                        "one block does not hold: which of the tensors you were given holds it, and how does it "
                        "enter the gradient of each score?",
    "block_d": "right with one block, wrong with several, and dv is right, but the keys' gradients do not sum to "
               "zero over a row (shifting every key by one vector changes no softmax, so they must): the number "
               "per query that the gradient through the softmax needs is over the whole row, not over this "
               "block's keys. Which of the tensors you were given holds it?",
    "scale": "dq or dk is off by a factor sqrt(d): the scores are q k^T / sqrt(d), and the chain rule carries that "
             "factor into both.",
    "gradients": "dv is right but dq or dk is not: go through the chain rule from the scores to q and to k again "
                 "(which side of the product, which transpose).",
    "wrong_output": "the ring's output differs from one process's attention: the forward is the lesson's ring, so "
                    "only code that replaced the checker's rank function gets here.",
    "wrong_gradient": "your gradients pass the checks above, but the ring's dq, dk or dv differ from one process's: "
                      "the ring runs in float64; does block_backward keep its inputs' dtype, and use "
                      "nothing but its arguments (no state kept between calls)?",
    "deadlock": "the ring never finished: your function must return on every rank without waiting for anything.",
}
ANSWER_TOL = 1e-3  # float32 answer vs float64 autograd: the largest error, against the largest gradient (a wrong
# formula misses by the whole; float32 rounding at the large scores reaches 1e-4, 2,000 draws)
RING_TOL = dict(rtol=1e-6, atol=1e-8)  # float64 ring vs float64 attention
CASES = {  # name: key block sizes, the diagonal block's index (causal) or None, a shift of the scores
    "one block": ((12,), None, 0.0),
    "three blocks": ((5, 4, 3), None, 0.0),
    "causal": ((6, 6), 1, 0.0),  # an earlier chunk in full, then the queries' own chunk (6 queries)
    "large scores": ((5, 7), None, 100.0),  # log-sum-exps from about -20 to 250, above 88.7 in every draw (2,000
    # measured): e^lse overflows float32 there
}


def _near(got, want, i, factor=1.0):
    """Gradient ``i`` (0 dq, 1 dk, 2 dv) of every block equal to ``factor`` times autograd's within float32's rounding:
    the largest error at most ``ANSWER_TOL`` of that gradient's largest entry over the case's blocks (at large scores
    the gradients range over orders of magnitude, and a block's share may be tiny; a wrong formula misses by the
    whole)."""
    largest = max(w[i].abs().max().item() for w in want) * factor
    return max((g[i] - w[i] * factor).abs().max().item() for g, w in zip(got, want)) <= ANSWER_TOL * largest + 1e-7


FLEX = ("/torch/_higher_order_ops/flex_attention", "/torch/nn/attention/")  # torch's attention written in Python


def _is_attention(event, arg):
    return event == "c_call" and "attention" in getattr(arg, "__name__", "")


def _into_flex(frame, event):
    """A call into torch's flex attention (its dense backward takes the saved output and log-sum-exp too)."""
    return event == "call" and any(part in frame.f_code.co_filename.replace("\\", "/") for part in FLEX)


def _flex_functions():
    """The Python functions of torch's flex attention, where this torch has it."""
    from .guard import module_functions

    modules = []
    for name in ("torch._higher_order_ops.flex_attention", "torch.nn.attention.flex_attention"):
        try:
            modules.append(__import__(name, fromlist=["_"]))
        except ImportError:  # an older or a newer torch: nothing to refuse there
            pass
    return [(f, f"torch's {f.__qualname__} ({f.__module__})") for module in modules for f in module_functions(module)]


def _guard():
    """Torch's attention refused, however it is reached, for the call: every aten attention operator at the dispatcher
    (``Guard``'s operators), flex attention's Python functions tripped in place (its dense backward is the answer
    too), and SDPA replaced where torch exposes it."""
    import torch.nn.functional as F

    attributes = [(owner, "scaled_dot_product_attention", "F.scaled_dot_product_attention")
                  for owner in (F, torch._C._nn)]
    operators = [(name, f"torch's {name.split('::')[1]}") for name in torch._C._dispatch_get_all_op_names()
                 if name.startswith("aten::") and "attention" in name]
    return Guard(_flex_functions(), attributes, operators=operators)


@answer_side
def _own(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, refused when it called torch's attention."""
    __tracebackhide__ = True

    def forbidden(frame, event, arg):
        if _is_attention(event, arg):
            return f"torch's {arg.__name__}"
        if _into_flex(frame, event):
            return f"torch's {frame.f_code.co_name} (flex attention)"

    out, seen = watched_call(lambda: fn(*args, **kwargs), (), forbidden,
                             where=f"{getattr(fn, '__name__', 'your function')}(...)", hints=RING_HINTS,
                             guard=_guard())
    if seen:
        fail(RING_HINTS, "used_library", f"{getattr(fn, '__name__', 'your function')} called {seen}.")
    return out


def block_references(q, ks, vs, dout, diagonal=None):
    """Attention of q to every block of keys ``ks`` (values ``vs``) at once, as one process computes it, and
    autograd's share of each block in the gradients: (o, lse, [(dq, dk, dv) of each block]).

    One leaf copy of q per block, so that autograd gives each block's share of dq (they add up to q's gradient); the
    blocks' scores side by side in one softmax, block ``diagonal``'s causal triangle masked (it is the queries' own
    chunk). Lab 14's Step 1 and its checker compare an answer with these."""
    qs = [q.detach().clone().requires_grad_() for _ in ks]
    ks, vs = [k.detach().clone().requires_grad_() for k in ks], [v.detach().clone().requires_grad_() for v in vs]
    scores = []
    for b, (q_b, k_b) in enumerate(zip(qs, ks)):
        s = q_b @ k_b.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if b == diagonal:
            s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
        scores.append(s)
    scores = torch.cat(scores, -1)
    lse = torch.logsumexp(scores, -1, keepdim=True)
    o = torch.softmax(scores, -1) @ torch.cat(vs, -2)
    (o * dout).sum().backward()
    return o.detach(), lse.detach(), [(q_b.grad, k.grad, v.grad) for q_b, k, v in zip(qs, ks, vs)]


def _case(name, g):
    """Case ``name``: the inputs of each block's call (float32) and autograd's (dq, dk, dv) of each block (float64),
    from ``block_references``. ``shift``: every key gets ``shift`` along its first axis and every query about 3, so
    that each row's scores all rise by about 3 shift / sqrt(d): large log-sum-exps, and a softmax as spread out as at
    moderate scores (a near one-hot softmax would leave float32's rounding larger than the gradients)."""
    sizes, diagonal, shift = CASES[name]
    sq, d = 6, 8

    def randn(*shape):
        return torch.randn(2, 2, *shape, generator=g, dtype=torch.float64)

    q, dout, lift = randn(sq, d), randn(sq, d), torch.zeros(d, dtype=torch.float64)
    lift[0] = 1.0
    q = q + 3 * lift * bool(shift)
    ks = [randn(m, d) + shift * lift for m in sizes]
    vs = [randn(m, d) for m in sizes]
    o, lse, want = block_references(q, ks, vs, dout, diagonal)
    calls = [dict(q=q.float(), k=k.float(), v=v.float(), o=o.float(), lse=lse.float(), dout=dout.float(),
                  diagonal=b == diagonal) for b, (k, v) in enumerate(zip(ks, vs))]
    return calls, want, lse


def _answers(block_backward, calls, name):
    """The answer on each block of a case: (dq, dk, dv) in float64, its shape and its inputs checked."""
    __tracebackhide__ = True
    got = []
    for b, call in enumerate(calls):
        before = {key: t.clone() for key, t in call.items() if isinstance(t, torch.Tensor)}
        out = _own(block_backward, **call)
        if not isinstance(out, tuple | list) or len(out) != 3 or not all(isinstance(t, torch.Tensor) for t in out) \
                or [tuple(t.shape) for t in out] != [tuple(call[x].shape) for x in "qkv"]:
            shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                      for t in (out if isinstance(out, tuple | list) else [out])]
            fail(RING_HINTS, "not_triple", f"{name}, block {b}: block_backward returned {shapes}; expected dq "
                                           f"{tuple(call['q'].shape)}, dk {tuple(call['k'].shape)}, dv "
                                           f"{tuple(call['v'].shape)}.")
        changed = [key for key, t in before.items() if not torch.equal(t, call[key])]
        if changed:
            fail(RING_HINTS, "changed_inputs", f"{name}, block {b}: block_backward changed {', '.join(changed)}.")
        got.append(tuple(t.detach().double() for t in out))
    return got


def _diagnose(name, got, want, passed):
    """The mistake, from which gradient is wrong, where (``passed``: the cases before), and the keys' sum."""
    __tracebackhide__ = True
    worst = {x: max((g[i] - w[i]).abs().max().item() for g, w in zip(got, want)) for i, x in enumerate("qkv")}
    what = f"{name}: max error dq {worst['q']:.3g}, dk {worst['k']:.3g}, dv {worst['v']:.3g}"
    if _near(got, want, 0) and all(_near([g[a:a + 1] for g in got], [w[b:b + 1] for w in want], 0)
                                   for a, b in ((1, 2), (2, 1))):
        fail(RING_HINTS, "swapped", what + ".")
    if not _near(got, want, 2):
        mistake = "block_lse" if name == "three blocks" and passed else "mask" if name == "causal" else \
            "large_scores" if name == "large scores" else "probabilities"
        fail(RING_HINTS, mistake, what + ".")
    key_sum = sum(g[1].sum(-2) for g in got)  # over every key of the row: zero for any gradient of a softmax
    size = sum(g[1].abs().sum(-2) for g in got)
    if key_sum.abs().max() > ANSWER_TOL * size.max() + 1e-6:
        mistake = "block_d" if name == "three blocks" and passed else "softmax_gradient"
        fail(RING_HINTS, mistake, f"{what}; the keys' gradients sum to up to {key_sum.abs().max():.3g} over a row.")
    root = math.sqrt(want[0][0].shape[-1])
    for factor in (root, 1 / root):
        if all(_near(got, want, i, factor) for i in (0, 1) if not _near(got, want, i)):
            fail(RING_HINTS, "scale", what + f" (yours are the right ones times {factor:.3g}).")
    fail(RING_HINTS, "gradients", what + ".")


def check_block_backward(block_backward, seed=None):
    """The answer alone, in this process, on each case of ``CASES``: against autograd's gradients of each block."""
    __tracebackhide__ = True
    seed = new_seeds(1)[0] if seed is None else seed
    lines, passed = [], []
    for c, name in enumerate(CASES):
        calls, want, lse = _case(name, generator(seed, c))
        got = _answers(block_backward, calls, name)
        if not all(torch.isfinite(t).all() for g in got for t in g):
            fail(RING_HINTS, "overflow" if CASES[name][2] else "not_finite",
                 f"{name} (log-sum-exp in [{lse.min():.1f}, {lse.max():.1f}]): block_backward returned "
                 f"{sum(int((~torch.isfinite(t)).sum()) for g in got for t in g)} non-finite entries.")
        if not all(_near(got, want, i) for i in range(3)):
            _diagnose(name, got, want, passed)
        passed.append(name)
        err = max((g[i] - w[i]).abs().max().item() for g, w in zip(got, want) for i in range(3))
        lines.append(f"block_backward, {name} ({len(calls)} block{'s' * (len(calls) > 1)} of "
                     f"{', '.join(str(x['k'].shape[-2]) for x in calls)} keys; log-sum-exp in [{lse.min():.1f}, "
                     f"{lse.max():.1f}]): dq, dk, dv equal autograd's, max error {err:.1e}")
    return lines


def _full_attention(q, k, v, causal):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[-2]
        scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, -1) @ v


def _ring_shards(seeds, index):
    """Ring case ``index``: each rank's tokens of q, k, v and of the output's gradient, (2, 2, 4, 8) each (2 zig-zag
    chunks of 2 tokens). ``seeds``: 2n of them (``rank_secrets.new_seeds``); rank r's q and dout from ``seeds[r]``,
    its k and v, which the ring hands to every other rank, from ``seeds[n + r]``: nothing a rank holds or receives
    says anything of what another keeps, not even through torch's generator, which keeps 32 bits of a seed."""
    n = len(seeds) // 2
    shards = []
    for rank in range(n):
        home, travels = generator(seeds[rank], index), generator(seeds[n + rank], index)
        q, dout = (torch.randn(2, 2, 4, 8, generator=home, dtype=torch.float64) * 2 for _ in range(2))
        k, v = (torch.randn(2, 2, 4, 8, generator=travels, dtype=torch.float64) * 2 for _ in range(2))
        shards.append([q, k, v, dout])
    return shards


def _called_by_answer(frame, event, arg):
    """In the ranks: torch's attention called from the answer's code."""
    if _is_attention(event, arg) and is_learners(frame.f_code.co_filename):
        return f"torch's {arg.__name__}"
    if _into_flex(frame, event) and frame.f_back is not None and is_learners(frame.f_back.f_code.co_filename):
        return f"torch's {frame.f_code.co_name} (flex attention)"


RING_REPORT = dict(error=(tuple, type(None)), results=list, seen=(str, type(None)), tampered=list)  # what _ring reports


def _ring(block_backward, cases, shards):
    """Runs on every rank: each case's fused ring with the learner's function, watched (the calls the answer makes,
    on every thread); this rank's output and gradients. ``shards``: this rank's own tokens of each case's q, k, v and
    output gradient (``rank_args``). Reports what it saw (``RING_REPORT``); the expected values are the checker's."""
    out = {"error": None, "results": [], "seen": None, "tampered": []}
    guard = _guard()
    try:
        with guard, Watcher(_called_by_answer) as watcher:
            _ring_cases(block_backward, cases, shards, out)
    except Refused:  # recorded: named from the record below
        pass
    except Exception as exc:  # noqa: BLE001
        out["error"] = caught(exc, "the fused ring with your block_backward")
    out["seen"], out["tampered"] = (guard.records + watcher.seen or [None])[0], watcher.tampered
    return out


def _ring_cases(block_backward, cases, shards, out):
    for (causal, layout), mine in zip(cases, shards):
        device = rank_device()  # a GPU per rank where there are enough (NCCL carries CUDA tensors only), else CPU
        mine = [t.to(device).clone().requires_grad_(i < 3) for i, t in enumerate(mine)]
        o = fused_ring_attention(*mine[:3], block_backward, causal=causal, layout=layout)
        o.backward(mine[3])
        out["results"].append([t.cpu() for t in [o.detach()] + [torch.zeros_like(t) if t.grad is None else t.grad
                                                                for t in mine[:3]]])


def _results(per_rank, cases, shards, n):
    """The ranks' results (each rank's report checked by ``rank_secrets.report_each``, none with an error), checked
    where the checker reads them: one a case, each [output, dq, dk, dv], the gradients like the q, k, v the rank was
    given (``shards``; autograd gives them their shape and dtype). An output of another shape is ``wrong_output``."""
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


def check_ring_attention(block_backward, world_sizes=(2, 3, 4), timeout=60.0):
    """Check ``block_backward`` alone, then in the fused ring on each of ``world_sizes`` ranks (gloo on CPU ranks, or
    NCCL on a GPU each where the machine has enough)."""
    __tracebackhide__ = True
    lines = check_block_backward(block_backward)
    cases = [(True, "contiguous"), (True, "zigzag"), (False, "contiguous")]
    for n in world_sizes:
        seeds = new_seeds(2 * n)  # new q, k, v at every check: two seeds a rank
        by_case = [_ring_shards(seeds, c) for c in range(len(cases))]  # [case][rank]: q, k, v, dout
        shards = [[by_case[c][rank] for c in range(len(cases))] for rank in range(n)]  # in its rank_args, to it alone
        data = [[unshard([mine[t] for mine in by_case[c]], layout) for t in range(4)]
                for c, (_, layout) in enumerate(cases)]  # the whole sequence, in token order: the checker's
        ranks = launch_answer(_ring, (block_backward, cases), n, timeout, "the ring", RING_HINTS["deadlock"],
                              rank_args=[(mine,) for mine in shards])
        for rank, r in enumerate(report_each(ranks, RING_REPORT, n)):  # the answer's own calls, on every rank
            if not all(isinstance(t, str) for t in r["tampered"]):
                refuse(f"tampered {r['tampered']!r:.200}, where the checker's rank function reports what switched "
                       "its watcher off, in words", f"rank {rank}", n)
            refuse_tampering(r["tampered"], f"rank {rank}: block_backward", n)
            if r["seen"]:
                fail(RING_HINTS, "used_library", f"rank {rank}: your block_backward called {r['seen']}.", n)
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
        lines.append(f"on {n} ranks: the fused ring with your block_backward, causal (contiguous, zig-zag) and full "
                     f"attention = one process's output and dq, dk, dv")
    return CheckResult("block_backward in the fused ring", lines)
