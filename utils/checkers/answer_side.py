"""Where a learner's code runs when the grader's judge holds it by name: never in the judge's own process.

In a lab notebook a checker gets the learner's functions and classes themselves, and runs them in the kernel and
in the ranks. The workshop's grader (``utils.workshop.grade``) must not: an answer that runs in the process that
writes the verdict can write the verdict (raise the checker's own exception, patch the checker from a class body,
write the result file). So its judge reads the notebook without running it (``labs.defined_names``) and hands the
checker an ``AnswerRef`` for each name, a handle that holds the notebook's path and the name, nothing else:

- sent to a rank (``run_ranks`` pickles its arguments), a handle arrives as the learner's own object:
  ``load_answer`` runs the notebook's definitions in that rank (``answers_from_notebook``) and picks the name;
- a checker's step that calls the learner's code in the kernel (lab 03's ``make_buckets``, lab 06's order, lab 09's
  ``choose_plan``, lab 14's merge and rule) is a function marked ``@answer_side``: called with a handle among its
  arguments, it runs in the *answer's process*, one process per judge started in the answer's sandbox (``python -m
  utils.checkers.answer_side``); what it returns comes back as plain data and tensors (``utils.launch.restricted``),
  a ``LabCheckFailed`` it raises as the same verdict, a stub's ``NotImplementedError`` as itself. Called with the
  learner's objects (in a notebook), it simply runs.

So an ``@answer_side`` step observes (the answer's result, the calls it made) and the judge decides: the checker
compares what comes back with what it computes itself. What an answer can still do, in its own process, is lie about
what it observed there (hide a forbidden call by patching the watcher); for these steps it must still return right
numbers. The same holds in the ranks, where a checker's rank function runs beside the answer's code and can be
replaced by it: each rank gets inputs only it holds, and the checker computes the expected result outside the ranks
(``rank_secrets``), so the ranks' reports are observations that must still hold right numbers; how the ranks moved
the data is observed beside the answer's code, and can be hidden (the limit, said there).
"""

from __future__ import annotations

import functools
import os
import pickle
import socket
import subprocess
import sys
from multiprocessing.connection import Connection

__all__ = ["AnswerRef", "AnswerProcessError", "answer_side", "load_answer", "answer_process", "close_answer_process",
           "PROCESS_WRAPPER"]

# A function wrapping the answer process's command line (``argv -> argv``): the grader's sandbox. None: run as is.
PROCESS_WRAPPER = None


class AnswerRef:
    """A learner's function or class, by name: ``notebook`` (a path) and ``name``. Sent to a rank or to the answer's
    process, it is the learner's object there (``load_answer``); in the judge it cannot be called."""

    def __init__(self, notebook, name):
        self.notebook, self.name = str(notebook), name
        self.__name__ = self.__qualname__ = name

    def __reduce__(self):
        return load_answer, (self.notebook, self.name)

    def __repr__(self):
        return f"<{self.name} of {os.path.basename(self.notebook)}>"

    def __call__(self, *args, **kwargs):
        raise TypeError(f"{self.name} is a learner's answer held by name: call it inside an @answer_side step "
                        "(utils.checkers.answer_side), which runs it in the answer's own process")


class AnswerProcessError(RuntimeError):
    """The answer's process ended, or sent something that is not an answer (``code``: its exit code, if it ended)."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


_DEFINED = {}  # notebook -> its namespace, in the process that runs the learner's code (a rank, the answer process)


def load_answer(notebook, name):
    """The learner's ``name``, from running ``notebook``'s definitions once in this process."""
    from .labs import answers_from_notebook

    if notebook not in _DEFINED:
        _DEFINED[notebook] = answers_from_notebook(notebook)
    namespace = _DEFINED[notebook]
    if name not in namespace:
        raise NameError(f"the notebook defines no {name} when its definitions run (keep the name of the stub)")
    return namespace[name]


def _holds_ref(values):
    return any(isinstance(v, AnswerRef) or (type(v) in (tuple, list) and _holds_ref(v)) for v in values)


def answer_side(func):
    """Mark a checker's step that calls the learner's code in the kernel: with an ``AnswerRef`` among its arguments
    it runs in the answer's process (the module docstring), else here."""
    @functools.wraps(func)
    def step(*args, **kwargs):
        __tracebackhide__ = True
        if not _holds_ref([*args, *kwargs.values()]):
            return func(*args, **kwargs)
        return answer_process().call(func.__module__, func.__qualname__, args, kwargs)
    step.runs_answer_side = True
    return step


# --- in the judge --------------------------------------------------------------------------------------------------

class _AnswerProcess:
    """The judge's end: ``python -m utils.checkers.answer_side FD`` started once (in ``PROCESS_WRAPPER``'s sandbox),
    spoken to over a socket pair: requests pickled by the judge (trusted), replies read with ``loads_tensors``."""

    def __init__(self):
        ours, theirs = socket.socketpair()
        command = [sys.executable, "-m", "utils.checkers.answer_side", str(theirs.fileno())]
        if PROCESS_WRAPPER is not None:
            command = PROCESS_WRAPPER(command)
        self.proc = subprocess.Popen(command, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(ours.detach())

    def call(self, module, qualname, args, kwargs):
        __tracebackhide__ = True
        from ..launch.restricted import RESULT_LIMIT, Unsendable, loads_plain, loads_tensors
        from .harness import LabCheckFailed

        import cloudpickle

        try:
            self.conn.send_bytes(cloudpickle.dumps((module, qualname, args, kwargs)))
            data = self.conn.recv_bytes(RESULT_LIMIT)  # more: OSError, then the process is stopped, below
        except (EOFError, OSError):
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # it closed the socket and goes on: stopped
                self.proc.kill()
                code = self.proc.wait()
            if PROCESS_WRAPPER is not None and 128 < code <= 128 + 64:  # a sandbox (bwrap): 128 + the signal
                code = 128 - code
            raise AnswerProcessError(f"the answer's process ended ({_how(code)}) while running {qualname}",
                                     code) from None
        try:
            kind, raw = loads_plain(data)
            body = loads_tensors(raw)
        except Exception as err:  # noqa: BLE001 -- anything but the protocol: the answer wrote on our socket
            raise AnswerProcessError(f"the answer's process sent something unreadable ({type(err).__name__}) while "
                                     f"running {qualname}") from None
        if kind == "ok":
            return body
        if kind == "unsendable":  # the step's value, as the checker's own type checks will name it (not_ops, ...)
            return Unsendable(*body) if isinstance(body, tuple) and len(body) == 2 else Unsendable("value", body)
        if kind == "failed" and isinstance(body, dict):
            body = {key: _text(body.get(key)) for key in ("mistake", "what", "hint")}  # strings, cut: no bomb
            if body.get("mistake") not in known_mistakes():  # an answer that raised the checker's exception itself
                raise AnswerProcessError(f"{qualname}: the answer's process named the mistake {body.get('mistake')!r}, "
                                         "which no checker names: the answer raised the checker's exception itself")
            raise LabCheckFailed(body["mistake"], body["what"], body["hint"])
        if kind == "stub":
            raise NotImplementedError(_text(body))
        raise AnswerProcessError(f"{qualname} raised in the answer's process: {_text(body)}")

    def close(self):
        self.conn.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _text(value, limit=4000):
    """What the answer's process sent as text: a string, cut at ``limit``; anything else only named (turning a deep
    list into a string can take the judge's memory and minutes)."""
    return value[:limit] if isinstance(value, str) else f"<a {type(value).__name__}, not text>"


def _how(code):
    import signal

    try:
        return f"killed by signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
    except ValueError:  # not a signal Python names
        return f"killed by signal {-code}"


def known_mistakes():
    """Every mistake a checker's step can name in the answer's process: the keys of the checkers' hint tables
    (``fail(HINTS, ...)``), ``raised`` (``learner_call``) and ``tampered`` (``watch``)."""
    import importlib
    import pkgutil

    codes = {"raised", "tampered"}
    for info in pkgutil.iter_modules([os.path.dirname(os.path.abspath(__file__))]):  # this package's modules
        module = importlib.import_module(f"{__package__}.{info.name}")
        for name, value in vars(module).items():
            if name.endswith("HINTS") and isinstance(value, dict):
                codes.update(key for key in value if isinstance(key, str))
    return codes


_PROCESS = None


def answer_process():
    """The judge's answer process, started on first use."""
    global _PROCESS
    if _PROCESS is None:
        _PROCESS = _AnswerProcess()
    return _PROCESS


def close_answer_process():
    global _PROCESS
    if _PROCESS is not None:
        _PROCESS.close()
        _PROCESS = None


# --- in the answer's process ---------------------------------------------------------------------------------------

def _reply(kind, body):
    from ..launch.restricted import Unsendable, dumps_tensors

    try:
        data = dumps_tensors(body)
    except Unsendable as err:
        if kind == "ok":  # the value the step returned: its type and why, for the checker to name
            kind, data = "unsendable", dumps_tensors((err.type_name, err.text))
        elif kind == "failed":  # the verdict without its evidence
            data = dumps_tensors({**body, "evidence": {}})
        else:
            data = dumps_tensors(str(body))
    return pickle.dumps((kind, data))


def serve(fd):
    """Run the judge's requests, one at a time, until it closes the socket: ``(module, qualname, args, kwargs)``."""
    import importlib

    import cloudpickle  # noqa: F401 -- the requests hold functions pickled by value (a check's closures)

    from .harness import LabCheckFailed

    conn = Connection(fd)
    while True:
        try:
            module, qualname, args, kwargs = pickle.loads(conn.recv_bytes())  # from the judge: trusted
        except EOFError:
            return
        try:
            func = importlib.import_module(module)
            for part in qualname.split("."):
                func = getattr(func, part)
            value = func(*args, **kwargs)  # the step itself: its arguments are the learner's objects here
            message = _reply("ok", value)
        except LabCheckFailed as err:
            message = _reply("failed", dict(mistake=err.mistake, what=err.what, hint=err.hint,
                                            world_size=err.world_size, evidence=dict(err.evidence)))
        except NotImplementedError as err:
            message = _reply("stub", str(err))
        except BaseException as err:  # noqa: BLE001 -- the learner's, escaping the step's own harness
            message = _reply("raised", f"{type(err).__name__}: {str(err)[:2000]}")
        sys.stdout.flush(), sys.stderr.flush()
        conn.send_bytes(message)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)
