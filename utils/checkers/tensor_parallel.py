"""The checker of lab 05 (tensor parallelism): Megatron's vocabulary-parallel cross-entropy.

Used by ``labs/05_tensor_parallel_lab.ipynb``; lesson 05 derives the column-parallel split it
starts from. The learner writes ``VocabParallelCrossEntropy``, a ``torch.autograd.Function`` whose
``forward(ctx, logits, target)`` gets this rank's (tokens, v/t) block of the logits (rank r holds
words [r v/t, (r+1) v/t)) and every token's target word, and returns the per-token losses,
(tokens,), the same on every rank. Same conventions as every lab (``utils.checkers.common``): a
``CheckResult`` on success, else ``LabCheckFailed`` with ``.mistake`` and ``.hint``.

It checks the *technique*, not only the numbers, because a wrong technique reaches the right numbers:

- **communication** (``CommLedger``): forward all-reduces at most 3 values per token (the max, the
  target's logit, the sum of exps), and backward nothing. An answer that all-gathers the logits
  (b·s·v values: what the split was meant to avoid) gets the right loss and is rejected;
- **values**, on four sets of logits, so that each shortcut shows: *tame* (every rank's block has
  the same max), *spread* (rank r's block is 4r higher: a per-rank max no longer adds up),
  *large* (logits near 200: exp overflows float32 unless the max is subtracted) and *apart* (each
  target's logit 120 below the others: exp(x_target - M) underflows to 0 in float32, so a formula
  that takes the log of the target's softmax gives inf where log-sum-exp minus the logit does not). In every case
  some targets are the first word of a block and some the last, so an owner's mask off by one at an edge shows. The loss and
  the logit gradient are compared with ``F.cross_entropy`` on the whole vocabulary, with the
  tokens weighted in backward (so a backward that ignores its ``grad`` argument shows);
- **the caller's tensor** is left as it was.

The logits are random, new at every check, each rank's block from a seed of its own, and each rank gets its own
block only (``rank_secrets``: in its ``rank_args``, never in what every rank gets): no rank holds what the loss of a
token needs, so an answer that replaces this module's rank function cannot compute the right numbers on one rank.
The checker makes the whole logits itself and computes every reference from them; the ranks report only what they
observed.
"""

import torch
import torch.nn.functional as F

from ..launch import rank_device
from ..comm.ledger import CommLedger
from .boundaries import FAR_APART
from .common import GRAD_TOL, CheckResult, caught, close, fail, first_error, launch_answer, raise_if_error
from .rank_secrets import fields, generator, new_seeds, refuse, reports, tensors_like

TP_HINTS = {
    "gathered_logits": "you moved the logits themselves (tokens x v values per rank) to compute the loss: the "
                       "right numbers, the wrong way, and exactly the traffic the split was for. The loss needs only "
                       "three numbers per token from the whole vocabulary: its max (dist.all_reduce with "
                       "op=dist.ReduceOp.MAX), the sum of exp(x - max) and the target's logit (from the one rank that "
                       "holds it). All-reduce those, (tokens,) each.",
    "not_all_reduce": "forward combined its per-token numbers with another collective than dist.all_reduce (a "
                      "gather, a reduce to one rank, a broadcast...). An all-gather of them can leave every rank "
                      "the right numbers, but each rank then receives one value per rank for every token, bytes "
                      "that grow with the tensor-parallel degree, where an all-reduce leaves each rank one; a reduce "
                      "leaves the result on one rank only, a broadcast copies one rank's numbers. The lab asks for "
                      "all-reduces: look at the op of each call in the list above and replace the others.",
    "extra_collectives": "forward needs at most three all-reduces of one value per token (the max, the target's logit, "
                         "the sum of exps); more moves bytes the loss does not need.",
    "missing_all_reduce": "each rank holds only v/t logits of every token: the max, the sum of exps and the target's "
                          "logit must be combined over the ranks with dist.all_reduce, or each rank computes a loss "
                          "over its own words only.",
    "backward_comm": "the gradient of each logit, softmax - one-hot, is made of numbers this rank already has after "
                     "forward: backward needs no communication (an all-reduce there adds the other ranks' blocks, which belong to "
                     "other words, into yours).",
    "in_place": "do not change the logits you were given (logits -= max changes the caller's tensor, and "
                "autograd's): compute shifted = logits - max, a new tensor.",
    "target_not_masked": "only the rank that holds the target word may contribute its logit: local = target - start, "
                         "and zero the picked value where the target is outside [start, start + v/t) before the "
                         "all-reduce; otherwise every rank adds the logit of some other word.",
    "local_max": "subtract the max over the WHOLE vocabulary, the same number on every rank "
                 "(all_reduce(top, op=dist.ReduceOp.MAX)): with each rank's own max, the ranks' sums of exp are on "
                 "different scales and cannot be added.",
    "overflow": "exp(200) is inf in float32: subtract each token's max logit (over the whole vocabulary) before exp.",
    "underflow": "the target's logit is far below the max: exp(x_target - M) is 0 in float32 and its log is -inf. "
                 "Never take the log of a softmax: loss = log(sum of exp(x - M)) - (x_target - M), with the picked "
                 "logit itself all-reduced, not its exp.",
    "not_finite": "the loss or its gradient is inf or nan on ordinary logits (within a few units of 0, where "
                  "nothing overflows or underflows): look for a log of 0, a division by 0, or an infinity you "
                  "filled in yourself (a mask of -inf, all-reduced with a SUM, stays -inf).",
    "grad_output_ignored": "backward receives grad, d(what the caller made of the losses)/d(each token's loss), not "
                           "always 1 (the checker weights the tokens): multiply your gradient by grad.unsqueeze(-1).",
    "no_one_hot": "the gradient of -x_target is -1 at the target word: subtract 1 at the target's column, on the rank "
                  "that holds it only (softmax - one-hot).",
    "mask_edges": "rank r holds words start = r*v/t up to start + v/t, the first included, the last excluded: "
                  "mine = (target >= start) & (target < start + v/t). Your mask is off by one at an edge of the "
                  "block, so a target that is the first or the last word of a block is counted twice or not at all.",
    "wrong_values": "follow the three steps: M = the max over the vocabulary; picked = x_target - M, from the rank "
                    "that holds the target; loss = log(sum over the vocabulary of exp(x - M)) - picked.",
    "wrong_grad": "the gradient of a token's loss with respect to its logits is softmax(x) - one_hot(target), on this "
                  "rank's columns, times grad: softmax = exp(x - M) / (the summed exps), saved in forward.",
    "not_per_token": "return one loss per token, shape (tokens,), the same on every rank (the caller takes the mean).",
    "backward_returns": "backward returns one gradient per input of forward: (gradient of the logits, None) - the "
                        "target is a tensor of word ids, it has no gradient.",
    "deadlock": "every rank must call the same all-reduces in the same order, also a rank that holds the target word "
                "of no token (it contributes zeros).",
}
ERROR_PHRASES = [("incorrect number of gradients", "backward_returns"),
                 ("Connection closed by peer", "deadlock"),  # gloo, when the ranks' collectives do not pair up
                 ("Connection reset by peer", "deadlock")]  # the same, when the peer has already exited
TOKENS, WIDTH = 12, 8  # tokens per check; words per rank: the vocabulary is WIDTH x world_size
CASES = ("tame", "spread", "large", "apart")


def make_case(case, world_size, seeds, tokens=TOKENS, width=WIDTH):
    """The whole (tokens, v) logits, the targets (every rank holds some) and the per-token weights of backward, from
    the checker's ``seeds`` (``rank_secrets.new_seeds(world_size + 1)``): rank r's block of the logits from
    ``seeds[r]`` alone, the public targets from the last, so that what one rank holds says nothing of another's
    block, not even through torch's generator, which keeps 32 bits of a seed."""
    if len(seeds) != world_size + 1:
        raise ValueError(f"{len(seeds)} seeds for {world_size} ranks: give one a rank and one for the targets, "
                         f"{world_size + 1}.")
    vocab = width * world_size
    logits = torch.cat([torch.randn(tokens, width, generator=generator(seed, CASES.index(case)))
                        for seed in seeds[:world_size]], 1).clamp(-3, 3)
    gen = generator(seeds[world_size], CASES.index(case))  # the targets: every rank gets them
    owner = torch.arange(vocab) // width  # the rank that holds each word
    if case == "tame":
        logits[:, torch.arange(vocab) % width == width // 2] = 4.0  # every block's max is 4: local max = global
    elif case == "spread":
        logits += 4.0 * owner  # rank r's block 4r higher
    elif case == "large":
        logits += FAR_APART["large"]  # exp overflows float32
    column = torch.randint(0, width, (tokens,), generator=gen)  # the target's column in its owner's block
    column[:world_size], column[world_size:2 * world_size] = 0, width - 1  # each block's first and last word
    target = (torch.arange(tokens) % world_size) * width + column
    if case == "apart":  # exp(-123) underflows float32 (its smallest is about exp(-103)): the log of 0 is -inf
        logits[torch.arange(tokens), target] += FAR_APART["apart"]
    weights = torch.arange(1.0, tokens + 1) / tokens  # d(total)/d(loss of each token): not all 1
    return logits, target, weights


# What _cross_entropy_on_rank reports of a case: observations, no reference. Its loss is None only with an error.
REPORT = dict(loss=(torch.Tensor, type(None)), grad=(torch.Tensor, type(None)), changed=bool, forward=list,
              backward=list, error=(tuple, type(None)))


def _cross_entropy_on_rank(cls, public, blocks):
    """Runs on every rank: the learner's loss of this rank's block of each case, its gradient, the collectives.

    ``public``: {case: (target, weights)}, the same on every rank; ``blocks``: {case: this rank's (tokens, WIDTH)
    logits}, its own (``rank_args``). Reports what it saw (``REPORT``), a list of one dict a case, up to the first
    error; the expected values are the checker's to compute."""
    device, out = rank_device(), []  # CUDA under NCCL
    for case in CASES:
        target, weights = (t.to(device) for t in public[case])
        given = blocks[case].to(device)
        block = given.clone().requires_grad_()
        seen = dict(loss=None, grad=None, changed=False, forward=[], backward=[], error=None)
        out.append(seen)
        try:
            with CommLedger() as forward:
                loss = cls.apply(block, target)
            changed = not torch.equal(block.detach(), given)
            per_token = tuple(loss.shape) == (TOKENS,)
            with CommLedger() as backward:
                (loss if per_token else loss.sum()).backward(weights if per_token else None)
        except Exception as exc:  # noqa: BLE001 - reported to the learner in the kernel
            seen["error"] = caught(exc, f"VocabParallelCrossEntropy ({case} logits)")
            return out
        seen.update(loss=loss.detach().clone(), grad=block.grad, changed=changed,
                    forward=[(r.op, r.payload_bytes) for r in forward.records],
                    backward=[(r.op, r.payload_bytes) for r in backward.records])
    return out


def _observed(per_rank, blocks, n):
    """The ranks' reports (``rank_secrets.reports``, none with an error), checked where the checker reads them:
    {case: report} for each rank, each with a loss tensor, a gradient like the rank's block (``blocks``: what each rank
    was given) or None, and the calls as (op, bytes) pairs."""
    __tracebackhide__ = True
    out = []
    for rank, cases in enumerate(per_rank):
        for case, seen in zip(CASES, cases):
            what = f"rank {rank}, {case} logits"
            fields(seen, dict(REPORT, loss=torch.Tensor), what, n)
            if seen["grad"] is not None:  # autograd gives it the block's shape and dtype
                tensors_like({"grad": seen["grad"]}, {"grad": blocks[rank][case]}, what, n)
            calls = seen["forward"] + seen["backward"]
            if not all(isinstance(c, tuple) and len(c) == 2 and isinstance(c[0], str) and isinstance(c[1], int)
                       for c in calls):
                refuse(f"calls {calls!r:.200}, where the checker's rank function reports (op, bytes)", what, n)
        out.append(dict(zip(CASES, cases)))
    return out


def _judge_collectives(r, n):
    __tracebackhide__ = True
    forward, backward = r["forward"], r["backward"]
    budget, whole = 3 * TOKENS * 4, TOKENS * WIDTH * 4  # bytes: 3 float32 per token; one rank's block of logits
    told = f"forward called {forward or 'nothing'} (op, bytes); the budget is 3 values per token = {budget} B"
    if not forward:
        fail(TP_HINTS, "missing_all_reduce", f"{told}.", n)
    if any(b >= whole for _, b in forward):  # the logits themselves moved, whatever the collective
        fail(TP_HINTS, "gathered_logits", f"{told}; the logits themselves are {whole} B per rank, {whole * n} B in "
                                          "all.", n)
    if any(op != "all_reduce" for op, _ in forward):  # small: per-token numbers, through another collective
        fail(TP_HINTS, "not_all_reduce", f"{told}: {sorted({op for op, _ in forward if op != 'all_reduce'})} moved "
                                         f"less than the logits ({whole} B per rank), but is not an all-reduce.", n)
    if sum(b for _, b in forward) > budget:
        fail(TP_HINTS, "extra_collectives", f"{told}.", n)
    if backward:
        fail(TP_HINTS, "backward_comm", f"backward called {backward} (op, bytes); it needs nothing.", n)


def _unmasked(logits, target, n):
    """What an answer that picks a column on every rank, without the owner's mask, computes (with and without M)."""
    top = logits.max(-1).values
    local = (target - torch.arange(n)[:, None] * WIDTH).clamp(0, WIDTH - 1)  # (n, tokens): the column each rank picks
    picked = torch.stack([logits[:, r * WIDTH:(r + 1) * WIDTH].gather(-1, local[r, :, None]).squeeze(-1)
                          for r in range(n)]).sum(0)
    lse = torch.logsumexp(logits, -1)
    return lse - picked, lse - top - (picked - n * top)


def _edge_masked(logits, target, n):
    """What an answer whose owner's mask is off by one at a block's edge computes: the first word of each block
    left out (target > start), or the next block's first word let in (target <= start + v/t, clamped)."""
    top, lse = logits.max(-1).values, torch.logsumexp(logits, -1)
    starts = torch.arange(n)[:, None] * WIDTH
    out = []
    for mine in ((target > starts) & (target < starts + WIDTH), (target >= starts) & (target <= starts + WIDTH)):
        local = (target - starts).clamp(0, WIDTH - 1)
        picked = torch.stack([logits[:, r * WIDTH:(r + 1) * WIDTH].gather(-1, local[r, :, None]).squeeze(-1)
                              for r in range(n)])
        out.append(lse - top - ((picked - top) * mine).sum(0))
    return out


def _judge_values(case, made, rank, r, n):
    """Rank ``rank``'s loss and gradient of ``case`` against the references the checker computes from ``made``, its
    own (logits, target, weights)."""
    __tracebackhide__ = True
    logits, target, weights = made
    want = F.cross_entropy(logits, target, reduction="none")
    softmax = torch.softmax(logits, -1)[:, rank * WIDTH:(rank + 1) * WIDTH]
    one_hot = F.one_hot(target, n * WIDTH).float()[:, rank * WIDTH:(rank + 1) * WIDTH]
    want_grad = (softmax - one_hot) * weights[:, None]
    loss, grad = r["loss"], r["grad"]
    told = f"rank {rank}, {case} logits"
    if not (torch.isfinite(loss).all() and (grad is None or torch.isfinite(grad).all())):
        mistake = {"apart": "underflow", "large": "overflow"}.get(case, "not_finite")  # tame, spread: no extremes
        fail(TP_HINTS, mistake, f"{told}: loss {loss.tolist()[:4]} ... is not finite.", n)
    if not close(loss, want, GRAD_TOL):
        if case == "spread":
            fail(TP_HINTS, "local_max", f"{told}: the loss is right when every rank's block has the same max and "
                                        f"wrong when they differ: {loss[:3].tolist()} ..., expected "
                                        f"{want[:3].tolist()} ...", n)
        mistake = "target_not_masked" if any(close(loss, u, GRAD_TOL) for u in _unmasked(logits, target, n)) \
            else "mask_edges" if any(close(loss, u, GRAD_TOL) for u in _edge_masked(logits, target, n)) \
            else "wrong_values"
        fail(TP_HINTS, mistake, f"{told}: loss {loss[:3].tolist()} ..., expected {want[:3].tolist()} ... (max |diff| "
                                f"{(loss - want).abs().max():.2e}).", n)
    if grad is None:
        fail(TP_HINTS, "wrong_grad", f"{told}: the logits got no gradient.", n)
    if not close(grad, want_grad, GRAD_TOL):
        guesses = {"grad_output_ignored": softmax - one_hot, "no_one_hot": softmax * weights[:, None]}
        mistake = next((m for m, g in guesses.items() if close(grad, g, GRAD_TOL)), "wrong_grad")
        fail(TP_HINTS, mistake, f"{told}: the gradient of the logits differs from softmax - one-hot, times the "
                                f"tokens' weights (max |diff| {(grad - want_grad).abs().max():.2e}).", n)
    return max((loss - want).abs().max().item(), (grad - want_grad).abs().max().item())


def check_vocab_parallel_cross_entropy(cls, world_sizes=(2, 4), timeout=30.0):
    """Check ``cls``, a ``torch.autograd.Function``: ``cls.apply(logits_block, target)`` -> per-token losses.

    On each world size n every rank holds WIDTH = 8 words of a vocabulary of 8n and 12 tokens.
    Returns a ``CheckResult``; raises ``LabCheckFailed`` with the mistake recognised and its hint.
    """
    __tracebackhide__ = True
    lines = []
    for n in world_sizes:
        made = {case: make_case(case, n, new_seeds(n + 1)) for case in CASES}  # new logits at every check
        public = {case: (target, weights) for case, (_, target, weights) in made.items()}
        # rank r's block of each case: in its rank_args, to it alone (run_ranks sends a view as a copy of its own)
        blocks = [{case: logits[:, rank * WIDTH:(rank + 1) * WIDTH] for case, (logits, _, _) in made.items()}
                  for rank in range(n)]
        per_rank = launch_answer(_cross_entropy_on_rank, (cls, public), n, timeout, "VocabParallelCrossEntropy",
                                 TP_HINTS["deadlock"], rank_args=[(mine,) for mine in blocks])
        per_rank = reports(per_rank, REPORT, len(CASES), n)  # its shape (rank_secrets), before reading anything
        raise_if_error(first_error([cases[-1] for cases in per_rank]), n, TP_HINTS, ERROR_PHRASES)
        ranks = _observed(per_rank, blocks, n)
        worst = 0.0
        for rank, r in enumerate(ranks):
            for case in CASES:
                if tuple(r[case]["loss"].shape) != (TOKENS,):
                    fail(TP_HINTS, "not_per_token", f"rank {rank} returned a loss of shape "
                                                    f"{tuple(r[case]['loss'].shape)}; expected ({TOKENS},).", n)
                _judge_collectives(r[case], n)
                if r[case]["changed"]:
                    fail(TP_HINTS, "in_place", f"rank {rank}: the logits block it was given changed.", n)
            for case in CASES:
                worst = max(worst, _judge_values(case, made[case], rank, r[case], n))
        calls = ranks[0]["tame"]["forward"]
        lines.append(f"world_size={n}, v={n * WIDTH}, {TOKENS} tokens: losses and logit gradients equal to "
                     f"F.cross_entropy's on the whole vocabulary (max |diff| {worst:.1e}), also with the ranks' "
                     f"logits on different scales, near 200 and 120 apart; forward: {len(calls)} all-reduces, "
                     f"{sum(b for _, b in calls)} B (all-gathering the logits: {TOKENS * WIDTH * 4 * n} B); "
                     "backward: no communication; the caller's logits untouched")
    return CheckResult("VocabParallelCrossEntropy", lines)
