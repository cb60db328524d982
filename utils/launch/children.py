"""Child processes: start a command in a session of its own, read its output, wait with a timeout, kill its tree.

The course's one way to run a program it must never hang on nor leave behind. Three places need it: the
``torchrun`` agents of lesson scripts (``utils.launch.scripts.run_agents``, under ``launch`` and ``run_script``:
lessons 02 to 13b), the workshop's grader (each learner's answer, ``utils.workshop.grade.run_answer``) and the test
suite's notebooks (``utils/course/notebook_runner.py``). Each keeps the same four rules, written here once:

- the child leads a session of its own (``start_new_session=True``): its process group is its own, not ours;
- a thread reads its output as it comes (a child that fills its pipe stops until someone reads), keeping all of
  it or, with ``limit``, its first and last ``limit / 2`` bytes and a count of the rest;
- the caller waits at most ``timeout`` seconds;
- whatever ends the wait, the child **and every process under it** are killed (``kill_tree``), also those in
  sessions of their own (torchrun's workers, papermill's kernel), then the output is read to its end.

    done = run_child([sys.executable, "-c", "print('hi')"], timeout=60, env=env, cwd=folder)
    done.code, done.output, done.seconds, done.stopped      # 0, 'hi\\n', 0.1, None
    child = start_child(command, env=env); watch(child.pid); done = child.wait(timeout=600)   # the pid while it runs
    first, second = run_children([agent_a, agent_b], timeout=300, echo=True, prefix="[agent {i}] ", until=ready)

Nothing here knows about lessons: the callers choose the environment, the folder and what to echo.
"""

import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["ChildResult", "Child", "Output", "start_child", "run_child", "run_children", "kill_tree", "send_signal"]

POLL = 0.2  # seconds between looks at several children (or one whose lines we echo or test with ``until``)
DRAIN = 30  # seconds to wait, once the tree is killed, for the output's end (a process that left it may hold the pipe)


@dataclass(frozen=True)
class ChildResult:
    """What one child did.

    ``code``: its exit code (negative: the signal that ended it), or None when it was still running when the wait
    ended and was killed. ``stopped``: why the wait ended before every child had ended by itself (``timed out after
    60 s``; ``exit code 3``, a sibling's failure; ``until``), else None. ``output``: its stdout and stderr together,
    as written (with a ``limit``: the head, a line saying how many bytes were left out, the tail). ``seconds``: from
    the start to the end of the wait, the output read."""

    command: tuple
    code: int | None
    output: str
    seconds: float
    stopped: str | None = None

    @property
    def timed_out(self):
        return (self.stopped or "").startswith("timed out")

    def tail(self, lines=25):
        """The last ``lines`` lines of the output, for an error message."""
        return "\n".join(self.output.splitlines()[-lines:])


class Output:
    """A child's output as its reader thread gets it: all of it, or (``limit``) the first and last ``limit // 2``
    bytes and a count of the rest (a child may print without end). With ``lines`` (a queue), each complete line
    is also put there, as ``(index, text)``, for the calling thread to echo."""

    def __init__(self, limit=None, lines=None, index=0):
        self.limit, self.lines, self.index = limit, lines, index
        self.chunks, self.head, self.tail, self.total, self.partial = [], b"", b"", 0, b""
        self.lock = threading.Lock()  # ``text()`` may be called (``until``) while the reader appends

    def read(self, stream):
        for chunk in iter(lambda: stream.read1(65536), b""):
            with self.lock:
                self._keep(chunk)
            if self.lines is not None:
                self._split(chunk)
        if self.lines is not None and self.partial:  # a last line without its newline
            self.lines.put((self.index, self.partial.decode(errors="replace")))

    def _keep(self, chunk):
        self.total += len(chunk)
        if self.limit is None:
            self.chunks.append(chunk)
            return
        half = self.limit // 2
        if len(self.head) < half:
            self.head, chunk = self.head + chunk[:half - len(self.head)], chunk[half - len(self.head):]
        self.tail = (self.tail + chunk)[-half:]

    def _split(self, chunk):
        *complete, self.partial = (self.partial + chunk).split(b"\n")
        for line in complete:
            self.lines.put((self.index, (line + b"\n").decode(errors="replace")))
        if len(self.partial) > 65536:  # a line without end: echo it in pieces rather than hold it all
            self.lines.put((self.index, self.partial.decode(errors="replace")))
            self.partial = b""

    def text(self):
        with self.lock:
            if self.limit is None:
                return b"".join(self.chunks).decode(errors="replace")
            cut = self.total - len(self.head) - len(self.tail)
            middle = f"\n[... {cut:,} bytes of output left out ...]\n" if cut > 0 else ""
            return (self.head + middle.encode() + self.tail).decode(errors="replace")


class Child:
    """A command running in a session of its own, its output read by a thread; ``start_child`` makes one."""

    def __init__(self, command, env=None, cwd=None, stdin=None, limit=None, lines=None, index=0):
        self.command, self.output = tuple(command), Output(limit, lines, index)
        self.started = time.perf_counter()
        try:
            self.proc = subprocess.Popen(list(command), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         env=env, cwd=cwd, start_new_session=True)
        except FileNotFoundError as err:  # the folder was checked before: the program is missing
            raise FileNotFoundError(f"cannot start {list(map(str, command))}: no program {str(command[0])!r} (give "
                                    "its path, or a name on the PATH of the environment given)") from err
        self.reader = threading.Thread(target=self.output.read, args=(self.proc.stdout,), daemon=True,
                                       name=f"output of {self.proc.pid}")
        self.reader.start()

    @property
    def pid(self):
        return self.proc.pid

    def wait(self, timeout, drain=DRAIN):
        """Wait at most ``timeout`` seconds, kill the tree (``kill_tree``), read the output to its end: its
        ChildResult."""
        return _wait([self], timeout, drain=drain)[0]


def _check(commands, timeout, envs, cwd, limit):
    """Every argument at once, with the numbers: nothing is started when one is wrong."""
    if not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout={timeout!r}: give a positive number of seconds, e.g. 300")
    if not commands:
        raise ValueError("no command given: give a list of commands, each a list such as [sys.executable, '-c', ...]")
    for command in commands:
        if isinstance(command, (str, bytes)) or not command:
            raise TypeError(f"command {command!r}: give a non-empty list of arguments, such as "
                            f"{str(command).split()[:3] or ['python', '-c', 'pass']}, not one string")
    if len(envs) != len(commands):
        raise ValueError(f"{len(envs)} environments for {len(commands)} commands: give one dict per command, "
                         "or one dict for all")
    if cwd is not None and not Path(cwd).is_dir():
        raise FileNotFoundError(f"cwd={str(cwd)!r}: no such folder to start {list(map(str, commands[0]))} in")
    if limit is not None and (not isinstance(limit, int) or limit < 2):
        raise ValueError(f"limit={limit!r}: give the bytes of output to keep (half from the start, half from the "
                         "end), at least 2, e.g. 8000; or None to keep all of it")


def start_child(command, env=None, cwd=None, stdin=None, limit=None):
    """Start ``command`` (a list) in a session of its own, its output (stderr with stdout) read by a thread.

    ``env``: the child's whole environment (None: ours). ``cwd``: its working folder (None: ours). ``stdin``: as for
    ``subprocess.Popen`` (None: ours; ``subprocess.DEVNULL``: nothing). ``limit``: keep only the first and last
    ``limit // 2`` bytes of output (None: all). Returns a ``Child``; ``child.wait(timeout)`` ends it."""
    _check([command], 1, [env], cwd, limit)
    return Child(command, env, cwd, stdin, limit)


def run_child(command, timeout, env=None, cwd=None, stdin=None, limit=None, echo=False, prefix="", until=None,
              drain=DRAIN):
    """``run_children`` with one command: its ChildResult."""
    return run_children([command], timeout, env, cwd, stdin, limit, echo, prefix, until, drain)[0]


def run_children(commands, timeout, env=None, cwd=None, stdin=None, limit=None, echo=False, prefix="", until=None,
            drain=DRAIN):
    """Start every command at once (as ``start_child``), wait at most ``timeout`` seconds for all: a ChildResult
    each, in order.

    The wait ends early when one child fails (exits non-zero) while others still run (they would wait for it until
    their own timeouts) or when ``until``, a function of the output so far (all children's, joined), returns true.
    Whatever ends it, every process still alive is killed first, each child's tree included. Raises nothing for a
    failure or a timeout: read ``code`` and ``stopped``. ``env``: one dict for all, or a list of one per command.
    ``echo``: print each child's lines as they come (True), or those a function of the line accepts; only the
    calling thread prints, so the lines land where it prints (a notebook's cell). ``prefix`` goes before each
    echoed line; ``{i}`` in it is the child's index. ``drain``: seconds to wait for the output's end once the tree
    is killed."""
    envs = env if isinstance(env, list) else [env] * len(commands or [])
    _check(commands, timeout, envs, cwd, limit)
    lines = queue.Queue() if echo else None
    children = []
    try:
        for i, (command, child_env) in enumerate(zip(commands, envs)):
            children.append(Child(command, child_env, cwd, stdin, limit, lines, i))
    except BaseException:
        kill_tree([child.proc for child in children])  # the ones already started must not outlive the error
        raise
    return _wait(children, timeout, until, echo, prefix, lines, drain)


def _wait(children, timeout, until=None, echo=False, prefix="", lines=None, drain=DRAIN):
    if not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout={timeout!r}: give a positive number of seconds, e.g. 300")
    start_time = min(child.started for child in children)
    procs = [child.proc for child in children]
    lone = len(children) == 1 and until is None and not echo  # nothing to do but wait: wait the whole time at once

    def show(wait):
        try:
            i, line = lines.get(timeout=wait)
        except queue.Empty:
            return
        if echo is True or echo(line):
            print(prefix.format(i=i) + line, end="", flush=True)

    stopped = None
    try:
        while any(proc.poll() is None for proc in procs):
            failed = [proc.returncode for proc in procs if proc.poll()]
            if failed:
                stopped = f"exit code {failed[0]}"
                break
            left = timeout - (time.perf_counter() - start_time)
            if left < 0:
                stopped = f"timed out after {timeout} s"
                break
            if until is not None and until("".join(child.output.text() for child in children)):
                stopped = "until"
                break
            pause = max(0.001, left + 0.001 if lone else min(POLL, left))
            if lines is not None:
                show(pause)
            else:
                try:
                    next(proc for proc in procs if proc.poll() is None).wait(pause)
                except (subprocess.TimeoutExpired, StopIteration):
                    pass
    finally:
        alive = [proc.poll() is None for proc in procs]
        kill_tree(procs)  # also what a child that ended by itself left in its group
    for child in children:
        child.reader.join(timeout=drain)  # the pipe ends when the child and everything under it are gone
    while lines is not None and not lines.empty():
        show(0)
    for proc in procs:
        proc.wait()
        proc.stdout.close()
    seconds = time.perf_counter() - start_time
    return [ChildResult(child.command, None if was_alive else child.proc.returncode, child.output.text(), seconds,
                     stopped) for child, was_alive in zip(children, alive)]


def send_signal(pid, signum, group=False, alone=True):
    """``signum`` to the process group ``pid`` leads (``group``), or where it has none (yet) to ``pid`` itself if
    ``alone``; to ``pid`` only without ``group``. A process already gone is no error."""
    if group:
        try:
            os.killpg(pid, signum)
            return
        except (ProcessLookupError, PermissionError):
            if not alone:
                return
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def kill_tree(procs):
    """Kill each process (a ``Popen`` started with ``start_new_session=True``) and everything under it.

    torchrun starts each worker in a session of its own, and so does papermill its kernel, so killing the child's
    process group alone would leave them running, holding the child's stdout open: reading it to its end would
    then wait for them forever. So the child's descendants are listed (psutil) and killed first, whatever session
    they are in, then its group. A child that already exited may have left members of its group behind (a child
    it did not wait for): they are killed too."""
    for proc in procs:
        family = []
        if proc.poll() is None:
            try:
                family = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        for p in family:  # the workers (and theirs), whatever session they are in
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own group (or led it, and left members)
        except (ProcessLookupError, PermissionError):
            pass
