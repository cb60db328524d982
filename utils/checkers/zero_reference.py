"""Lab 03's inputs and reference: what each rank trains on, and plain DDP on the same, computed by the checker alone.

``utils.checkers.zero`` (the lab's checker) gives each rank a random seed of its own (``rank_secrets``). Rank k builds
ToyNet from it (``toy_model``) and the checker's rank function broadcasts rank 0's, so every rank starts from the
model only rank 0 could build; and rank k draws its ``PER_RANK`` samples of ``digits`` a step from it (``shard``), so
each step's global batch is the ranks' shares, each on its rank alone. The checker holds every seed, and here it
computes plain DDP on those shares in its own process (``ddp_reference``): each rank's gradient on its share, their
mean (what DDP's all-reduce and division give), the unsharded optimizer of the same class and groups
(``zero_optim.model_params``) on every number. No rank holds what that takes, rank 0's model and every rank's share,
so an answer that replaces the checker's rank function cannot report DDP's values without moving data between its
ranks. What the ranks send back is taken as observations only, once ``observed`` has found it of the shape the rank
function gives it (``REPORT``).
"""

import torch
import torch.nn.functional as F

from ..models import ToyNet
from .rank_secrets import generator, refuse, shaped
from .zero_optim import model_params

__all__ = ["PER_RANK", "REPORT", "flat", "toy_model", "shard", "ddp_reference", "observed"]

PER_RANK = 16  # samples per rank per step: a global batch of 16 n
STEP = dict(events=[[int, int, int]], after_backward=int, live_after=int, records=[[str, int, (int, float)]],
            shards=[(torch.Tensor, type(None))], after=torch.Tensor)  # what zero._one_case reports a step
CASE = dict(steps=[STEP], state_bytes=int, held_bytes=int, state_steps=[float], has_optimizer=bool,
            calls=[[str, int]])  # and every call of the case, its construction's too: (op, payload bytes)
REPORT = dict(error=(type(None), [(int, type(None)), str, str]), cases=[CASE])  # a rank's: observations, no reference


def flat(params):
    """The parameters as one flat vector (a copy, detached), in their order."""
    return torch.cat([p.detach().reshape(-1) for p in params])


def toy_model(seed):
    """ToyNet from ``seed`` (its weights, frozen ``input_scale`` and buffer ``input_shift``), on the CPU, the caller's
    random state left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ToyNet()


def shard(seed, samples, steps):
    """(steps, PER_RANK) indices into ``samples`` samples, none twice: a rank's share of each step, from its seed."""
    if steps * PER_RANK > samples:
        raise ValueError(f"{steps} steps of {PER_RANK} samples a rank need {steps * PER_RANK:,} samples; there are "
                         f"{samples:,}: use at most {samples // PER_RANK} steps.")
    return torch.randperm(samples, generator=generator(seed, samples))[: steps * PER_RANK].view(steps, PER_RANK)


def ddp_reference(x, y, seeds, optimizer_class, defaults, grouping, steps):
    """Plain DDP on ``len(seeds)`` ranks from rank 0's model, rank k on ``shard(seeds[k], ...)``, with the unsharded
    ``optimizer_class(groups, **defaults)`` (``grouping``: ``zero_optim.model_params``'s), in one process, on the CPU.

    Returns dict(before (the flat trainable parameters at the start), mean (the first step's mean gradient, flat),
    final (the parameters after ``steps`` steps), sizes (numbers per trainable tensor), groups and options
    (``model_params``'))."""
    model = toy_model(seeds[0])
    params = [p for p in model.parameters() if p.requires_grad]  # each tensor once: the tied weight too
    given, groups, options = model_params(model, grouping, defaults["lr"])
    optimizer = optimizer_class(given, **defaults)
    shares = [shard(seed, len(x), steps) for seed in seeds]
    before, first = flat(params), None
    for step in range(steps):
        grads = [torch.autograd.grad(F.cross_entropy(model(x[s[step]]), y[s[step]]), params) for s in shares]
        for p, per_rank in zip(params, zip(*grads)):
            p.grad = torch.stack(per_rank).sum(0) / len(seeds)  # DDP: the all-reduce's sum, divided by n
        first = flat(p.grad for p in params) if first is None else first
        optimizer.step()
    return dict(before=before, mean=first, final=flat(params), sizes=[p.numel() for p in params], groups=groups,
                options=options)


def observed(per_rank, cases, steps, sizes, n):
    """The ranks' reports, where each is what ``zero._zero2_on_rank`` returns (``REPORT``: every case of ``steps`` steps
    unless it stopped at an error, a gradient event per trainable tensor of ``sizes`` numbers, a (Ψ,) float
    parameter vector after each step); ``LabCheckFailed("not_a_report")`` otherwise."""
    __tracebackhide__ = True
    shaped(per_rank, [REPORT], n, "the ranks' reports")
    if len(per_rank) != n:
        refuse(f"{len(per_rank)} reports from {n} ranks", "the ranks' reports", n)
    for k, report in enumerate(per_rank):
        if len(report["cases"]) > cases or len(report["cases"]) < cases and not report["error"]:
            refuse(f"rank {k} ran {len(report['cases'])} of {cases} cases without an error", "the ranks' reports", n)
        for c, case in enumerate(report["cases"]):
            if len(case["steps"]) != steps:
                refuse(f"rank {k}, case {c}: {len(case['steps'])} steps, not {steps}", "the ranks' reports", n)
            for step in case["steps"]:
                if sorted(i for i, _, _ in step["events"]) != list(range(len(sizes))):
                    refuse(f"rank {k}, case {c}: gradients of tensors {[i for i, _, _ in step['events']]}, not one "
                           f"of each of the {len(sizes)} trainable tensors", "the ranks' reports", n)
                if step["after"].shape != (sum(sizes),) or not step["after"].is_floating_point():
                    refuse(f"rank {k}, case {c}: parameters of shape {tuple(step['after'].shape)} "
                           f"{step['after'].dtype}, not ({sum(sizes)},) float", "the ranks' reports", n)
    return per_rank
