"""The watcher of forbidden calls: a profile hook on every thread the learner's code runs on, beside the guard.

Some labs refuse a call: torch's schedules in lab 06 (they compute the order the lab asks for), the lesson's ring
module in lab 14, the planner's search in lab 09. Two things stand between an answer and those calls:

- the **hook** (``sys.setprofile``: a "call" event for every Python function, "c_call" for every builtin called
  from Python code), which sees a call into a whole module: a lab's ``forbidden(frame, event, arg)`` names it;
- the **guard** (``utils.checkers.guard``), which trips the key targets in place for the duration of the call, so
  that every alias reaches them only to be refused, whatever became of the hook: a name imported earlier, a
  ``partial``, a thread's target, a pool's task (a pool started in an earlier cell too). ``watched_call`` returns
  the guard's record first: with the guard on, switching the hook off no longer hides a tripped target.

The hook goes on every thread:

- Python 3.12+: ``threading.setprofile_all_threads`` (read in 3.12's ``threading.py``: ``setprofile(func)``, for
  the threads started from now on, then ``sys._setprofileallthreads(func)``, for every running Python thread); on
  exit the old hook goes back the same way, on every thread (``threading.setprofile_all_threads(old)``);
- Python 3.11: ``sys.setprofile`` (this thread) and ``threading.setprofile`` (every thread the ``threading`` module
  starts from now on: ``Thread._bootstrap_inner`` calls ``sys.setprofile(threading._profile_hook)``, read in
  ``threading.py``). A thread already running (a pool from an earlier cell) is not watched: only the guard covers it.

The hook notices a call *it sees* to ``sys.setprofile``, ``sys.settrace``, ``sys.getprofile`` (the way to put the
hook back afterwards), ``sys.gettrace``, ``sys._setprofileallthreads`` (3.12+), their ``threading`` counterparts,
and ``_thread.start_new_thread`` made from outside ``threading``; after the call the checker verifies that this
thread's hook is still in place. Any of these is the mistake ``tampered``. A debugger (``pdb``) inside a checked
function sets a trace too, and is refused the same way: debug outside the check.

What the hook does not see (checked on the installed 3.11; 3.12+ was not run here): a builtin called from C, e.g.
``functools.partial(sys.setprofile, None)()`` or ``map(sys.setprofile, ...)``, emits no "c_call"; so an answer can
switch the hook off (on any thread it starts, too) and put it back unseen. Then only the guard's targets are
refused: on 3.11 and 3.12+ alike, a call into the rest of a watched module, a copy of a target's code made before
the call, or a reference to SDPA taken before it passes, with the hook off.
"""

import _thread
import sys
import threading

from .guard import Guard
from .harness import LabCheckFailed, learner_call

__all__ = ["TAMPER_HINT", "Watcher", "watched_call", "refuse_tampering"]

TAMPER_HINT = ("your code changed the interpreter's profile or trace hooks (sys.setprofile, sys.settrace, "
               "threading.setprofile...) or started a thread behind threading's back: the checker watches the calls "
               "your code makes, on every thread, and refuses an answer that switches that off. Remove those calls "
               "(and any debugger breakpoint) from the checked functions.")
_TAMPERING_BUILTINS = {id(f): name for f, name in (  # by id: a builtin bound to a list cannot be hashed
    (sys.setprofile, "sys.setprofile"), (sys.settrace, "sys.settrace"), (sys.getprofile, "sys.getprofile"),
    (sys.gettrace, "sys.gettrace"), (_thread.start_new_thread, "_thread.start_new_thread"),
    *(((sys._setprofileallthreads, "sys._setprofileallthreads"),) if hasattr(sys, "_setprofileallthreads") else ()))}
_TAMPERING_CODE = {getattr(threading, name).__code__: f"threading.{name}" for name in (
    "setprofile", "settrace", "getprofile", "gettrace", "setprofile_all_threads", "settrace_all_threads")
    if hasattr(threading, name)}
_THREADING = threading.__file__


class Watcher:
    """The hook: ``seen`` holds the first label ``forbidden(frame, event, arg)`` gave, ``tampered`` what turned it off.

    Use as a context manager around the learner's code; ``tampered`` is filled on exit too if the hook is gone."""

    def __init__(self, forbidden):
        self.forbidden, self.seen, self.tampered, self.active = forbidden, [], [], False

    def __call__(self, frame, event, arg):
        if not self.active:  # a thread the answer left running after the call: nothing to watch any more
            return
        if event == "c_call" and id(arg) in _TAMPERING_BUILTINS:
            if not (arg is _thread.start_new_thread and frame.f_code.co_filename == _THREADING):  # Thread.start's
                self.tampered.append(_TAMPERING_BUILTINS[id(arg)])
        elif event == "call" and frame.f_code in _TAMPERING_CODE:
            self.tampered.append(_TAMPERING_CODE[frame.f_code])
        if not self.seen and (label := self.forbidden(frame, event, arg)):
            self.seen.append(label)

    def __enter__(self):
        self._old = sys.getprofile(), threading.getprofile()
        self.active = True
        if hasattr(threading, "setprofile_all_threads"):  # Python 3.12+
            threading.setprofile_all_threads(self)
        else:
            threading.setprofile(self)
            sys.setprofile(self)
        return self

    def __exit__(self, *exc):
        self.active = False  # first: the checks below are calls too
        still = sys.getprofile() is self and threading.getprofile() is self
        if hasattr(threading, "setprofile_all_threads"):  # Python 3.12+: the running threads had it too
            threading.setprofile_all_threads(self._old[0])
        else:
            sys.setprofile(self._old[0])
        threading.setprofile(self._old[1])
        if not still:
            self.tampered.append("the profile hook was gone when the call returned")
        return False


def watched_call(fn, args, forbidden, where=None, hints=None, guard=None, **how):
    """``fn(*args)`` under the ``Watcher``: (its result, the label of the first call ``forbidden`` names, or None).

    ``forbidden(frame, event, arg)`` returns a label for a call the lab refuses (the library that does what the lab
    asks you to write, or the judge's own search where the course holds it), else None; the caller fails with its hint.
    An exception the answer raises goes through ``learner_call`` (``where``, ``hints`` and ``how``: its
    ``phrases``, ``let_through``, ``mistake_of``); a hook switched off is
    ``LabCheckFailed("tampered")``. ``guard``: a ``Guard`` of the key targets, on for the call; a call it
    recorded is the label returned, even when the answer caught the refusal or raised something else.
    """
    __tracebackhide__ = True
    name = where or f"{getattr(fn, '__name__', 'your function')}{tuple(args)}"
    guard = guard or Guard()
    try:
        with guard, Watcher(forbidden) as watcher:
            result = learner_call(fn, *args, where=name, hints=hints or {}, **how)
    except BaseException:  # Refused, or what the answer made of it: the record names the mistake
        if not guard.records or sys.exc_info()[0] is KeyboardInterrupt:
            raise
        result = None
    refuse_tampering(watcher.tampered, name)
    return result, (guard.records + watcher.seen or [None])[0]


def refuse_tampering(tampered, where, world_size=None):
    """Raise ``LabCheckFailed("tampered")`` if the answer switched the watcher off or tried to (``tampered``: a
    ``Watcher``'s list, which a rank returns as data)."""
    __tracebackhide__ = True

    if tampered:
        raise LabCheckFailed("tampered", f"{where} called {', '.join(dict.fromkeys(tampered))}.",
                             TAMPER_HINT, world_size)
