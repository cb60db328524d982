"""The two estimators notebook 06b compares a measured step with: ``bubble_at_cost`` and ``start_shift``."""

import pytest

from utils.pipeline import Interval, bubble_at_cost, bubble_fraction, idle_fraction, schedule_orders, simulate, start_shift

COSTS = (0.03, 0.06)  # the notebook's fixed costs, seconds


@pytest.mark.parametrize("p", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
@pytest.mark.parametrize("name", ["GPipe", "1F1B"])
def test_an_undisturbed_step_is_the_formula_and_its_simulation(name, p, m):
    sim = simulate(schedule_orders(name, p, m), *COSTS)
    assert bubble_at_cost(sim, *COSTS) == pytest.approx(bubble_fraction(p, m), abs=1e-12)
    assert start_shift(sim, sim) == 0.0


@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("m", [2, 4, 8])
def test_start_shift_tells_gpipe_from_1f1b(p, m):
    """Lesson 06 asserts its measured timeline is nearer its own schedule than halfway to the other: they differ."""
    gpipe, ofob = (simulate(schedule_orders(name, p, m), *COSTS) for name in ("GPipe", "1F1B"))
    assert start_shift(gpipe, ofob) > 0.05 and start_shift(ofob, gpipe) > 0.05


def test_late_ops_only_raise_the_bubble_at_cost():
    """Every op 20% late: counted at cost, above the formula; the timed idle share does not see it."""
    p, m = 4, 4
    late = simulate(schedule_orders("1F1B", p, m), 1.2 * COSTS[0], 1.2 * COSTS[1])
    assert bubble_at_cost(late, *COSTS) > bubble_fraction(p, m) + 0.05
    assert idle_fraction(late) == pytest.approx(bubble_fraction(p, m))


def test_ops_slowed_by_their_neighbour_lower_the_timed_idle_share():
    """p=2, m=2, GPipe, forward 1 and backward 2 when a rank computes alone, 1.5x that while both compute
    (they share the cores with other programs): the fill and drain are fast, the overlapped middle slow,
    so the timed idle share reads *below* the formula; counted at cost, the bubble stays above it."""
    F, B = "F", "B"
    step = [Interval(0, F, 0, 0.0, 1.0), Interval(0, F, 1, 1.0, 2.5), Interval(1, F, 0, 1.0, 2.5),  # overlapped: 1.5x
            Interval(1, F, 1, 2.5, 3.5), Interval(1, B, 1, 3.5, 5.5),                              # rank 1 alone
            Interval(1, B, 0, 5.5, 8.5), Interval(0, B, 1, 5.5, 8.5),                              # overlapped: 1.5x
            Interval(0, B, 0, 8.5, 10.5)]                                                          # rank 0 alone
    formula = bubble_fraction(2, 2)  # 1/3
    assert idle_fraction(step) == pytest.approx(1 - 15 / 21)  # 28.6%: below the formula
    assert idle_fraction(step) < formula < bubble_at_cost(step, 1.0, 2.0)  # at cost: 1 - 12/21 = 42.9%


def test_start_shift_needs_the_same_ops():
    sim = simulate(schedule_orders("GPipe", 2, 2), *COSTS)
    with pytest.raises(ValueError, match="different ops"):
        start_shift(sim[:-1], sim)
    assert isinstance(sim[0], Interval)
