"""The ZeRO memory calculator of notebook 03: sliders and dropdowns around the notebook's own text function.

Notebook 03 derives ``zero_bytes_per_rank`` and writes ``zero_text(billions, world_size, stage, dtype,
optimizer)``, the line its headless run prints; this widget calls that same function on every change, so
the widget and the printed line cannot disagree. Three things a browser showed that a headless run cannot:

- a ``FloatLogSlider`` snaps its value to its log steps once displayed (7.5 B became 7.94 B with steps of
  0.1), so the parameter count is a ``SelectionSlider`` over published model sizes: the value is one of
  them, exactly, in the kernel and in the page;
- every control has a label (``description``), wide enough to read (``description_width``);
- the world-size slider is wide (1 to 1024 in a default 124-pixel track is 8 ranks a pixel); its readout
  is editable, for a size between two pixels.

Constructible without a display: ``c = ZeroCalculator(zero_text)`` fills ``c.result.value`` (HTML);
``display(c.box)`` shows it.
"""

import html

import ipywidgets as widgets

__all__ = ["MODEL_SIZES_B", "ZeroCalculator"]

#: parameter counts in billions: GPT-2, GPT-3, Llama 1-3 sizes, and 7.5 B, the ZeRO paper's running example
MODEL_SIZES_B = (0.125, 0.35, 0.76, 1.3, 1.5, 2.7, 6.7, 7, 7.5, 8, 13, 30, 65, 70, 175, 405, 1000)
STAGES = [("0: plain DP", 0), ("1: P_os", 1), ("2: P_os+g", 2), ("3: P_os+g+p", 3)]
LABEL_STYLE = {"description_width": "8em"}  # "params (B)", "ZeRO stage", "optimizer" fit whole


class ZeroCalculator:
    """One control per argument of ``text``; every change puts ``text(**values)`` into ``result``."""

    def __init__(self, text, billions=7.5, world_size=64, stage=3, dtype="mixed", optimizer="adam"):
        if billions not in MODEL_SIZES_B:
            raise ValueError(f"billions={billions} is not one of the calculator's sizes {MODEL_SIZES_B}; "
                             f"pick one of them, or call the text function directly for another size.")
        self.text = text
        wide = widgets.Layout(width="36em")
        self.controls = dict(
            billions=widgets.SelectionSlider(options=[(f"{b:g}", b) for b in MODEL_SIZES_B], value=billions,
                                             description="params (B)", style=LABEL_STYLE, layout=wide),
            world_size=widgets.IntSlider(value=world_size, min=1, max=1024, description="world size",
                                         style=LABEL_STYLE, layout=wide),
            stage=widgets.Dropdown(options=STAGES, value=stage, description="ZeRO stage", style=LABEL_STYLE),
            dtype=widgets.Dropdown(options=["mixed", "fp32"], value=dtype, description="precision", style=LABEL_STYLE),
            optimizer=widgets.Dropdown(options=["adam", "sgd+momentum", "sgd"], value=optimizer,
                                       description="optimizer", style=LABEL_STYLE))
        self.result = widgets.HTML()
        for control in self.controls.values():
            control.observe(lambda _change: self.update(), names="value")
        self.box = widgets.VBox([*self.controls.values(), self.result])
        self.update()

    def values(self):
        return {name: control.value for name, control in self.controls.items()}

    def update(self):
        """Recompute; returns the text shown (in a <pre> that wraps only between words)."""
        shown = self.text(**self.values())
        self.result.value = f'<pre style="white-space: pre-wrap; word-break: normal">{html.escape(shown)}</pre>'
        return shown
