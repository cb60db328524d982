"""The learners' cheatsheet, notebooks/cheatsheet.md: every formula is its lesson's own, every lesson exists, one page.

Each formula line reads ``- FORMULA — what it is, its symbols ([NN](lesson.ipynb))``. Two checks hold it to the
lesson it links:

- **A whole formula.** The formula (before the dash), and every clause of the description that is one ``$...$``
  alone, must be a *whole* formula of the lesson's Markdown: a whole ``$...$`` there (a display's pieces split at
  ``\\quad``, as in ``$$A, \\qquad B$$``), or plain text that does not run on into more formula (no letter, digit,
  bracket or operator right before or after it). A fragment (``\\frac{p-1}{m+p`` of ``\\frac{p-1}{m+p-1}``, a term
  cut from a sum, one side of an equation) is not whole.
- **A symbol paired with its definition.** A description clause (split at ``,``, ``;`` and ``:`` outside ``$...$``
  and brackets) that holds ``$...$`` and words, such as ``$S$ = bytes of the full tensor``, must be the lesson's own
  clause, words and symbol together (compared with the dollars dropped, bounded by non-letters); the symbol it opens
  with must be one of the line's formulas' symbols; and the formulas and these clauses must all be stated in *one*
  Markdown cell of the lesson, so a line cannot borrow another formula of the lesson (``$2\\Psi$`` for
  ``$2\\Psi + (2 + K)\\Psi/N$``) or a definition given elsewhere. Renaming or redefining a symbol then fails.

Plain-text glosses (``s sequence, b batch``) are not checked: a symbol is checked where it is written ``$x$``.
The checks can fail: ``mutants`` changes every line a coefficient, two symbols swapped, a term dropped, a symbol
renamed and one redefined, and each wrong copy must be caught.
"""

import re

import nbformat

from utils.course.notebook_runner import ROOT

CHEATSHEET = ROOT / "notebooks" / "cheatsheet.md"
MAX_LINES = 70  # one printed page
SEPARATOR = " — "
LINK = re.compile(r"\]\(([^)\s]+\.ipynb)\)")
TAIL = re.compile(r"\s*\(\[[^\]]+\]\([^)\s]+\.ipynb\)\)\s*$")  # the line's closing link, "([06a](06a_...ipynb))"
SPAN = re.compile(r"\$([^$]+)\$")
# a display's pieces: "A, \qquad B" and "A \quad\text{...}" are two formulas (brace depth is checked in _split_display)
DISPLAY_BREAK = re.compile(r"\s*[,;]?\s*\\q?quad\s*")
OPERATORS = set("+-=·×*/≈<>≤≥−^_")  # a formula that has one of these next to it runs on
GLUE = set("_^)]}\\/·×²³'′")  # characters that join a formula to what touches it (with letters and digits)
OPENING = set("([{")  # these join on the right only: "(" before a formula is the sentence's
TEX_NAMES = {"frac", "text", "cdot", "times", "sum", "log", "left", "right", "lceil", "rceil", "Big", "qquad", "quad",
             "approx", "operatorname", "argmax", "nabla", "in", "le", "ge", "log_2", "mathrm", "over"}


def _norm(text: str) -> str:
    """One line per cell: bullets made words (so a list's "- " is no minus), bold marks dropped, ``$$`` as ``$``."""
    text = re.sub(r"(?m)^\s*[-*] ", "• ", text).replace("**", "").replace("$$", "$")
    return " ".join(text.split())


def _split_display(span: str) -> str:
    """``A, \\qquad B.`` inside one ``$...$`` becomes ``A$, $B$.``: each piece a formula of its own (brace depth 0)."""
    out, depth, i = [], 0, 0
    while i < len(span):
        ch = span[i]
        depth += {"{": 1, "}": -1}.get(ch, 0)
        m = DISPLAY_BREAK.match(span, i) if depth == 0 and ch in ",; \\" else None
        if m and "quad" in m.group(0):
            out.append("$, $")
            i = m.end()
            continue
        out.append(ch)
        i += 1
    body = "".join(out)
    stripped = body.rstrip(" .,;")  # "\right\rceil ." ends a sentence, not the formula
    return stripped + "$" + body[len(stripped):].strip()


def lesson_text(path) -> list[str]:
    """The lesson's Markdown cells, normalised, with each display split into its formulas."""
    nb = nbformat.read(path, nbformat.NO_CONVERT)
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        parts = _norm(cell.source).split("$")
        # odd pieces are math: rejoin them with their pieces split; the closing "$" comes from _split_display
        text = "".join(p if k % 2 == 0 else "$" + _split_display(p) for k, p in enumerate(parts))
        cells.append(text)
    return cells


def _in_math(text: str, i: int) -> bool:
    return text.count("$", 0, i) % 2 == 1


def _touches(before: str, after: str) -> bool:
    """Does the formula run on: a letter, digit or joining character right at either end, or an operator next?"""
    left, right = before[-1:], after[:1]
    if left.isalnum() or left in GLUE or right.isalnum() or right in GLUE | OPENING:
        return True
    if (left == "." and before[-2:-1].isdigit()) or (right == "." and after[1:2].isdigit()):  # a decimal point
        return True
    return before.rstrip()[-1:] in OPERATORS or after.lstrip()[:1] in OPERATORS


def _whole_at(text: str, i: int, j: int) -> bool:
    """Is ``text[i:j]`` a whole formula of ``text``: whole ``$...$``, or text that does not run on?"""
    piece = text[i:j]
    if _in_math(text, i) or _in_math(text, j):
        if "$" in piece:  # it would open or close a span in the middle of the lesson's
            return False
        # inside one span: it must be all of it
        return text[:i].endswith("$") and text[j:].startswith("$") and _whole_at(text, i - 1, j + 1)
    if text[i - 1:i] == "(" and text[j:j + 1] == ")":  # "(min(p - s, m))": the brackets are the sentence's
        return not _touches(text[:i - 1], text[j + 1:])
    return not _touches(text[:i], text[j:])


def _balanced(formula: str) -> bool:
    depth = 0
    for ch in formula:
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def is_whole_formula(formula: str, cells: list[str]) -> bool:
    formula = _norm(formula)
    if not _balanced(formula):  # "\frac{p-1}{m+p": a piece of a formula
        return False
    for text in cells:
        i = text.find(formula)
        while i >= 0:
            if _whole_at(text, i, i + len(formula)):
                return True
            i = text.find(formula, i + 1)
    return False


def _flat(text: str) -> str:
    return " ".join(text.replace("$", "").split())


def is_lessons_clause(clause: str, cells: list[str]) -> bool:
    """The clause's words and symbols, dollars dropped, in the lesson, not glued to a letter or digit at either end."""
    clause = _flat(_norm(clause)).lower()  # "Summing $n$ numbers" starts a sentence there
    for text in (_flat(c).lower() for c in cells):
        i = text.find(clause)
        while i >= 0:
            before, after = text[:i][-1:], text[i + len(clause):][:1]
            if not (before.isalnum() or before in "_^\\" or after.isalnum() or after in "_^"):
                return True
            i = text.find(clause, i + 1)
    return False


def clauses(description: str) -> list[str]:
    """The description cut at ``,``, ``;`` and ``:`` that stand outside ``$...$`` and brackets."""
    out, depth, start, math = [], 0, 0, False
    for k, ch in enumerate(description):
        if ch == "$":
            math = not math
        elif not math and ch in "([":
            depth += 1
        elif not math and ch in ")]":
            depth -= 1
        elif not math and depth == 0 and ch in ",;:" and description[k + 1:k + 2] == " ":
            out.append(description[start:k].strip())
            start = k + 1
    out.append(description[start:].strip())
    return [c for c in out if c]


def symbols(formula: str) -> set[str]:
    """The symbols a formula uses: ``\\Psi_{s,t}``, ``T_F``, ``\\varepsilon``, ``n``, ``Ψ``; names like ``\\frac`` and
    the words of ``\\text{...}`` are not symbols."""
    tex = re.sub(r"\\(text|operatorname|mathrm)\{[^}]*\}", " ", formula.replace("$", " "))
    found = set()
    for m in re.finditer(r"(\\[A-Za-z]+|[^\W\d_])(_\{[^}]*\}|_\\text\{[^}]*\}|_[A-Za-z0-9])?", tex):
        if m.group(1).startswith("\\") and m.group(1)[1:] in TEX_NAMES:
            continue
        found.add(m.group(0))
        found.add(m.group(1))  # "P_r" also uses the letter P
    return found


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
        if len(links) != 1 or not (folder / links[0]).is_file() or not TAIL.search(line):
            found.append(f"line {n}: a formula ends with a link to exactly one lesson that exists, this line links "
                         f"{links}")
            continue
        lesson = cells.setdefault(links[0], lesson_text(folder / links[0]))
        formula, description = line[2:].split(SEPARATOR, 1)
        parts = clauses(TAIL.sub("", description))
        formulas = [formula] + [c for c in parts if SPAN.fullmatch(c)]  # "reduce-scatter: $x$": $x$ alone is one
        uses = set().union(*map(symbols, formulas))
        if _norm(formula) in {_norm(m.group(0)) for m in SPAN.finditer(description)}:
            found.append(f"line {n}: the formula {formula!r} again in its description: each says something else")
        where = []  # for each formula and clause checked, the lesson's cells that state it
        for piece in formulas:
            where.append({k for k, cell in enumerate(lesson) if is_whole_formula(piece, [cell])})
            if not where[-1]:
                found.append(f"line {n}: {piece!r} is not a whole formula of {links[0]}'s Markdown; copy the "
                             "lesson's formula whole (its TeX as written there), not a fragment of one")
        for clause in parts:
            if "$" not in clause or SPAN.fullmatch(clause):
                continue
            where.append({k for k, cell in enumerate(lesson) if is_lessons_clause(clause, [cell])})
            if not where[-1]:
                found.append(f"line {n}: the clause {clause!r} is not in {links[0]}'s Markdown; pair each symbol "
                             "with the lesson's own words for it")
            lead = SPAN.match(clause)  # "$S$ = bytes of the full tensor": the symbol this clause defines
            named = symbols(lead.group(0)) if lead else set()
            if len(named - {s for s in named if "_" in s and s.split("_")[0] in named}) == 1 and not named <= uses:
                found.append(f"line {n}: {lead.group(0)!r} is defined here but its formula does not use it; "
                             f"the formula's symbols are {sorted(uses)}")
        if all(where) and not set.intersection(*where):
            found.append(f"line {n}: its formula and its symbols come from different cells of {links[0]} "
                         f"({[sorted(w) for w in where]}); take them from the one cell that states them together")
    return found


def test_every_formula_is_its_lessons_own():
    text = CHEATSHEET.read_text()
    formulas = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(formulas) >= 40, f"only {len(formulas)} formula lines: was the cheatsheet cut short?"
    assert problems(text) == []


def test_it_fits_one_page():
    lines = CHEATSHEET.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"the cheatsheet has {len(lines)} lines; one page is {MAX_LINES}: shorten it"


# --- the check can fail: wrong copies of every line, of four kinds, each must be caught ---------------------------

def _top_level_terms(formula: str) -> list[tuple[int, int]]:
    """Where each `` + x`` / `` - x`` term of a formula sits at bracket depth 0 (operator and term, as (start, end))."""
    spans, depth, start = [], 0, None
    for k, ch in enumerate(formula):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if depth == 0 and formula[k:k + 3] in (" + ", " - "):
            if start is not None:
                spans.append((start, k))
            start = k
        elif ch in "$=" and start is not None and depth == 0:
            spans.append((start, k))
            start = None
    if start is not None:
        spans.append((start, len(formula)))
    return spans


def _swap(formula: str, a: str, b: str) -> str:
    token = r"(?<![\\A-Za-z{}])(" + re.escape(a) + "|" + re.escape(b) + r")(?![A-Za-z])"
    return re.sub(token, lambda m: b if m.group(1) == a else a, formula)


def mutants(text: str):
    """``(kind, line number, the line changed)``: a changed coefficient, two symbols swapped, a term dropped, a symbol
    renamed and a symbol redefined, wherever the line has one to change."""
    for n, line in enumerate(text.splitlines(), 1):
        if not (line.startswith("- ") and SEPARATOR in line):
            continue
        formula, description = line[2:].split(SEPARATOR, 1)
        digit = re.search(r"(?<![_^\\])\d", formula)
        if digit:
            bumped = str((int(digit.group(0)) + 1) % 10)
            changed = formula[:digit.start()] + bumped + formula[digit.end():]
            yield "coefficient", n, "- " + changed + SEPARATOR + description
        letters = sorted(s for s in symbols(formula) if len(s) == 1 and re.search(
            r"(?<![\\A-Za-z{}])" + re.escape(s) + r"(?![A-Za-z])", formula))
        if len(letters) >= 2:
            yield "swapped symbols", n, "- " + _swap(formula, letters[0], letters[1]) + SEPARATOR + description
        for start, end in _top_level_terms(formula)[-1:]:  # the last term: " + P_r" of "2P + P_r"
            yield "dropped term", n, "- " + formula[:start] + formula[end:] + SEPARATOR + description
        first = re.match(r"(\$?)([^$=]+?) [+-] ", formula)  # the first: "2\Psi + " of "$2\Psi + 18\Psi/N$"
        if first and _balanced(first.group(2)):
            yield "dropped term", n, "- " + first.group(1) + formula[first.end():] + SEPARATOR + description
        for clause in clauses(TAIL.sub("", description)):
            lead = SPAN.match(clause)
            if not lead or SPAN.fullmatch(clause) or len(symbols(lead.group(0))) != 1:
                continue
            unused = next(c for c in "qzQZ" if c not in symbols(line))
            renamed = clause.replace(lead.group(0), f"${unused}$", 1)
            yield "renamed symbol", n, line.replace(clause, renamed, 1)
            words = clause[lead.end():].split()
            redefined = clause[:lead.end()] + " " + " ".join(words[:-1] + ["widgets"])
            yield "redefined symbol", n, line.replace(clause, redefined, 1)
            break


# Wrong copies that are another formula the same cell states, told apart only by the line's prose (not checked):
# 04c's all-gather with its backward term dropped is the lesson's own all-gather for reshard_after_forward=False.
SAME_CELL_FORMULAS = {r"$\frac{S-1}{S}(P + P_r)$"}


def test_a_wrong_copy_of_any_formula_or_symbol_is_caught():
    """Every line changed five ways (where it can be): each change must be caught on that line."""
    text = CHEATSHEET.read_text()
    made, missed, equivalent = {}, [], 0
    for kind, n, changed in mutants(text):
        made[kind] = made.get(kind, 0) + 1
        if changed[2:].split(SEPARATOR, 1)[0] in SAME_CELL_FORMULAS:
            equivalent += 1
            assert not problems(changed), f"line {n}: {changed} is caught now: drop it from SAME_CELL_FORMULAS"
        elif not problems(changed):
            missed.append(f"line {n}, {kind}: {changed}")
    assert sum(made.values()) >= 80 and equivalent == len(SAME_CELL_FORMULAS), (made, equivalent)
    assert set(made) == {"coefficient", "swapped symbols", "dropped term", "renamed symbol", "redefined symbol"}, made
    assert missed == [], f"{len(missed)} wrong copies pass the check:\n" + "\n".join(missed)


def test_a_missing_lesson_or_a_line_without_formula_is_caught():
    text = CHEATSHEET.read_text()
    assert any("99_nowhere.ipynb" in p for p in problems(text + "- $x$ — y ([99](99_nowhere.ipynb))\n"))
    assert any("no '—'" in p for p in problems(text + "- a line without its formula\n"))
    fragment = text.replace(r"\frac{p-1}{m+p-1}$ — the idle", r"\frac{p-1}{m+p}$ — the idle")
    assert fragment != text and any("06a_pipeline_schedules.ipynb" in p for p in problems(fragment))
