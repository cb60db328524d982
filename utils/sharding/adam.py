"""Adam's update rule, written out: what lesson 03, lab 03's reference solution and lab 03's checker share.

ZeRO shards the optimizer state, so the ZeRO lab needs an optimizer step it can apply to a *piece* of
the parameters: this one, on a 1-D tensor (a view of a flat buffer works). It is exactly
``torch.optim.Adam``'s rule without weight decay, so the lab's ZeRO steps can be compared with plain
data parallelism running the same rule on every element.
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
    state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)  # m: running mean of the gradient
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)  # v: of its square
    bias1, bias2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]
    denom = (state["exp_avg_sq"] / bias2).sqrt_().add_(eps)
    param.addcdiv_(state["exp_avg"], denom, value=-lr / bias1)
