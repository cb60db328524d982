"""The grader's output: a gradebook (learner x lab) as CSV and HTML, every verdict as JSON, and each learner's feedback.

``write_gradebook(answers, verdicts, out, learners, labs)`` takes what ``utils.workshop.grade`` found and decided and
writes

- ``gradebook.csv``: one row per learner (every one ``find_submissions`` found, an empty folder too), one column per
  lab of the course (``utils.checkers.labs.LABS``, or the labs graded: ``--labs``), handed in by anyone or not, then how many labs passed; a cell says ``pass``, or for each part not passed ``part: what`` (the checker's name
  for the mistake, ``not written yet``, ``timeout``, ``crash``, ``does not parse`` ...); ``not submitted`` when the
  learner handed in no such notebook (or why their folder was not read: a symlink);
- ``gradebook.html``: the same table, coloured, each cell linked to its feedback (the link percent-encoded: a
  learner's name may hold spaces, ``#`` or any script);
- ``results.json``: every verdict with its message, hint, seconds and the kept output;
- ``feedback/<learner>/[<assignment>/]<lab>.md``: per part, the verdict, the checker's message and hint, and the
  end of the output when the answer crashed, raised or ran out of time (nbgrader's feedback/ layout: the
  notebook's path in the learner's submission, ``.md`` for ``.ipynb``).
"""

import csv
import html
import json
from dataclasses import asdict
from pathlib import Path
from urllib.parse import quote

from utils.checkers.labs import LABS

__all__ = ["cell", "write_gradebook"]

NOT_SUBMITTED = "not submitted"
COLOURS = {"pass": "#d4edda", NOT_SUBMITTED: "#eeeeee"}  # anything else: not yet (#f8d7da)
# A folder name that is not UTF-8 (an archive unpacked from another system) reaches Python with its bytes as
# surrogates (PEP 383): written as \udcXX in the text, percent-encoded byte for byte in a link, never a crash.
NAME_ERRORS = "backslashreplace"


def cell(verdicts):
    """One gradebook cell from one notebook's part verdicts: "pass", or what went wrong, part by part."""
    wrong = [v for v in verdicts if v.verdict != "pass"]
    if not wrong:
        return "pass"
    labels = {v.label for v in wrong}
    if len(verdicts) == 1 or (len(wrong) == len(verdicts) and len(labels) == 1):
        return wrong[0].label  # one part, or every part the same ("does not parse")
    return "; ".join(f"{v.part}: {v.label}" for v in wrong)


def _feedback(answer, verdicts):
    lines = [f"# {answer.lab}: feedback for {answer.learner}", ""]
    for v in verdicts:
        lines += [f"## {v.part}: {'passed' if v.verdict == 'pass' else 'not yet: ' + v.label}", "",
                  "~~~~", v.message.strip(), "~~~~", ""]
        if v.hint and v.verdict != "pass":
            lines += [f"**Hint:** {v.hint}", ""]
        if v.verdict in ("crash", "error", "timeout") and v.output.strip():
            lines += ["What your code printed (the start and the end):", "", "~~~~", v.output.strip()[-3000:],
                      "~~~~", ""]
        lines += [f"_graded in {v.seconds:.1f} s_", ""]
    return "\n".join(lines)


def write_gradebook(answers, verdicts, out, learners, labs=None):
    """Write the gradebook and the feedback files under ``out``; returns the gradebook's paths. ``learners``:
    ``find_submissions``'s, every learner -> "" or what their cells say instead of "not submitted" (a learner
    with no answer has a row only through it, so it is not optional). ``labs``: the columns, in order (default:
    every lab of the course), so a lab nobody handed in is a column of "not submitted"."""
    out = Path(out)
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    missing = dict(learners)
    learners = sorted(set(missing) | {a.learner for a in answers})
    labs = list(LABS if labs is None else labs)
    labs += sorted({a.lab for a in answers} - set(labs))  # an answer is never dropped from the gradebook
    by_answer = {}
    for v in verdicts:
        by_answer.setdefault((v.learner, v.lab), []).append(v)
    table, links = {}, {}
    for answer in answers:
        found = by_answer.get((answer.learner, answer.lab), [])
        table[answer.learner, answer.lab] = cell(found)
        path = out / "feedback" / answer.learner / answer.feedback
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_feedback(answer, found), encoding="utf-8", errors=NAME_ERRORS)
        links[answer.learner, answer.lab] = path.relative_to(out).as_posix()
    rows = [[learner] + [table.get((learner, lab), missing.get(learner) or NOT_SUBMITTED) for lab in labs]
            for learner in learners]
    for row in rows:
        row.append(f"{row[1:].count('pass')}/{len(labs)}")
    with open(out / "gradebook.csv", "w", newline="", encoding="utf-8", errors=NAME_ERRORS) as f:
        csv.writer(f).writerows([["learner", *labs, "labs passed"], *rows])
    (out / "gradebook.html").write_text(_html(labs, rows, links), encoding="utf-8", errors=NAME_ERRORS)
    (out / "results.json").write_text(json.dumps([asdict(v) for v in verdicts], indent=1))
    return [out / "gradebook.csv", out / "gradebook.html"]


def _html(labs, rows, links):
    def td(learner, lab, text):
        colour = COLOURS.get(text, "#f8d7da")
        body = html.escape(text)
        if (learner, lab) in links:
            body = f'<a href="{html.escape(quote(links[learner, lab], errors="surrogateescape"))}">{body}</a>'
        return f'<td style="background:{colour}">{body}</td>'

    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["learner", *labs, "labs passed"])
    body = "\n".join("<tr><th>" + html.escape(row[0]) + "</th>" + "".join(td(row[0], lab, text) for lab, text in
                     zip(labs, row[1:])) + f"<td>{row[-1]}</td></tr>" for row in rows)
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Gradebook</title><style>"
            "table{border-collapse:collapse;font-family:sans-serif;font-size:90%}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}</style></head><body>\n"
            f"<h1>Gradebook</h1>\n<table>\n<tr>{head}</tr>\n{body}\n</table>\n</body></html>\n")
