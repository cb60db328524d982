"""Teaching the course to a room: one module per job a teacher has before, during and after a workshop.

``seats.py`` deals one machine's cores and GPUs out to the learners; ``hub.py`` serves the course to
them from one JupyterHub (``make hub USERS=N``); ``slurm.py`` is the recipe for a cluster instead;
``preflight.py`` checks a box the day before (``make preflight``); ``student.py`` writes the course as
learners get it, with no reference solution anywhere, in an nbgrader course directory (``make student``;
``student_files.py``: the release's own README, Makefile and test runner; ``student_suite.py``: its tests;
``logic_leaks.py``: a lab answer's logic found in it by shape, renamed or not);
``grade.py`` runs every learner's lab notebooks through the labs' checkers, each answer in its own process
inside ``sandbox.py``'s bubblewrap sandbox (``make grade SUBMISSIONS=folder``), and ``gradebook.py`` writes what it decided; ``submissions.py`` makes a
class of learners' answers, right, unwritten and wrong, to try the grader on. Import the module you need: none is
imported here; ``hub.py`` and the nbgrader engine of ``student.py`` need the ``teacher`` extra. This
package is a teacher's: the student release leaves it out.
"""
