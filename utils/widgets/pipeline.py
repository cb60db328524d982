"""The pipeline schedule explorer of notebook 06b: sliders around the notebook's ``schedule_figure``.

Notebook 06b writes ``schedule_figure(stages, microbatches, schedule, backward_cost)``, which simulates a
schedule with ``utils.pipeline`` and returns its matplotlib figure, or the error as text for a schedule
that cannot exist. This widget draws that figure on every change. What a browser showed and a headless run
cannot, and what is done about it:

- labels such as "micro-batches m" were cut: every control gets a label wide enough (``description_width``);
- the x-axis title fell outside the picture: the figure is saved with ``bbox_inches="tight"``;
- the picture was stretched to the output's width (blurry): the image is shown at its own pixel size,
  drawn at twice the screen's density, and scaled down only when the page is narrower;
- after an invalid choice the previous picture, with its title, stayed: now the picture is cleared and
  the message says why.

Constructible without a display: ``e = ScheduleExplorer(schedule_figure)`` fills ``e.picture.value`` (PNG
bytes) and ``e.message.value``; ``display(e.box)`` shows it.
"""

import io

import ipywidgets as widgets
import matplotlib.pyplot as plt

__all__ = ["ScheduleExplorer", "png_width"]

LABEL_STYLE = {"description_width": "9em"}  # "micro-batches m" fits whole
DPI, SCALE = 160, 2  # drawn at 160 dpi, shown at half size: sharp on a high-density screen, crisp on any


def png_width(png: bytes) -> int:
    """The width in pixels of a PNG (read from its header)."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG: its first 8 bytes are not the PNG signature")
    return int.from_bytes(png[16:20], "big")


class ScheduleExplorer:
    """One control per argument of ``figure``; every change redraws ``picture`` or explains in ``message``.

    The picture is an ``Image`` widget whose value is replaced, not ``interactive_output``: its ``Output`` widget can
    deadlock a headless papermill run (nbclient issue 312), which is how the test suite executes lesson 06b."""

    def __init__(self, figure, stages=4, microbatches=8, schedule="1F1B", backward_cost=2.0,
                 schedules=("GPipe", "1F1B")):
        self.figure, self.title = figure, ""
        self.controls = dict(
            stages=widgets.IntSlider(value=stages, min=1, max=8, description="stages p", style=LABEL_STYLE),
            microbatches=widgets.IntSlider(value=microbatches, min=1, max=16, description="micro-batches m",
                                           style=LABEL_STYLE),
            schedule=widgets.Dropdown(options=list(schedules), value=schedule, description="schedule",
                                      style=LABEL_STYLE),
            backward_cost=widgets.FloatSlider(value=backward_cost, min=0.5, max=3.0, step=0.5,
                                              description="t_b / t_f", style=LABEL_STYLE),
        )
        self.picture, self.message = widgets.Image(format="png"), widgets.Label()
        for control in self.controls.values():
            control.observe(lambda _change: self.update(), names="value")
        controls = list(self.controls.values())
        self.box = widgets.VBox([widgets.HBox(controls[:2]), widgets.HBox(controls[2:]), self.message, self.picture])
        self.update()

    def values(self):
        return {name: control.value for name, control in self.controls.items()}

    def update(self):
        """Redraw; returns the figure's title, or the error text of a schedule that cannot exist."""
        fig = self.figure(**self.values())
        if isinstance(fig, str):  # a schedule that cannot exist: say why, and show no stale picture
            self.picture.value, self.picture.layout.display, self.title = b"", "none", ""
            self.message.value = fig
            return fig
        self.title = fig.axes[0].get_title() if fig.axes else ""
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=DPI, bbox_inches="tight")  # tight: axis titles stay inside
        plt.close(fig)
        png = png.getvalue()
        width = png_width(png) // SCALE
        self.picture.layout = widgets.Layout(width=f"{width}px", max_width="100%", height="auto")
        self.picture.value, self.message.value = png, ""
        return self.title
