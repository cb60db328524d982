"""Grading at scale: every learner's lab notebooks through the labs' own checkers, each answer in a process of its own.

    python -m utils.workshop.grade SUBMISSIONS OUT     # what `make grade SUBMISSIONS=folder` runs

SUBMISSIONS holds one folder per learner, as nbgrader collects them: ``<learner>/<assignment>/<lab>.ipynb``
(nbgrader's ``submitted/`` folder; a course folder that contains ``submitted/`` works too), or
``<learner>/<lab>.ipynb``. Every folder in it but ``.ipynb_checkpoints`` is a learner with a row, an empty one too, one
named ``submitted`` too when ``submitted/`` itself is given; nothing that is a symlink is followed
(``find_submissions``). A
lab is a notebook of ``labs/`` (``utils.checkers.labs.LABS``); other notebooks are listed and skipped. OUT receives
``gradebook.csv``, ``gradebook.html``, ``results.json`` and
``feedback/<learner>/[<assignment>/]<lab>.md`` (``utils.workshop.gradebook``).

Each (learner, lab, part) is one *answer*, decided by a *judge* (``python -P -m utils.workshop.grade --judge``,
``Judge``), a process that reads the notebook without running any of it (``labs.defined_names``: its plain values,
and a handle, ``answer_side.AnswerRef``, for each function and class) and calls the part's checker the way the lab's
check cell does. The learner's code runs only where a handle is sent: in the ranks (``utils.launch.run_ranks``) and,
for the checkers' steps that call it outside the ranks, in one answer process (``utils.checkers.answer_side``); the
judge reads back what they return as data and tensors only (``utils.launch.restricted``) and decides the verdict
itself: what an answer raises, prints or writes, or patches in the judge's view, is not the verdict
(tests/test_workshop_judge.py). A checker's rank function runs beside the answer in its rank, so an answer can replace
it: each rank therefore gets inputs only it holds, and the checker computes the expected result here
(``utils.checkers.rank_secrets``); what the ranks report about how they moved the data can still be forged. Since
no learner code runs in it, a judge is warm: each worker keeps one and hands it answer after answer (an interpreter,
torch and the checkers imported once); and each worker takes a learner's answers one after another, in one folder
of the learner's, with one rank server for them all (started in the learner's sandbox for the first, stopped after
the last): learners never share a sandbox, so only a learner's own answers can reach each other. The judge runs
outside the sandbox (``-P``: its import path holds not the
answer's folder, where the answer's code writes); what runs the answer's code, its learner's rank server with every
rank (kept for the learner's answers, stopped after the last) and its own answer process (ended with it), runs

- in the sandbox of ``utils.workshop.sandbox`` (bubblewrap; ``--no-sandbox`` where it cannot run, with a warning):
  the course read-only without ``labs/solutions``, ``build/`` and ``.git``, neither the submissions nor the
  gradebook, a copy of its own notebook, no network but loopback; every process it starts ends with it (its own
  process namespace); ``MEMORY_LIMIT`` bytes of address space per process (beyond: the verdict ``memory``) and
  ``CPU_LIMIT`` seconds of CPU per process, by default its timeout (beyond: ``time``);
- in a temporary folder of its learner's (its own with ``run_answer`` alone), its working directory, ``HOME`` and
  ``TMPDIR`` (removed after the learner's last answer), into which the learner's notebooks are copied before any of
  the learner's code runs (the judge itself reads the submissions, never these copies), with
  files it writes capped at ``FILE_LIMIT`` bytes each (``RLIMIT_FSIZE``);
- with a wall-clock timeout (``Part.timeout``, or ``--timeout``), after which the judge and everything under it is
  killed (``utils.launch.children.kill_tree``) and the next answer gets a new judge;
- with its output (through a pipe of its own, which the judge and the sandbox's processes hold for that answer only)
  read as it comes and only the first and last ``OUTPUT_LIMIT / 2`` bytes kept.

Its verdict is one of ``VERDICTS``. Answers run on a pool of one worker a core (fewer where memory is short,
``default_workers``); ``overhead_line`` reports what isolating an answer costs (its sandbox, rank server and
definitions started).
"""

import argparse
import ast
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..checkers.labs import LABS
from ..hardware import usable_cores
from ..launch.scripts import ROOT

__all__ = ["VERDICTS", "Answer", "Verdict", "Submissions", "LINK", "find_submissions", "lab_world_size", "default_workers",
           "run_answer", "grade", "main"]

VERDICTS = {  # verdict -> what the gradebook says (a "mistake" shows the checker's name for it instead)
    "pass": "pass",
    "mistake": "the checker's name for the mistake",
    "not written": "not written yet",
    "missing": "missing",          # the notebook does not define a name the part needs
    "error": "error",              # the notebook's definitions raised, or something escaped the checker's harness
    "timeout": "timeout",
    "crash": "crash",              # the grading process died (os._exit, a signal, out of memory)
    "unparsable": "does not parse",  # not a notebook (invalid JSON), or a code cell with a syntax error
    "memory": "over the memory limit",  # an allocation beyond MEMORY_LIMIT failed, or the process was killed for it
    "time": "over the CPU-time limit",  # CPU_LIMIT (or the timeout's) seconds of CPU used by one process (SIGXCPU)
}
OUTPUT_LIMIT = 8_000   # bytes of an answer's output kept for its feedback: the first and the last half
MESSAGE_LIMIT = 4_000  # characters of a checker's message kept (it may quote the learner's exception)
FILE_LIMIT = 64 << 20  # bytes any one file an answer writes may reach (RLIMIT_FSIZE); beyond: SIGXFSZ, a crash
MEMORY_LIMIT = 6 << 30  # bytes of address space each process of an answer may reserve (the sandbox's prlimit --as)
MEMORY_PHRASES = ("MemoryError", "can't allocate memory", "Cannot allocate memory")
CPU_LIMIT = None  # seconds of CPU each process of an answer may use (prlimit --cpu); None: the answer's timeout, which
# one thread reaches only as its wall-clock timeout ends: ``time`` is for an answer whose threads spin in parallel
HIDDEN = ("labs/solutions", "build", ".git", "tests",  # folders and files of the course an answer's sandbox does not
          "utils/course/mutation_scores.json", "TEACHING.md")  # see: planted wrong answers, mutants' diffs, notes


@dataclass(frozen=True)
class Answer:
    """One learner's notebook for one lab; ``feedback`` is where its feedback goes, under OUT/feedback/."""

    learner: str
    lab: str
    notebook: Path
    feedback: str


@dataclass
class Verdict:
    learner: str
    lab: str
    part: str
    verdict: str
    mistake: str = ""
    message: str = ""
    hint: str = ""
    seconds: float = 0.0
    output: str = ""
    checking: float = 0.0  # of ``seconds``, the judge's time on it (reading the notebook, the checker, its ranks)
    starting: float = 0.0  # of ``checking``, the answer's sandbox and rank server started, its definitions run once

    @property
    def label(self):
        """What the gradebook shows: "pass", the checker's mistake, or the verdict in words."""
        if self.verdict == "missing":
            return f"missing {self.mistake}"
        return self.mistake if self.verdict == "mistake" else VERDICTS[self.verdict]


class Submissions(NamedTuple):
    answers: list   # Answers, to grade
    skipped: dict   # path under submitted/ -> why it is not graded
    learners: dict  # every learner -> "" (its folder was read) or why not: what its gradebook cells then say


LINK = "a symlink: not followed"
NOT_LEARNERS = {".ipynb_checkpoints"}  # Jupyter's own folder, beside a notebook opened in submitted/ itself
SUBMITTED = "submitted"  # nbgrader's folder of submissions


def _points_to(path):
    """Where a symlink points, as written in it: ``os.readlink``, never ``resolve()`` (a loop raises there)."""
    try:
        return os.readlink(path)
    except OSError as err:
        return f"unreadable: {err.strerror}"


def _linked(path):
    return f"{LINK} (it points to {_points_to(path)}); nbgrader collects by copying: copy it in instead"


def find_submissions(folder):
    """Every learner and lab notebook under ``folder`` (nbgrader's submitted/, or a course folder holding it).

    A learner is every folder in it (``..x``, ``.hidden``, spaces, any script; ``iterdir`` never lists ``.`` and
    ``..``) except Jupyter's ``.ipynb_checkpoints``, so an empty one is a row of "not submitted", not a learner gone
    missing. ``folder`` is stepped into its ``submitted/`` only when its own name is not ``submitted``: given
    nbgrader's ``submitted/`` itself, a learner named ``submitted`` is a learner. Nothing that is a symlink is
    followed (a learner folder, a subfolder, a notebook): nbgrader collects by copying, so a link was made by hand
    and may lead anywhere (another learner's notebook, graded as this one's; the solutions; a home directory; itself,
    a loop). A linked learner gets a row saying ``LINK``; a learner folder that cannot be read gets a row saying
    why. A linked subfolder or notebook, a folder that cannot be read, a second copy of a lab (the first in path
    order is graded) and a notebook that is not a lab are skipped, each with why. Returns ``Submissions``."""
    folder = Path(folder)
    if folder.name != SUBMITTED and (folder / SUBMITTED).is_dir():
        folder = folder / SUBMITTED
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder; give the folder of submissions, one folder per learner "
                                "(nbgrader's submitted/<learner>/<assignment>/<lab>.ipynb)")
    answers, skipped, learners = [], {}, {}
    for learner in sorted(folder.iterdir()):
        if learner.is_symlink():  # checked first: is_dir() would follow it
            if not learner.is_file():  # a link to a folder, to nothing any more, or a loop
                learners[learner.name] = LINK
                skipped[learner.name] = _linked(learner)
            continue
        if not learner.is_dir() or learner.name in NOT_LEARNERS:
            continue
        learners[learner.name] = ""
        notebooks = []
        for root, dirs, files in os.walk(learner, onerror=lambda err: skipped.setdefault(
                str(Path(err.filename).relative_to(folder)), f"could not be read: {err.strerror}")):
            here = Path(root)
            depth = len(here.relative_to(learner).parts)  # learner/<lab>.ipynb or learner/<assignment>/<lab>.ipynb
            for name in dirs + files:
                path = here / name
                if path.is_symlink() and name not in NOT_LEARNERS and (name in dirs and not depth or name.endswith(".ipynb")):
                    skipped[str(path.relative_to(folder))] = _linked(path)
                elif name in files and name.endswith(".ipynb"):
                    notebooks.append(path)
            dirs[:] = [] if depth else [d for d in dirs if d not in NOT_LEARNERS and not (here / d).is_symlink()]
        if str(learner.relative_to(folder)) in skipped:  # os.walk could not list the learner's own folder
            learners[learner.name] = f"its folder could not be read ({skipped[learner.name]})"
        for notebook in sorted(notebooks):
            relative = notebook.relative_to(learner)
            where = str(notebook.relative_to(folder))
            if notebook.stem not in LABS:
                skipped[where] = "not a lab of the course"
            elif (learner.name, notebook.stem) in {(a.learner, a.lab) for a in answers}:
                skipped[where] = "a second copy of the lab: the first in path order is graded"
            else:
                answers.append(Answer(learner.name, notebook.stem, notebook.resolve(),
                                      str(relative.with_suffix(".md"))))
    return Submissions(answers, skipped, learners)


def lab_world_size(lab):
    """The WORLD_SIZE of the lab's parameters cell in labs/ (read, not run): the size a learner's check used."""
    import nbformat

    notebook = nbformat.read(str(LABS[lab].path(ROOT)), as_version=4)
    for cell in notebook.cells:
        if "parameters" in cell.metadata.get("tags", []):
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "WORLD_SIZE":
                    return ast.literal_eval(node.value)
    raise ValueError(f"labs/{lab}.ipynb: no WORLD_SIZE in its parameters cell; pass --world-size")


def default_workers(world_size, cores=None, memory=None):
    """Answers graded at once: one a core, and at most one per ``(world_size + 1) * 400 MB`` of available memory
    (the answer's process and its ranks, each a Python with torch: about 300-400 MB resident here), at least one."""
    import psutil

    cores = cores or usable_cores()  # the CPU affinity where there is one (Linux), else the machine's
    memory = memory if memory is not None else psutil.virtual_memory().available
    return max(1, min(cores, int(memory // ((world_size + 1) * 400 * 2**20))))


# --- in the judge: the answer's verdict, decided where none of its code runs ------------------------------------

def _definitions(*answers):
    """Runs in a rank (a one-rank launch): the notebook's definitions, run there; the names they define."""
    return [a.__name__ if hasattr(a, "__name__") else type(a).__name__ for a in answers]


STARTED = [None]  # when grade_one's answer had its sandbox, rank server and definitions up (judge_one reports it)
SERVING = [None]  # the folder whose learner the judge's rank server is kept for, if any


def grade_one(notebook, lab, index, world_size, smoke, source=None):
    """Grade one part, as the judge: a dict of Verdict's fields (verdict, mistake, message, hint).

    The notebook is read, never run, here (``defined_names``): its plain values come as values, its functions and
    classes as ``AnswerRef`` handles that run only in the sandbox, in the ranks and in the answer's process
    (``utils.checkers.answer_side``). What comes back from there is read as data and tensors (``restricted``)."""
    import nbformat

    from ..checkers.answer_side import AnswerProcessError, AnswerRef
    from ..checkers.common import LabCheckFailed
    from ..checkers.labs import defined_names
    from ..launch import RankError, RankTimeoutError, rank_server, run_ranks, server_handle

    part = LABS[lab].parts[index]
    # the judge reads ``source``, the submission itself, never ``notebook``, the copy in the answer's folder, which the
    # learner's earlier code may have replaced (by a link to the solutions); the sandbox's processes load the copy
    source = notebook if source is None else source
    try:
        nbformat.read(str(source), as_version=4)
    except Exception as err:  # noqa: BLE001 -- invalid JSON (NotJSONError), not nbformat 4, unreadable
        return dict(verdict="unparsable", message=f"not a notebook: {type(err).__name__}: {str(err)[:500]}",
                    hint="open it in Jupyter; if it does not open, save it again and submit that copy.")
    try:
        names = defined_names(source)
    except Exception as err:  # noqa: BLE001 -- a cell that does not parse, a literal ast.literal_eval refuses ({[1]})
        return dict(verdict="unparsable", message=f"{type(err).__name__}: {str(err)[:MESSAGE_LIMIT]}",
                    hint="run the notebook from the top; fix the cell named.")
    missing = [name for name in part.needs if name not in names]
    if missing:
        return dict(verdict="missing", mistake=", ".join(missing), message=f"the notebook defines no "
                    f"{', '.join(missing)}", hint=f"keep the names of the notebook's stubs: {', '.join(part.needs)}")
    borrowed = [name for name in part.needs if names[name][0] == "import" and "solutions" in names[name][1].split(".")]
    if borrowed:  # `from labs.solutions... import`: the reference's code, not the learner's
        return dict(verdict="mistake", mistake="imports_reference", message=f"{', '.join(borrowed)}: imported from "
                    "the reference solution (labs/solutions/), not written in the notebook",
                    hint="write your own answer between the ## YOUR CODE markers.")
    answers = {name: value if kind == "value" else AnswerRef(notebook, name) for name, (kind, value) in names.items()}
    refs = [answers[name] for name in part.needs if isinstance(answers[name], AnswerRef)]
    try:
        if refs:  # the definitions, run once in a rank of the sandbox: their own errors named as such
            # what the notebook and the checker import, imported once by the sandbox's rank server (a module the
            # answer names is imported there, in the sandbox, never here), so that no rank imports it again
            rank_server().preload([*(module for kind, module in names.values() if kind == "import"
                                     and module and not module.startswith(".")), part.checker().__module__])
            run_ranks(_definitions, *refs, world_size=1, process_group=False, verbose=False, timeout=part.timeout)
            # what the definitions left running (a daemon, unsealed) is gone before the checker's ranks start
            server_handle.sweep_rank_server()
        STARTED[0] = time.perf_counter()
        result = part.run(answers, world_size, smoke)
    except RankTimeoutError as err:
        return dict(verdict="timeout", message=f"reading the notebook's definitions did not end: {str(err)[:1000]}",
                    hint="a class body or an import of your notebook does not return: look for a loop there.")
    except RankError as err:
        report = err.reports.get(err.rank, {})
        if report.get("type") == "NameError" and "defines no" in report.get("message", ""):
            return dict(verdict="missing", mistake=", ".join(part.needs), message=report["message"],
                        hint=f"keep the names of the notebook's stubs: {', '.join(part.needs)}")
        return dict(verdict="error", message=f"reading the notebook's definitions: {str(err)[:MESSAGE_LIMIT]}",
                    hint="restart the kernel and run the notebook from the top: the same error shows there.")
    except LabCheckFailed as err:
        return dict(verdict="mistake", mistake=err.mistake, message=str(err).removesuffix(f"\nHint: {err.hint}"),
                    hint=err.hint)
    except NotImplementedError as err:
        return dict(verdict="not written", message=str(err), hint="write your code between the ## YOUR CODE markers.")
    except AnswerProcessError as err:
        if err.code is None:
            return dict(verdict="error", message=str(err), hint="your code raised while the checker called it: read "
                        "the message, run the check cell.")
        return dict(verdict="crash", message=str(err), hint="your code ended the process (os._exit, sys.exit, a "
                    "signal): return instead.")
    except Exception as err:  # noqa: BLE001 -- the checker's own, on what the answer sent back
        return dict(verdict="error", message=f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=-4)}",
                    hint="your code raised while the checker called it: read the message, run the check cell.")
    return dict(verdict="pass", message=str(result))


def judge_one(job):
    """One answer in this judge: ``job`` is run_answer's dict (notebook, lab, index, world_size, smoke, box, work, keep).
    The judge's folder, environment and sandbox are the answer's for the time of it; its answer process is its own and
    ends with it; its rank server, in its sandbox, is its own too, or, with ``keep``, its learner's: kept for the
    learner's next answer (``grade`` runs a learner's answers one after another in one folder). Returns Verdict's
    fields."""
    import linecache
    import tempfile as tempfile_module

    from ..checkers.labs import _code_cells

    from ..checkers import answer_side
    from ..launch import server_handle

    if SERVING[0] != job["work"]:  # a server kept for another learner's folder (a learner's last answer stops it)
        server_handle.stop_rank_server()
    SERVING[0] = job["work"]
    linecache.clearcache()  # what an earlier answer's report read; then this answer's cells, the lines it may quote
    try:
        for filename, source, _ in _code_cells(job["source"]):  # the submission (read, not run), not the copy
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    except Exception:  # noqa: BLE001 -- not a notebook, a cell that does not parse: grade_one names it
        pass
    os.chdir(job["work"])  # the ranks' working folder, where they write
    os.environ.update(HOME=job["work"], TMPDIR=job["work"])  # the rendezvous folders of its launches
    tempfile_module.tempdir = None  # tempfile reads TMPDIR again
    box = job["box"]
    if box is not None:
        from . import sandbox

        wrap = lambda argv: sandbox.sandboxed(argv, **box)  # noqa: E731
    else:
        wrap = None
    server_handle.SERVER_WRAPPER = answer_side.PROCESS_WRAPPER = wrap
    start = STARTED[0] = time.perf_counter()
    try:
        fields = grade_one(Path(job["notebook"]), job["lab"], job["index"], job["world_size"], job["smoke"],
                           Path(job["source"]))
    except BaseException as err:  # noqa: BLE001 -- the grader's own bug: this answer's verdict, not the judge's end
        fields = dict(verdict="error", message=f"the grader failed: {type(err).__name__}: {err}",
                      hint="ask the teacher: this is not your code's verdict.")
    finally:
        answer_side.close_answer_process()
        if not job.get("keep"):
            server_handle.stop_rank_server()
            SERVING[0] = None
        else:  # what this answer left running in the learner's sandbox never reaches the learner's next answer
            server_handle.sweep_rank_server()
    fields["message"] = fields["message"][:MESSAGE_LIMIT]
    fields["checking"] = round(time.perf_counter() - start, 2)
    fields["starting"] = round(STARTED[0] - start, 2)
    return fields


def _judge(fd):
    """``--judge FD``: a warm judge. FD is a socket to the grader; each request is one answer's job as JSON, with the
    write end of a pipe for that answer's output (``socket.recv_fds``). The judge points its stdout and stderr there
    (its answer process inherits them; so the pipe ends when the answer's last process has), judges,
    puts its own stdout back, and answers with the verdict's fields as one JSON line. No learner code runs here, so
    one judge serves answer after answer: an interpreter and torch imported once, not once an answer."""
    import resource
    import socket

    from ..launch.restricted import RESTRICTED_ENV
    from ..launch.warm import ENV as WARM_ENV

    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))  # each file an answer's process writes
    os.environ[RESTRICTED_ENV] = "1"  # the ranks send, and run_ranks reads, data and tensors only
    os.environ.pop(WARM_ENV, None)  # never the test suite's warm rank server: it would run outside the sandbox
    channel = socket.socket(fileno=fd)
    quiet, errors = os.open(os.devnull, os.O_WRONLY), os.dup(2)  # the judge's own errors: the grader's stderr
    os.dup2(quiet, 1)
    while True:
        message, fds, _, _ = socket.recv_fds(channel, 1 << 20, 1)
        if not message:
            return
        job = json.loads(message)
        for out in fds:
            os.dup2(out, 1), os.dup2(out, 2)
            os.close(out)
        try:
            fields = judge_one(job)
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(quiet, 1), os.dup2(errors, 2)  # the answer's output pipe is now held by none of ours
        channel.sendall(json.dumps(fields).encode() + b"\n")


class Judge:
    """The grader's end of a warm judge (``python -P -m utils.workshop.grade --judge FD``): ``run(job, timeout)``
    returns (fields or None, output, seconds, timed out); fields None when the judge ended or ran past ``timeout`` (it
    is then killed with everything under it, and the next ``run`` starts a new one). ``close()`` ends it."""

    def __init__(self, env):
        self.env, self.proc = env, None

    def _start(self):
        import socket

        self.channel, theirs = socket.socketpair()
        # -P: the judge's import path holds not its working folder, where an answer's code writes
        self.proc = subprocess.Popen([sys.executable, "-P", "-m", "utils.workshop.grade", "--judge", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     env=self.env, cwd=self.env["HOME"],
                                     start_new_session=True)
        theirs.close()
        self.replies = b""

    def run(self, job, timeout):
        import select
        import socket

        from ..launch.children import Output

        if self.proc is None or self.proc.poll() is not None:
            self._start()
        read, write = os.pipe()
        output = Output(OUTPUT_LIMIT)
        reader = threading.Thread(target=output.read, args=(os.fdopen(read, "rb"),), daemon=True)
        reader.start()
        start = time.perf_counter()
        try:
            socket.send_fds(self.channel, [json.dumps(job).encode()], [write])
        except OSError:
            pass  # the judge is gone: no reply comes, below
        finally:
            os.close(write)
        fields, timed_out = None, False
        while b"\n" not in self.replies:
            left = timeout - (time.perf_counter() - start)
            if left <= 0 or not select.select([self.channel], [], [], left)[0]:
                timed_out = True  # still judging at the timeout
                break
            chunk = self.channel.recv(1 << 20)
            if not chunk:  # the judge ended (a crash of its own, out of memory)
                break
            self.replies += chunk
        if b"\n" in self.replies:
            line, self.replies = self.replies.split(b"\n", 1)
            fields = json.loads(line)
        else:
            self.close(wait=0)  # it and all under it, at once
        reader.join(timeout=10)  # the pipe ends with the answer's last process
        return fields, output.text(), time.perf_counter() - start, timed_out

    def close(self, wait=15):
        """End the judge: its channel closed, ``wait`` seconds for it to leave by itself, then it and all under it
        killed."""
        from ..launch.children import kill_tree

        if self.proc is not None:
            self.channel.close()
            if wait and self.proc.poll() is None:
                try:
                    self.proc.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    pass
            kill_tree([self.proc])
            self.proc.wait()
            self.proc = None


# --- in the grader -----------------------------------------------------------------------------------------------

# What of the teacher's environment reaches a judge, and through its ranks the answers' code (run_ranks gives every rank
# the environment of the process that launches it): what Python, torch, its backends and BLAS libraries, CUDA and the
# course read, by name or prefix; never the rest (the hub's password, a token, whatever the teacher's shell holds)
JUDGE_ENV = ("PATH", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONIOENCODING", "HOME", "TMPDIR", "LANG", "LC_", "TZ", "TERM",
             "LD_LIBRARY_PATH", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH_", "CUDA_", "NCCL_", "GLOO_", "NVIDIA_",
             "TRITON_", "COURSE_")


def judge_env():
    """The judges' environment: the course on the path, one thread, no rendezvous of the grader's, and of the
    teacher's variables only those ``JUDGE_ENV`` names (by name, or by prefix for those that end with "_")."""
    def absolute(variable):  # an empty or relative entry is the judge's folder, where an answer's code writes
        return [p for p in os.environ.get(variable, "").split(os.pathsep) if os.path.isabs(p)]

    kept = {k: v for k, v in os.environ.items() if k in JUDGE_ENV or any(
        k.startswith(prefix) for prefix in JUDGE_ENV if prefix.endswith("_"))}
    env = dict(kept, PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join([str(ROOT), *absolute("PYTHONPATH")]), PATH=os.pathsep.join(absolute("PATH")),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), HOME=tempfile.gettempdir())
    env.pop("MASTER_ADDR", None), env.pop("MASTER_PORT", None)
    return env


def run_answer(answer, index, world_size, smoke=False, timeout=None, sandbox=None, hidden=(), judge=None, folder=None,
               keep=False, cpu=None):
    """Grade part ``index`` of ``answer`` (see the module's docstring): a Verdict.

    ``sandbox``: run its code in ``utils.workshop.sandbox`` (True), not (False), or where bubblewrap works (None);
    ``hidden``: more folders its sandbox must not see (the submissions, the gradebook); ``judge``: a warm ``Judge``
    to use (``grade`` keeps one a worker), else one is started for this answer and closed after. ``folder``: the
    learner's folder, where ``grade`` copies each of the learner's notebooks and runs all of them (one sandbox's worth
    of processes, its rank server kept from one answer to the next while ``keep``; ``cpu``: its CPU limit, the
    longest of the learner's timeouts), else a fresh temporary folder for this answer alone."""
    from . import sandbox as box

    part = LABS[answer.lab].parts[index]
    timeout = timeout or part.timeout
    boxed = box.available() is None if sandbox is None else sandbox
    own = judge is None
    judge = judge or Judge(judge_env())
    try:
        # the learner's folder (grade removes it), or a temporary one of this answer's own
        with contextlib.nullcontext(None) if folder is not None else \
                tempfile.TemporaryDirectory(prefix="grade-", ignore_cleanup_errors=True) as tmp:
            work = Path(folder) if folder is not None else Path(tmp, "work")
            work.mkdir(exist_ok=True)
            notebook = work / answer.notebook.name  # a copy: the sandbox never sees the submissions
            if folder is None:  # (grade copies a learner's notebooks before any of the learner's code runs)
                shutil.copyfile(answer.notebook, notebook)
            spec = None
            if boxed:  # the judge runs outside the sandbox; what runs the answer's code (ranks, answer process) inside
                spec = dict(work=str(work), readable=[str(ROOT)], memory=MEMORY_LIMIT, cpu=cpu or CPU_LIMIT or timeout,
                            hidden=[str(ROOT / h) for h in HIDDEN] + list(map(str, hidden)))
            job = dict(notebook=str(notebook), source=str(answer.notebook), lab=answer.lab, index=index, world_size=world_size, smoke=smoke,
                       box=spec, work=str(work), keep=keep)
            fields, output, seconds, timed_out = judge.run(job, timeout)
    finally:
        if own:
            judge.close()
    verdict = Verdict(answer.learner, answer.lab, part.name, "crash", seconds=round(seconds, 2), output=output)
    if fields is not None:
        for key, value in fields.items():
            setattr(verdict, key, value)
    elif timed_out:
        verdict.verdict, verdict.message = "timeout", f"still running after {timeout:g} s; stopped"
        verdict.hint = "your code does not return: look for a loop that never ends, or a wait nobody answers."
    else:
        verdict.message = "the judge ended without a verdict: the machine out of memory, or the grader's bug"
        verdict.hint = "ask the teacher: this is not your code's verdict."
    if verdict.verdict in ("mistake", "error", "crash") and "killed by signal SIGXCPU" in verdict.message:
        verdict.verdict = "time"  # a process of the answer's, killed at its CPU limit (utils.launch names the signal)
        verdict.hint = (f"a process of your answer used {cpu or CPU_LIMIT or timeout:g} s of CPU: look for a loop "
                        "that never ends.")
    if verdict.verdict in ("mistake", "error", "crash") and any(
            phrase in verdict.message + verdict.output for phrase in MEMORY_PHRASES):
        verdict.verdict = "memory"
        verdict.hint = (f"your answer asked for more memory than the grader allows a process "
                        f"({MEMORY_LIMIT >> 30} GiB of address space): allocate what the task needs.")
    return verdict


def grade(answers, world_size=None, smoke=False, workers=None, timeout=None, log=print, sandbox=None, hidden=()):
    """Every part of every answer: a list of Verdicts. ``workers`` threads, each with a warm judge, take a learner's
    answers one after another, in one folder of the learner's, whose rank server (in the learner's sandbox) serves
    them all: learners never share a sandbox, a learner's answers do. ``sandbox``, ``hidden``: as for ``run_answer``."""
    sizes = {a.lab: world_size or lab_world_size(a.lab) for a in answers}
    workers = workers or default_workers(max(sizes.values(), default=1))
    jobs = [(a, i) for a in answers for i in range(len(LABS[a.lab].parts))]
    done, lock = [0], threading.Lock()

    local = threading.local()  # each worker's warm judge
    judges = []
    by_learner = {}  # a learner's answers, one after another, on one worker: one folder, one sandbox's rank server
    for answer, index in jobs:
        by_learner.setdefault(answer.learner, []).append((answer, index))

    def one_learner(items):
        if not hasattr(local, "judge"):
            local.judge = Judge(judge_env())
            with lock:
                judges.append(local.judge)
        cpu = CPU_LIMIT or max(timeout or LABS[a.lab].parts[i].timeout for a, i in items)
        verdicts = []
        with tempfile.TemporaryDirectory(prefix="grade-", ignore_cleanup_errors=True) as tmp:
            work = Path(tmp, "work")
            work.mkdir()
            for answer in dict.fromkeys(a for a, _ in items):  # all of them before any of the learner's code runs
                shutil.copyfile(answer.notebook, work / answer.notebook.name)
            for n, (answer, index) in enumerate(items):
                try:
                    verdict = run_answer(answer, index, sizes[answer.lab], smoke, timeout, sandbox, hidden,
                                         judge=local.judge, folder=work, keep=n + 1 < len(items), cpu=cpu)
                except Exception as err:  # noqa: BLE001 -- the grader's own failure on this answer: its verdict only
                    local.judge.close(wait=0)  # and a fresh judge (and server) for the learner's next answer
                    verdict = Verdict(answer.learner, answer.lab, LABS[answer.lab].parts[index].name, "crash",
                                      message=f"the grader failed on this answer: {type(err).__name__}: {err}",
                                      hint="ask the teacher: this is not your code's verdict.")
                with lock:
                    done[0] += 1
                    log(f"[{done[0]}/{len(jobs)}] {answer.learner} {answer.lab} {verdict.part}: {verdict.label} "
                        f"({verdict.seconds:.1f} s)")
                verdicts.append(verdict)
        return verdicts

    log(f"grading {len(jobs)} answers ({len(answers)} notebooks) on {workers} worker(s)")
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            verdicts = [v for mine in pool.map(one_learner, by_learner.values()) for v in mine]
    finally:
        for judge in judges:
            judge.close()
    log(overhead_line(verdicts))
    return verdicts


def overhead_line(verdicts):
    """Per answer, the medians of its wall time, of the judge's time on it, and of the part of that spent starting its
    isolation: its sandbox and rank server started, its definitions run once (``Verdict.starting``; not counted: the
    answer process that four parts start later, and the stopping of both). The judge itself is warm (``Judge``): no
    interpreter is started per answer but those that run the answer's code."""
    timed = [v for v in verdicts if v.checking]
    if not timed:
        return "per answer: no check finished, no overhead to report"
    med = lambda xs: statistics.median(xs)  # noqa: E731
    return (f"per answer (median of {len(timed)}): {med([v.seconds for v in timed]):.1f} s, of which the judge "
            f"{med([v.checking for v in timed]):.1f} s, and of that the sandbox, rank server and definitions started "
            f"{med([v.starting for v in timed]):.1f} s")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--judge"]:  # a warm judge (Judge)
        return _judge(int(argv[1]))
    parser = argparse.ArgumentParser(prog="python -m utils.workshop.grade", description=__doc__.split("\n")[0])
    parser.add_argument("submissions", help="one folder per learner (nbgrader's submitted/)")
    parser.add_argument("out", help="where the gradebook and the feedback go")
    parser.add_argument("--world-size", type=int, help="ranks per check (default: each lab's WORLD_SIZE)")
    parser.add_argument("--workers", type=int, help="answers at once (default: cores // world size, at least 1)")
    parser.add_argument("--timeout", type=float, help="seconds per answer (default: each part's Part.timeout)")
    parser.add_argument("--smoke", action="store_true", help="the checkers' SMOKE sizes (fewer steps, sizes)")
    parser.add_argument("--labs", nargs="+", metavar="LAB", help="grade only these labs (notebook stems)")
    parser.add_argument("--no-sandbox", action="store_true", help="run answers without the sandbox (a machine "
                        "without bubblewrap): an answer can then read the solutions and write outside its folder")
    args = parser.parse_args(argv)
    from .sandbox import available

    why = None if args.no_sandbox else available()
    if why:
        parser.error(f"the sandbox cannot run here: {why}. Or pass --no-sandbox (GRADE_ARGS=--no-sandbox), knowing "
                     "that an answer can then read the solutions and write outside its folder.")
    if args.no_sandbox:
        print("WARNING: grading without the sandbox: an answer can read labs/solutions and write outside its folder")
    from .gradebook import write_gradebook

    sys.stdout.reconfigure(errors="backslashreplace")  # a learner's name that is not UTF-8: \udcXX, not a crash

    try:
        answers, skipped, learners = find_submissions(args.submissions)
    except FileNotFoundError as err:
        parser.error(str(err))
    if args.labs:
        unknown = set(args.labs) - set(LABS)
        if unknown:
            parser.error(f"--labs {' '.join(sorted(unknown))}: not labs of the course; the labs are {', '.join(LABS)}")
        answers = [a for a in answers if a.lab in args.labs]
    for path, why in skipped.items():
        print(f"skipped {path}: {why}")
    start = time.perf_counter()
    verdicts = grade(answers, args.world_size, args.smoke, args.workers, args.timeout,
                     sandbox=not args.no_sandbox, hidden=[Path(args.submissions).resolve(), Path(args.out).resolve()])
    paths = write_gradebook(answers, verdicts, args.out, learners, args.labs)
    print(f"graded {len(verdicts)} answers in {time.perf_counter() - start:.0f} s: {', '.join(map(str, paths))}")


if __name__ == "__main__":
    main()
