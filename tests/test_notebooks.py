"""Every notebook and lab, executed end to end by papermill with small parameters.

A notebook is a test: its asserts are the claims of the lesson. Parameters injected into the cell
tagged ``parameters``: SMOKE=True (tiny sizes) and WORLD_SIZE, once with 2 and once with 4 ranks
(``pytest --world-sizes=2`` for a quicker run); labs also get USE_REFERENCE=True, so that their
checker runs on the reference solution (tests/test_labs.py feeds it wrong ones).
"""

import pytest
from conftest import NOTEBOOK_TIMES
from notebook_runner import BUILD, ROOT, course_notebooks, execute, parameters_for


@pytest.mark.notebook
@pytest.mark.parametrize("path", course_notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_runs(path, world_size):  # world_size: from --world-sizes (conftest.py)
    out = BUILD / "test" / f"ws{world_size}"
    ok, seconds, log = execute(path, out, parameters_for(path, SMOKE=True, WORLD_SIZE=world_size))
    NOTEBOOK_TIMES.append((f"{path.relative_to(ROOT)} (WORLD_SIZE={world_size})", ok, seconds))
    assert ok, f"{path.name} failed under papermill with WORLD_SIZE={world_size} (executed copy in {out}):\n{log[-6000:]}"
