"""How long each notebook takes a learner, from its text, its measured run time and real workshops (a maintainer tool).

    python -m utils.course.minutes            # a table: words, code lines, the four parts, total; flags > 90
    python -m utils.course.minutes --write    # stores metadata.course.minutes (+ minutes_parts), states it in cell 1
    python -m utils.course.minutes --measured build/course   # copies `make course`'s durations into the data file
    python -m utils.course.minutes --record workshop.csv     # a workshop's real minutes (format: utils/course/observed.py)

The four parts, in minutes. Only running is measured; the other three are computed from the text by the rules
below (each is the one the unit test, tests/test_course_minutes.py, holds the notebooks to):

- reading (computed): the words of the markdown cells (whitespace-separated, formulas and links included) / 150;
- code (computed): the code the learner reads, at 10 lines a minute. Counted: every non-blank line of every code
  cell, comment lines included (they are read too), plus the non-blank lines of each utils function or class a
  cell prints with ``Code(inspect.getsource(f))``, found statically with ast (see printed_source_lines; the
  table's ``printed`` column; a name it cannot resolve is listed and not counted);
- running (measured): the notebook's full-parameter run time from utils/course/run_minutes.json (``make course``,
  papermill's duration on a shared 2-core machine: an upper bound). A notebook not measured there uses the data
  file's stated estimate, and the table flags it (``est``);
- exercises (computed, or a lab's stated estimate): for a lesson, the numbered items of its last "## Exercises" (or
  "**Exercises**") section at EXERCISE_MINUTES each (an item that sends the learner to a lab is not counted: the
  lab has its own time). For a lab, the lab's stated estimate, ``metadata.course.task_minutes`` (the upper end
  of the sentence its first cell once stated, kept in ``stated``), used as the tasks' minutes, reading, code and
  running added to it; else LAB_TASK_MINUTES per ``## YOUR CODE`` block.

The total is the sum, rounded up to a multiple of 5; where workshops have been recorded (--record), the median
of their minutes, rounded up to 5, replaces it (flagged STALE where the computed total has since moved by more
than 20%: utils/course/observed.py). A repository hook wants it at most 90 (MAX_MINUTES). --write
states it once, in cell 1's **Time** paragraph; no other sentence of a notebook may state how long it takes
(second_times, which a test runs on every notebook). Running under a minute is said as "under a minute", whatever
its rounding; the other parts' whole minutes then add up to their own rounded sum (whole_minutes).
"""

import argparse
import functools
import json
import math
import re
import sys
from pathlib import Path

from . import observed

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).with_name("run_minutes.json")
WORDS_PER_MINUTE = 150
LINES_PER_MINUTE = 10
EXERCISE_MINUTES = 10    # one lesson exercise: read it, change a cell or two, re-run them (minutes of running)
LAB_TASK_MINUTES = 20    # one "## YOUR CODE" block, where a lab states no time of its own
MAX_MINUTES = 90
PARTS = ("reading", "code", "running", "exercises")
TIME_LINE = "**Time**:"  # the paragraph of the first cell that --write owns
OWN = re.compile(r"^" + re.escape(TIME_LINE) + r" about \d+ minutes\b.*$", re.M)


def notebooks():
    return sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))


def key(path):
    path = Path(path)
    return f"{path.parent.name}/{path.name}"


def source(cell):
    s = cell["source"]
    return s if isinstance(s, str) else "".join(s)


def is_lab(path):
    return Path(path).parent.name == "labs"


def markdown_words(nb):
    """Words of the markdown cells, less the **Time** paragraph that --write adds (so that writing it changes no figure)."""
    return sum(len(OWN.sub("", source(c)).split()) for c in nb["cells"] if c["cell_type"] == "markdown")


def cell_code_lines(nb):
    return sum(1 for c in nb["cells"] if c["cell_type"] == "code"
               for line in source(c).splitlines() if line.strip())


def code_lines(nb):
    """What the learner reads as code: the code cells' non-blank lines, and the utils source the cells print."""
    return cell_code_lines(nb) + printed_source_lines(nb)[0]


def getsource_cells(nb):
    return sum("getsource(" in source(c) for c in nb["cells"] if c["cell_type"] == "code")


@functools.lru_cache(maxsize=None)
def utils_definitions():
    """{name: [(module, non-blank lines)]} for every top-level function and class of the course's utils package,
    read with ast (nothing is imported)."""
    import ast
    index = {}
    for file in sorted((ROOT / "utils").rglob("*.py")):
        text = file.read_text()
        lines = text.splitlines()
        module = ".".join(file.relative_to(ROOT).with_suffix("").parts)
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                body = lines[start - 1:node.end_lineno]
                index.setdefault(node.name, []).append((module, sum(1 for line in body if line.strip())))
    return index


def printed_source_lines(nb, index=None):
    """(lines, unresolved): the non-blank lines of the utils functions a notebook prints with
    ``inspect.getsource(f)``, found statically: f's module from the notebook's ``from utils.M import f``, or
    its dotted name, or the only definition of that name in utils; or a whole module, ``from utils.M import m``. A name defined in the notebook itself is
    already counted with its cell; one that cannot be resolved is listed, not counted."""
    index = utils_definitions() if index is None else index
    code = "\n".join(source(c) for c in nb["cells"] if c["cell_type"] == "code")
    imported = {}
    for m in re.finditer(r"^\s*from\s+(utils[\w.]*)\s+import\s+(\([\w\s,]+\)|[\w ,]+)", code, re.M):
        for name in re.split(r"[\s,]+", m.group(2).strip("() \n")):
            if name:
                imported[name] = m.group(1)
    defined_here = set(re.findall(r"^\s*(?:def|class)\s+(\w+)", code, re.M))
    total, unresolved = 0, []
    for expr in re.findall(r"getsource\(\s*([\w.]+)\s*\)", code):
        *prefix, name = expr.split(".")
        if not prefix and name in defined_here:
            continue
        candidates = index.get(name, [])
        if prefix:
            candidates = [c for c in candidates if c[0].endswith(".".join(prefix))] or candidates
        elif name in imported:
            candidates = [c for c in candidates if c[0] == imported[name]] or candidates
        module = ROOT / Path(*imported.get(name, "").split("."), name + ".py") if not prefix and name in imported else None
        if module is not None and module.is_file():  # a whole utils module: ``from utils.mesh import context4d``
            total += sum(1 for line in module.read_text().splitlines() if line.strip())
        elif len(candidates) == 1:
            total += candidates[0][1]
        elif (lines := library_source_lines(code, expr)) is not None:
            total += lines
        else:
            unresolved.append(expr)
    return total, unresolved


def library_source_lines(code, expr):
    """Non-blank lines of a library's function that a notebook prints (e.g. DeepSpeed's own
    ``DeepSpeedEngine._cast_inputs_half``), its head name imported by a ``from M import name`` line of the
    notebook: this one imports M (the library is installed beside the course), or None if it cannot."""
    import importlib
    import inspect
    head, *rest = expr.split(".")
    found = re.search(rf"^\s*from\s+([\w.]+)\s+import\s+(?:\([^)]*\b{head}\b|[\w ,]*\b{head}\b)", code, re.M)
    if not found or found.group(1).split(".")[0] == "utils":
        return None
    try:
        obj = getattr(importlib.import_module(found.group(1)), head)
        for part in rest:
            obj = getattr(obj, part)
        return sum(1 for line in inspect.getsource(obj).splitlines() if line.strip())
    except Exception:  # noqa: BLE001 - not importable or no source: listed as unresolved
        return None


def exercise_items(nb):
    """The numbered items of the last markdown cell with an Exercises heading, items sending to a lab excluded."""
    heading = r"^(?:#+\s+Exercises\b|\*\*Exercises\*\*).*$"  # "## Exercises" or a bold "**Exercises**" line
    cells = [source(c) for c in nb["cells"] if c["cell_type"] == "markdown" and re.search(heading, source(c), re.M)]
    if not cells:
        return []
    text = re.split(heading, cells[-1], flags=re.M)[-1]
    text = re.split(r"^#+\s", text, flags=re.M)[0]  # up to the next heading
    items = re.split(r"^\d+\.\s+", text, flags=re.M)[1:]
    return [item for item in items if not re.match(r"\*\*Lab\b", item) and "labs/" not in item]


def lab_task_minutes(nb):
    """The lab's stated estimate, used as its tasks' minutes: metadata.course.task_minutes ({"minutes", "stated": the words it was
    stated in, "note"}), or None."""
    task = nb.get("metadata", {}).get("course", {}).get("task_minutes")
    return task["minutes"] if task else None


def exercise_minutes(path, nb):
    if is_lab(path):
        stated = lab_task_minutes(nb)
        if stated is not None:
            return stated
        return LAB_TASK_MINUTES * sum(source(c).count("## YOUR CODE") for c in nb["cells"] if c["cell_type"] == "code")
    return EXERCISE_MINUTES * len(exercise_items(nb))


def load_data(path=DATA):
    return json.loads(Path(path).read_text()) if Path(path).exists() else {"notebooks": {}}


def run_minutes(path, data):
    """(minutes, measured?) from the data file: its measured seconds, else its stated estimate, else 0 (flagged)."""
    entry = data.get("notebooks", {}).get(key(path), {})
    if entry.get("seconds") is not None:
        return entry["seconds"] / 60, True
    return entry.get("estimate_minutes", 0), False


def parts(path, data=None, nb=None):
    """{"reading", "code", "running", "exercises"} in minutes (one decimal), and the facts behind them."""
    data = load_data() if data is None else data
    nb = json.loads(Path(path).read_text()) if nb is None else nb
    running, measured = run_minutes(path, data)
    p = {"reading": markdown_words(nb) / WORDS_PER_MINUTE, "code": code_lines(nb) / LINES_PER_MINUTE,
         "running": running, "exercises": exercise_minutes(path, nb)}
    printed, unresolved = printed_source_lines(nb)
    facts = {"words": markdown_words(nb), "lines": cell_code_lines(nb), "printed": printed,
             "unresolved": unresolved, "measured": measured}
    return {k: round(v, 1) for k, v in p.items()}, facts


def total(p):
    """The computed total: the four parts' sum, rounded up to a multiple of 5."""
    return int(5 * math.ceil(sum(p.values()) / 5))


def figure(path, data, p):
    """(minutes, workshops): the one time a notebook states. The median of its recorded workshops (rounded up to
    5) where there are any, else the computed total of its parts ``p``."""
    recorded, workshops = observed.workshop_minutes(data.get("notebooks", {}).get(key(path), {}))
    return (recorded, workshops) if workshops else (total(p), 0)


def whole_minutes(p):
    """The parts in whole minutes that add up to the rounded sum (largest remainders round up), so that the
    paragraph's parts never add up to more than the total it states. A run under a minute is 0 here (the paragraph
    says "under a minute"), and the other three add up to their own rounded sum: its seconds are lent to no part."""
    sub_minute = p["running"] < 1
    shown = [k for k in PARTS if not (sub_minute and k == "running")]
    floors = {k: math.floor(p[k]) if k in shown else 0 for k in PARTS}  # in PARTS order (ties go to the first)
    short = round(sum(p[k] for k in shown)) - sum(floors.values())
    for k in sorted(shown, key=lambda k: p[k] - floors[k], reverse=True)[:max(short, 0)]:
        floors[k] += 1
    return floors


def time_paragraph(path, minutes, p, workshops=0):
    """The **Time** paragraph, in a learner's words: the total, then what it is made of."""
    w = whole_minutes(p)
    running = "under a minute running the cells" if p["running"] < 1 else f"{w['running']} running the cells"
    split = (f"{w['reading']} reading, {w['code']} on the code, {running}, {w['exercises']} on the "
             f"{'tasks' if is_lab(path) else 'exercises'}")
    if workshops:
        took = "as a workshop took it" if workshops == 1 else f"the median of {workshops} workshops"
        return f"{TIME_LINE} about {minutes} minutes, {took} (from the text alone about {total(p)}: {split})."
    return f"{TIME_LINE} about {minutes} minutes ({split})."


def stated_minutes(first_cell):
    """The total the first cell states (from its **Time** paragraph), or None."""
    m = re.search(re.escape(TIME_LINE) + r" about (\d+) minutes", first_cell)
    return int(m.group(1)) if m else None


# A sentence that says how long a notebook, or running it, takes. In the first cell: any duration (minutes, hours,
# "half an hour", "1h15", seconds), besides its one **Time** paragraph. In every markdown cell: a run time, and a
# duration in a sentence about the lesson, the notebook, the lab, its exercises or tasks (a budget, an estimate, a
# "**Time**" line). Technical durations elsewhere (a 30 s timeout, gloo's 30-minute default, pip giving up after
# 46 minutes) are not the notebook's; nor are the times of single cells in code comments (07c, 08a keep theirs:
# code cells are not read).
DURATION = (r"(?:\b\d+(?:\.\d+)?(?:\s*-\s*\d+(?:\.\d+)?)?\s*(?:min|mins|minutes?|hours?|hrs?)\b|\b\d+\s*h\s*\d*\b|"
            r"\bhalf an hour\b|\b(?:an|one|a) (?:hour|minute)\b)")
HEADER_TIME = re.compile(r"[^\n.;]*(?:" + DURATION + r"|(?:\babout|~|\btakes?)\s*\d+(?:\.\d+)?\s*s\b|\bEstimated time\b|\*\*Tasks\*\*)[^\n.;]*", re.I)
RUN_TIME = re.compile(r"[^\n.;]*(?:\brun(?:ning)? time\b|\b(?:whole|this) notebook takes\b|\bEstimated time\b|"
                      + re.escape(TIME_LINE) + r"|\*\*Time\*\*)[^\n.;]*", re.I)
BUDGET = re.compile(r"[^\n.;]*(?:" + DURATION + r"[^\n.;]*\b(?:lessons?|notebooks?|labs?|exercises?|tasks?|in all)\b|"
                    r"\b(?:lessons?|notebooks?|labs?|exercises?|tasks?|budget|allow|plan on)\b[^\n.;]*" + DURATION
                    + r")[^\n.;]*", re.I)


def second_times(nb):
    """[(cell index, phrase)] of every sentence that states a time besides the generated **Time** paragraph, which
    the first cell holds exactly once (a second one is reported too)."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = source(cell)
        if i == 0:  # the one generated paragraph is the header's own; only here, and only once
            own = [m.group(0) for m in OWN.finditer(text)]
            found += [(0, extra) for extra in own[1:]]
            text = OWN.sub("", text)
        phrases = [m.group(0).strip() for pattern in ([HEADER_TIME, RUN_TIME, BUDGET] if i == 0 else
                                                      [RUN_TIME, BUDGET])
                   for m in pattern.finditer(text)]
        # a phrase several patterns match, once (the longer: "1.5 min" is not also reported as "1")
        found += [(i, a) for a in dict.fromkeys(phrases) if not any(a != b and a in b for b in phrases)]
    return found


def restate(path, first, minutes, p, workshops=0):
    """The first cell with its time said once, as the tool computes it: its **Time** paragraph (re)written before
    the one that says what the learner needs (else at the end)."""
    new = re.sub(r"\n*" + OWN.pattern + r"\n?", "\n", first, flags=re.M)
    line = time_paragraph(path, minutes, p, workshops)
    paragraphs = re.split(r"\n\s*\n", new.strip("\n"))
    at = next((i for i, s in enumerate(paragraphs) if re.search(r"\*\*(What you need|You need)\*\*", s)),
              len(paragraphs))
    paragraphs.insert(at, line)
    return "\n\n".join(paragraphs) + ("\n" if first.endswith("\n") else "")


def write(path, data):
    nb = json.loads(Path(path).read_text())
    p, _ = parts(path, data, nb)
    minutes, workshops = figure(path, data, p)
    course = nb["metadata"].setdefault("course", {})
    course["minutes"], course["minutes_parts"] = minutes, p
    first = source(nb["cells"][0])
    new = restate(path, first, minutes, p, workshops)
    nb["cells"][0]["source"] = new.splitlines(keepends=True)
    Path(path).write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"{key(path)}: minutes = {minutes}" + (f" (from {workshops} workshop(s))" if workshops else "")
          + ("" if new == first else f"\n    + {time_paragraph(path, minutes, p, workshops)!r}"))


def record_measured(build_dir, data_path=DATA, memory_only=False):
    """``make course``'s run times and memory into the data file (utils/course/observed.py)."""
    observed.record_measured(build_dir, data_path, key, memory_only)


def table(data):
    rows = []
    print(f"{'notebook':<50} {'words':>6} {'lines':>6} {'printed':>7} {'read':>5} {'code':>5} {'run':>5} {'ex':>5} "
          f"{'total':>5} {'stated':>6}")
    for path in notebooks():
        p, f = parts(path, data)
        t, workshops = figure(path, data, p)
        status = data.get("notebooks", {}).get(key(path), {}).get("status", "")
        stale = observed.stale_workshops(data.get("notebooks", {}).get(key(path), {}), total(p))
        flags = ("" if f["measured"] else " est") + (" >90" if t > MAX_MINUTES else "") + \
            (f" from {workshops} workshop(s)" if workshops else "") + \
            (f" STALE: {len(stale)} workshop(s) timed a lesson whose computed total has since moved by over "
             f"{observed.STALE_FRACTION:.0%}" if stale else "") + \
            (" FAILED at full parameters" if status.startswith("failed") else "") + \
            (f" unresolved getsource: {', '.join(f['unresolved'])}" if f["unresolved"] else "")
        print(f"{key(path):<50} {f['words']:>6} {f['lines']:>6} {f['printed']:>7} {p['reading']:>5} {p['code']:>5} "
              f"{p['running']:>5} {p['exercises']:>5} {total(p):>5} {t:>6}{flags}")
        rows.append((key(path), t))
    over = [k for k, t in rows if t > MAX_MINUTES]
    print(f"\nover {MAX_MINUTES} min ({len(over)}): {', '.join(over) or 'none'}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=observed.__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="store metadata.course.minutes and state it in cell 1")
    ap.add_argument("--measured", metavar="DIR", help="copy papermill durations from DIR (build/course) into the data file")
    ap.add_argument("--memory-only", action="store_true", help="with --measured: copy only the peak memory")
    ap.add_argument("--record", metavar="CSV", help="a workshop's real minutes per notebook (format below) into the "
                    "data file; the notebooks it names are then written again (as --write)")
    ap.add_argument("paths", nargs="*")
    args = ap.parse_args(argv)
    if args.measured:
        record_measured(args.measured, memory_only=args.memory_only)
    changed = []
    if args.record:
        try:
            before = load_data()
            changed = observed.record_workshop(args.record, DATA, [key(p) for p in notebooks()],
                                               computed=lambda k: total(parts(ROOT / k, before)[0]))
        except (ValueError, OSError) as error:  # a row to fix: its line and what to write, without a traceback
            ap.error(str(error))
        print(f"recorded {args.record}: {len(changed)} notebook(s); now `make guide` for TEACHING.md")
    data = load_data()
    if args.write or changed:
        for path in [Path(p) for p in args.paths] or [ROOT / k for k in changed] or notebooks():
            write(path, data)
    else:
        table(data)


if __name__ == "__main__":
    sys.exit(main())
