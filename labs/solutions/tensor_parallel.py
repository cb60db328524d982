"""Reference solution of labs/05_tensor_parallel_lab.ipynb: Megatron's vocabulary-parallel cross-entropy.

The output layer of a language model maps the hidden size h to the vocabulary v (50,257 words for
GPT-2, 128,256 for Llama 3), and it is split column-parallel like any other layer (lesson 05):
rank r holds v/t rows of the weight and computes the logits of *its* v/t words. The loss needs a
softmax over all v words, and all-gathering the logits would move b·s·v values per rank. Megatron-LM
(Shoeybi et al., arXiv 1909.08053, section 3) fuses the loss into the split instead: a softmax
cross-entropy needs only three numbers per token from the whole vocabulary,

    loss = log(sum_j exp(x_j - M)) - (x_target - M),   M = max_j x_j,

and each is a max or a sum of per-rank parts: three all-reduces of b·s values, whatever v. The
gradient, softmax - one-hot, is local to the rank that holds each logit: no communication back.
"""

import torch
import torch.distributed as dist


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of logits split by vocabulary over the ranks (Megatron-LM, arXiv 1909.08053)."""

    @staticmethod
    def forward(ctx, logits, target):  # logits (tokens, v/t): this rank's words; target (tokens,) in [0, v)
        width = logits.shape[-1]
        start = dist.get_rank() * width  # rank r holds words [r v/t, (r+1) v/t)
        top = logits.max(dim=-1).values  # (tokens,): this rank's max ...
        dist.all_reduce(top, op=dist.ReduceOp.MAX)  # ... and the whole vocabulary's: exp never overflows
        shifted = logits - top.unsqueeze(-1)  # a new tensor: the caller's logits stay as they were
        mine = (target >= start) & (target < start + width)  # tokens whose target word this rank holds
        local = (target - start).clamp(0, width - 1)  # its column here (any valid column elsewhere ...)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1) * mine  # ... zeroed where not mine
        dist.all_reduce(picked)  # x_target - M, from the one rank that holds it
        exp = shifted.exp()  # (tokens, v/t)
        total = exp.sum(dim=-1)
        dist.all_reduce(total)  # sum over the whole vocabulary
        ctx.save_for_backward(exp / total.unsqueeze(-1), local, mine)  # this rank's softmax: (tokens, v/t)
        return total.log() - picked  # (tokens,), the same on every rank

    @staticmethod
    def backward(ctx, grad):  # grad (tokens,): d(whatever the caller made of the losses) / d(loss)
        softmax, local, mine = ctx.saved_tensors
        one_hot = torch.zeros_like(softmax)
        one_hot.scatter_(-1, local.unsqueeze(-1), mine.to(softmax.dtype).unsqueeze(-1))
        return (softmax - one_hot) * grad.unsqueeze(-1), None  # local: no all-reduce in backward
