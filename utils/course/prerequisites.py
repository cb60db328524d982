"""Each notebook's prerequisites: the lessons whose results it uses, kept in ``metadata.course.prerequisites`` (a
list of notebook stems) and checked against what its first cell's **You need** paragraph says, so the two cannot
disagree. The schedules (utils/course/schedules.py) read them to keep every lesson after what it needs.

    python -m utils.course.prerequisites           # prints each notebook's prerequisites
    python -m utils.course.prerequisites --check   # exit 1 where the metadata and the text disagree

The text check, both ways: a notebook the paragraph names exactly (``05b``, ``lesson 05a``, a link to
``06b_pipeline_bubble.ipynb``) must be in the metadata; a prerequisite in the metadata must be named by its
lesson number (``lesson 05``, ``lessons 03-06`` and ``05b`` all name lesson 05); and every lesson number the
paragraph names must be met by a prerequisite with that number, declared directly or through the prerequisites'
own (so ``lessons 01-03`` needs a 01, a 02 and a 03 somewhere up the chain). A lesson number is one written
``NNx`` or following *lesson*, *notebook*, *part* or *lab* (``lessons 03 (ZeRO) and 06``): "a load of about 12"
names none. Sentences (split at ". " and at the paragraph's end) that say lessons only "help", or what a lesson
"then" does later, are asides, not prerequisites, and are not checked.
"""

import argparse
import json
import re
import sys

from . import minutes
from .notebook_runner import course_metadata

NEED = re.compile(r"\*\*(?:What you|You) need\*\*(.*?)(?:\n\n|$)", re.S)
SENTENCE = re.compile(r"(?<=\.)\s+")  # a sentence ends at ". " (not at the dot of ``.ipynb``) or the paragraph's end
ASIDE = re.compile(r"\bhelps?\b|\bthen\b")  # a sentence of lessons that only help, or of what comes later
EXACT = re.compile(r"(?<![\w./-])(\d\d[a-d])(?![\w])|\((?:\.\./(?:notebooks|labs)/)?(\d\d[a-d]?_\w+)\.ipynb\)")
ITEM = r"\d\d[a-d]?(?:\s*-\s*\d\d[a-d]?)?(?:\s*\([^()]*\))?"
LIST = re.compile(rf"\b(?:lessons?|notebooks?|parts?|labs?)\s+({ITEM}(?:\s*(?:,|\band\b|\bor\b)\s*{ITEM})*)", re.I)
RANGE = re.compile(r"\b(\d\d)[a-d]?\s*-\s*(\d\d)")
NUMBER = re.compile(r"(?<![\w.$~-])(\d\d)[a-d]?(?![\w-])")
PART = re.compile(r"\bparts? \[?\d|\bthis lesson\b")


def stems():
    return {p.stem: p for p in minutes.notebooks()}


def declared(path):
    """The notebook's ``metadata.course.prerequisites``: the stems of the notebooks it needs (direct ones)."""
    return list(course_metadata(path).get("prerequisites", []))


def need_paragraph(path):
    """The first cell's **You need** paragraph (lesson 10 says **What you need**); '' where there is none."""
    cell = json.loads(path.read_text())["cells"][0]
    found = NEED.search("".join(cell["source"]))
    return found.group(1) if found else ""


def named(text, own):
    """(stems named exactly, lesson numbers named) in a **You need** paragraph of notebook ``own``."""
    text = " ".join(s for s in SENTENCE.split(text.strip()) if not ASIDE.search(s))
    exact = {a or b for a, b in EXACT.findall(text)}
    numbers = {s[:2] for s in exact}
    for found in LIST.findall(text):
        listed = re.sub(r"\([^()]*\)", "", found)
        numbers |= set(NUMBER.findall(listed))
        for a, b in RANGE.findall(listed):
            numbers |= {f"{n:02d}" for n in range(int(a), int(b) + 1)}
    if PART.search(text):
        numbers.add(own[:2])
    return exact, numbers


def upstream(wanted, known):
    """The stems ``wanted`` and, through their own metadata, everything they need."""
    seen, todo = set(), list(wanted)
    while todo:
        stem = todo.pop()
        if stem not in seen and stem in known:
            seen.add(stem)
            todo += declared(known[stem])
    return seen


def disagreements(path, known=None):
    """What is wrong with ``path``'s prerequisites, one sentence each; [] when they agree with its text."""
    known = known or stems()
    own, wanted = path.stem, declared(path)
    exact, numbers = named(need_paragraph(path), own)
    exact = {next((k for k in known if k == s or k.startswith(s + "_")), s) for s in exact}
    out = [f"{own}: prerequisite {p} is no notebook (renamed?)" for p in wanted if p not in known]
    out += [f"{own}: its **You need** names {s} but metadata.course.prerequisites {wanted} leaves it out; add it"
            for s in sorted(exact - set(wanted) - {own}) if known.get(s, path).parent.name == "notebooks"]
    out += [f"{own}: metadata.course.prerequisites has {p}, but its **You need** never names lesson {p[:2]}; "
            f"say why it is needed there" for p in wanted if p[:2] not in numbers]
    met = {s[:2] for s in upstream(wanted, known)}
    if path.parent.name == "notebooks":
        met.add(own[:2])
    out += [f"{own}: its **You need** names lesson {n}, but no prerequisite in metadata.course.prerequisites "
            f"{wanted} (nor theirs) is a lesson {n}; add it, or say the lesson only helps" for n in sorted(numbers - met)]
    out += [f"{own}: a lab cannot be a prerequisite ({p})" for p in wanted if known.get(p, path).parent.name == "labs"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 where the metadata and the text disagree")
    args = ap.parse_args(argv)
    known = stems()
    if args.check:
        problems = [m for p in known.values() for m in disagreements(p, known)]
        print("\n".join(problems) or "prerequisites agree with every notebook's text")
        return 1 if problems else 0
    for stem, path in known.items():
        print(f"{stem}: {', '.join(declared(path)) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
