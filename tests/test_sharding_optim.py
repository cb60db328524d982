"""The course's sharded optimizer beside torch's own: utils.sharding.adam (Adam written out), utils.sharding.groups
(params as torch.optim takes them) and lab 03's reference BucketedZeRO2 (any torch.optim class over each rank's
chunks), compared with the unsharded optimizer of the same class, bit for bit."""

import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from utils.course.notebook_runner import ROOT
from utils import run_ranks
from utils.datasets import digits
from utils.models import ToyNet
from utils.sharding.adam import adam_update
from utils.sharding.groups import param_groups

sys.path.insert(0, str(ROOT / "labs"))  # the labs import their reference as `solutions`, from labs/
from solutions.zero import BucketedZeRO2  # noqa: E402


@pytest.mark.parametrize("foreach", [False, True])
def test_adam_update_is_torch_adam_bit_for_bit(foreach):
    """10 steps on gradients spanning 6 decades: every float32 equal (the old mul/add and sqrt(v / bc2) differed by ~1e-7
    off). foreach=True runs _multi_tensor_adam's order (on CPU through the same element-wise kernels)."""
    torch.manual_seed(0)
    start = torch.randn(10_001)
    grads = [torch.randn(10_001) * 10.0 ** torch.randint(-4, 2, (10_001,)) for _ in range(10)]
    ours, state = start.clone(), {}
    theirs = start.clone().requires_grad_()
    opt = torch.optim.Adam([theirs], lr=1e-2, foreach=foreach)
    for g in grads:
        adam_update(ours, g, state, lr=1e-2)
        theirs.grad = g.clone()
        opt.step()
    assert torch.equal(ours, theirs.detach())


def test_param_groups_reads_what_torch_optimizers_take():
    model = ToyNet()
    groups = param_groups(model.parameters())  # a generator, with the frozen input_scale and the tied weight
    assert len(groups) == 1 and [p.shape for p in groups[0]["params"]] == [
        p.shape for p in model.parameters() if p.requires_grad]
    two = param_groups([{"params": [model.input_scale, model.embed.weight], "weight_decay": 0.1},
                        {"params": model.head.bias, "lr": 0.5}])
    assert [len(g["params"]) for g in two] == [1, 1] and two[0]["weight_decay"] == 0.1 and two[1]["lr"] == 0.5
    with pytest.raises(TypeError, match="got one"):
        param_groups(model.embed.weight)
    with pytest.raises(ValueError, match="frozen"):
        param_groups([model.input_scale])
    with pytest.raises(ValueError, match="empty"):
        param_groups(iter([]))


def _groups(model, kind):
    """What the caller passes: a generator of every parameter (the frozen one too), or two groups of their own."""
    if kind == "generator":
        return model.parameters()
    named = list(model.named_parameters())
    return [{"params": (p for name, p in named if not name.endswith("bias")), "weight_decay": 0.1},  # + input_scale
            {"params": [p for name, p in named if name.endswith("bias")], "lr": 0.02, "weight_decay": 0.0}]


CASES = [(torch.optim.Adam, dict(lr=3e-3), "generator"),
         (torch.optim.AdamW, dict(lr=3e-3, weight_decay=0.1), "generator"),
         (torch.optim.SGD, dict(lr=0.1, momentum=0.9), "generator"),
         (torch.optim.AdamW, dict(lr=3e-3), "two groups")]


def _sharded_vs_unsharded(steps, bucket_numel):
    """On each rank: BucketedZeRO2 and the unsharded optimizer of the same class, fed the same mean gradient."""
    rank, n = dist.get_rank(), dist.get_world_size()
    x, y = digits()
    out = []
    for optimizer_class, defaults, kind in CASES:
        torch.manual_seed(0)
        model = ToyNet()
        torch.manual_seed(0)
        ref = ToyNet()
        zero = BucketedZeRO2(_groups(model, kind), bucket_numel, optimizer_class, **defaults)
        ref_opt = optimizer_class(_groups(ref, kind), **defaults)
        frozen_hooked = model.input_scale._post_accumulate_grad_hooks is not None
        for step in range(steps):
            mine = torch.arange(16) + (step * n + rank) * 16
            F.cross_entropy(model(x[mine]), y[mine]).backward()
            # The reference gets the very mean gradient the ranks reduce-scattered: gather each bucket's chunks
            grads = {}
            for bucket, shard, numel in zip(zero.buckets, zero.grad_shards, zero.numels):
                full = shard.new_empty(shard.numel() * n)
                dist.all_gather_into_tensor(full, shard)
                grads.update(zip(map(id, bucket), full[:numel].split([p.numel() for p in bucket])))
            by_id = {id(p): q for p, q in zip(model.parameters(), ref.parameters())}
            for p in model.parameters():
                if id(p) in grads:
                    by_id[id(p)].grad = grads[id(p)].view_as(p).clone()
            zero.step()
            ref_opt.step()
        out.append(dict(name=f"{optimizer_class.__name__} {defaults} {kind}", frozen_hooked=frozen_hooked,
                        ours=[p.detach().clone() for p in model.parameters()],
                        ref=[p.detach().clone() for p in ref.parameters()]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_bucketed_zero2_equals_the_unsharded_optimizer(world_size):
    """Adam, AdamW (weight decay), SGD (momentum), two param groups, a generator with a frozen parameter: after
    10 steps every rank's parameters are torch.equal to the unsharded optimizer's (element-wise rules: a chunk's
    numbers go through the same float32 operations as in the whole tensor). 3 ranks: the buckets are padded."""
    for rank_out in run_ranks(_sharded_vs_unsharded, 10, 1_000, world_size=world_size, verbose=False):
        for case in rank_out:
            assert not case["frozen_hooked"], case["name"]
            for ours, ref in zip(case["ours"], case["ref"]):
                assert torch.equal(ours, ref), (case["name"], (ours - ref).abs().max().item())
