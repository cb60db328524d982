"""Claims tied to their source: every sentence about what a library does inside carries a pointer (a maintainer tool).

    python tests/claims.py                  # checks every pointer; exits 1 on any broken one
    python tests/claims.py --json out.json  # the same, and the result as JSON (for a run against another torch)

A pointer lives in the notebook's metadata, never in its prose::

    nb.metadata["course"]["claims"] = [
      {"cell": "<cell id>", "says": "<short exact quote from that cell>",
       "file": "torch/distributed/run.py",        # relative to the directory that holds the top-level package
       "code": "start_new_session=True"},         # a short exact piece of that file's code that makes it true
    ]

The rules (tests/test_claims.py holds every notebook and lab to them, and tests them on planted bad pointers):

- ``cell`` is a cell of the notebook and ``says`` occurs in its source (whitespace runs collapsed), so rewording the
  sentence forces a look at its pointer;
- ``file`` exists where the installed package lives (found with importlib, without importing it);
- ``code`` occurs in the file (whitespace runs collapsed) and at least one occurrence lies in code: not wholly inside a
  comment or a string literal / docstring (Python files: ``tokenize``; other files: not on a line that starts with
  ``//``, ``#``, ``*`` or ``/*``); and ``code`` holds more than one token (a bare name proves nothing);
- a pointer into a package that ``make setup`` does not install (the ``teacher`` extra: nbgrader, jupyterhub) is
  skipped, with the reason, while that package is absent.

On a library upgrade the list of "lessons to re-read" this prints is the maintainer's work.
"""

import argparse
import bisect
import functools
import importlib.util
import io
import json
import re
import sys
import tokenize
from collections import Counter
from pathlib import Path

from minutes import key, notebooks, source  # one list of the course's notebooks, one way to name and read them

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = {"nbgrader": "teacher", "jupyterhub": "teacher"}  # top-level package -> the extra that installs it
FIELDS = ("cell", "says", "file", "code")


def squash(text):
    return re.sub(r"\s+", " ", text).strip()


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def claims_of(nb):
    return nb.get("metadata", {}).get("course", {}).get("claims", [])


@functools.cache
def package_root(top):
    """The directory that holds the installed top-level package (or module) ``top``; None when it is absent."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).parent
    return Path(spec.origin).parent if spec.origin else None


@functools.cache
def _squashed(path):
    """The file's text with whitespace runs collapsed to one space, and a map back: each piece of it starts at
    ``flat_starts[k]`` in the collapsed text and at ``orig_starts[k]`` in the file (within a piece, offsets agree)."""
    text = _read(path)
    parts, flat_starts, orig_starts, flat, pos = [], [], [], 0, 0
    for m in re.finditer(r"\s+", text):
        for piece, orig in ((text[pos:m.start()], pos), (" ", m.start())):
            flat_starts.append(flat)
            orig_starts.append(orig)
            parts.append(piece)
            flat += len(piece)
        pos = m.end()
    flat_starts.append(flat)
    orig_starts.append(pos)
    parts.append(text[pos:])
    return "".join(parts), flat_starts, orig_starts


@functools.cache
def _read(path):
    return Path(path).read_text(encoding="utf-8", errors="replace")


@functools.cache
def _not_code_mask(path):
    """A bytearray over the file's characters: 1 where a character is in a comment or a string literal (Python), or on
    a comment line (other files). Whitespace counts as neither code nor not-code: callers look at the rest."""
    text = _read(path)
    mask = bytearray(len(text))
    if str(path).endswith((".py", ".pyi")):
        starts = [0]
        for line in text.splitlines(keepends=True):
            starts.append(starts[-1] + len(line))
        try:
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                if tok.type in (tokenize.COMMENT, tokenize.STRING):
                    a = starts[tok.start[0] - 1] + tok.start[1]
                    b = starts[tok.end[0] - 1] + tok.end[1]
                    mask[a:b] = b"\x01" * (b - a)
        except (tokenize.TokenError, IndentationError, SyntaxError):
            pass  # a file tokenize cannot read to the end: what it read is marked
    else:
        offset = 0
        for line in text.splitlines(keepends=True):
            if line.lstrip().startswith(("//", "#", "*", "/*")):
                mask[offset:offset + len(line)] = b"\x01" * len(line)
            offset += len(line)
    return mask


def token_count(piece):
    """How many tokens ``piece`` holds, read as Python (a fragment: unbalanced brackets allowed)."""
    count = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(piece).readline):
            if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                continue
            count += 1
    except (tokenize.TokenError, IndentationError, SyntaxError):
        count = max(count, len(re.findall(r"\w+|[^\w\s]", piece)))
    return count


def find_in_code(path, piece):
    """(found, in code): whether ``piece`` occurs in the file, and whether one of its occurrences lies in code."""
    text = _read(path)
    flat, flat_starts, orig_starts = _squashed(path)
    mask = _not_code_mask(path)

    def orig(i):
        k = bisect.bisect_right(flat_starts, i) - 1
        return orig_starts[k] + (i - flat_starts[k])

    needle = squash(piece)
    found = False
    start = flat.find(needle)
    while start >= 0:
        found = True
        if any(not mask[i] and not text[i].isspace() for i in range(orig(start), orig(start + len(needle) - 1) + 1)):
            return True, True
        start = flat.find(needle, start + 1)
    return found, False


def check(nb, claim):
    """None when the pointer holds; ("skip", reason) for an absent optional package; else ("broken", what broke)."""
    missing = [f for f in FIELDS if not isinstance(claim.get(f), str) or not claim.get(f).strip()]
    if missing:
        return "broken", f"pointer lacks {', '.join(missing)}"
    cells = {c.get("id"): c for c in nb["cells"]}
    if claim["cell"] not in cells:
        return "broken", f"no cell with id {claim['cell']!r}"
    if squash(claim["says"]) not in squash(source(cells[claim["cell"]])):
        return "broken", "the quote is not in the cell (the sentence changed: re-check the claim, then the quote)"
    top = claim["file"].split("/")[0].removesuffix(".py")
    root = package_root(top)
    if root is None:
        if top in OPTIONAL:
            return "skip", f"{top} is not installed (the {OPTIONAL[top]!r} extra)"
        return "broken", f"package {top!r} is not installed"
    path = root / claim["file"]
    if not path.is_file():
        return "broken", f"{claim['file']} is gone from {top}"
    if token_count(claim["code"]) < 2:
        return "broken", f"code {claim['code']!r} is a bare name or one token: quote the code that makes it true"
    found, in_code = find_in_code(path, claim["code"])
    if not found:
        return "broken", f"code {claim['code']!r} is gone from {claim['file']}"
    if not in_code:
        return "broken", f"code {claim['code']!r} is only in a comment or a string/docstring of {claim['file']}"
    return None


def library(claim):
    return claim.get("file", "?").split("/")[0].removesuffix(".py")


def run(paths=None):
    """Checks every pointer of every notebook and lab: a dict with the counts, the broken and skipped pointers and the
    lessons to re-read."""
    result = {"pointers": 0, "per_library": Counter(), "broken": [], "skipped": [], "reread": []}
    for path in paths or notebooks():
        nb = load(path)
        for claim in claims_of(nb):
            result["pointers"] += 1
            result["per_library"][library(claim)] += 1
            verdict = check(nb, claim)
            if verdict is None:
                continue
            kind, why = verdict
            entry = {"notebook": key(path), "says": claim.get("says"), "file": claim.get("file"),
                     "code": claim.get("code"), "why": why}
            result["broken" if kind == "broken" else "skipped"].append(entry)
    result["reread"] = sorted({b["notebook"] for b in result["broken"]})
    result["per_library"] = dict(sorted(result["per_library"].items()))
    return result


def report(result, out=None):
    out = out or sys.stdout
    for b in result["broken"]:
        print(f"BROKEN {b['notebook']}: \"{b['says']}\"\n    {b['file']}: {b['why']}", file=out)
    for s in result["skipped"]:
        print(f"skipped {s['notebook']}: \"{s['says']}\" ({s['why']})", file=out)
    per = ", ".join(f"{lib} {n}" for lib, n in result["per_library"].items())
    print(f"{result['pointers']} pointers ({per}); {len(result['broken'])} broken, {len(result['skipped'])} skipped",
          file=out)
    if result["reread"]:
        print("lessons to re-read: " + ", ".join(result["reread"]), file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", metavar="FILE", help="write the result as JSON")
    args = parser.parse_args(argv)
    result = run()
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 1 if result["broken"] else 0


if __name__ == "__main__":
    sys.exit(main())
