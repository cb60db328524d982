"""What every lab shares, written once and run for each lab of utils.checkers.labs.LABS.

- The table covers every lab notebook in labs/, and each lab's reference solution defines every name
  the lab asks for.
- The notebook's own stubs (read from the notebook, not re-typed here) define those names, and each
  part of the lab answers them with the stub's "not implemented yet" error, never a grade.
- The reference solution passes every part through the table (the path the workshop's grader takes)
  at the world sizes the notebook runs at in the suite (metadata.course.suite_world_sizes).

Each checker's planted wrong answers are in tests/checkers/test_<checker>.py; the lab notebooks
themselves run in tests/test_notebooks.py.
"""

import pytest

from lab_grading import reference_answers
from utils.course.notebook_runner import ROOT, suite_world_sizes
from utils.checkers.labs import LABS, answers_from_notebook, lab_of

LAB_NOTEBOOKS = sorted((ROOT / "labs").glob("*.ipynb"))


def test_the_table_has_every_lab_notebook_and_no_other():
    assert sorted(LABS) == [path.stem for path in LAB_NOTEBOOKS]
    with pytest.raises(KeyError, match="not a lab of the course"):
        lab_of("notebooks/00_start_here.ipynb")


@pytest.mark.parametrize("name", sorted(LABS))
def test_each_checker_has_its_test_file_and_its_solution(name):
    """Lab, checker, solution and test share one name: utils/checkers/<x>.py, labs/solutions/<x>.py, tests/checkers/test_<x>.py."""
    solution = LABS[name].solution
    for path in (f"utils/checkers/{solution}.py", f"labs/solutions/{solution}.py", f"tests/checkers/test_{solution}.py"):
        assert (ROOT / path).is_file(), f"{name}: no {path}"


@pytest.mark.parametrize("name", sorted(LABS))
def test_the_reference_defines_every_answer(name):
    lab = LABS[name]
    answers = reference_answers(lab, ROOT)
    assert sorted(answers) == sorted(lab.answers)


@pytest.mark.parametrize("name", sorted(LABS))
def test_the_notebook_stubs_raise_their_own_error(name):
    lab = LABS[name]
    stubs = answers_from_notebook(lab.path(ROOT))
    assert set(lab.answers) <= set(stubs), f"{name}: the notebook defines no {set(lab.answers) - set(stubs)}"
    assert stubs.get("USE_REFERENCE") is False, "a lab ships with USE_REFERENCE = False"
    for part in lab.parts:
        with pytest.raises(NotImplementedError):  # the stub's own message, never LabCheckFailed
            part.run(stubs, world_size=2, smoke=True)


def test_a_missing_answer_is_named():
    lab = LABS["06_pipeline_lab"]
    with pytest.raises(NameError, match="defines no interleaved_one_f_one_b"):
        lab.parts[0].run({}, world_size=2)


def test_a_cell_that_does_not_parse_is_named(tmp_path):
    import nbformat

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                               nbformat.v4.new_code_cell("def f(:\n    pass")])
    nbformat.write(notebook, tmp_path / "lab.ipynb")
    with pytest.raises(SyntaxError, match="code cell 1 does not parse"):
        answers_from_notebook(tmp_path / "lab.ipynb")


def test_only_definitions_run(tmp_path):
    """A loop, a print, a launch or the reference import are left out; imports, defs and plain values are kept."""
    import nbformat

    cells = ["import math\nUSE_REFERENCE = False\nTOTAL = 2 * 3", "raise SystemExit('ran a cell')",
             "def f():\n    return math.pi\nprint('ran')\nfor i in range(10**12):\n    pass",
             "if USE_REFERENCE:\n    from solutions.ddp import BucketedDDP", "%time x = 1\n!rm -rf /"]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), tmp_path / "l.ipynb")
    answers = answers_from_notebook(tmp_path / "l.ipynb")
    assert answers["f"]() == answers["math"].pi and answers["USE_REFERENCE"] is False
    assert "TOTAL" not in answers and "BucketedDDP" not in answers and "x" not in answers


REFERENCE_RUNS = [(name, n) for name in sorted(LABS) for n in suite_world_sizes(LABS[name].path(ROOT))]


@pytest.mark.slow
@pytest.mark.parametrize("name, world_size", REFERENCE_RUNS, ids=[f"{name}-{n}" for name, n in REFERENCE_RUNS])
def test_the_reference_passes_every_part(name, world_size):
    lab = LABS[name]
    answers = reference_answers(lab, ROOT)
    for part in lab.parts:
        result = part.run(answers, world_size=world_size, smoke=True)
        assert str(result).startswith("PASSED"), result
