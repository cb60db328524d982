"""Tools for teachers who run a workshop from this course (not part of what learners get).

- ``student``: ``make student``, the course as learners get it, with no reference solution anywhere, in an
  nbgrader course directory (``build/student/release/``): ``build_release``, ``leaks``; ``student_files``: its
  README, Makefile and test runner for learners.

Imported on first use (PEP 562), so that ``python -m utils.workshop.student`` runs the module once.
"""

__all__ = ["build_release", "leaks"]


def __getattr__(name):
    if name in __all__:
        from . import student

        return getattr(student, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
