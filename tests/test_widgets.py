"""The two widgets of the course (utils/widgets/memory.py for lesson 03, utils/widgets/pipeline.py for
lesson 06), built without a display: what a browser showed wrong, checked headless.

tests/browser/ drives the same widgets in JupyterLab; these run in a second, in any `make test`.
"""

import ipywidgets as widgets
import matplotlib
import matplotlib.pyplot as plt
import pytest

from utils.sharding.memory import bytes_per_param, zero_bytes_per_rank
from utils.widgets.memory import MODEL_SIZES_B, ZeroCalculator
from utils.pipeline import bubble_fraction, idle_fraction, schedule_orders, simulate
from utils.widgets.pipeline import SCALE, ScheduleExplorer, png_width
from utils.pipeline.timeline import draw_gantt

matplotlib.use("Agg")


def zero_text(billions=7.5, world_size=64, stage=3, dtype="mixed", optimizer="adam"):  # lesson 03's, verbatim
    b = zero_bytes_per_rank(billions * 1e9, world_size, stage, *bytes_per_param(dtype, optimizer))
    return (f"{billions:g} B parameters, {world_size} ranks, ZeRO stage {stage}, {dtype} {optimizer}: per rank\n  "
            + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in b.items()))


def schedule_figure(stages=4, microbatches=8, schedule="1F1B", backward_cost=2.0):  # lesson 06's, shortened
    try:
        orders = schedule_orders(schedule, stages, microbatches)
    except ValueError as err:
        return f"ValueError: {err}"
    timeline = simulate(orders, forward=1.0, backward=backward_cost)
    fig, ax = plt.subplots(figsize=(11, 0.45 * stages + 1.3))
    draw_gantt(ax, timeline, f"{schedule}, p={stages}, m={microbatches}: bubble {idle_fraction(timeline):.1%} "
               f"(formula {bubble_fraction(stages, microbatches):.1%})", unit=None)
    return fig


def test_calculator_keeps_its_default_exactly():
    """A FloatLogSlider with steps of 0.1 showed 7.94 B for 7.5 B: a selection slider cannot snap."""
    calc = ZeroCalculator(zero_text)
    slider = calc.controls["billions"]
    assert isinstance(slider, widgets.SelectionSlider)
    assert slider.value == 7.5 and MODEL_SIZES_B[slider.index] == 7.5  # the index is what the page holds
    assert calc.update() == zero_text() and "total 1.88 GB" in calc.result.value  # 16 x 7.5e9 / 64 bytes


def test_calculator_controls_are_labelled_and_wide():
    calc = ZeroCalculator(zero_text)
    labels = {name: control.description for name, control in calc.controls.items()}
    assert all(labels.values()), f"every control needs a label: {labels}"
    assert labels["stage"] == "ZeRO stage" and labels["dtype"] == "precision" and labels["optimizer"] == "optimizer"
    assert calc.controls["world_size"].layout.width == "36em"  # 1-1024 in the default ~124 px was 8 ranks a pixel


def test_calculator_follows_its_controls():
    calc = ZeroCalculator(zero_text)
    calc.controls["stage"].value = 0
    calc.controls["billions"].value = 70
    assert "70 B parameters" in calc.result.value and "total 1120.00 GB" in calc.result.value  # 16 x 70e9
    with pytest.raises(ValueError, match="billions=7.3"):
        ZeroCalculator(zero_text, billions=7.3)


def test_explorer_labels_fit_and_picture_has_its_own_size():
    explorer = ScheduleExplorer(schedule_figure)
    for control in explorer.controls.values():
        assert control.description and control.style.description_width == "9em"  # "micro-batches m" whole
    png = explorer.picture.value
    assert png[:4] == b"\x89PNG"
    assert explorer.picture.layout.width == f"{png_width(png) // SCALE}px"  # not stretched to the page
    assert explorer.title.startswith("1F1B, p=4, m=8")


def test_explorer_picture_changes_and_keeps_its_x_axis_title():
    explorer = ScheduleExplorer(schedule_figure)
    before = explorer.picture.value
    explorer.controls["microbatches"].value = 2
    assert explorer.picture.value != before and explorer.title.startswith("1F1B, p=4, m=2")
    fig = schedule_figure()
    fig.canvas.draw()
    label = fig.axes[0].xaxis.label.get_window_extent()
    assert label.y0 < 0, "a plain savefig cuts the x-axis title off; the widget saves with bbox_inches='tight'"
    plt.close(fig)


def test_explorer_clears_the_picture_on_an_invalid_choice():
    explorer = ScheduleExplorer(schedule_figure, schedules=("GPipe", "1F1B", "zigzag"))
    explorer.controls["schedule"].value = "zigzag"
    assert explorer.message.value.startswith("ValueError: unknown schedule 'zigzag'")
    assert explorer.picture.value == b"" and explorer.title == "", "no stale picture, no stale title"
    explorer.controls["schedule"].value = "GPipe"
    assert explorer.picture.value and explorer.message.value == "" and explorer.title.startswith("GPipe")
    assert explorer.picture.layout.display != "none"


def test_png_width_refuses_what_is_not_a_png():
    with pytest.raises(ValueError, match="not a PNG"):
        png_width(b"GIF89a" + bytes(30))
