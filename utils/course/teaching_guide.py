"""Writes TEACHING.md, the teacher's guide: every lesson and lab with its minutes, world sizes, cores
and memory, what to demo and what learners do alone, and one-, two- and three-day schedules built from the
minutes (utils/course/schedules.py). A maintainer tool, like utils/course/minutes.py; a test keeps TEACHING.md
equal to what this writes.

    python -m utils.course.teaching_guide           # rewrites TEACHING.md (make guide)
    python -m utils.course.teaching_guide --check   # exit 1 if TEACHING.md is stale

Where the numbers come from: minutes from each notebook's ``metadata.course.minutes`` and ``minutes_parts``
(utils/course/minutes.py: reading at 150 words a minute, code at 10 lines a minute, exercises at 10 minutes an
item or a lab's own estimate, all computed; the full-parameter run time, measured; or recorded workshops); world
sizes from its parameters cell and ``metadata.course.world_sizes``; peak memory from utils/course/run_minutes.json
(``make course`` samples the notebook's kernel and ranks). The labs' usual mistakes are their checkers' own
hint tables (utils/checkers/), so the guide names the mistakes the checker recognises, no more.
"""

import argparse
import importlib
import json
import math
import re
import sys

from . import minutes, observed, prerequisites, schedules, teaching_notes
from .notebook_runner import ROOT, course_metadata

GUIDE = ROOT / "TEACHING.md"

LEGACY_NOTES = {  # the old notes, for the notebooks whose metadata.course.teaching is not written yet
    "00_start_here": ("the first `%%ranks` cell, then a rank that crashes and one that hangs: the notebook survives both",
                      "the machine report and the exercises on `run_ranks`",
                      "Why does a hung rank not hang my notebook? (the launcher's timeout and its report.) Why gloo and "
                      "not NCCL here? (no GPU: the same cell picks NCCL on GPUs.)"),
    "01a_point_to_point_and_collectives": ("the ring of blocking sends that deadlocks, then `sendrecv`",
                                           "the collective pictures and their checks against torch",
                                           "Which collective is which (reduce-scatter vs all-gather)? Why does a "
                                           "blocking ring deadlock when every rank sends first?"),
    "01b_ring_all_reduce": ("the ring all-reduce from scratch against `dist.all_reduce`, and the ledger's bytes",
                            "busbw and the alpha-beta model; the exercises",
                            "Why 2(n-1)/n and not 2? Why is a timing on 2 shared cores not a network's bandwidth?"),
    "02a_ddp_from_scratch": ("DDP from scratch equal to one process; the bytes per rank measured",
                             "buckets and overlap measured on torch DDP; the exercises",
                             "Why average, not sum, the gradients? Why must every rank start from the same weights?"),
    "02b_ddp_in_practice": ("`no_sync` and the one table of our DDP, torch DDP and Lightning",
                            "samplers and sharded streams",
                            "What does `no_sync` save, and what does it cost in memory? Why does a sampler need "
                            "`set_epoch`?"),
    "03_zero_from_scratch": ("ZeRO-1, -2, -3 on the memory ledger beside the paper's formulas",
                             "the memory calculator; the exercises",
                             "Why does ZeRO-3 send 3Ψ and ZeRO-1/2 2Ψ? Where do mixed-precision Adam's 16 bytes "
                             "a parameter come from?"),
    "04a_fsdp2_zero_redundancy": ("`fully_shard` block by block, compared with lesson 03's and one process",
                                  "`ZeroRedundancyOptimizer` and the torchrun script",
                                  "What is a unit of FSDP2 and why shard block by block? What happens to a tied "
                                  "weight?"),
    "04b_dtensor_meta_checkpoints": ("a DTensor's placements and `redistribute`; a model built on the meta device",
                                     "the sharded checkpoint saved at one world size and loaded at another",
                                     "Where is the data of a meta tensor? (nowhere: shapes only.) Why can a DCP "
                                     "checkpoint load at another world size?"),
    "04c_fsdp2_overlap_and_accumulation": ("`reshard_after_forward` True, False and an int: bytes sent and kept, beside "
                                           "the formulas; prefetch read from a profile",
                                           "HSDP's bytes per mesh dim; accumulation with `set_requires_gradient_sync`",
                                           "What does `reshard_after_forward=False` trade? Why is accumulation not "
                                           "pipeline micro-batching?"),
    "05a_tensor_parallelism": ("the naive split's idle ranks, then Megatron's f and g on one MLP",
                               "the attention heads split; the checks against the unsplit model",
                               "Why column then row, and not row then column? Why 2 all-reduces forward and 2 "
                               "backward per layer?"),
    "05b_dtensor_and_sequence_parallelism": ("`parallelize_module` with `CommDebugMode` counting the same collectives",
                                             "sequence parallelism and its activation memory; the torchrun script",
                                             "Why must every tensor-parallel rank see the same input? What does "
                                             "sequence parallelism save, and what does it not?"),
    "06a_pipeline_schedules": ("GPipe and 1F1B from scratch, equal to one process",
                               "the schedules as op lists; the torchrun script",
                               "Why micro-batches? Why does 1F1B not shrink the bubble, only the memory?"),
    "06b_pipeline_bubble": ("a per-rank timeline as a Gantt chart, the bubble beside (p-1)/(m+p-1)",
                            "the schedule explorer; activation memory; interleaved 1F1B",
                            "Why is the measured bubble larger than the formula on a loaded machine? What does "
                            "interleaving cost?"),
    "06c_zero_bubble": ("B and W computed apart on a linear layer, equal to autograd; ZB-H1 beside 1F1B in the simulator",
                        "the memory count per stage; torch's ZBV and DualPipeV against one process",
                        "Why can W wait and B not? Why does ZB-H1 not raise the per-device peak memory, and what "
                        "does it raise?"),
    "07a_deepspeed_config": ("the tutorial example that cannot run, then `deepspeed.initialize` that does",
                             "the config checker; what `auto_cast` casts",
                             "Why does DeepSpeed not complain about a misspelt key? Why no C++ op compiled here?"),
    "07b_deepspeed_zero": ("ZeRO stages 0-3 beside lesson 03's formulas and DeepSpeed's estimators",
                           "offload; bf16 and fp16",
                           "Why does fp16 need a loss scale and bf16 not? What does offload trade?"),
    "07c_deepspeed_features": ("one feature (accumulation or clipping) checked against one process",
                               "the rest of the features; the activation-checkpointing trap; the pipeline engine",
                               "Why is a reentrant checkpoint a trap here? How do I get one fp32 file out of a "
                               "ZeRO checkpoint?"),
    "08a_lightning_strategies": ("one `LightningModule` under `ddp_notebook`, same losses as our DDP",
                                 "the other strategies; callbacks under DDP; the script",
                                 "Why `ddp_notebook` in Jupyter and `ddp` in a script? Which strategies need a GPU?"),
    "08b_lightning_speedups": ("one speed-up measured alone, beside its claim",
                               "the others; the GPU benchmark where a GPU is present",
                               "Why does a speed-up measured on a CPU not transfer to a GPU (and the reverse)?"),
    "08c_lightning_accumulation_and_tp": ("`accumulate_grad_batches` equal to the large batch, and its one all-reduce "
                                          "per step under DDP",
                                          "tensor parallelism in `configure_model` under `ModelParallelStrategy`; "
                                          "`fsdp`/`deepspeed` on a GPU",
                                          "How does accumulation differ from a pipeline's micro-batches? Why must the "
                                          "tied weight be split the same way in both layers?"),
    "08d_fp8_numerics": ("the format table beside torch.finfo, then the outlier rows lost under one scale and kept "
                         "per row",
                         "the amax history's spike, Float8Linear against torch._scaled_mm, the recipes' error table",
                         "Why e4m3 for gradients when e5m2 has the range? (once scaled, range matters less than a "
                         "mantissa bit.) Why is nothing here faster? (the FP8 matmul is simulated in fp32 on a CPU.)"),
    "09a_3d_mesh": ("one `DeviceMesh` with dp, pp, tp and the fixed order of wrapping",
                    "every mesh of the world size, equal to one process",
                    "Why tensor parallelism inside a node and pipelines across nodes? Why this wrapping order?"),
    "09b_3d_costs_and_planner": ("the memory and bytes per mesh dimension beside the planner's terms",
                                 "the planner against published figures; the exercises",
                                 "Why does the planner's memory differ from a real GPU's? (allocator, fragmentation, "
                                 "kernels' workspaces: it states what it leaves out.)"),
    "09c_activation_recompute": ("none, full and selective checkpointing of the capstone's layers: bytes kept and "
                                 "FLOPs, exactly the planner's terms",
                                 "the time of each mode; Llama-2-7B with eager and flash attention; the exercises",
                                 "Why does selective recompute save nothing with flash attention? Why do saved-tensor "
                                 "hooks miss what selective checkpointing keeps?"),
    "10_torchrun_and_slurm": ("torchrun started from the notebook with a timeout; two agents as two nodes",
                              "the fake Slurm job's environment; the sbatch template",
                              "How do the nodes find each other (rendezvous)? Why does killing torchrun's process "
                              "group miss its workers? (each worker runs in a session of its own.)"),
    "11a_failures_and_resume": ("a rank killed with SIGKILL, the run resumed bit for bit",
                                "`--max-restarts` and two agents; what breaks the equality",
                                "What must a checkpoint hold besides the weights (optimizer, data position, "
                                "random state)?"),
    "11b_hangs_and_profiles": ("a hang read with the timeout report and `TORCH_DISTRIBUTED_DEBUG=DETAIL`",
                               "the profile of a DDP step (a trace to open in Perfetto)",
                               "How do I tell which rank is stuck, and on which collective?"),
    "12a_fx_trace_and_cost": ("the transformer traced with `torch.fx`, and what a symbolic trace cannot do",
                              "the cost pass against the course's formulas; balanced pipeline stages",
                              "Why does a symbolic trace fail on data-dependent control flow? Why balance stages "
                              "by cost and not by layer count?"),
    "12b_fx_rewrite_and_export": ("tensor parallelism as a graph rewrite, equal to lesson 05's layers by hand",
                                  "`torch.export` and the pipelining tracer",
                                  "What does `torch.export` capture that a symbolic trace does not (and the "
                                  "reverse)?"),
    "13a_frameworks_one_process": ("lesson 02's step in TensorFlow, equal to torch DDP",
                                   "the probe of `HierarchicalCopyAllReduce`",
                                   "Is this the same algorithm as torch DDP? (the same arithmetic, checked.)"),
    "13b_frameworks_workers_horovod": ("the step in worker processes through `TF_CONFIG`",
                                       "the parameter server; Horovod's API over `torch.distributed`",
                                       "Why do updates in turn (a parameter server without sync) differ from DDP?"),
    "14_context_parallelism": ("four key blocks merged in a scrambled order give SDPA's output, then the ring "
                               "checked against one process at 2, 3 and 4 ranks",
                               "the bytes cells and the causal-work table: contiguous against zig-zag",
                               "Why is the merge exact in any order? Why does the ring send about the same bytes per "
                               "rank whatever n, while Ulysses sends less as n grows? Why can Ulysses not use more "
                               "ranks than heads?"),
    "15_expert_parallelism": ("the three all-to-alls of the expert-parallel layer, equal to one process, then the "
                              "ledger's bytes per token beside 2kh(n-1)/n and the Mixtral figure",
                              "the capacity and dropped-tokens table, the balancing loss, the 2 x 2 mesh",
                              "Why does a capacity factor of 1 drop tokens? (a random router is unbalanced.) Why "
                              "does DeepSpeed's auxiliary loss differ from Switch's? (no alpha, first choices only.)"),
}
LAB_NOTE = ("the goal and the check cell on the stub (it answers 'not written yet')",
            "the whole lab: the checker grades it and names the mistake")

def stem_path(stem):
    for folder in ("notebooks", "labs"):
        if (path := ROOT / folder / f"{stem}.ipynb").exists():
            return path
    raise KeyError(f"{stem}: no notebooks/{stem}.ipynb or labs/{stem}.ipynb "
                   "(renamed? update utils/course/teaching_guide.py)")


def schedule_name(title):
    """A schedule's short name (``make preflight SCHEDULE=...``): its title before the colon, "one-day"."""
    return title.split(":")[0].replace(" ", "-")


def schedule_stems(name):
    """The notebooks schedule ``name`` uses, labs included (utils/course/schedules.PLANS); "all": every one."""
    if name == "all":
        return [p.stem for p in minutes.notebooks()]
    for title, plan in schedules.PLANS.items():
        if schedule_name(title) == name:
            return [stem for day in plan for stem in day]
    raise KeyError(f"no schedule {name!r}; the schedules are all, "
                   f"{', '.join(schedule_name(t) for t in schedules.PLANS)} (utils/course/schedules.py)")


def measured_peak(stem, data):
    """The notebook's peak resident memory in bytes as ``make course`` measured it (``peak_memory_mb`` in
    utils/course/run_minutes.json: notebook_runner.PeakMemory's largest sum over papermill, the kernel and its ranks,
    sampled every 0.5 s at full parameters, so a shorter spike may be missed; shared pages counted in every
    process, an upper bound on them), or None where it was not measured."""
    mib = data["notebooks"].get(minutes.key(stem_path(stem)), {}).get("peak_memory_mb")
    return mib * 2**20 if mib else None


def default_world_size(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            found = re.search(r"^WORLD_SIZE\s*=\s*(\d+)", "".join(cell["source"]), re.M)
            return int(found.group(1)) if found else None
    return None


def row(path, data):
    course = course_metadata(path)
    parts = course.get("minutes_parts", {})
    n = default_world_size(path)
    entry = data["notebooks"].get(minutes.key(path), {})
    peak = measured_peak(path.stem, data)
    return {
        "key": minutes.key(path), "minutes": course.get("minutes"), "parts": parts, "world_size": n,
        "world_sizes": course.get("world_sizes") or "1-8", "cores": n and f"{math.ceil(n / 2)}-{n}",
        "memory": f"{peak / 2**30:.1f} GiB" if peak else "not measured", "seconds": entry.get("seconds"),
        "run": run_measured(minutes.key(path), data), "workshops": len(entry.get("workshops", [])),
    }


def run_measured(key, data):
    """How a notebook's run time was measured, for the table: seconds, date, the load of the 2-core machine."""
    entry = data["notebooks"].get(key, {})
    if entry.get("seconds") is None:
        return f"not measured (estimate {entry.get('estimate_minutes', 0)} min)"
    run = observed.measuring_run(data, key)
    load = f", load {run['load_average_1_5_15'][0]:.1f}" if run else ""
    return f"{entry['seconds']:.0f} s ({entry.get('measured_at', '?')[:10]}{load})"


def figures_section(data, paths):
    """Where each figure comes from: measured (from what run, on which machine) or computed (by which rule)."""
    cores = sorted({r["cores"] for r in data.get("runs", [])})
    labs = [(p.stem, course_metadata(p).get("task_minutes")) for p in paths if p.parent.name == "labs"]
    stated = "; ".join(f"{stem} {t['minutes']} (\"{t['stated'].replace('**', '')}\")"
                       for stem, t in labs if t)
    default = ", ".join(stem for stem, t in labs if not t)
    return [
        "## Where the figures come from", "",
        "Measured:", "",
        "- **Running**: papermill's duration of the whole notebook at its own parameters (its default "
        "`WORLD_SIZE`; a lab with its reference solution), by `make course` on a machine with "
        f"{' or '.join(map(str, cores))} cores shared with other jobs, so an upper bound for a laptop; the table "
        "gives each run's date and the machine's 1-minute load average at the moment `--measured` stored the batch, "
        "after all its notebooks had run: how busy the machine still was then, not a reading taken during each "
        "notebook (a figure above the core count says other jobs were running at that moment). `python -m utils.course.minutes --measured build/course` stores them in "
        "`utils/course/run_minutes.json`.",
        "- **Memory**: the peak resident memory of the notebook's kernel and ranks, sampled by the same run.",
        "- **Workshops**: where a teacher has recorded a workshop (below), the minutes the room took.", "",
        "Computed from the notebook's text (`make minutes` prints the words, lines and parts of each):", "",
        f"- **Reading**: the words of the markdown cells at {minutes.WORDS_PER_MINUTE} a minute.",
        f"- **Code**: the non-blank lines of the code cells, and of the `utils` source a cell prints, at "
        f"{minutes.LINES_PER_MINUTE} a minute.",
        f"- **Exercises**: a lesson's numbered exercises at {minutes.EXERCISE_MINUTES} minutes each (one that sends "
        "to a lab not counted). A lab's tasks: the lab's stated estimate, the upper end of the sentence its first "
        "cell used to state (`metadata.course.task_minutes`), taken as the minutes of its tasks alone; its reading, "
        f"code and running are added to it as for a lesson: {stated}"
        + (f"; else {minutes.LAB_TASK_MINUTES} per `## YOUR CODE` block: {default}." if default else "."),
        f"- **Minutes**: the four parts' sum rounded up to a multiple of 5, or the median of the recorded "
        f"workshops rounded up to 5. The first cell of each notebook states the same figure, and no other time "
        f"(a test checks both). At most {minutes.MAX_MINUTES}, one session.", "",
        "**Record a workshop.** After the day, write one row per notebook taught, in a CSV file:", "",
        "```", ",".join(observed.COLUMNS), "02a_ddp_from_scratch,85,12,2026-12-01,exercises 1-3 only", "```", "",
        "`minutes`: from opening the notebook until most of the room had finished its exercises (a lab: its "
        "tasks), breaks left out; `learners`: how many took part. `python -m utils.course.minutes --record "
        "FILE` stores the rows in `utils/course/run_minutes.json` and writes the notebooks' first cells again; "
        "`make guide` then rewrites this page and its schedules with them. Send the change (or the CSV) upstream.", "",
        "`make course` runs every notebook at full parameters; `make guide` rewrites this page. `make test-catch-up` "
        "runs each notebook alone from a fresh copy of the course: a learner who falls behind can start at any "
        "lesson.", ""]


def lab_mistakes(stem):
    """The mistakes the lab's checkers recognise, from their hint tables (via utils.checkers.labs)."""
    from utils.checkers.labs import LABS

    names = []
    for part in LABS[stem].parts:
        module = importlib.import_module(f"utils.checkers.{part.check.split(':')[0]}")
        for attr in dir(module):
            if attr.endswith("HINTS") and isinstance(getattr(module, attr), dict):
                names += [m for m in getattr(module, attr) if m not in names]
    return names


def title(path):
    """The notebook's title, from its first line (``# 05b · DTensor and sequence parallelism: ...``)."""
    first = json.loads(path.read_text())["cells"][0]["source"]
    return "".join(first).split("\n")[0].lstrip("# ").split(" · ", 1)[-1]


def render():
    data = minutes.load_data()
    paths = minutes.notebooks()
    rows = {p.stem: row(p, data) for p in paths}
    written = [p for p in paths if teaching_notes.has_notes(p)]
    broken = [m for p in written for m in teaching_notes.problems(p, None if teaching_notes.is_lesson(p)
                                                                  else lab_mistakes(p.stem))]
    if broken:
        raise ValueError("the teacher's notes are incomplete:\n" + "\n".join(broken))
    unwritten = [p.stem for p in paths if p not in written and p.stem not in LEGACY_NOTES and p.parent.name != "labs"]
    if unwritten:
        raise KeyError(f"no teaching notes for {', '.join(unwritten)}: write metadata.course.teaching "
                       "(utils/course/teaching_notes.py)")
    lines = ["# Teaching the course: a guide for workshops", "",
             "<!-- Written by utils/course/teaching_guide.py (`make guide`) from the notebooks' stated minutes; "
             "edit that file, not this one. -->", "",
             "For a teacher preparing a one-, two- or three-day workshop on a shared GPU box, a JupyterHub or a Slurm "
             "cluster. Run time and memory below are measured; reading, code and exercise minutes are computed "
             "from the notebooks' text, and replaced by what real workshops took once a teacher records them (which "
             "is which, and from what: the end of this page). The schedules are built from those minutes, so they "
             "hold as long as the notebooks do. The room itself (`make preflight USERS=N` checks the "
             "box, `make hub USERS=N` serves the course to N learners, `make slurm-recipe` prints the cluster's "
             "reservation, jobs and SSH tunnel): the README's \"Teaching a workshop\".", "",
             "## Every lesson and lab", "",
             "Minutes: the whole sitting, the figure each notebook's first cell states: reading + code + running + "
             "exercises (whole minutes, each rounded so that they add up to the rounded sum), or recorded workshops "
             "where marked. Run measured: the full-parameter run behind the running minutes. Ranks: the notebook's default `WORLD_SIZE` "
             "(and the sizes it accepts). Cores: a rank a core runs at full speed; the launcher accepts up to two "
             "ranks a core. Memory: the peak resident memory of the notebook's kernel and ranks together at full "
             "parameters, sampled every 0.5 s (a shorter spike may be missed; shared libraries counted once per "
             "process: an upper bound on those).", "",
             "| notebook | minutes (read / code / run / exercises) | run measured | ranks (accepted) | cores | memory |",
             "| --- | --- | --- | --- | --- | --- |"]
    for p in paths:
        r = rows[p.stem]
        q = r["parts"]
        split = " / ".join(str(v) for v in minutes.whole_minutes(q).values()) if q else "-"
        split += f"; {r['workshops']} workshop{'s' * (r['workshops'] > 1)}" if r["workshops"] else ""
        sizes = ", ".join(map(str, r["world_sizes"])) if isinstance(r["world_sizes"], list) else r["world_sizes"]
        lines.append(f"| [{r['key']}]({r['key']}) | {r['minutes']} ({split}) | {r['run']} | {r['world_size'] or '-'} ({sizes}) | "
                     f"{r['cores'] or '-'} | {r['memory']} |")
    lines += ["", "## What to demo, what learners do alone, the usual questions", "",
              "For each notebook: the demo and its share of the sitting (the rest is the learners' own work), the "
              "questions that come up with their answers, the problems a room meets with their fixes; for a lab, the "
              "mistakes learners make most. The answers to every lesson's exercises are in the instructor keys, "
              "`labs/solutions/keys/<lesson>.md` (not in the student release).", ""]
    for p in paths:
        if teaching_notes.has_notes(p):
            lines += teaching_notes.note_lines(p, rows[p.stem]["minutes"])
        elif p.parent.name == "notebooks":
            demo, alone, questions = LEGACY_NOTES[p.stem]
            lines += [f"**{p.stem}.** Demo: {demo}. Alone: {alone}. Questions: {questions} (Its full notes, with "
                      "answers, are not written yet.)", ""]
        else:
            mistakes = ", ".join(f"`{m}`" for m in lab_mistakes(p.stem))
            lines += [f"**{p.stem}.** Demo: {LAB_NOTE[0]}. Alone: {LAB_NOTE[1]}. Where learners go wrong (the "
                      f"mistakes its checker names, each with a hint): {mistakes}. (Its notes in words are not "
                      "written yet.)", ""]
    lines += teaching_notes.quiz_lines(paths)
    lines += teaching_notes.gpu_lines(paths, {s: r["world_size"] for s, r in rows.items()})
    lines += teaching_notes.fallback_lines(paths, {s: r["world_sizes"] for s, r in rows.items()})
    by_stem = {p.stem: p for p in paths}
    lines += schedules.markdown({s: r["minutes"] for s, r in rows.items()},
                                {p.stem: prerequisites.declared(p) for p in paths}, {p.stem: title(p) for p in paths},
                                lambda stems: teaching_notes.day_check_lines(stems, by_stem))
    lines += ["## Memory per plan", ""]
    for plan in schedules.PLANS:
        peaks = {s: measured_peak(s, data) or 0 for s in schedule_stems(schedule_name(plan))}
        top = max(peaks, key=peaks.get)
        lines.append(f"- {plan[0].upper()}{plan[1:]}: its largest notebook, {top}, peaks at "
                     f"{peaks[top] / 2**30:.1f} GiB; `make preflight USERS=N SCHEDULE={schedule_name(plan)}` asks "
                     "that of the box for each learner, plus at least one kernel left running (with its rank server).")
    lines.append("")
    lines += checkers_section()
    lines += figures_section(data, paths)
    return "\n".join(lines)


def checkers_section():
    """How well each lab's checker catches wrong answers: the recorded `make mutants` runs."""
    from .mutants import scores

    return (["## How well the checkers catch wrong answers", "",
             "`make mutants` mutates each lab's reference solution (an operator, a comparison, a constant off by one, "
             "swapped arguments, a dropped statement), runs the lab's checker on every mutant, and sends each one it "
             "accepts to a one-process oracle: the same results on the checker's inputs and on larger ones make it "
             "equivalent, anything else is a miss. A rejection is *named* when the learner is told which mistake "
             "(any of the lab's names but the generic `crash`). Recorded runs (`utils/course/mutation_scores.json`):",
             ""] + scores.table_lines() + [""]
            + (["Every mutant not rejected with a named mistake, with what the oracle or the checker said:", ""]
               + scores.details_lines() + [""] if scores.details_lines() else []))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if TEACHING.md differs from what would be written")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not GUIDE.exists() or GUIDE.read_text() != text:
            print("TEACHING.md is stale: run `make guide`")
            return 1
        return 0
    GUIDE.write_text(text)
    print(f"wrote {GUIDE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
