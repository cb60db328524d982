"""utils.tensor_parallel.toy_plan (lesson 08c): Megatron's split of ToyNet with parallelize_module equals one
process, the tied weight stays one tensor, and a wrong degree or a missing tie is named at once.
No Lightning here: the ranks import torch and the plan, nothing more."""

import pytest
import torch
import torch.nn.functional as F

import utils
from utils.models import ToyNet
from utils.tensor_parallel.toy_plan import apply_toy_tp

TOL = dict(rtol=1e-5, atol=1e-6)  # float32, another summation order


def _tp_forward_backward(x, y):
    """In each of 2 ranks: ToyNet split by apply_toy_tp; its loss and full gradients after one backward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    net = apply_toy_tp(ToyNet(), init_device_mesh("cpu", (2,)))
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad)
             for n, p in net.named_parameters() if p.grad is not None}
    return dict(loss=loss.item(), grads=grads, tied=net.mix2.weight is net.mix1.weight)


def test_toy_tp_plan_equals_one_process():
    """Megatron's split of ToyNet on 2 ranks: the loss and every gradient (the tied weight's summing both uses)."""
    x, y = torch.randn(48, 64), torch.randint(0, 10, (48,))
    torch.manual_seed(0)
    net = ToyNet()
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    expected = {n: p.grad for n, p in net.named_parameters() if p.grad is not None}
    for r in utils.run_ranks(_tp_forward_backward, x, y, world_size=2, backend="gloo", verbose=False):
        assert r["tied"], "apply_toy_tp must leave mix2.weight and mix1.weight one tensor"
        torch.testing.assert_close(r["loss"], loss.item(), **TOL)
        assert r["grads"].keys() == expected.keys()
        torch.testing.assert_close(r["grads"], expected, **TOL)


class _Mesh:  # what apply_toy_tp asks of a mesh before it touches any process group
    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n


def test_apply_toy_tp_names_an_indivisible_degree():
    with pytest.raises(ValueError, match="hidden size 63 is not divisible by tensor-parallel degree 2; use 3, 7 or 9"):
        apply_toy_tp(ToyNet(hidden=63), _Mesh(2))


def test_apply_toy_tp_wants_the_tie():
    net = ToyNet()
    net.mix2.weight = torch.nn.Parameter(net.mix1.weight.detach().clone())
    with pytest.raises(ValueError, match="tied"):
        apply_toy_tp(net, _Mesh(2))
