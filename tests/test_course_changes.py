"""utils/course/changes.py, behind `make test-quick`: which notebooks a change touches (fast: nothing is executed)."""

import pytest
from utils.course.changes import changed_files, notebook_dependencies, text_at, utils_closure
from utils.course.notebook_runner import ROOT


def test_a_lab_depends_on_its_checker_its_solution_and_what_they_import():
    deps = notebook_dependencies(ROOT / "labs" / "02_ddp_lab.ipynb")
    assert {"labs/02_ddp_lab.ipynb", "utils/checkers/ddp.py", "labs/solutions/ddp.py",
            "utils/data_parallel/buckets.py", "utils/launch/kernel.py"} <= deps  # buckets: through checkers/ddp.py
    assert "utils/mesh/parallelize3d.py" not in deps


def test_a_lesson_depends_on_the_scripts_it_runs():
    deps = notebook_dependencies(ROOT / "notebooks" / "10_torchrun_and_slurm.ipynb")
    assert {"notebooks/scripts/02_ddp_train.py", "utils/scale_out/torchrun.py", "utils/data_parallel/torch_ddp.py"} <= deps


def test_a_package_brings_its_init_and_relative_imports():
    closure = utils_closure("utils.mesh.parallelize3d")
    assert {"utils/mesh/__init__.py", "utils/mesh/mesh3d.py", "utils/sharding/memory.py", "utils/__init__.py"} <= closure


def test_a_bad_revision_is_named():
    with pytest.raises(ValueError, match="no-such-revision"):
        changed_files("no-such-revision")


def test_a_file_at_a_commit_and_a_range():
    assert "def changed_files" in text_at("HEAD", "utils/course/changes.py")
    assert text_at("HEAD", "no/such/file.py") is None
    with pytest.raises(ValueError, match="no-such-revision"):
        text_at("no-such-revision", "utils/course/changes.py")
    assert changed_files("HEAD..HEAD") == set()  # a range of commits: no untracked file counts
