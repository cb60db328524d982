"""Issue 36: the hard cases every checker tries come from one place (utils/checkers/boundaries.py); each case has the
property its kind claims, each checker covers the kinds that apply to it (read from the checker), and an answer
wrong only at a boundary is rejected there."""

import math
import sys

import pytest
import torch
import torch.distributed as dist

from lab_grading import expect_rejection
from utils.checkers import boundaries, ddp, halving_doubling, tensor_parallel
from utils.checkers.boundaries import FAR_APART, bucket_caps, buckets, check_world_sizes, element_counts
from utils.checkers.folded_all_reduce import check_halving_doubling_all_reduce
from utils.checkers.labs import LABS
from utils.checkers.rank_secrets import new_seeds
from utils.course.notebook_runner import ROOT
from utils.models import ToyNet

sys.path.insert(0, str(ROOT / "labs"))
from solutions.halving_doubling import halving_doubling_all_reduce  # noqa: E402

TOY = [p.numel() * p.element_size() for p in ToyNet().parameters() if p.requires_grad][::-1]


def test_world_sizes_add_a_non_power_of_two_above_4_unless_smoke():
    assert check_world_sizes((2, 3), 4) == [2, 3, 4, 6]  # 6 = 4 + 2: two ranks fold
    assert check_world_sizes((2, 3), 4, smoke=True) == [2, 3, 4]
    assert check_world_sizes((2, 4), 8, accepted=(2, 4, 8)) == [2, 4, 8]  # powers of two only: none to add
    extra = boundaries.first_non_power_of_two_above_4(range(2, 9))
    assert extra > 4 and extra & (extra - 1) and extra - 4 >= 2
    assert boundaries.first_non_power_of_two_above_4((2, 3, 4, 5)) == 5  # where 6 is not accepted
    with pytest.raises(ValueError, match="WORLD_SIZE = 7: this lab's checker accepts"):
        check_world_sizes((2, 3), 7)


@pytest.mark.parametrize("p", range(1, 9))
def test_element_counts_have_their_kinds_property(p):
    for numel, kind in element_counts(p):
        assert {"multiple": numel % p == 0, "one": numel == 1, "fewer_than_ranks": numel < p,
                "remainder": numel % p != 0, "large_odd": numel > 10_000 and numel % 2}[kind], (numel, kind)
    assert element_counts(p)[0][1] == "multiple"


def test_bucket_caps_have_their_kinds_property():
    caps = bucket_caps(TOY, round_caps=(1 << 20, 4096))
    assert boundaries.kinds(caps) == {"one_for_all", "inside_a_tensor", "fills_exactly_first", "fills_exactly_later",
                                      "one_short_later", "one_per_tensor"}
    for cap, kind in caps:
        made = [sum(TOY[i] for i in b) for b in buckets(TOY, cap)]
        if kind == "one_for_all":
            assert made == [sum(TOY)]
        elif kind == "one_per_tensor":
            assert made == TOY
        elif kind == "fills_exactly_first":
            assert made[0] == cap
        elif kind == "fills_exactly_later":
            assert cap in made[1:]
        elif kind == "one_short_later":  # a later bucket reaches cap - 1 on its way, and must go on
            assert buckets(TOY, cap) != buckets(TOY, cap, restart=1)
        else:
            assert cap not in made and all(s >= cap for s in made[:-1])
    # what the two later kinds are for: a count restarted one unit off differs from the rule at one of them
    assert any(buckets(TOY, c) != buckets(TOY, c, restart=-1) for c, k in caps if k == "fills_exactly_later")
    with pytest.raises(ValueError, match="at least three tensors"):
        bucket_caps([5, 5])


def test_far_apart_overflows_and_underflows_float32():
    assert math.isinf(torch.exp(torch.tensor(FAR_APART["large"])).item())
    assert torch.exp(torch.tensor(FAR_APART["apart"])).item() == 0.0


def test_each_checker_covers_its_kinds():
    """Read from the checkers themselves: their cases are the generator's, every kind included."""
    for p in range(1, 9):
        assert {n for n, _ in halving_doubling.cases(p)} == {n for n, _ in element_counts(p)}
    logits, _, _ = tensor_parallel.make_case("large", 2, new_seeds(3))  # new logits at every check
    assert logits.min() > FAR_APART["large"] - 10
    logits, target, _ = tensor_parallel.make_case("apart", 2, new_seeds(3))
    assert logits[torch.arange(len(target)), target].max() < FAR_APART["apart"] + 10


class Stop(Exception):
    pass


def test_lab_02_trains_at_every_cap_kind(monkeypatch):
    """The caps check_ddp hands its ranks when called as the lab and the grader call it (not its module constant):
    every kind of the generator's, the exact fills included."""
    seen = {}

    def launch(rank_fn, args, *rest, **kwargs):
        seen["caps"] = args[-1]  # _on_rank(ddp_class, x, y, lr, caps), then each rank's own seed and samples
        raise Stop
    monkeypatch.setattr(ddp, "launch_answer", launch)
    with pytest.raises(Stop):
        LABS["02_ddp_lab"].parts[0].call(ddp.check_ddp, {"BucketedDDP": object}, 4, False)
    kinds = dict(bucket_caps(TOY, round_caps=(1 << 20, 4096)))
    assert set(seen["caps"]) == set(kinds), (seen["caps"], kinds)
    assert {"fills_exactly_first", "fills_exactly_later", "one_short_later"} <= set(kinds.values()), kinds


@pytest.mark.parametrize("lab", sorted(LABS))
def test_every_lab_checks_at_a_non_power_of_two_above_4_where_it_accepts_one(lab):
    """Each part's call, as the grader and the check cell make it, asks the checker for 6 ranks unless SMOKE
    (labs 01a and 09: powers of two only)."""
    for part in LABS[lab].parts:
        asked = {}

        def spy(*args, world_sizes=None, **kwargs):
            asked["sizes"] = world_sizes
        part.call(spy, {name: None for name in part.needs}, 4, False)
        if asked.get("sizes") is None:
            continue  # a part with no world sizes (a search judged in the kernel)
        want = 6 if lab not in ("01a_halving_reduce_scatter_lab", "09_plan_3d_lab") else None
        assert (want in asked["sizes"]) if want else all(n & (n - 1) == 0 for n in asked["sizes"]), (lab, asked)
        part.call(spy, {name: None for name in part.needs}, 4, True)
        assert 6 not in asked["sizes"], "SMOKE keeps the suite's sizes"


def folded_right_up_to_4(tensor, reduce_scatter):
    """kind: an answer right on 2, 3 and 4 ranks and wrong above 4 (the reference, then one added above 4). make
    mutants found real ones: a fold of 2*rem written 1*rem, right wherever one rank folds (3, 5), wrong at 6."""
    halving_doubling_all_reduce(tensor, reduce_scatter)
    if dist.get_world_size() > 4:
        tensor.view(-1)[0] += 1  # planted


def test_an_answer_wrong_only_above_4_is_caught_there():
    check_halving_doubling_all_reduce(folded_right_up_to_4, world_sizes=(2, 3, 4), timeout=30)  # passes without 5
    expect_rejection(check_halving_doubling_all_reduce, folded_right_up_to_4,
                     world_sizes=check_world_sizes((2, 3, 4), 4), timeout=30, mistake="not_power_of_two",
                     phrase="not on 6 ranks")
