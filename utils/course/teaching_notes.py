"""The teacher's notes of every notebook, kept beside it in ``metadata.course.teaching``, and what TEACHING.md
says from them: what to demo and for how long, what learners do alone, the usual questions with their answers, the
common problems with their fixes, what the notebook does on a GPU seat, a lab's usual mistakes in words, and a
lesson's question for the day's check. The instructor keys (answers to every lesson exercise and to the day checks)
are in ``labs/solutions/keys/<stem>.md``, which the student release leaves out with the rest of ``labs/solutions``.

    metadata.course.teaching = {
      "demo": "what the teacher shows", "demo_minutes": 15,   # own work: the notebook's minutes less these
      "alone": "what learners do on their own",
      "questions": [{"q": "...?", "a": "..."}],             # 2 to 4, each answered
      "problems": [{"symptom": "...", "fix": "..."}],       # 1 to 3
      "gpu": "what it does on a GPU seat",
      "check": "...?",                                      # lessons: the day check's question (key: ## Check)
      "mistakes": [{"code": "...", "words": "..."}],        # labs: 3 to 6, codes of the checker's hint tables
    }

``problems(path)`` lists what is missing or wrong in a notebook's notes and key (a test requires none);
the ``*_lines`` functions write TEACHING.md's sections (utils/course/teaching_guide.py).
"""

import html
import json
import re

from . import minutes
from .notebook_runner import ROOT, course_metadata

KEYS = ROOT / "labs" / "solutions" / "keys"  # out of the student release with the rest of labs/solutions


def notes(path):
    """The notebook's ``metadata.course.teaching``; a KeyError naming the fix where it has none."""
    found = course_metadata(path).get("teaching")
    if not found:
        raise KeyError(f"{minutes.key(path)} has no metadata.course.teaching: write its teacher's notes "
                       "(utils/course/teaching_notes.py says what they hold)")
    return found


def has_notes(path):
    return bool(course_metadata(path).get("teaching"))


def is_lesson(path):
    return path.parent.name == "notebooks"


def key_path(path):
    return KEYS / f"{path.stem}.md"


def problems(path, lab_mistakes=None):
    """What is missing or wrong in the notes of ``path`` (and its key, for a lesson). ``lab_mistakes``: the codes
    the lab's checkers know (utils.course.teaching_guide.lab_mistakes), for a lab."""
    name = minutes.key(path)
    try:
        t = notes(path)
    except KeyError as e:
        return [str(e)]
    found = []
    total = course_metadata(path).get("minutes") or 0
    for field in ("demo", "alone", "gpu") + (("check",) if is_lesson(path) else ()):
        if not isinstance(t.get(field), str) or len(t[field].strip()) < 10:
            found.append(f"{name}: '{field}' missing or too short")
    dm = t.get("demo_minutes")
    if not isinstance(dm, int) or not 0 < dm < total:
        found.append(f"{name}: demo_minutes {dm!r} must be a whole number between 0 and the notebook's {total} "
                     "minutes (the rest is the learners' own work)")
    qs = t.get("questions", [])
    if not 2 <= len(qs) <= 4 or any(not q.get("q", "").rstrip().endswith("?") or len(q.get("a", "").strip()) < 10
                                    for q in qs):
        found.append(f"{name}: 2 to 4 questions, each a question (ending in '?') with its answer; got {len(qs)}")
    ps = t.get("problems", [])
    if not 1 <= len(ps) <= 3 or any(not p.get("symptom") or not p.get("fix") for p in ps):
        found.append(f"{name}: 1 to 3 problems, each with a symptom and a fix; got {len(ps)}")
    if is_lesson(path):
        if not t.get("check", "").rstrip().endswith("?"):
            found.append(f"{name}: its day-check question must end in '?'")
        found += key_problems(path)
    else:
        ms = t.get("mistakes", [])
        unknown = [m.get("code") for m in ms if m.get("code") not in (lab_mistakes or [])]
        if not 3 <= len(ms) <= 6 or unknown or any(len(m.get("words", "")) < 20 for m in ms):
            found.append(f"{name}: 3 to 6 mistakes in words, each with a code its checker names; got {len(ms)}, "
                         f"codes unknown to the checker: {unknown}")
    return found


def key_problems(path):
    """A lesson's key: one ``## Exercise k`` per exercise the course counts (minutes.exercise_items), in order,
    and a ``## Check``."""
    key = key_path(path)
    shown = f"labs/solutions/keys/{key.name}"
    if not key.exists():
        return [f"{minutes.key(path)}: no instructor key {shown}"]
    text = key.read_text()
    count = len(minutes.exercise_items(json.loads(path.read_text())))
    heads = re.findall(r"^## Exercise (\d+)\s*$", text, re.M)
    found = []
    if heads != [str(k) for k in range(1, count + 1)]:
        found.append(f"{shown}: exercise headings {heads}, the lesson has {count} exercises "
                     f"(## Exercise 1 .. {count})")
    if not re.search(r"^## Check\s*$", text, re.M):
        found.append(f"{shown}: no '## Check' (the answer to the day check)")
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        if len(section.split("\n", 1)[-1].strip()) < 20:
            found.append(f"{shown}: '## {section.splitlines()[0]}' has no answer")
    return found


def note_lines(path, total):
    """The guide's paragraph for one notebook."""
    t = notes(path)
    demo = t["demo_minutes"]
    lines = [f"**{path.stem}** ({total} minutes: about {demo} of demo, {total - demo} of the learners' own work). "
             f"Demo: {t['demo']}. Alone: {t['alone']}. On a GPU seat: {t['gpu']}", ""]
    if not is_lesson(path):
        lines += ["Mistakes learners make most (in brackets, the name the check's panel gives it):", ""]
        lines += [f"- {m['words']} (`{m['code']}`)" for m in t["mistakes"]] + [""]
    lines += ["Usual questions:", ""] + [f"- *{q['q']}* {q['a']}" for q in t["questions"]] + [""]
    lines += ["Common problems:", ""] + [f"- {p['symptom']}: {p['fix']}" for p in t["problems"]] + [""]
    return lines


_TAGS = re.compile(r"<[^>]+>")


def _plain(text):
    text = html.unescape(_TAGS.sub("", text))
    text = re.sub(r"\((?:click|click for the answer)\)", "", text)
    text = " ".join(text.replace(">", " ").split()).strip(" :.")
    return re.sub(r"^(?:\(\d+\)|\d+\.)\s+", "", text)  # the quiz's own numbering: the guide numbers them


def quizzes(path):
    """The notebook's quiz questions, in order: each "Quick quiz" and each item of a "## Quiz" section (their answers
    stay in the notebook, folded under <details>)."""
    found = []
    for cell in json.loads(path.read_text())["cells"]:
        text = minutes.source(cell)
        if cell["cell_type"] != "markdown" or "quiz" not in text.lower():
            continue
        section = re.split(r"^#+\s+Quiz\s*$", text, flags=re.M)
        if len(section) > 1:
            found += [_plain(s) for s in re.findall(r"<summary>(.*?)</summary>", section[1], re.S)]
        for quick in re.finditer(r"Quick quiz(?:</b>)?[.:]?(?:</b>)?\**[.:]?(.*?)(?:<details>|</summary>|$)", text,
                                 re.S):
            if question := _plain(quick.group(1)):
                found.append(question)
    return found


def quiz_lines(paths):
    lines = ["## Quizzes", "",
             "The lessons' own quizzes, to ask the room after the cell they follow; each answer is folded under the "
             "question in the notebook.", ""]
    for path in paths:
        if is_lesson(path) and (qs := quizzes(path)):
            lines.append(f"- **{path.stem}**: " + " ".join(f"({k}) {q}" for k, q in enumerate(qs, 1)))
    return lines + [""]


def day_check_lines(stems, paths_by_stem):
    """A day's pre/post check: the check question of each lesson taught that day."""
    asked = [(s, notes(paths_by_stem[s])["check"]) for s in stems
             if is_lesson(paths_by_stem[s]) and has_notes(paths_by_stem[s])]
    if not asked:
        return []
    lines = ["Check, before the first lesson and again at the end of the day (the same questions: the difference is "
             "what the day taught; answers under **Check** in `labs/solutions/keys/<lesson>.md`):", ""]
    return lines + [f"{k}. {q} ({s})" for k, (s, q) in enumerate(asked, 1)] + [""]


def parameters(path):
    cell = next((c for c in json.loads(path.read_text())["cells"]
                 if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    return minutes.source(cell) if cell else ""


def gpu_lines(paths, world_size_of):
    lines = ["## A GPU room", "",
             "A multi-rank cell runs over NCCL, one GPU a rank, only when the seat has at least as many GPUs as the "
             "cell has ranks (utils/launch/plan.py; two NCCL ranks cannot share a GPU); otherwise over gloo on CPU "
             "ranks, the same code. So a seat of one GPU runs every multi-rank cell on its CPU cores, and the "
             "cores column above still applies; the GPU serves only the single-process cells that pick it. The "
             "column below gives the GPUs a seat needs to run a notebook's default ranks over NCCL, and what the "
             "notebook does with a GPU.", "",
             "| notebook | GPUs for NCCL at its default ranks | on a GPU seat |", "| --- | --- | --- |"]
    for path in paths:
        n = world_size_of[path.stem]
        need = f"{n}" if n and n > 1 else "- (one process)"
        lines.append(f"| {path.stem} | {need} | {notes(path)['gpu'] if has_notes(path) else 'not written yet'} |")
    return lines + [""]


def fallback_lines(paths, world_sizes_of):
    smoke = [p.stem for p in paths if re.search(r"^SMOKE\s*=", parameters(p), re.M)]
    no_two = [p.stem for p in paths if isinstance(world_sizes_of[p.stem], list) and 2 not in world_sizes_of[p.stem]]
    return [
        "## Before and during the day", "",
        "**Each learner, a week before**: the README's \"Before the workshop (learners)\": the two commands of its "
        "quick start (Linux, or Windows through WSL 2; macOS is not tested), then `make preflight USERS=1`, which "
        "says what their machine can run. Ask for its last lines back; a learner whose check fails joins the hub (or "
        "a neighbour) instead.", "",
        "**The hub is down**: learners who passed their own check run `make lab` on their laptop; the others read "
        "the executed course, built the day before with `make site-executed` (every notebook run, outputs kept, "
        "served from `build/site/` by any static file server: `python -m http.server --directory build/site`), and pair with a "
        "neighbour for the exercises.", "",
        "**Thin seats** (fewer cores than a notebook's ranks, a busy hub, ranks timing out): in the notebook's "
        "parameters cell set `WORLD_SIZE = 2` (every multi-rank notebook accepts 2"
        + (f" except {', '.join(no_two)}" if no_two else "") + "), and where it has one, `SMOKE = True`: "
        "the test suite's setting, tiny sizes and few steps (the suite runs each notebook so in about a minute at "
        "most on 2 cores), every check still holding, the figures noisier. Notebooks with `SMOKE`: "
        f"{len(smoke)} of {len(paths)}"
        + (f" (not {', '.join(p.stem for p in paths if p.stem not in smoke)})" if len(smoke) < len(paths) else "")
        + ".", ""]
