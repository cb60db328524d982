"""Lab 03's optimizer side, checked: the inner optimizer is the one asked for, with its arguments and groups' options.

``utils.checkers.zero`` (the lab's checker) builds the learner's class as any torch optimizer is built,
``cls(params, bucket_numel, optimizer_class=..., **defaults)``, in two ways: Adam over ``model.parameters()``
(a generator, with ToyNet's frozen ``input_scale`` in it), and AdamW with weight decay over two parameter
groups of their own options (the weights, decayed; the biases, at another lr and not decayed). It compares
every step with the *unsharded* optimizer of the same class and groups on DDP's mean gradient. When the
first step is wrong, this module names why: it replays that first step on the same gradient with the
optimizers a classic mistake builds instead (torch.optim.Adam whatever the class; one group with the
defaults; no defaults at all; each of the caller's arguments left out in turn) and says which one the answer
matches. The inner optimizer must be kept in
``self.optimizer`` (a ``torch.optim.Optimizer``): its state is what ZeRO shards, and what the checker counts.
"""

import torch

from .common import WEIGHT_TOL, close, fail

GROUP_LR_FACTOR = 2.0  # the biases' group: lr x 2 (and no weight decay), so a group's options that are ignored show
WEIGHT_DECAY = 0.1  # the weights' group in the AdamW case: decoupled decay lr x 0.1 x p per step

OPTIM_HINTS = {
    "optimizer_class_ignored": "build the inner optimizer from the optimizer_class you are given "
                               "(optimizer_class(groups, **defaults)), not torch.optim.Adam: AdamW decays the weights "
                               "apart from the gradient, SGD has no second moment.",
    "group_options_ignored": "give the inner optimizer one parameter group per entry of self.param_groups, with that "
                             "group's own options ({**group, 'params': your chunks of its buckets}): here the biases' "
                             "group has another lr and no weight decay.",
    "lr_ignored": "pass the optimizer's arguments on: optimizer_class(groups, **defaults), so lr, eps and every other "
                  "keyword you are given are the caller's, not the class's defaults.",
    "state_hidden": "keep the inner optimizer in self.optimizer (a torch.optim.Optimizer over your chunks): its state "
                    "is what ZeRO shards, and where the checker counts it.",
}


def model_params(model, grouping, lr):
    """What the checker passes as ``params``, the trainable parameters' indices per group, and each group's options.

    ``grouping`` "generator": ``model.parameters()`` itself (the frozen parameter included); "groups": the weights
    (and the frozen parameter) with weight decay, the biases at ``GROUP_LR_FACTOR`` x ``lr`` without."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    index = {id(p): i for i, p in enumerate(trainable)}
    if grouping == "generator":
        return model.parameters(), [list(range(len(trainable)))], [{}]
    named = list(model.named_parameters())
    weights = [p for name, p in named if not name.endswith("bias")]  # input_scale (frozen) among them
    biases = [p for name, p in named if name.endswith("bias")]
    options = [{"weight_decay": WEIGHT_DECAY}, {"lr": GROUP_LR_FACTOR * lr, "weight_decay": 0.0}]
    params = [{"params": (p for p in weights), **options[0]}, {"params": biases, **options[1]}]
    return params, [[index[id(p)] for p in g if p.requires_grad] for g in (weights, biases)], options


def first_step(optimizer_class, groups, options, defaults, before, grad, sizes):
    """One step of the unsharded ``optimizer_class`` from the flat ``before`` with the flat gradient ``grad``."""
    tensors = [t.clone() for t in before.split(sizes)]
    for t, g in zip(tensors, grad.split(sizes)):
        t.grad = g.clone()
    optimizer_class([{**o, "params": [tensors[i] for i in g]} for g, o in zip(groups, options)], **defaults).step()
    return torch.cat(tensors)


def optimizer_state(answer):
    """(holds an optimizer, bytes of its per-element state, its step counters) of the learner's instance."""
    optimizer = getattr(answer, "optimizer", None)
    if not isinstance(optimizer, torch.optim.Optimizer):
        return False, 0, []
    tensors = {id(t): t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()}
    steps = [float(s["step"]) for s in optimizer.state.values() if "step" in s]
    return True, sum(t.nbytes for t in tensors.values()), steps


def judge_first_step(hints, case, n, label):
    """Name the mistake when the answer's first step differs from the unsharded optimizer's (``case`` from the
    checker: its optimizer, groups, options and defaults, and rank 0's first step)."""
    __tracebackhide__ = True
    step = case["steps"][0]
    replay = lambda cls, groups, options, defaults: first_step(  # noqa: E731 - the same step, another optimizer
        cls, groups, options, defaults, step["before"], step["mean"], case["sizes"])
    cls, groups, options, defaults = case["optimizer_class"], case["groups"], case["options"], case["defaults"]
    want = replay(cls, groups, options, defaults)
    if close(step["after"], want, WEIGHT_TOL):
        return
    what = f"{label}: after the first step your parameters differ from {cls.__name__}'s (max diff " \
           f"{(step['after'] - want).abs().max().item():.2e})"
    if cls is not torch.optim.Adam and close(step["after"], replay(torch.optim.Adam, groups, options, defaults),
                                             WEIGHT_TOL):
        fail(hints, "optimizer_class_ignored", f"{what}, and equal torch.optim.Adam's.", n)
    all_params = [[i for g in groups for i in g]]
    if len(groups) > 1 and close(step["after"], replay(cls, all_params, [{}], defaults), WEIGHT_TOL):
        fail(hints, "group_options_ignored", f"{what}, and equal {cls.__name__}'s over one group with the "
             f"defaults {defaults}: the groups' own options {options} were ignored.", n)
    if close(step["after"], replay(cls, groups, options, {}), WEIGHT_TOL):
        fail(hints, "lr_ignored", f"{what}, and equal {cls.__name__}'s with its own defaults, not {defaults}.", n)
    for name in defaults:  # one argument passed on, another dropped (lr given, eps left out)
        if close(step["after"], replay(cls, groups, options, {k: v for k, v in defaults.items() if k != name}),
                 WEIGHT_TOL):
            fail(hints, "lr_ignored", f"{what}, and equal {cls.__name__}'s without {name}={defaults[name]!r}, one of "
                 f"the caller's arguments {defaults}.", n)
