"""What was observed, fed back into utils/course/run_minutes.json, the one file of measured figures that
utils/course/minutes.py reads: ``make course``'s run time and peak memory of each notebook (``--measured``), and
the minutes a real workshop spent on it (``--record``). Both run as options of ``python -m utils.course.minutes``.

A workshop record is a CSV file, one row per notebook taught, written by the teacher after the day::

    notebook,minutes,learners,date,note
    02a_ddp_from_scratch,85,12,2026-12-01,exercises 1-3 only
    labs/02_ddp_lab.ipynb,70,10,2026-12-01,

``notebook``: a stem or a path (``notebooks/...`` or ``labs/...``); ``minutes``: whole minutes from opening the
notebook to the time most of the room had finished its exercises (or the lab's tasks), breaks left out;
``learners``: how many took part; ``date``: the workshop's, YYYY-MM-DD; ``note``: anything (may be empty).
A row is keyed by notebook, date and note: recording the same file twice changes nothing, and two rooms that
taught one notebook on one day are two rows if their notes tell them apart (e.g. ``room A``, ``room B``); two
rows of one file with the same three are refused, naming both lines.

Each stored row keeps the notebook's computed total (minutes.total of its parts) when it was recorded, as
``computed``: where the notebook's computed total has since moved by more than STALE_FRACTION of it, the lesson
changed after the workshop, and ``python -m utils.course.minutes`` flags the figure (``stale``); a test fails
until a new workshop is recorded or the old rows are removed.
"""

import csv
import datetime
import json
import math
import os
import statistics
from pathlib import Path

COLUMNS = ("notebook", "minutes", "learners", "date", "note")
STALE_FRACTION = 0.2  # a computed total moved by more than this since a workshop: the lesson is not the one taught
MOST_MINUTES = 480  # a workshop day; a row above it is a typo (seconds, or a whole day for several notebooks)


def load(data_path):
    return json.loads(Path(data_path).read_text()) if Path(data_path).exists() else {"notebooks": {}}


def save(data, data_path):
    Path(data_path).write_text(json.dumps(data, indent=1) + "\n")


def workshop_minutes(entry):
    """(minutes, workshops) a notebook's data entry records from workshops: the median of the recorded minutes
    rounded up to a multiple of 5, and how many workshops; (None, 0) when none is recorded."""
    rows = entry.get("workshops", [])
    if not rows:
        return None, 0
    return int(5 * math.ceil(statistics.median(r["minutes"] for r in rows) / 5)), len(rows)


def stale_workshops(entry, computed):
    """The recorded rows of a notebook's data entry whose computed total (stored with the row) differs from the
    notebook's computed total now by more than STALE_FRACTION of the stored one: the lesson they timed changed."""
    return [w for w in entry.get("workshops", [])
            if abs(computed - w.get("computed", computed)) > STALE_FRACTION * w.get("computed", computed)]


def _positive_int(text, what, row, most):
    try:
        value = int(str(text).strip())
    except ValueError:
        value = None
    if value is None or not 1 <= value <= most:
        raise ValueError(f"{row}: {what} is {text!r}; write a whole number from 1 to {most}")
    return value


def read_record(path, keys):
    """The rows of a workshop record, checked: [{"notebook": key, "minutes", "learners", "date", "note"}].
    ``keys``: the course's notebooks as "notebooks/NAME.ipynb" / "labs/NAME.ipynb"."""
    stems = {Path(k).stem: k for k in keys}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS[:4] if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: no column {', '.join(missing)}; the first line must be {','.join(COLUMNS)} "
                             "(see python -m utils.course.minutes --help)")
        rows, seen = [], {}
        for n, raw in enumerate(reader, start=2):
            where = f"{path}, line {n}"
            name = (raw["notebook"] or "").strip()
            key = name if name in keys else stems.get(Path(name).stem if name.endswith(".ipynb") else name)
            if key is None:
                raise ValueError(f"{where}: notebook {name!r} is not in notebooks/ or labs/; write its stem, "
                                 f"e.g. {next(iter(stems))}")
            try:
                date = datetime.date.fromisoformat((raw["date"] or "").strip()).isoformat()
            except ValueError:
                raise ValueError(f"{where}: date {raw['date']!r} is not YYYY-MM-DD") from None
            rows.append({"notebook": key, "minutes": _positive_int(raw["minutes"], "minutes", where, MOST_MINUTES),
                         "learners": _positive_int(raw["learners"], "learners", where, 10_000), "date": date,
                         "note": (raw.get("note") or "").strip(), "line": n})
            same = (key, date, rows[-1]["note"])
            if same in seen:
                raise ValueError(f"{where}: {key} on {date} with note {same[2]!r} is already line {seen[same]}; two "
                                 "rooms on one day: tell them apart in the note (e.g. room A, room B)")
            seen[same] = n
    if not rows:
        raise ValueError(f"{path}: no rows under the header; one row per notebook taught")
    return rows


def record_workshop(path, data_path, keys, computed=None):
    """Store a workshop record's rows under each notebook's ``workshops`` in the data file, a row replacing the one
    of the same notebook, date and note; returns the keys of the notebooks whose figures changed. ``computed``:
    key -> the notebook's computed total now, stored with each row (see stale_workshops)."""
    rows = read_record(path, keys)
    data = load(data_path)
    changed = []
    for row in rows:
        entry = data["notebooks"].setdefault(row["notebook"], {})
        kept = [w for w in entry.get("workshops", []) if (w["date"], w["note"]) != (row["date"], row["note"])]
        new = {k: row[k] for k in ("minutes", "learners", "date", "note")} | {"file": Path(path).name}
        if computed is not None:
            new["computed"] = computed(row["notebook"])
        entry["workshops"] = sorted(kept + [new], key=lambda w: (w["date"], w["note"]))
        changed.append(row["notebook"])
    save(data, data_path)
    return sorted(set(changed))


def record_measured(build_dir, data_path, key, memory_only=False):
    """Copy papermill's duration of each executed notebook under build_dir into the data file, with the
    date, the core count and the load average now (the machine may be shared: the seconds are upper bounds);
    a failed notebook gets its error's last lines. A notebook still running (no duration yet) is left as it was.
    The peak memory of each notebook's processes (build_dir/peak_memory.json, written by ``make course``) goes
    in as ``peak_memory_mb``; ``memory_only``: only that (a run on a loaded machine: its seconds say little,
    its memory is the notebook's own). ``key``: a path's key in the data file."""
    data = load(data_path)
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
    save(data, data_path)


def measuring_run(data, key):
    """The ``make course`` run that measured a notebook's seconds (the last run listing it), or None."""
    return next((r for r in reversed(data.get("runs", [])) if key in r.get("notebooks", [])), None)
