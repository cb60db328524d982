"""The optional lesson 13 (other frameworks, parts 13a and 13b): its torch reference, its model and step in
TensorFlow, and how the suite skips it.

``make test-frameworks`` runs these and notebooks 13a and 13b themselves (after ``make frameworks`` installs the
[frameworks] extra). Without TensorFlow, the TensorFlow tests here skip with the reason, and the
default suite skips both parts (``metadata.course.requires``, utils/course/notebook_runner.py).
"""

import json

import pytest
import torch
import torch.nn.functional as F
from utils.course.notebook_runner import ROOT, course_metadata, missing_requirements

import utils

NOTEBOOKS = [ROOT / "notebooks" / "13a_frameworks_one_process.ipynb", ROOT / "notebooks" / "13b_frameworks_workers_horovod.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_declares_what_it_needs(path):
    meta = course_metadata(path)
    assert meta["requires"] == ["tensorflow"] and meta["suite_world_sizes"] == [2]
    assert 2 in meta["world_sizes"] and meta["test_timeout"] >= 300


def test_missing_requirement_is_named(tmp_path):
    """A notebook that needs a module nobody has is reported, one that needs only torch is not."""
    def notebook(requires):
        path = tmp_path / f"{len(requires)}.ipynb"
        path.write_text(json.dumps({"cells": [], "metadata": {"course": {"requires": requires}}}))
        return path

    assert missing_requirements(notebook(["torch", "no_such_module_for_lesson_13"])) == ["no_such_module_for_lesson_13"]
    assert missing_requirements(notebook(["torch"])) == []


def test_reference_ddp_equals_one_process():
    """utils.frameworks.reference (torch only): DDP's step on 2 ranks reproduces the one-process step; a wrong
    gradient is refused by check()."""
    from utils.frameworks.reference import SAME_FRAMEWORK, check, first_batch, torch_ddp_step, torch_reference

    x, y = first_batch(24)
    assert x.shape == (24, 64) and y.shape == (24,)
    ref = torch_reference(x, y, lr=0.5)
    assert list(ref["grads"]) == [n for n, p in utils.ToyNet().named_parameters() if p.requires_grad]
    for name, g in ref["grads"].items():  # one SGD step, from the initial weights
        torch.testing.assert_close(ref["after"][name], ref["init_state"][name] - 0.5 * g)
    ddp = utils.run_ranks(torch_ddp_step, x, y, 0.5, world_size=2, verbose=False)
    for r in ddp:
        assert check("DDP grads", r["grads"], ref["grads"], SAME_FRAMEWORK) < 1e-5
        check("DDP weights", r["after"], ref["after"], SAME_FRAMEWORK)
    with pytest.raises(AssertionError):
        check("grads x 2", {k: 2 * v for k, v in ref["grads"].items()}, ref["grads"], SAME_FRAMEWORK)


def _state_and_batch(batch=48):
    torch.manual_seed(0)
    model = utils.ToyNet()
    x, y = utils.digits()
    return model, x[:batch], y[:batch]


TOL = dict(rtol=1e-4, atol=1e-6)  # float32, another framework's kernels (the notebook explains it)


def test_tf_toynet_matches_torch_forward_and_gradient():
    tf = pytest.importorskip("tensorflow", reason="TensorFlow is in the optional [frameworks] extra: `make frameworks`")
    from utils.frameworks.tf_toynet import TRAINABLE, TFToyNet, single_device_step

    model, x, y = _state_and_batch()
    assert [n for n, p in model.named_parameters() if p.requires_grad] == TRAINABLE
    tf_model = TFToyNet(model.state_dict())
    torch.testing.assert_close(torch.as_tensor(tf_model(tf.constant(x.numpy())).numpy()), model(x).detach(), **TOL)
    F.cross_entropy(model(x), y).backward()
    _, grads = single_device_step(tf_model, x.numpy(), y.numpy(), lr=0.5)
    torch.testing.assert_close({k: torch.as_tensor(v) for k, v in grads.items()},
                               {n: p.grad for n, p in model.named_parameters() if p.requires_grad}, **TOL)
    # the tied weight: one variable, whose gradient sums both uses (as torch's does)
    assert sum(1 for v in tf_model.trainable_variables if v is tf_model.params["mix1.weight"]) == 1


def test_dp_step_on_one_replica_is_the_single_device_step():
    tf = pytest.importorskip("tensorflow", reason="TensorFlow is in the optional [frameworks] extra: `make frameworks`")
    from utils.frameworks.tf_toynet import TFToyNet, dp_step, single_device_step

    model, x, y = _state_and_batch()
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")  # one replica: the step's code path, no second device needed
    with strategy.scope():
        dp_model = TFToyNet(model.state_dict())
    loss, (grads,) = dp_step(strategy, dp_model, x.numpy(), y.numpy(), lr=0.5)
    ref = TFToyNet(model.state_dict())
    ref_loss, ref_grads = single_device_step(ref, x.numpy(), y.numpy(), lr=0.5)
    assert abs(loss - ref_loss) < 1e-6
    for k in ref_grads:
        torch.testing.assert_close(torch.as_tensor(grads[k]), torch.as_tensor(ref_grads[k]), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(torch.as_tensor(dp_model.torch_state()[k]), torch.as_tensor(ref.torch_state()[k]),
                                   rtol=1e-5, atol=1e-7)
