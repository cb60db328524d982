"""The watcher of forbidden calls: a profile hook on every thread the learner's code runs on, that it cannot remove.

Some labs refuse a call: torch's schedules in lab 06 (they compute the order the lab asks for), the lesson's ring
module in lab 14, the planner's search in lab 09. The checker sees calls through a profile hook
(``sys.setprofile``: a "call" event for every Python function, "c_call" for every builtin). A hook set with
``sys.setprofile`` sees only the thread that set it, so an answer that did its forbidden call in a
``threading.Thread`` would pass. So the hook goes on every thread:

- Python 3.12+: ``threading.setprofile_all_threads`` (the running threads and every one started later);
- Python 3.11: ``sys.setprofile`` (this thread) and ``threading.setprofile`` (every thread the ``threading`` module
  starts from now on: ``Thread._bootstrap_inner`` calls ``sys.setprofile(threading._profile_hook)``, read in
  ``threading.py``). Threads that were already running before the call are not the answer's.

And the answer must not switch it off. The hook itself notices a call to ``sys.setprofile``, ``sys.settrace``,
``sys.getprofile`` (the way to put the hook back afterwards), their ``threading`` counterparts, and
``_thread.start_new_thread`` made from outside ``threading`` (a thread that bypasses ``threading.setprofile``);
after the call the checker verifies that the hook is still in place. Any of these is the mistake ``tampered``.
A debugger (``pdb``) inside a checked function sets a trace too, and is refused the same way: debug outside the check.
"""

import _thread
import sys
import threading

from .guard import Guard
from .harness import learner_call

__all__ = ["TAMPER_HINT", "Watcher", "watched_call", "refuse_tampering"]

TAMPER_HINT = ("your code changed the interpreter's profile or trace hooks (sys.setprofile, sys.settrace, "
               "threading.setprofile...) or started a thread behind threading's back: the checker watches the calls "
               "your code makes, on every thread, and refuses an answer that switches that off. Remove those calls "
               "(and any debugger breakpoint) from the checked functions.")
_TAMPERING_BUILTINS = {id(f): name for f, name in (  # by id: a builtin bound to a list cannot be hashed
    (sys.setprofile, "sys.setprofile"), (sys.settrace, "sys.settrace"), (sys.getprofile, "sys.getprofile"),
    (sys.gettrace, "sys.gettrace"), (_thread.start_new_thread, "_thread.start_new_thread"))}
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
    asks you to write, the checker's own search: both ship to learners), else None; the caller fails with its hint.
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
    from .common import LabCheckFailed

    if tampered:
        raise LabCheckFailed("tampered", f"{where} called {', '.join(dict.fromkeys(tampered))}.",
                             TAMPER_HINT, world_size)
