"""The student release's README, Makefile and test runner: the teachers' files less what learners have no use for.

Used by ``utils.workshop.student`` (``make student``). Each function takes the teachers' text and returns the
learners': the Makefile less the developers' targets, the README less its sentences about reference solutions and
its commands the release has not, the test runner with no reference parameter.
"""

import ast
import re

__all__ = ["FLAG", "KEPT_TARGETS", "RELEASE_NOTE", "SOLUTIONS", "release_makefile", "release_readme", "release_runner", "targets"]

FLAG = "USE_REFERENCE"  # the teachers' switch to a lab's reference solution
SOLUTIONS = "solutions"  # labs/solutions/: the teachers' folder, never released
KEPT_TARGETS = {"setup", "lab", "test", "strip", "clean", "frameworks", "$(STAMP)", "$(FW_STAMP)"}


def _rules(lines):
    """The targets of the rule lines among ``lines`` (not recipes, not .PHONY, not inside define ... endef)."""
    targets, inside = set(), False
    for line in lines:
        if re.match(r"define\b", line):
            inside = True
        elif line.startswith("endef"):
            inside = False
        elif not inside and not line.startswith(("\t", ".PHONY")):
            if m := re.match(r"([^\s#=:][^=:]*?):(?!=)", line):
                targets |= set(m.group(1).split())
    return targets


def release_makefile(text):
    """The Makefile less the targets of the teachers' and developers' tools: blocks (blank-line separated) whose
    rules are all in KEPT_TARGETS stay; .PHONY lines keep only the targets that stay."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = []
        for line in block.split("\n"):
            if line.startswith(".PHONY:"):
                names = [n for n in line.split(":", 1)[1].split() if n in KEPT_TARGETS]
                line = ".PHONY: " + " ".join(names) if names else None
            if line is not None:
                lines.append(line)
        if lines and _rules(lines) <= KEPT_TARGETS:
            out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def targets(makefile):
    return _rules(makefile.split("\n"))


def _blocks(markdown):
    """Markdown split into blocks at blank lines outside code fences."""
    blocks, current, fenced = [], [], False
    for line in markdown.split("\n"):
        if line.strip().startswith("```"):
            fenced = not fenced
        if not line.strip() and not fenced:
            if current:
                blocks.append("\n".join(current))
            current = []
        else:
            current.append(line)
    return blocks + (["\n".join(current)] if current else [])


RELEASE_NOTE = ("In this copy of the course `make test` runs every lesson with small parameters and opens every "
                "lab as you get it, stubs unwritten, checking that its checker answers \"not written yet\".")
TEACHER_WORDS = rf"{FLAG}|{SOLUTIONS}/|reference solution|TEACHING\.md"


def _make_targets(block):
    """The targets named by the ``make ...`` commands in backticks (variables like PYTHON=... left out)."""
    return {w for cmd in re.findall(r"`make ([^`]*)`", block) for w in cmd.split() if "=" not in w}


def release_readme(text, targets, drop_sections=("Teaching a workshop", "For teachers")):
    """A README for learners: sentences about reference solutions removed, blocks naming a ``make`` target the
    release does not have removed, and the teachers' sections left out; RELEASE_NOTE after the first code block."""
    out, skipping, noted = [], False, False
    for block in _blocks(text):
        if block.startswith("## "):
            skipping = block[3:].split("\n")[0].strip() in drop_sections
        if skipping or not _make_targets(block) <= targets:
            continue
        if re.search(TEACHER_WORDS, block):  # keep the lines, drop the sentences
            parts = re.split(r"((?<=[.!?)])\s+(?=[A-Z`*]))", block)
            kept = [(sep, sentence) for sep, sentence in zip([""] + parts[1::2], parts[0::2])
                    if not re.search(TEACHER_WORDS, sentence)]
            block = "".join(sep + sentence for sep, sentence in kept).lstrip()
        out.append(block)
        if block.startswith("```") and not noted:
            out.append(RELEASE_NOTE)
            noted = True
    return "\n\n".join(out) + "\n"


def _replace_function(source, name, new):
    """``source`` with the top-level function ``name`` replaced by the code ``new`` (found with ast, not a regex)."""
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = source.split("\n")
    return "\n".join(lines[:node.lineno - 1] + new.strip("\n").split("\n") + lines[node.end_lineno:])


RUNNER_PARAMETERS = '''
def parameters_for(path, **parameters):
    """The student release has no reference solutions: a notebook gets the parameters it is given."""
    return parameters
'''


def release_runner(source):
    """utils/course/notebook_runner.py with ``parameters_for`` passing the parameters it is given, nothing added."""
    return _replace_function(source, "parameters_for", RUNNER_PARAMETERS)
