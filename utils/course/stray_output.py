"""No unexplained output: every warning or stderr line an executed lesson prints is explained in its text.

A lesson lists what it expects to print in ``metadata.course.expected_output``: one entry a message, a regular
expression, the id of the cell whose text explains it, and in ``says`` words of that cell, so that an entry
pointing at the wrong cell fails (``explanation_problems``)::

    "expected_output": [{"pattern": "CPU ranks on \\\\d+ cores", "cell": "b196cc5a", "says": "can sensibly run"}]

The course's own warnings, which any lesson may print, are in ``COURSE_WIDE`` with the lesson and cell that explain
them. Anything else counts as stray: every message of a stream named stderr (the kernel's, and the ranks', which
arrive there prefixed ``[rank k]``, utils/launch/kernel.py), and every warning-looking line of stdout and of a
displayed or returned value's text (a torchrun script's ranks print theirs on stdout, and a cell may show captured
output as its value). tests/test_notebooks.py fails a notebook whose executed copy has any; `make course` runs
``main`` on its full-parameter copies.

    python -m utils.course.stray_output build/course   # the stray messages of every executed copy under a folder
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The course's own warnings: the pattern, the notebook and cell whose text explains it, words that text quotes.
COURSE_WIDE = [
    {"pattern": r"CPU ranks on \d+ cores is more than this machine can sensibly run",  # utils/launch/plan.py
     "notebook": "notebooks/00_start_here.ipynb", "cell": "b196cc5a", "says": "can sensibly run"},
]

# A warning in stdout: Python's ("file:12: UserWarning: ..."), a logger's ("WARNING:name:...", DeepSpeed's
# "[WARNING]"), or torch's C++/glog line: the level's letter (W, E or F), the date, the time with its fraction, then
# the thread and file ("W1128 16:15:43.504000 18195 torch/...") or the file alone ("[rank0]:[W1128
# 16:40:23.042158657 socket.cpp:767] ..."). Not a bare word: a lesson may print source code that names UserWarning or
# logging.WARNING.
WARNING_LIKE = re.compile(r"\b[A-Z]\w*Warning: |\bWARNING:|\[WARNING\]|\b[WEF]\d{4} \d\d:\d\d:\d\d\.\d+ ")
RANK_PREFIX = re.compile(r"^\[rank \d+\] ?")
# A message whose indented lines below belong to it: Python's warning (its source line follows) or a traceback.
HAS_CONTINUATION = re.compile(r"\b[A-Z]\w*Warning: |^Traceback \(most recent call last\):")


def expected_output(source):
    """The compiled patterns a notebook may print: its ``metadata.course.expected_output``, then ``COURSE_WIDE``."""
    nb = json.loads(Path(source).read_text())
    entries = nb["metadata"].get("course", {}).get("expected_output", []) + COURSE_WIDE
    return [re.compile(entry["pattern"]) for entry in entries]


def _text(text):
    return "".join(text) if isinstance(text, list) else text


def messages(outputs):
    """The messages to account for in one cell's outputs: stderr split into messages, and the warning-looking lines
    of stdout and of a displayed or returned value's ``text/plain``. An indented stderr line continues the message
    above it only where that message is a Python warning (its source line) or a traceback, and only where the line
    is no warning itself: any other line is a message of its own."""
    found = []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream" and out.get("name") == "stderr":
            for line in _text(out["text"]).splitlines():
                if not line.strip():
                    continue
                bare = RANK_PREFIX.sub("", line)
                if (found and found[-1][0] == "stderr" and bare[:1].isspace() and not WARNING_LIKE.search(line)
                        and HAS_CONTINUATION.search(RANK_PREFIX.sub("", found[-1][1]))):
                    found[-1] = ("stderr", f"{found[-1][1]}\n{line}")
                else:
                    found.append(("stderr", line))
            continue
        if kind == "stream":
            text = _text(out["text"])
        elif kind in ("display_data", "execute_result"):
            text = _text(out.get("data", {}).get("text/plain", ""))
        else:
            continue
        found += [(kind, line) for line in text.splitlines() if WARNING_LIKE.search(line)]
    return [text for _, text in found]


def stray_output(executed, source=None):
    """The messages of the executed notebook ``executed`` that no pattern of ``source`` (the notebook as stored,
    where its metadata is; default: ``executed`` itself) matches: ``["cell <id>: <message>", ...]``."""
    patterns = expected_output(source or executed)
    nb = json.loads(Path(executed).read_text())
    stray = []
    for cell in nb["cells"]:
        for message in messages(cell.get("outputs", [])):
            if not any(p.search(message) for p in patterns):
                stray.append(f"cell {cell.get('id', '?')}: {message[:600]}")
    return stray


def explanation_problems(source):
    """What is wrong with a notebook's ``expected_output`` list: a missing key, a pattern that does not compile, a
    cell id that is not in the notebook (the explanation moved or was deleted), a cell whose text does not say the
    entry's ``says`` (the id names another cell, or the explanation was reworded)."""
    nb = json.loads(Path(source).read_text())
    cells = {cell.get("id"): _text(cell.get("source", "")) for cell in nb["cells"]}
    problems = []
    for i, entry in enumerate(nb["metadata"].get("course", {}).get("expected_output", [])):
        if set(entry) != {"pattern", "cell", "says"}:
            problems.append(f"entry {i} has keys {sorted(entry)}: give exactly 'pattern', 'cell' and 'says' (words "
                            "that cell's text quotes)")
            continue
        try:
            re.compile(entry["pattern"])
        except re.error as exc:
            problems.append(f"entry {i}: pattern {entry['pattern']!r} is not a regular expression ({exc})")
        if entry["cell"] not in cells:
            problems.append(f"entry {i}: cell {entry['cell']!r}, which should explain {entry['pattern']!r}, is not "
                            f"in {Path(source).name}: name the id of the cell whose text explains it")
        elif not entry["says"] or entry["says"] not in cells[entry["cell"]]:
            problems.append(f"entry {i}: cell {entry['cell']!r} of {Path(source).name} does not say "
                            f"{entry['says']!r}, which should explain {entry['pattern']!r}: name the cell whose text "
                            "explains it, and quote words of that text in 'says'")
    return problems


def main(argv):
    if len(argv) != 1:
        sys.exit("python -m utils.course.stray_output FOLDER: the executed copies under FOLDER (build/course, "
                 "build/test/ws2), each checked against the stored notebook of the same name")
    bad = 0
    for executed in sorted(Path(argv[0]).glob("*/*.ipynb")):
        source = ROOT / executed.parent.name / executed.name
        stray = stray_output(executed, source if source.exists() else None)
        bad += bool(stray)
        print(f"{executed.parent.name}/{executed.name}: {len(stray)} stray message(s)")
        for message in stray:
            print("  " + message.replace("\n", "\n  "))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
