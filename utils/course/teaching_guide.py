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
    broken = [m for p in paths for m in teaching_notes.problems(p, None if teaching_notes.is_lesson(p)
                                                                else lab_mistakes(p.stem))]
    if broken:  # a notebook without notes included ("has no metadata.course.teaching")
        raise ValueError("the teacher's notes are incomplete:\n" + "\n".join(broken))
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
        lines += teaching_notes.note_lines(p, rows[p.stem]["minutes"])
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
