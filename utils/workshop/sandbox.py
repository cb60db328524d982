"""A sandbox for code the teacher does not trust (a learner's graded answer): bubblewrap, with limits.

``sandboxed(argv, work=..., hidden=...)`` returns the command line that runs ``argv`` inside ``bwrap`` (Debian's
``bubblewrap`` 0.8.0, ``apt install bubblewrap``; it needs unprivileged user namespaces, which Debian and Ubuntu
allow) under ``prlimit`` (util-linux). Inside, the program sees

- the system (``/usr``, ``/etc`` and the links into them), the Python installation and the course, all read-only;
- not the folders and files in ``hidden`` (an empty read-only folder, or an empty file, in their place): the labs'
  solutions, ``build/`` (the gradebook, the release), ``.git``, and whatever the caller adds (the submissions, other
  learners);
- ``work``, its own folder, read-write, and a private ``/tmp`` and ``/dev/shm``: fresh folders beside ``work``
  (never in it, where earlier code could have left a symlink), so they lie where ``work`` does (the grader's
  temporary folder: on disk unless the host's is itself a tmpfs), not in a tmpfs of bwrap's own, which would hold
  what is written there in memory that the memory limit does not count. Each file written is capped by the caller
  (the grader: ``RLIMIT_FSIZE``), their number is not; a fresh ``/proc`` and ``/dev``;
- a user of its own, uid and gid 65534 inside (``--unshare-user``), with no capability (``--cap-drop ALL``), also
  when the grader runs as root: with root's capabilities a program could unmount what hides the solutions;
- no network but its own loopback (``--unshare-net``: gloo's ranks still talk over 127.0.0.1);
- its own process namespace (``--unshare-pid``): when the program ends, every process it started ends with it,
  a daemon that double-forked or called ``setsid`` included (the kernel kills a namespace with its first process);
  ``--die-with-parent`` ends it all if the grader dies;
- limits on each of its processes (``prlimit``): ``memory`` bytes of address space (an allocation beyond fails with
  ``MemoryError`` or torch's "can't allocate memory", which the grader names ``memory``) and ``cpu`` seconds of
  CPU time (beyond, the kernel sends SIGXCPU: the grader names it ``time``).

Not limited: the number of processes. ``RLIMIT_NPROC`` counts every thread of the grader's user (and none of
root's), so no value both stops a fork bomb and lets sixteen workers' torch threads run; a cgroup's ``pids.max``
would, where the grader may create cgroups (root, or a delegated cgroup v2 subtree). The process namespace still
ends every process an answer started when it ends.

``available()`` says why the sandbox cannot run here (no bwrap, no user namespaces), or None. Measured on this
course's 2-core machine: starting Python with torch and 2 ranks inside the sandbox costs no more than outside
(2.6 s for both).
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["SYSTEM", "available", "sandboxed"]

SYSTEM = ("/usr", "/etc", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/opt")  # bound read-only where they exist
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: sudo apt install bubblewrap; Fedora: sudo dnf install bubblewrap)"


def available():
    """None if the sandbox runs here, else why not (in words, with the fix)."""
    for tool in ("bwrap", "prlimit"):
        if shutil.which(tool) is None:
            return f"no `{tool}` on PATH: {INSTALL_HINT if tool == 'bwrap' else 'install util-linux'}"
    try:
        done = subprocess.run(["bwrap", "--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL",
                               "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "true"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap did not run: {err}"
    if done.returncode:
        return (f"bwrap cannot create namespaces here ({done.stderr.strip()[:200]}): allow unprivileged user "
                "namespaces (sysctl kernel.unprivileged_userns_clone=1), or run the grader on a machine that does")
    return None


def _system_binds():
    binds = []
    for path in SYSTEM:
        if os.path.islink(path):
            binds += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            binds += ["--ro-bind", path, path]
    return binds


def sandboxed(argv, work, readable=(), hidden=(), memory=None, cpu=None, net=False, devices=(), scratch=None):
    """The command line that runs ``argv`` in the sandbox (see the module docstring). ``work``: the program's own
    folder (read-write, its working directory); ``readable``: folders it may read (the course; the Python of
    ``sys.base_prefix`` and ``sys.prefix`` are added); ``hidden``: folders and files inside those it must not see;
    ``memory``: bytes of address space per process; ``cpu``: seconds of CPU time per process; ``net``: keep the
    host's network (default: loopback only); ``devices``: device files to pass through (a GPU's ``/dev/nvidia*``;
    with them ``/sys`` is bound read-only, where the driver's libraries look the GPUs up); ``scratch``: an empty folder
    the caller has just made, outside ``work``, for what the sandbox gets of its own (its /tmp, /dev/shm and the empty
    file), which the caller removes when the sandbox has ended (default: one made beside ``work``, left there)."""
    work = str(Path(work).resolve())
    os.makedirs(work, exist_ok=True)
    binds = _system_binds()
    seen = set()
    for path in [sys.base_prefix, sys.prefix, *map(str, readable)]:
        path = str(Path(path).resolve())
        if path not in seen and not any(path.startswith(s + os.sep) for s in SYSTEM) and os.path.exists(path):
            seen.add(path)
            binds += ["--ro-bind", path, path]
    # What the sandbox gets of its own (its /tmp, its /dev/shm, the empty file bound over a hidden one) is made fresh
    # here, beside ``work``, not in it: code that ran in an earlier sandbox of the same ``work`` could have put a
    # symlink where such a path would be, and bwrap, or this function, would follow it out of the sandbox.
    own = str(scratch) if scratch is not None else tempfile.mkdtemp(prefix=".sandbox-", dir=os.path.dirname(work))
    if os.listdir(own) or Path(own).resolve() == Path(work) or Path(work) in Path(own).resolve().parents:
        raise ValueError(f"scratch={own}: the sandbox's own folder must be empty and outside work={work}: make a "
                         "fresh one with tempfile.mkdtemp beside it.")
    for path in map(str, hidden):
        path = str(Path(path).resolve())
        if os.path.isdir(path):  # an empty folder in its place, read-only: nothing written there lands in memory
            binds += ["--tmpfs", path, "--remount-ro", path]
        elif os.path.isfile(path):  # an empty file in its place (not /dev/null: bwrap's binds are nodev)
            empty = os.path.join(own, "empty")
            open(empty, "w").close()
            binds += ["--ro-bind", empty, path]
    # The program's /tmp and /dev/shm are folders on disk: a tmpfs would hold what is written there in memory that no
    # RLIMIT_AS counts. /proc, /dev and /tmp first: a folder given under the host's /tmp is then bound on top of them.
    private = {}
    for name in ("tmp", "shm"):
        private[name] = os.path.join(own, name)
        os.mkdir(private[name])
    # A user of its own (uid and gid 65534 inside) and no capability: started by root, bwrap would otherwise keep
    # root's capabilities inside, and CAP_SYS_ADMIN undoes every bind (umount a hidden folder, remount the course rw)
    command = ["bwrap", "--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
               "--unshare-cgroup-try", *([] if net else ["--unshare-net"]), "--proc", "/proc", "--dev", "/dev",
               *[a for d in devices for a in ("--dev-bind-try", str(d), str(d))],
               *(["--ro-bind-try", "/sys", "/sys"] if devices else []),
               "--bind", private["shm"], "/dev/shm", "--bind", private["tmp"], "/tmp", *binds, "--bind", work, work,
               "--chdir", work, *argv]
    # CPU: SIGXCPU at the soft limit (the grader names it), SIGKILL 5 s of CPU later if it is caught
    limits = ([f"--as={int(memory)}"] if memory else []) + ([f"--cpu={int(cpu)}:{int(cpu) + 5}"] if cpu else [])
    return ["prlimit", *limits, "--", *command] if limits else command
