"""The course's own tools: what keeps the lessons honest and runs them, no lesson's (a maintainer's, not a learner's).

Each module runs as ``python -m utils.course.NAME`` (``make`` targets in brackets); ``tests/`` holds their tests,
``tests/test_course_NAME.py``.

- ``notebook_runner``: every notebook headless with papermill, timed, its peak memory sampled (``make course``);
  the test suite runs the notebooks through it (``tests/test_notebooks.py``, ``tests/conftest.py``).
- ``early_errors``: the first cells of many notebooks in one Python, for the suite's check that an unsupported
  ``WORLD_SIZE`` fails at once.
- ``minutes``: each notebook's one stated time, from its text and ``run_minutes.json``, the measured run times
  (``make minutes``); ``observed`` feeds that file (``make course``'s measurements, a workshop's real minutes:
  ``minutes --measured``, ``--record``); ``teaching_guide`` writes TEACHING.md from them (``make guide``), with
  ``teaching_notes``: each notebook's notes for the teacher (``metadata.course.teaching``) and the instructor keys.
- ``stray_output``: every warning or stderr line of an executed notebook is on its list, explained in its text
  (``tests/test_notebooks.py`` fails a notebook on any other).
- ``schedules``: the workshop plans TEACHING.md gives (blocks between breaks, set-up, slack, each lab on its lesson's
  day), checked against ``prerequisites`` (each notebook's ``metadata.course.prerequisites``, checked against its
  **You need** text).
- ``claims``: every sentence about what a library does carries a pointer into that library's source, checked.
- ``shown_source``: the utils functions each notebook prints as source, listed in ``shown_source.json`` (``make
  shown``); ``changes``: the notebooks a change touches (``make test-quick``).
- ``robustness``: the suite's timing claims under a busy core, repeated (``make robust``).
- ``torch_suite``: the whole suite on another torch, in its own environment (``make test-torch``; run by its path,
  standard library only).
- ``bench_launch``: how long a multi-rank launch takes, and threads per rank (``make bench``; it asserts nothing).

- ``lab_overrides.json``: JupyterLab's defaults for the course (no news pop-up, no kernel chooser), which ``make setup``
  installs into ``.venv`` (``tests/test_lab_settings.py``).

Nothing is imported here. The student release (``utils.workshop.student``) keeps ``notebook_runner`` and
``run_minutes.json``, which its own tests use, and ``lab_overrides.json``, and leaves the rest out.
"""
