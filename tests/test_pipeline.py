"""utils/pipeline/schedules.py: the schedules, the simulator, the bubble formula and the error messages (pure Python, fast).

The runs on ranks are checked in notebooks/06a_pipeline_schedules.ipynb, 06b_pipeline_bubble.ipynb and tests/checkers/test_pipeline_schedule.py;
the interleaved order (lab 06's answer, not in utils) in tests/checkers/test_pipeline_schedule.py.
"""

import pytest

from utils.pipeline import (PipelineDeadlock, bubble_fraction, check_ranks, gpipe_order, idle_fraction,
                            microbatch_size, one_f_one_b_order, peak_in_flight, schedule_orders, simulate, split_layers)


@pytest.mark.parametrize("name", ["GPipe", "1F1B"])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("costs", [(1.0, 1.0), (1.0, 2.0), (3.0, 1.0)])
def test_simulated_bubble_is_the_formula(name, p, m, costs):
    timeline = simulate(schedule_orders(name, p, m), *costs)
    assert idle_fraction(timeline) == pytest.approx(bubble_fraction(p, m), abs=1e-12)
    span = max(iv.end for iv in timeline) - min(iv.start for iv in timeline)
    assert span == pytest.approx((m + p - 1) * sum(costs))  # fill + m slots + drain


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 2), (3, 1)])
def test_activations_held(p, m):
    assert [peak_in_flight(gpipe_order(s, p, m)) for s in range(p)] == [m] * p
    assert [peak_in_flight(one_f_one_b_order(s, p, m)) for s in range(p)] == [min(p - s, m) for s in range(p)]


def test_orders():
    assert gpipe_order(0, 2, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 2), ("B", 1), ("B", 0)]
    assert one_f_one_b_order(0, 2, 3) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]
    assert one_f_one_b_order(1, 2, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]


def test_deadlock_is_named():
    orders = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)],  # stage 0: no warm-up
              [("F", 0), ("F", 1), ("B", 0), ("B", 1)]]  # stage 1: waits for F1 before sending B0
    with pytest.raises(PipelineDeadlock, match="rank 0 is at \\('B', 0\\).*rank 1 is at \\('F', 1\\)"):
        simulate(orders)


def test_incomplete_orders():
    with pytest.raises(ValueError, match="twice"):
        simulate([[("F", 0), ("F", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="without a backward"):
        simulate([[("F", 0), ("F", 1), ("B", 0)]])
    with pytest.raises(ValueError, match="not an op"):
        simulate([[("X", 0)]])


def test_errors_name_the_numbers():
    assert split_layers(5, 2) == [(0, 3), (3, 5)]
    with pytest.raises(ValueError, match="cannot split 4 layers into 5 stages.*at most 4"):
        split_layers(4, 5)
    assert microbatch_size(32, 4) == 8
    with pytest.raises(ValueError, match="batch of 30 does not split into 4.*1, 2, 3, 5, 6, 10, 15, 30"):
        microbatch_size(30, 4)
    with pytest.raises(ValueError, match="needs 4 stage ranks but only 2"):
        check_ranks(4, 2)
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule_orders("zero bubble", 2, 2)


def test_the_timeline_tells_f_b_and_w_apart_without_colour():
    """Issue 40: a pattern per kind and each pass's letter in its label, so a grey-scale print still reads."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from utils.pipeline.timeline import HATCHES, draw_gantt
    from utils.pipeline.zero_bubble import zb_h1_order

    fig, ax = plt.subplots(figsize=(12, 2))
    draw_gantt(ax, simulate([zb_h1_order(r, 2, 4) for r in range(2)], 1.0, 1.0, weight=1.0), unit=None)
    drawn = {bar.get_hatch() or "" for bar in ax.patches}
    assert {HATCHES[k] for k in "FBW"} <= drawn, drawn  # one pattern per kind drawn
    assert len({HATCHES[k] for k in "FBW"}) == 3, "F, B and W share a pattern"
    labels = {t.get_text()[0] for t in ax.texts}
    assert labels == {"F", "B", "W"}, labels
    assert [t.get_text() for t in ax.get_legend().get_texts()][:3] == ["F: forward", "B: backward", "W: weight gradient"]
    plt.close(fig)
