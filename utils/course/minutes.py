"""How long each notebook takes a learner, from its text and its measured run time (a maintainer tool).

    python -m utils.course.minutes            # a table: words, code lines, the four parts, total; flags > 90
    python -m utils.course.minutes --write    # stores metadata.course.minutes (+ minutes_parts), restates it in cell 1
    python -m utils.course.minutes --measured build/course   # copies `make course`'s durations into the data file

The four parts, in minutes (each rule is the one the unit test, tests/test_course_minutes.py, holds the notebooks
to):

- reading: the words of the markdown cells (whitespace-separated, formulas and links included) / 150;
- code: the code the learner reads, at 10 lines a minute. Counted: every non-blank line of every code cell,
  comment lines included (they are read too), plus the non-blank lines of each utils function or class a
  cell prints with ``Code(inspect.getsource(f))``, found statically with ast (see printed_source_lines; the
  table's ``printed`` column; a name it cannot resolve is listed and not counted);
- running: the notebook's full-parameter run time from utils/course/run_minutes.json (``make course``, measured on a
  shared 2-core machine: an upper bound). A notebook not measured there uses the data file's stated
  estimate, and the table flags it (``est``);
- exercises: for a lesson, the numbered items of its last "## Exercises" (or "**Exercises**") section at EXERCISE_MINUTES each (an
  item that sends the learner to a lab is not counted: the lab has its own time). For a lab, the upper end of
  the time the lab states for its tasks ("**Estimated time** 30-45 minutes", "**You need** 45-75 minutes",
  "**Time**: about 45 minutes", renamed "**Tasks**:" by --write), else LAB_TASK_MINUTES per ``## YOUR CODE`` block.

The total is the sum, rounded up to a multiple of 5. A repository hook wants it at most 90 (MAX_MINUTES).
"""

import argparse
import functools
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).with_name("run_minutes.json")
WORDS_PER_MINUTE = 150
LINES_PER_MINUTE = 10
EXERCISE_MINUTES = 10    # one lesson exercise: read it, change a cell or two, re-run them (minutes of running)
LAB_TASK_MINUTES = 20    # one "## YOUR CODE" block, where a lab states no time of its own
MAX_MINUTES = 90
TIME_LINE = "**Time**"   # the paragraph of the first cell that --write owns


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
    own = re.compile(r"^" + re.escape(TIME_LINE) + r" about \d+ min in all:.*$", re.M)
    return sum(len(own.sub("", source(c)).split()) for c in nb["cells"] if c["cell_type"] == "markdown")


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


def lab_stated_minutes(nb):
    """The upper end of the time a lab's first cell states for its tasks, or None."""
    first = source(nb["cells"][0])
    m = re.search(r"\*\*(?:Estimated time|You need|Time|Tasks)\*\*:?\s*(?:about\s+)?(\d+)(?:\s*-\s*(\d+))?\s*minutes", first)
    return int(m.group(2) or m.group(1)) if m else None


def exercise_minutes(path, nb):
    if is_lab(path):
        stated = lab_stated_minutes(nb)
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
    return int(5 * math.ceil(sum(p.values()) / 5))


def time_paragraph(minutes, p):
    return (f"{TIME_LINE} about {minutes} min in all: reading ~{math.ceil(p['reading'])} min, code ~{math.ceil(p['code'])} "
            f"min, running ~{math.ceil(p['running'])} min, exercises ~{math.ceil(p['exercises'])} min.")


def stated_minutes(first_cell):
    """The total the first cell states (from its **Time** paragraph), or None."""
    m = re.search(re.escape(TIME_LINE) + r" about (\d+) min in all", first_cell)
    return int(m.group(1)) if m else None


def restate(first, minutes, p):
    """The first cell with its time said once, as the tool computes it; and a list of what changed."""
    changes, new = [], first
    # 1. our own paragraph, from an earlier --write, goes (it is written again below)
    new = re.sub(r"\n*^" + re.escape(TIME_LINE) + r" about \d+ min in all:[^\n]*\n?", "\n", new, flags=re.M)
    # 2. the old wordings of the reading time: "**You need** reading time ~40 min, " / "**Reading time** ~35 min, "
    for pattern, repl in [
        (r"(\*\*You need\*\*) reading time ~\d+(?:-\d+)? min, ", r"\1 "),
        (r"\*\*Reading time\*\* ~\d+(?:-\d+)? min[,;] \*\*run time\*\*", "**Run time**"),
        # a lab's own time for its tasks stays (it is the exercises part, read again on the next run);
        # only lab 09's "**Time**:" is renamed, as the paragraph below owns that word
        (r"\*\*Time\*\*: about (\d+) minutes\.", r"**Tasks**: about \1 minutes."),
    ]:
        for m in re.finditer(pattern, new):
            changes.append(f"- {m.group(0)!r}")
        new = re.sub(pattern, repl, new)
    # 3. the new paragraph, before the one that says what the learner needs (else at the end)
    line = time_paragraph(minutes, p)
    paragraphs = re.split(r"\n\s*\n", new.strip("\n"))
    at = next((i for i, s in enumerate(paragraphs) if re.search(r"\*\*(What you need|You need|Run time|run time|Estimated time)\*\*", s)),
              len(paragraphs))
    paragraphs.insert(at, line)
    new = "\n\n".join(paragraphs) + ("\n" if first.endswith("\n") else "")
    changes.append(f"+ {line!r}")
    return new, changes


def write(path, data):
    nb = json.loads(Path(path).read_text())
    first = source(nb["cells"][0])
    # the figures are those of the text as written: the old wordings removed first (the numbers do not matter there)
    nb["cells"][0]["source"] = restate(first, 0, dict.fromkeys(("reading", "code", "running", "exercises"), 0))[0]
    p, _ = parts(path, data, nb)
    minutes = total(p)
    course = nb["metadata"].setdefault("course", {})
    course["minutes"], course["minutes_parts"] = minutes, p
    new, changes = restate(first, minutes, p)
    nb["cells"][0]["source"] = new.splitlines(keepends=True)
    Path(path).write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"{key(path)}: minutes = {minutes}")
    for c in changes:
        print(f"    {c}")


def record_measured(build_dir, data_path=DATA, memory_only=False):
    """Copy papermill's duration of each executed notebook under build_dir into the data file, with the
    date, the core count and the load average now (the machine may be shared: the seconds are upper bounds);
    a failed notebook gets its error's last lines. A notebook still running (no duration yet) is left as it was.
    The peak memory of each notebook's processes (build_dir/peak_memory.json, written by ``make course``) goes
    in as ``peak_memory_mb``; ``memory_only``: only that (a run on a loaded machine: its seconds say little,
    its memory is the notebook's own)."""
    import datetime
    import os
    data = load_data(data_path)
    peaks_file = Path(build_dir) / "peak_memory.json"
    peaks = json.loads(peaks_file.read_text()) if peaks_file.exists() else {}
    run = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "cores": os.cpu_count(), "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
           "command": "make course", "notebooks": []}
    for out in sorted(Path(build_dir).glob("*/*.ipynb")):
        nb = json.loads(out.read_text())
        meta = nb["metadata"].get("papermill", {})
        entry = data["notebooks"].setdefault(key(out), {})
        if key(out) in peaks and not meta.get("exception") and meta.get("duration") is not None:
            entry["peak_memory_mb"] = round(peaks[key(out)] / 2**20)
        if memory_only:
            continue
        if meta.get("exception"):
            errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
            last = errors[-1] if errors else {}
            entry.update(status="failed at full parameters", seconds=None, measured_at=meta.get("end_time"),
                         error=f"{last.get('ename', '?')}: {last.get('evalue', '')}"[-1500:])
        elif meta.get("duration") is not None:
            entry.update(seconds=round(meta["duration"], 1), status="ok", measured_at=meta.get("end_time"))
            entry.pop("error", None)
        else:
            continue
        run["notebooks"].append(key(out))
    if not memory_only:
        data.setdefault("runs", []).append(run)
    Path(data_path).write_text(json.dumps(data, indent=1) + "\n")


def table(data):
    rows = []
    print(f"{'notebook':<50} {'words':>6} {'lines':>6} {'printed':>7} {'read':>5} {'code':>5} {'run':>5} {'ex':>5} {'total':>5}")
    for path in notebooks():
        p, f = parts(path, data)
        t = total(p)
        status = data.get("notebooks", {}).get(key(path), {}).get("status", "")
        flags = ("" if f["measured"] else " est") + (" >90" if t > MAX_MINUTES else "") + \
            (" FAILED at full parameters" if status.startswith("failed") else "") + \
            (f" unresolved getsource: {', '.join(f['unresolved'])}" if f["unresolved"] else "")
        print(f"{key(path):<50} {f['words']:>6} {f['lines']:>6} {f['printed']:>7} {p['reading']:>5} {p['code']:>5} "
              f"{p['running']:>5} {p['exercises']:>5} {t:>5}{flags}")
        rows.append((key(path), t))
    over = [k for k, t in rows if t > MAX_MINUTES]
    print(f"\nover {MAX_MINUTES} min ({len(over)}): {', '.join(over) or 'none'}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="store metadata.course.minutes and restate it in cell 1")
    ap.add_argument("--measured", metavar="DIR", help="copy papermill durations from DIR (build/course) into the data file")
    ap.add_argument("--memory-only", action="store_true", help="with --measured: copy only the peak memory")
    ap.add_argument("paths", nargs="*")
    args = ap.parse_args(argv)
    if args.measured:
        record_measured(args.measured, memory_only=args.memory_only)
    data = load_data()
    if args.write:
        for path in [Path(p) for p in args.paths] or notebooks():
            write(path, data)
    else:
        table(data)


if __name__ == "__main__":
    sys.exit(main())
