"""Seal a rank: after ``seal()`` the process (and every thread and child it has) can reach its peers only through what
it already holds, which for a rank of ``backend="relay"`` is its link to the kernel's relay (``relay.py``).

Two layers of Linux's, each after ``PR_SET_NO_NEW_PRIVS``:

1. **Landlock** (``landlock(7)``, where the kernel has it: 5.13 and later, with Landlock among its security modules):
   the process may read files, but in ``/proc`` only its own folder and ``cpuinfo``: the others' folders show a
   process's name, command line and sizes, which a peer can set at will. It may write or create no file anywhere.
   From Landlock ABI 6 on (Linux 6.12), it may also send no signal and reach no abstract Unix socket outside itself.
2. **A seccomp filter** (``seccomp(2)``, ``SECCOMP_SET_MODE_FILTER`` with ``SECCOMP_FILTER_FLAG_TSYNC``: every
   thread) that answers ``EPERM`` to the system calls that would open another way to a peer:

   - a socket: ``socket``, ``socketpair``, ``bind``, ``connect``, ``listen``, ``accept``. No TCP, no Unix socket,
     and no new process group of torch's own;
   - a file written or changed: ``open``/``openat`` with a flag that writes or creates, ``openat2``, and the calls
     that create, rename, link, remove, truncate or re-time a file, or change its mode, owner or attributes (a file a
     peer reads is a message);
   - a lock, a lease or a watch a peer could see: ``flock``, ``fcntl``'s lock and lease commands, ``inotify``,
     ``fanotify``;
   - a signal to any process but itself: ``kill``, ``tgkill``, ``rt_sigqueueinfo``... with another process's
     number, ``tkill``, ``pidfd_*``, ``setpgid``/``setsid`` (into a peer's group, which ``kill(0)`` then reaches),
     and a descriptor's signal to another process (``fcntl`` ``F_SETOWN``/``F_SETSIG``, ``ioctl`` ``FIOSETOWN``,
     ``FIOASYNC``). Another process's scheduling, priority or limits are refused too;
   - what ``/proc`` shows of it: ``prctl``'s name and memory map (``PR_SET_NAME``, ``PR_SET_MM``), and
     ``PR_SET_DUMPABLE`` (a rank made dumpable again could be read by a peer);
   - another process's memory (``ptrace``, ``process_vm_readv``/``writev``), the kernel's key rings, System V and
     POSIX message queues, semaphores and shared memory, ``io_uring`` (whose requests no filter sees), ``bpf``,
     ``perf_event_open``, ``userfaultfd``, and the calls that change namespaces or mounts.

   A system call of another architecture (``int 0x80`` on x86-64, the x32 ABI) ends the process. The filter knows the
   system call numbers of x86-64 and AArch64 (from Linux's ``unistd`` headers); ``available()`` says None there, and
   why not elsewhere (there the relay still records every message, unsealed).

What stays open: time, and what a process sees of the whole machine. A rank can still tell how busy the machine is by
its own speed, which a peer can change; how many processes were started since it last looked (the process numbers
of its own children), which a peer changes by starting some; and the machine's free memory (``sysinfo``). Where the
kernel has no Landlock, it can also read ``/proc``: the machine's load and its peers' folders (their sizes and CPU
times, which a peer can change too, though not set to a chosen name). A transport built on these is a program of its
own, slow, not a stub that borrows torch's collective. A rank may signal only itself (not a child of its
own either).
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

__all__ = ["available", "seal"]

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SECCOMP_SYSCALL = {"x86_64": 317, "aarch64": 277}
NUMBERS = {
    "x86_64": {
        "socket": 41, "open": 2, "openat": 257, "openat2": 437, "creat": 85, "rename": 82, "renameat": 264,
        "renameat2": 316, "link": 86, "linkat": 265, "symlink": 88, "symlinkat": 266, "unlink": 87, "unlinkat": 263,
        "mkdir": 83, "mkdirat": 258, "rmdir": 84, "mknod": 133, "mknodat": 259, "truncate": 76, "chmod": 90,
        "fchmodat": 268, "fchmodat2": 452, "chown": 92, "lchown": 94, "fchownat": 260, "utime": 132, "utimes": 235,
        "futimesat": 261, "utimensat": 280, "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197,
        "lremovexattr": 198, "fremovexattr": 199, "flock": 73, "fcntl": 72, "inotify_init": 253, "inotify_init1": 294,
        "fanotify_init": 300, "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129,
        "rt_tgsigqueueinfo": 297, "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "setpriority": 141, "sched_setaffinity": 203,
        "sched_setscheduler": 144, "sched_setparam": 142, "sched_setattr": 314, "ioprio_set": 251, "prlimit64": 302,
        "shmget": 29, "msgget": 68, "semget": 64, "mq_open": 240, "add_key": 248, "request_key": 249, "keyctl": 250,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321, "perf_event_open": 298,
        "setns": 308, "unshare": 272, "name_to_handle_at": 303, "open_by_handle_at": 304, "userfaultfd": 323,
        "mount": 165, "move_mount": 429, "fsopen": 430, "fsmount": 432, "open_tree": 428, "kcmp": 312,
        "process_madvise": 440, "quotactl": 179, "socketpair": 53, "bind": 49, "connect": 42, "listen": 50,
        "accept": 43, "accept4": 288, "setpgid": 109, "setsid": 112, "fchmod": 91, "fchown": 93, "prctl": 157,
        "ioctl": 16, "shmat": 30, "shmctl": 31, "shmdt": 67, "semop": 65, "semctl": 66, "semtimedop": 220,
        "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
    },
    "aarch64": {  # the generic table: no open, creat, rename... (only their *at forms)
        "socket": 198, "openat": 56, "openat2": 437, "renameat": 38, "renameat2": 276, "linkat": 37, "symlinkat": 36,
        "unlinkat": 35, "mkdirat": 34, "mknodat": 33, "truncate": 45, "fchmodat": 53, "fchmodat2": 452,
        "fchownat": 54, "utimensat": 88, "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14,
        "lremovexattr": 15, "fremovexattr": 16, "flock": 32, "fcntl": 25, "inotify_init1": 26, "fanotify_init": 262,
        "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
        "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "setpriority": 140, "sched_setaffinity": 122, "sched_setscheduler": 119,
        "sched_setparam": 118, "sched_setattr": 274, "ioprio_set": 30, "prlimit64": 261, "shmget": 194,
        "msgget": 186, "semget": 190, "mq_open": 180, "add_key": 217, "request_key": 218, "keyctl": 219,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 280, "perf_event_open": 241,
        "setns": 268, "unshare": 97, "name_to_handle_at": 264, "open_by_handle_at": 265, "userfaultfd": 282,
        "mount": 40, "move_mount": 429, "fsopen": 430, "fsmount": 432, "open_tree": 428, "kcmp": 272,
        "process_madvise": 440, "quotactl": 60, "socketpair": 199, "bind": 200, "connect": 203, "listen": 201,
        "accept": 202, "accept4": 242, "setpgid": 154, "setsid": 157, "fchmod": 52, "fchown": 55, "prctl": 167,
        "ioctl": 29, "shmat": 196, "shmctl": 195, "shmdt": 197, "semop": 193, "semctl": 191, "semtimedop": 192,
        "msgsnd": 189, "msgrcv": 188, "msgctl": 187,
    },
}
WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND  # open flags that write or create
# fcntl: F_GETLK, F_SETLK(W), F_SETOWN, F_SETSIG, F_SETOWN_EX, F_OFD_*LK, F_SETLEASE, F_GETLEASE, F_NOTIFY (a lock,
# a lease or a watch a peer sees; a file's signal sent to another process)
FCNTL = (5, 6, 7, 8, 10, 15, 36, 37, 38, 1024, 1025, 1026)
IOCTL = (0x8901, 0x8902, 0x5452)  # FIOSETOWN, SIOCSPGRP, FIOASYNC: a descriptor's signal to another process
# prctl: PR_SET_DUMPABLE (a peer could then read this rank's memory), PR_SET_NAME (its name, in /proc for every
# process to read), PR_SET_MM (its command line and environment, ditto), PR_SET_PTRACER
PRCTL = (4, 15, 35, 0x59616D61)
DENIED = ("socket", "socketpair", "bind", "connect", "listen", "accept", "accept4", "setpgid", "setsid", "fchmod",
          "fchown", "creat", "openat2", "rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat",
          "unlink", "unlinkat", "mkdir", "mkdirat", "rmdir", "mknod", "mknodat", "truncate", "chmod", "fchmodat",
          "fchmodat2", "chown", "lchown", "fchownat", "utime", "utimes", "futimesat", "utimensat", "setxattr",
          "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr", "flock", "inotify_init",
          "inotify_init1", "fanotify_init", "tkill", "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "ptrace",
          "process_vm_readv", "process_vm_writev", "setpriority", "ioprio_set", "shmget", "msgget", "semget", "shmat",
          "shmctl", "shmdt", "semop", "semctl", "semtimedop", "msgsnd", "msgrcv", "msgctl",
          "mq_open", "add_key", "request_key", "keyctl", "io_uring_setup", "io_uring_enter", "io_uring_register",
          "bpf", "perf_event_open", "setns", "unshare", "name_to_handle_at", "open_by_handle_at", "userfaultfd",
          "mount", "move_mount", "fsopen", "fsmount", "open_tree", "kcmp", "process_madvise", "quotactl")
SELF_OR_ZERO = ("kill", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr", "prlimit64")
SELF_ONLY = ("tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")

# classic BPF, as seccomp reads it
LD_W_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_EPERM, RET_KILL = 0x7FFF0000, 0x00050000 | 1, 0x80000000
NR, ARCH = 0, 4


def _arg(i):
    return 16 + 8 * i  # the low 32 bits of argument i (little-endian): pids, flags and commands are ints


def available():
    """None where ``seal`` works (Linux on x86-64 or AArch64), else why not."""
    if not os.uname().sysname == "Linux":
        return "the seal is Linux's seccomp"
    if platform.machine() not in NUMBERS:
        return f"the seal knows the system calls of {sorted(NUMBERS)}, not of {platform.machine()}"
    return None


def program(machine, pid):
    """The filter's instructions, (code, jt, jf, k) each, for ``machine`` and a process numbered ``pid``."""
    numbers = NUMBERS[machine]
    code, fixups = [], []  # fixups: (index, 'jt' or 'jf', label)

    def op(c, k, jt=0, jf=0):
        code.append([c, jt, jf, k])
        for field, target in (("jt", jt), ("jf", jf)):
            if isinstance(target, str):
                fixups.append((len(code) - 1, field, target))
                code[-1][1 if field == "jt" else 2] = 0

    labels = {}
    op(LD_W_ABS, ARCH)
    op(JEQ, AUDIT_ARCH[machine], 0, "kill")
    op(LD_W_ABS, NR)
    op(JGE, 0x40000000, "kill", 0)  # x32's numbers
    for name in DENIED:
        if name in numbers:
            op(JEQ, numbers[name], "deny", 0)
    blocks = [("open", "open"), ("openat", "openat"), ("fcntl", "fcntl"), ("ioctl", "ioctl"), ("prctl", "prctl")]
    blocks += [(name, "self_or_zero") for name in SELF_OR_ZERO] + [(name, "self_only") for name in SELF_ONLY]
    for name, label in blocks:
        if name in numbers:
            op(JEQ, numbers[name], label, 0)
    op(RET, RET_ALLOW)
    for name, offset in (("open", _arg(1)), ("openat", _arg(2))):
        labels[name] = len(code)
        op(LD_W_ABS, offset)
        op(JSET, WRITES, "deny", 0)
        op(RET, RET_ALLOW)
    for name, argument, commands in (("fcntl", 1, FCNTL), ("ioctl", 1, IOCTL), ("prctl", 0, PRCTL)):
        labels[name] = len(code)
        op(LD_W_ABS, _arg(argument))
        for command in commands:
            op(JEQ, command, "deny", 0)
        op(RET, RET_ALLOW)
    labels["self_or_zero"] = len(code)
    op(LD_W_ABS, _arg(0))
    op(JEQ, 0, "allow", 0)
    labels["self_only"] = len(code)
    op(LD_W_ABS, _arg(0))
    op(JEQ, pid, "allow", "deny")
    labels["allow"] = len(code)
    op(RET, RET_ALLOW)
    labels["deny"] = len(code)
    op(RET, RET_EPERM)
    labels["kill"] = len(code)
    op(RET, RET_KILL)
    for index, field, label in fixups:
        jump = labels[label] - (index + 1)
        if not 0 <= jump <= 255:
            raise AssertionError(f"a jump of {jump} in the seal's filter")
        code[index][1 if field == "jt" else 2] = jump
    return [tuple(c) for c in code]


# Landlock (``landlock(7)``): the file-system rights this process keeps, and the scopes it is held to
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1, 1 << 1, 1 << 2, 1 << 3
FS_CHANGES = sum(1 << b for b in range(4, 13))  # remove a folder or file; make a device, folder, file, socket, link
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 1 << 1  # ABI 6


def _landlock(libc):
    """Read only outside ``/proc``, and in ``/proc`` only this process's own folder and ``cpuinfo`` (the others' folders
    hold names, command lines and sizes a peer sets at will), write nowhere; with ABI 6, no signal or abstract
    socket out of this domain. Returns the ABI used, or 0 where Linux has no Landlock (the seccomp filter then
    stands alone)."""
    abi = libc.syscall(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        return 0
    handled = FS_WRITE_FILE | FS_READ_FILE | FS_READ_DIR | FS_CHANGES | (FS_REFER if abi >= 2 else 0) | \
        (FS_TRUNCATE if abi >= 3 else 0)
    scoped = SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET if abi >= 6 else 0
    attr = struct.pack("<QQQ", handled, 0, scoped)[:24 if abi >= 6 else 16 if abi >= 4 else 8]
    ruleset = libc.syscall(444, attr, len(attr), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        places = [os.path.join("/", name) for name in os.listdir("/") if name != "proc"]
        places += [f"/proc/{os.getpid()}", "/proc/cpuinfo"]  # torch reads the machine's cores on its first matmul
        for place in places:
            try:
                fd = os.open(place, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rights = FS_READ_FILE | (FS_READ_DIR if os.path.isdir(place) else 0)
                rule = struct.pack("<Qi", rights, fd)  # struct landlock_path_beneath_attr, packed
                if libc.syscall(445, ruleset, 1, rule, 0):  # landlock_add_rule(LANDLOCK_RULE_PATH_BENEATH)
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({place})")
            finally:
                os.close(fd)
        if libc.syscall(446, ruleset, 0):  # landlock_restrict_self
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


def seal():
    """Seal this process (single-threaded: Landlock holds the calling thread and its later children; the seccomp
    filter every thread) and every child it starts from now on; returns the layers, e.g. ``["seccomp",
    "landlock 7"]``. Raises OSError where Linux refuses it, RuntimeError where ``available()`` is not None."""
    why = available()
    if why:
        raise RuntimeError(why)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0):  # PR_SET_NO_NEW_PRIVS, which both need
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    abi = _landlock(libc)
    machine = platform.machine()
    filters = b"".join(struct.pack("<HBBI", *instruction) for instruction in program(machine, os.getpid()))
    buffer = ctypes.create_string_buffer(filters, len(filters))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Program(len(filters) // 8, ctypes.addressof(buffer))
    # seccomp(SECCOMP_SET_MODE_FILTER = 1, SECCOMP_FILTER_FLAG_TSYNC = 1, &prog): every thread, at once
    if libc.syscall(SECCOMP_SYSCALL[machine], 1, 1, ctypes.byref(prog)):
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER)")
    return ["seccomp"] + ([f"landlock {abi}"] if abi else [])
