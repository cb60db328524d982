"""Adam's update rule, written out in ``torch.optim.Adam``'s own order of operations: equal to it bit for bit.

Lesson 03 and lab 03 shard a torch optimizer (any element-wise ``torch.optim`` class) over each rank's
chunk; this is the rule that ``torch.optim.Adam`` then runs on every element, readable in ten lines, for a 1-D tensor (a view of a
flat buffer works). It follows ``_single_tensor_adam`` without weight decay, amsgrad or capturable
(``torch/optim/adam.py`` in torch 2.13): ``exp_avg.lerp_(grad, 1 - beta1)``, then
``(exp_avg_sq.sqrt() / bias_correction2 ** 0.5).add_(eps)``. Both roundings matter: ``m * beta1 + (1 - beta1) * g``
instead of the lerp, or ``sqrt(v / bias_correction2)`` instead of ``sqrt(v) / sqrt(bias_correction2)``, is the
same formula in real numbers but differs in float32 by an ulp here and there: of the order of 1e-7 after
10 steps at lr 1e-2 (2.4e-7 on the test's data, 4.8e-7 on 100,000 values); ``tests/test_sharding_optim.py``
asserts ``torch.equal`` with torch's Adam after 10 steps.
"""

import torch

LR = 1e-2  # Adam's learning rate in every check


def adam_update(param, grad, state, lr=LR, betas=(0.9, 0.999), eps=1e-8):
    """One Adam step (Kingma & Ba, 2015) on the 1-D tensor ``param``, in place (a view works).

    ``state`` is a dict, empty before the first call: Adam then adds ``exp_avg`` and ``exp_avg_sq``,
    two float32 tensors the size of ``param`` (8 bytes per element: ZeRO's K), and a step count.
    """
    if not state:
        state.update(step=0, exp_avg=torch.zeros_like(param), exp_avg_sq=torch.zeros_like(param))
    state["step"] += 1
    beta1, beta2 = betas
    state["exp_avg"].lerp_(grad, 1 - beta1)  # m: running mean of the gradient (torch: lerp, not mul + add)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)  # v: of its square
    bias_correction1, bias_correction2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]
    denom = (state["exp_avg_sq"].sqrt() / bias_correction2 ** 0.5).add_(eps)  # sqrt(v) / sqrt(bc2), as torch
    param.addcdiv_(state["exp_avg"], denom, value=-(lr / bias_correction1))
