"""The learners' cheatsheet, notebooks/cheatsheet.md: every formula is its lesson's own, every lesson exists, one page.

Each formula line reads ``- FORMULA — what its symbols are ([NN](lesson.ipynb))``. The formula (before the dash,
TeX or the lesson's plain text) must appear in a Markdown cell of the lesson it links, and so must every other
``$...$`` on the line, compared with the dollars dropped and whitespace collapsed: a lesson that changes a formula
fails here until the cheatsheet copies the new one.
"""

import re

import nbformat

from utils.course.notebook_runner import ROOT

CHEATSHEET = ROOT / "notebooks" / "cheatsheet.md"
MAX_LINES = 70  # one printed page
SEPARATOR = " — "
LINK = re.compile(r"\]\(([^)\s]+\.ipynb)\)")
TEX = re.compile(r"\$([^$]+)\$")


def _flat(text: str) -> str:
    """Dollars dropped, whitespace collapsed: a formula the lesson wraps over two lines still matches."""
    return " ".join(text.replace("$", "").split())


def _lesson_markdown(path):
    nb = nbformat.read(path, nbformat.NO_CONVERT)
    return [_flat(cell.source) for cell in nb.cells if cell.cell_type == "markdown"]


def problems(text: str, folder=CHEATSHEET.parent) -> list[str]:
    """What is wrong with the cheatsheet ``text``, one sentence each (empty: nothing)."""
    found, cells = [], {}
    for n, line in enumerate(text.splitlines(), 1):
        for link in LINK.findall(line):
            if not (folder / link).is_file():
                found.append(f"line {n}: links {link}, which is not in {folder.name}/; link the lesson's file name")
        if not line.startswith("- "):
            continue
        if SEPARATOR not in line:
            found.append(f"line {n}: no {SEPARATOR.strip()!r} between the formula and its symbols: {line[:60]}")
            continue
        links = LINK.findall(line)
        if len(links) != 1 or not (folder / links[0]).is_file():
            found.append(f"line {n}: a formula links exactly one lesson that exists, this line links {links}")
            continue
        formula = line[2:].split(SEPARATOR, 1)[0]
        markdown = cells.setdefault(links[0], _lesson_markdown(folder / links[0]))
        for piece in [formula] + [m.group(0) for m in TEX.finditer(line)]:
            if not any(_flat(piece) in cell for cell in markdown):
                found.append(f"line {n}: {piece!r} is not in the Markdown of {links[0]}; copy the lesson's own "
                             "formula (its TeX as written there) into the cheatsheet")
    return found


def test_every_formula_is_its_lessons_own():
    text = CHEATSHEET.read_text()
    formulas = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(formulas) >= 40, f"only {len(formulas)} formula lines: was the cheatsheet cut short?"
    assert problems(text) == []


def test_it_fits_one_page():
    lines = CHEATSHEET.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"the cheatsheet has {len(lines)} lines; one page is {MAX_LINES}: shorten it"


def test_a_changed_formula_or_a_missing_lesson_is_caught():
    """The check can fail: a bubble written as (p-1)/(m+p), a lesson that does not exist, a line with no formula."""
    text = CHEATSHEET.read_text()
    assert r"\frac{p-1}{m+p-1}" in text
    wrong = text.replace(r"\frac{p-1}{m+p-1}", r"\frac{p-1}{m+p}")
    assert any("06a_pipeline_schedules.ipynb" in p for p in problems(wrong))
    assert any("99_nowhere.ipynb" in p for p in problems(text + "- $x$ — y ([99](99_nowhere.ipynb))\n"))
    assert any("no '—'" in p for p in problems(text + "- a line without its formula\n"))
    lesson_symbol = text.replace(r"$(n-1)\,\varepsilon\sum_r|x_r|$", r"$(n-1)\,\varepsilon\sum_r|x_r|$ $\delta_q$")
    assert any(r"\delta_q" in p for p in problems(lesson_symbol)), "a symbol's TeX must be the lesson's too"
