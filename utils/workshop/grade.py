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

Each (learner, lab, part) is one *answer*, graded by ``python -m utils.workshop.grade --one ...``: a fresh
process that reads the notebook's definitions (``answers_from_notebook``) and calls the part's checker the way
the lab's check cell does (the checker starts its ranks with ``utils.launch.run_ranks``). Why a process per
answer: a learner's code can hang, ``os._exit``, kill itself, print without end or write files, and none of
that may reach the grader or another learner. So each answer runs

- in the sandbox of ``utils.workshop.sandbox`` (bubblewrap; ``--no-sandbox`` where it cannot run, with a warning):
  the course read-only without ``labs/solutions``, ``build/`` and ``.git``, neither the submissions nor the
  gradebook, a copy of its own notebook, no network but loopback; every process it starts ends with it (its own
  process namespace); ``MEMORY_LIMIT`` bytes of address space per process (beyond: the verdict ``memory``) and
  ``CPU_LIMIT`` seconds of CPU per process, by default its timeout (beyond: ``time``);
- in a fresh temporary folder, its working directory, ``HOME`` and ``TMPDIR`` (removed afterwards), with
  files it writes capped at ``FILE_LIMIT`` bytes each (``RLIMIT_FSIZE``);
- with a wall-clock timeout (``Part.timeout``, or ``--timeout``), after which the process and everything
  under it is killed;
- with its output read as it comes and only the first and last ``OUTPUT_LIMIT / 2`` bytes kept.

The verdict is still written by the answer's own process (``--one``), so an answer that forges it is not
stopped yet (issue 37, part 3). The last three by ``utils.launch.children`` (``run_child``), the course's one way
to run a child and stop its tree.

Its verdict is one of ``VERDICTS``. Answers run on a pool of one worker a core (fewer where memory is short,
``default_workers``): an answer spends most of its time starting Python and importing torch, on one core, and
a few seconds in its ranks (measured on 2 cores: 70 answers took 805 s on one worker, 496 s on two).
"""

import argparse
import ast
import json
import os
import shutil
import signal
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
from ..launch import run_child
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
    checking: float = 0.0  # of ``seconds``, the check itself (reading the notebook, the checker, its ranks)

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


# --- inside the answer's own process ---------------------------------------------------------------------------

def grade_one(notebook, lab, index, world_size, smoke):
    """Grade one part in this process: a dict of Verdict's fields (verdict, mistake, message, hint)."""
    import nbformat

    from ..checkers.common import LabCheckFailed
    from ..checkers.labs import answers_from_notebook

    part = LABS[lab].parts[index]
    try:
        nbformat.read(str(notebook), as_version=4)
    except Exception as err:  # noqa: BLE001 -- invalid JSON (NotJSONError), not nbformat 4, unreadable
        return dict(verdict="unparsable", message=f"not a notebook: {type(err).__name__}: {str(err)[:500]}",
                    hint="open it in Jupyter; if it does not open, save it again and submit that copy.")
    try:
        answers = answers_from_notebook(notebook)
    except SyntaxError as err:
        return dict(verdict="unparsable", message=str(err), hint="run the notebook from the top; fix the cell named.")
    except BaseException as err:  # noqa: BLE001 -- an import or a class body of the learner's raised
        return dict(verdict="error", message=f"reading the notebook's definitions: {type(err).__name__}: {err}",
                    hint="restart the kernel and run the notebook from the top: the same error shows there.")
    missing = [name for name in part.needs if name not in answers]
    if missing:
        return dict(verdict="missing", mistake=", ".join(missing), message=f"the notebook defines no "
                    f"{', '.join(missing)}", hint=f"keep the names of the notebook's stubs: {', '.join(part.needs)}")
    borrowed = [name for name in part.needs if "solutions" in str(getattr(answers[name], "__module__", "")).split(".")]
    if borrowed:  # `from labs.solutions... import`: the repository is on the path, so the import works
        return dict(verdict="mistake", mistake="imports_reference", message=f"{', '.join(borrowed)}: imported from "
                    "the reference solution (labs/solutions/), not written in the notebook",
                    hint="write your own answer between the ## YOUR CODE markers.")
    try:
        result = part.run(answers, world_size, smoke)
    except LabCheckFailed as err:
        return dict(verdict="mistake", mistake=err.mistake, message=str(err).removesuffix(f"\nHint: {err.hint}"),
                    hint=err.hint)
    except NotImplementedError as err:
        return dict(verdict="not written", message=str(err), hint="write your code between the ## YOUR CODE markers.")
    except BaseException as err:  # noqa: BLE001 -- the learner's code, SystemExit included
        return dict(verdict="error", message=f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=-4)}",
                    hint="your code raised while the checker called it: read the message, run the check cell.")
    return dict(verdict="pass", message=str(result))


def _one(argv):
    """``--one NOTEBOOK LAB PART RESULT WORLD_SIZE [--smoke]``: grade one part, write the verdict to RESULT."""
    import resource

    notebook, lab, index, result, world_size, *smoke = argv
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    start = time.perf_counter()
    fields = grade_one(Path(notebook), lab, int(index), int(world_size), smoke == ["--smoke"])
    fields["message"] = fields["message"][:MESSAGE_LIMIT]
    fields["checking"] = round(time.perf_counter() - start, 2)  # informational (the answer could write it)
    Path(result).write_text(json.dumps(fields))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no teardown of what the answer left running (threads, a rank server): the grader kills it


# --- in the grader -----------------------------------------------------------------------------------------------

def run_answer(answer, index, world_size, smoke=False, timeout=None, sandbox=None, hidden=()):
    """Grade part ``index`` of ``answer`` in a process of its own (see the module's docstring): a Verdict.

    ``sandbox``: run it in ``utils.workshop.sandbox`` (True), not (False), or where bubblewrap works (None);
    ``hidden``: more folders its sandbox must not see (the submissions, the gradebook)."""
    from . import sandbox as box

    part = LABS[answer.lab].parts[index]
    timeout = timeout or part.timeout
    boxed = box.available() is None if sandbox is None else sandbox
    with tempfile.TemporaryDirectory(prefix="grade-", ignore_cleanup_errors=True) as tmp:
        work, result = Path(tmp, "work"), Path(tmp, "result.json")
        work.mkdir()
        notebook = work / answer.notebook.name  # a copy: the sandbox never sees the submissions
        shutil.copyfile(answer.notebook, notebook)
        env = dict(os.environ, HOME=str(work), TMPDIR=str(work), PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        env.pop("MASTER_ADDR", None), env.pop("MASTER_PORT", None)
        command = [sys.executable, "-m", "utils.workshop.grade", "--one", str(notebook), answer.lab, str(index),
                   str(result), str(world_size), *(["--smoke"] if smoke else [])]
        if boxed:
            command = box.sandboxed(command, tmp, readable=[ROOT], hidden=[ROOT / h for h in HIDDEN] + list(hidden),
                                    memory=MEMORY_LIMIT, cpu=CPU_LIMIT or timeout)
        done = run_child(command, timeout, env=env, cwd=work, stdin=subprocess.DEVNULL, limit=OUTPUT_LIMIT, drain=10)
        verdict = Verdict(answer.learner, answer.lab, part.name, "crash", seconds=round(done.seconds, 1),
                          output=done.output)
        if done.timed_out:
            verdict.verdict, verdict.message = "timeout", f"still running after {timeout:g} s; stopped"
            verdict.hint = "your code does not return: look for a loop that never ends, or a wait nobody answers."
        elif result.exists():
            for key, value in json.loads(result.read_text()).items():
                setattr(verdict, key, value)
        else:
            code = done.code
            if boxed and code > 128:  # bwrap exits with 128 + the signal that ended the program it ran
                code = -(code - 128)
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            verdict.message = f"the grading process ended without a verdict ({how})"
            verdict.hint = "your code ended the process (os._exit, sys.exit in a rank, a signal): return instead."
            if code == -signal.SIGXCPU:
                verdict.verdict, verdict.hint = "time", (f"a process of your answer used {CPU_LIMIT or timeout:g} s "
                                                         "of CPU: look for a loop that never ends.")
        if verdict.verdict in ("mistake", "error", "crash") and "killed by signal SIGXCPU" in verdict.message:
            verdict.verdict = "time"  # a rank of the answer's, killed at its CPU limit (utils.launch names the signal)
            verdict.hint = (f"a process of your answer used {CPU_LIMIT or timeout:g} s of CPU: look for a loop that "
                            "never ends.")
        if verdict.verdict in ("mistake", "error", "crash") and any(
                phrase in verdict.message + verdict.output for phrase in MEMORY_PHRASES):
            verdict.verdict = "memory"
            verdict.hint = (f"your answer asked for more memory than the grader allows a process "
                            f"({MEMORY_LIMIT >> 30} GiB of address space): allocate what the task needs.")
    return verdict


def grade(answers, world_size=None, smoke=False, workers=None, timeout=None, log=print, sandbox=None, hidden=()):
    """Every part of every answer, on ``workers`` threads each running one answer's process: a list of Verdicts.
    ``sandbox``, ``hidden``: as for ``run_answer``."""
    sizes = {a.lab: world_size or lab_world_size(a.lab) for a in answers}
    workers = workers or default_workers(max(sizes.values(), default=1))
    jobs = [(a, i) for a in answers for i in range(len(LABS[a.lab].parts))]
    done, lock = [0], threading.Lock()

    def one(job):
        answer, index = job
        verdict = run_answer(answer, index, sizes[answer.lab], smoke, timeout, sandbox, hidden)
        with lock:
            done[0] += 1
            log(f"[{done[0]}/{len(jobs)}] {answer.learner} {answer.lab} {verdict.part}: {verdict.label} "
                f"({verdict.seconds:.1f} s)")
        return verdict

    log(f"grading {len(jobs)} answers ({len(answers)} notebooks) on {workers} worker(s)")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        verdicts = list(pool.map(one, jobs))
    log(overhead_line(verdicts))
    return verdicts


def overhead_line(verdicts):
    """Per answer, the median of its wall time, of its check, and of the rest: the overhead of isolating it (a fresh
    interpreter, its imports, the sandbox, the folder made and removed), what warm workers would save."""
    timed = [v for v in verdicts if v.checking]
    if not timed:
        return "per answer: no check finished, no overhead to report"
    med = lambda xs: statistics.median(xs)  # noqa: E731
    return (f"per answer (median of {len(timed)}): {med([v.seconds for v in timed]):.1f} s, of which the check "
            f"{med([v.checking for v in timed]):.1f} s and the overhead (interpreter, imports, sandbox) "
            f"{med([v.seconds - v.checking for v in timed]):.1f} s")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--one"]:  # inside an answer's process (run_answer)
        return _one(argv[1:])
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
