"""Every notebook and lab, executed end to end by papermill with small parameters.

A notebook is a test: its asserts are the claims of the lesson. Parameters injected into the cell
tagged ``parameters``: SMOKE=True (tiny sizes) and WORLD_SIZE=2; labs also get USE_REFERENCE=True,
so that their checker runs on the reference solution (tests/test_labs.py feeds it wrong ones).
"""

import pytest
from conftest import NOTEBOOK_TIMES
from notebook_runner import BUILD, ROOT, course_notebooks, execute, parameters_for

SMOKE_PARAMETERS = {"SMOKE": True, "WORLD_SIZE": 2}


@pytest.mark.notebook
@pytest.mark.parametrize("path", course_notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_runs(path):
    ok, seconds, log = execute(path, BUILD / "test", parameters_for(path, **SMOKE_PARAMETERS))
    NOTEBOOK_TIMES.append((str(path.relative_to(ROOT)), ok, seconds))
    assert ok, f"{path.name} failed under papermill (executed copy in build/test/):\n{log[-6000:]}"
