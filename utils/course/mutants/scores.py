"""The measured mutation scores, kept in the repository: ``utils/course/mutation_scores.json``, and their table.

``python -m utils.course.mutants --record`` (after full runs, no ``--sample``) copies each lab's summary from
``build/mutants/<lab>.json`` into the JSON file with the commit it was measured on, the date, the machine and every
mutant that was not rejected with a named mistake (equivalent, unnamed or missed, with its diff line and what the
oracle saw). TEACHING.md's "How well the checkers catch wrong answers" is written from it (utils/course/teaching_guide.py),
and so is the README's table, between its ``<!-- mutation-scores -->`` markers (a test keeps both current).
"""

import datetime
import json
import platform
import subprocess
from pathlib import Path

from utils.course.notebook_runner import ROOT

SCORES = ROOT / "utils" / "course" / "mutation_scores.json"
README = ROOT / "README.md"
BEGIN, END = "<!-- mutation-scores -->", "<!-- /mutation-scores -->"
GOAL = 0.95  # issue 36: at least 95% of the non-equivalent mutants rejected with a named mistake, in every lab
KEPT = ("mutants", "tried", "equivalent", "named", "unnamed", "missed", "seconds", "score", "named_share")


def _cpu():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def record(out, labs=None):
    """Store the full runs in ``out`` (build/mutants) into SCORES; returns the labs stored. A sampled run is refused:
    the table states whole-lab figures only."""
    data = json.loads(SCORES.read_text()) if SCORES.exists() else {"labs": {}}
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    stored = []
    for path in sorted(Path(out).glob("*.json")):
        report = json.loads(path.read_text())
        if labs and report["lab"] not in labs:
            continue
        if report["tried"] != report["mutants"]:
            raise ValueError(f"{path}: {report['tried']} of {report['mutants']} mutants tried (a sample): run the "
                             f"whole lab (make mutants LAB={report['lab']}) before recording it")
        data["labs"][report["lab"]] = {
            **{k: report[k] for k in KEPT}, "commit": commit, "date": datetime.date.today().isoformat(),
            "cpu": _cpu(), "not_named": [{k: r.get(k) for k in ("index", "kind", "outcome", "mistake", "diff",
                                                                "oracle", "detail") if r.get(k) is not None}
                                         for r in report["records"] if r["outcome"] != "named"]}
        stored.append(report["lab"])
    SCORES.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    write_readme()
    return stored


def table_lines(data=None):
    """The table of every recorded lab (markdown), then what each lab's unnamed, missed and equivalent mutants were."""
    data = data or (json.loads(SCORES.read_text()) if SCORES.exists() else {"labs": {}})
    if not data["labs"]:
        return ["No full run recorded yet (`make mutants`, then `python -m utils.course.mutants --record`)."]
    lines = ["| lab | mutants | equivalent | rejected, named | rejected, unnamed | accepted (missed) | named % | "
             "minutes | measured |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for lab, s in sorted(data["labs"].items()):
        mark = "" if s["named_share"] >= GOAL else " (below 95%)"
        lines.append(f"| {lab} | {s['mutants']} | {s['equivalent']} | {s['named']} | {s['unnamed']} | {s['missed']} "
                     f"| {100 * s['named_share']:.1f}%{mark} | {s['seconds'] / 60:.1f} | {s['date']}, {s['commit']} |")
    return lines


def readme_block():
    return "\n".join([BEGIN] + table_lines() + [END])


def write_readme():
    text = README.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        README.write_text(head + readme_block() + rest.split(END, 1)[1])


def details_lines(data=None):
    """Each lab's mutants that were not rejected with a named mistake, with why (for TEACHING.md)."""
    data = data or (json.loads(SCORES.read_text()) if SCORES.exists() else {"labs": {}})
    lines = []
    for lab, s in sorted(data["labs"].items()):
        for r in s["not_named"]:
            why = r.get("oracle") or r.get("detail") or r.get("mistake") or ""
            lines.append(f"- {lab} #{r['index']} ({r['kind']}, {r['outcome']}): `{r['diff'][:160]}`"
                         + (f": {why[:200]}" if why else ""))
    return lines
