"""A small front end for ``utils.planner``: sliders and dropdowns for the mesh and the options, the estimate as a table.

Built from ipywidgets only, and constructible without a display: ``w = PlannerWidget(); w.update()`` fills
``w.table.value`` (HTML) and ``w.result`` (the ``Estimate``, or the ``ValueError`` a bad combination raises, shown
in words rather than as a traceback). In a notebook, show it with ``display(w.box)``.
"""

import ipywidgets as widgets

from ..planner import GPT2_SMALL, H100_NODE, LLAMA2_7B, LLAMA2_70B, MIXTRAL_8X7B, Plan, estimate

MODELS = {"Llama-2-7B": LLAMA2_7B, "Llama-2-70B": LLAMA2_70B, "GPT-2 small": GPT2_SMALL,
          "Mixtral 8x7B": MIXTRAL_8X7B}


class PlannerWidget:
    """One control per field of ``Plan`` (and the model); every change recomputes ``estimate``."""

    def __init__(self, models=None, cluster=H100_NODE):
        self.models, self.cluster, self.result = models or MODELS, cluster, None
        pick = widgets.Dropdown
        self.model = pick(options=list(self.models), description="model")
        self.dp, self.tp, self.pp, self.v = (pick(options=[1, 2, 4, 8, 16, 32, 64], value=1, description=d)
                                             for d in ("dp", "tp", "pp", "v"))
        self.cp, self.ep = (pick(options=[1, 2, 4, 8, 16], value=1, description=d) for d in ("cp", "ep"))
        self.micro_batch = pick(options=[1, 2, 4, 8], value=1, description="micro-batch")
        self.global_batch = widgets.IntSlider(value=64, min=1, max=1024, description="global batch")
        self.zero = pick(options=[0, 1, 2, 3], value=0, description="ZeRO stage")
        self.precision = pick(options=["bf16", "fp32"], description="precision")
        self.checkpointing = pick(options=["none", "selective", "full"], description="recompute")
        self.sequence_parallel = widgets.Checkbox(value=False, description="sequence parallel")
        self.table = widgets.HTML()
        controls = [self.model, self.dp, self.tp, self.pp, self.v, self.micro_batch, self.global_batch, self.zero,
                    self.precision, self.checkpointing, self.sequence_parallel, self.cp, self.ep]
        for control in controls:
            control.observe(lambda _change: self.update(), names="value")
        self.box = widgets.HBox([widgets.VBox(controls), self.table])
        self.update()

    def plan(self):
        return Plan(self.global_batch.value, self.micro_batch.value, self.dp.value, self.tp.value, self.pp.value,
                    self.v.value, self.zero.value, self.precision.value, self.checkpointing.value,
                    self.sequence_parallel.value, cp=self.cp.value, ep=self.ep.value)

    def update(self):
        """Recompute and redraw; returns the ``Estimate`` (or the ``ValueError`` that the plan raised)."""
        try:
            self.result = estimate(self.models[self.model.value], self.plan(), self.cluster)
        except ValueError as error:
            self.result = error
            self.table.value = f"<b>not a valid plan:</b> {error}"
            return error
        self.table.value = as_html(self.result)
        return self.result


def as_html(est):
    """The estimate's terms as an HTML table (GB, seconds, shares)."""
    m = est.memory
    rows = [("Ψ (parameters)", f"{est.psi / 1e9:.3f} B"), ("Ψ on the busiest rank", f"{est.psi_rank / 1e9:.3f} B"),
            ("parameters", f"{m.parameters / 1e9:.2f} GB"), ("gradients", f"{m.gradients / 1e9:.2f} GB"),
            ("optimizer state", f"{m.optimizer / 1e9:.2f} GB"), ("activations", f"{m.activations / 1e9:.2f} GB"),
            ("unsharded in a pipeline (ZeRO-2/3)", f"{m.gathered / 1e9:.2f} GB"),
            ("total per rank", f"{m.total / 1e9:.2f} GB")]
    rows += [(f"sent per step, {k}", f"{v / 1e9:.3f} GB") for k, v in est.bytes_per_step.items()]
    rows += [("bubble", f"{est.bubble:.1%}")] + [(f"time, {k}", f"{v:.3f} s") for k, v in est.times.items()]
    rows += [("step time", f"{est.step_time:.3f} s"), ("MFU", f"{est.mfu:.1%}"),
             ("fits", "yes" if est.fits else est.reason)]
    return "<table>" + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows) + "</table>"
