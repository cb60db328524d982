"""The student release's own tests (``make test`` there): every lesson runs; every lab answers its stubs.

``make student`` (utils/workshop/student.py) writes this file into the release as ``tests/test_course.py``; the
teachers' course does not collect it (it lives in ``utils/``, not ``tests/``), and ``tests/test_workshop_student.py``
runs it on one lab. A lesson is executed by papermill with SMOKE=True, at its ``metadata.course.suite_world_sizes``, and
must pass. A lab is executed as a learner first opens it, stubs untouched, every cell in order, errors allowed:
the first cell that raises must answer "not written yet" (a stub's ``NotImplementedError``), and so must every
cell that calls a checker function the lab imports from ``utils.checkers`` (or "set its diagnosis", lab 11's
answer to a diagnosis left empty): the checker runs, sees an answer not written yet and says so, rather than
crashing, hanging or grading.
"""

import json
import re
import time

import pytest
from utils.course.notebook_runner import (BUILD, ROOT, execute, missing_requirements, notebook_timeout,
                                          supported_world_sizes)

FLAG = "USE_" + "REFERENCE"  # the teachers' switch to a reference solution, spelled so that this file has none
CHECKERS = re.compile(r"from utils\.checkers\.\w+ import ([\w, ]+)")  # what a lab imports from its checker
NOT_YET = re.compile(r"not written yet|YOUR CODE|set its diagnosis")


def run_lab(path, parameters):
    """Every cell of a lab, in order, errors allowed; [(cell source, error name or None, error text + output)]."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in parameters.items())))
    NotebookClient(nb, kernel_name="python3", timeout=notebook_timeout(path), allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    cells = []
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        text += "".join(f"{o.ename}: {o.evalue}" for o in errors)
        cells.append((cell.source, errors[0].ename if errors else None, text))
    return cells


def check_stubs_answered(path, cells):
    """The first error answers "not written yet" (a stub's NotImplementedError, or the lab's summary of them), and
    so does every cell that calls a checker function the lab imports from ``utils.checkers``."""
    erring = [(src, name, text) for src, name, text in cells if name]
    assert erring, f"{path.name}: every cell ran without error, yet its stubs are not written"
    src, name, text = erring[0]
    assert "NotImplementedError" in text and NOT_YET.search(text), (
        f"{path.name}: the first error is {name}, not a stub's:\n{src}\n{text[-2000:]}")
    names = sorted({n.strip() for src, _, _ in cells for found in CHECKERS.findall(src) for n in found.split(",")
                    if n.strip().startswith("check_")})
    assert names, f"{path.name}: imports no check_... function from utils.checkers"
    call = re.compile(r"\b(" + "|".join(names) + r")\(")
    checks = [(src, name, text) for src, name, text in cells if call.search(src) and not CHECKERS.search(src)]
    assert checks, f"{path.name}: no cell calls the checker functions it imports ({names})"
    for src, name, text in checks:
        assert "NotImplementedError" in text and NOT_YET.search(text), (
            f"{path.name}: a checker cell did not answer the unmodified stub with 'not written yet':\n{src}\n"
            f"raised {name}:\n{text[-2000:]}")
    return len(checks)


@pytest.mark.notebook
def test_notebook_runs(path, world_size, record_property):  # (path, world_size) pairs: from conftest.py
    supported = supported_world_sizes(path)
    if supported is not None and world_size not in supported:
        pytest.skip(f"{path.name} cannot use WORLD_SIZE={world_size} (metadata.course.world_sizes = {supported})")
    if missing := missing_requirements(path):
        pytest.skip(f"{path.name} needs {', '.join(missing)} (metadata.course.requires): `make frameworks`")
    if path.parent.name == "labs":
        start = time.perf_counter()
        checks = check_stubs_answered(path, run_lab(path, dict(SMOKE=True, WORLD_SIZE=world_size)))
        record_property("notebook_time", (f"labs/{path.name}: {checks} checker cell(s) answered the stubs "
                                          f"(WORLD_SIZE={world_size})", True, time.perf_counter() - start))
        return
    out = BUILD / "test" / f"ws{world_size}"
    ok, seconds, log = execute(path, out, dict(SMOKE=True, WORLD_SIZE=world_size))
    record_property("notebook_time", (f"{path.relative_to(ROOT)} (WORLD_SIZE={world_size})", ok, seconds))
    assert ok, f"{path.name} failed under papermill with WORLD_SIZE={world_size} (executed copy in {out}):\n{log[-6000:]}"


def test_the_release_holds_no_reference_solution():
    """No solutions folder and no switch to a reference anywhere in what learners got."""
    assert not list(ROOT.rglob("solutions")), "a solutions folder is in the release"
    for path in [*ROOT.glob("labs/*.ipynb"), *ROOT.glob("notebooks/*.ipynb")]:
        code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        assert FLAG not in code and not re.search(r"\b(from|import) solutions\b", code), path.name
