"""The launcher behind every multi-rank cell: ``run_ranks`` and the ``%%ranks`` magic (notebook 00).

A launch crosses three kinds of process, and each file here runs in one of them:

====================  ===========  ==================================================================
file                  runs in      does
====================  ===========  ==================================================================
``plan.py``           the kernel   checks the arguments, picks backend, device and threads
                                   (``LaunchPlan``), and what each rank is told (``RankSetup``)
``kernel.py``         the kernel   ``run_ranks``: packs the function, asks the server for ranks,
                                   prints their output, raises their errors, stops them
``server_handle.py``  the kernel   its handle on the server: starts it, has it import what the
                                   notebook imported, fork a rank, report the ranks' exits
``server.py``         the server   a warm Python started once per kernel: imports torch, forks ranks
``rank.py``           each rank    becomes the kernel (folder, path, environment), joins the process
                                   group, runs the function, sends the result back; ``rank_device``
``relay.py``          both         ``backend="relay"``: a process group whose every message passes
                                   through the kernel, which writes it down (a checker's ranks)
``seal.py``           each rank    a relay rank's seccomp filter: no socket, file write or signal to
                                   a peer, so the relay is its one way to the others
``errors.py``         the kernel   which rank failed first; where hung ranks were stuck
``magic.py``          the kernel   ``%%ranks N``: a cell's code as the function
``restricted.py``     the kernel   what a rank sends back, read as plain data (and tensors, where a
                                   grader's ranks run a learner's code): never a function it names
``report.py``         the kernel   a failed launch in one line per rank: the call each waits in
                                   and the program's line that made it (labs 11a and 11b)
``children.py``       any parent   a command in a session of its own: output read by a thread, a
                                   timeout, its whole process tree killed (torchrun's agents, the
                                   grader's answers, the test suite's notebooks)
``scripts.py``        any parent   a lesson script under ``torchrun`` (``run_script``, ``launch``):
                                   its command line, a timeout, its ``RESULT`` line read back
``warm.py``           the suite    the test suite's warm starts: one process imports torch once and
                                   forks each notebook's kernel and its rank server (learners' start cold)
====================  ===========  ==================================================================

Read them in that order. What the package offers the rest of the course is listed in ``__all__``; ``report``
and ``scripts`` are imported by their names (``from utils.launch.scripts import run_script``).
"""

from .children import ChildResult, kill_tree, run_child, run_children, start_child
from .errors import RankError, RankTimeoutError
from .kernel import DEFAULT_TIMEOUT, run_ranks
from .plan import LaunchPlan, RankSetup, plan_launch
from .rank import rank_device
from .server_handle import rank_server

__all__ = ["run_ranks", "rank_device", "plan_launch", "LaunchPlan", "RankSetup", "RankError", "RankTimeoutError",
           "DEFAULT_TIMEOUT", "rank_server", "start_child", "run_child", "run_children", "ChildResult", "kill_tree"]
