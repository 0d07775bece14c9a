"""Sandbox harness, run by `sandbox.py` as `python -I -S -B _harness.py CONFIG` inside its namespaces; stdlib only."""

# Processes. The *keeper* (root in the namespaces; pid 1 of the pid namespace when there is one) joins the run's
# cgroups, builds the filesystem view and pivots into it, then forks the *worker* and (tests mode) the *judge*. The
# worker drops every privilege and execs a fresh interpreter (`python -c <_worker.py>`) that runs the untrusted
# program; the judge runs the tests. Both are children of the keeper, which exits with the judge's status (tests) or
# the worker's (stdin/stdout).
#
# Why the verdict is sound. The tests run in the judge, a separate interpreter that no untrusted code ever ran in. The
# judge reaches the program's functions through proxies: a call sends its arguments to the worker over a pipe and gets
# the result back, and both directions carry only plain data (None, bool, int, float, str, bytes, and
# list/tuple/set/frozenset/dict of these), re-built by the judge's own decoder with size and depth limits. So no object
# the program made can take part in a comparison (an always-equal `__eq__` never crosses), and nothing the program does
# inside its interpreter (frames, gc, patched builtins/json/os/sys.modules, ctypes writes) touches the judge's.
# - The judge never imports, runs or reads anything the program can name, reach or write: a module the program
#   imported is mapped to the judge's own import only when it is on the fixed `JUDGE_MODULES` list; the judge's working
#   directory, HOME, TMPDIR and /tmp are a private tmpfs (/judge) that the worker's mount namespace does not have; a
#   runtime under /tmp is bound into it at its own path, so no folder on the judge's import path is the program's to
#   create, rename or write; its `sys.path` is the read-only runtime alone.
# - Helpers that come with the prompt (HumanEval/32's `poly`) are trusted code: `code.trusted_helpers` hands them to
#   the judge as setup, over the program's names, so the tests never call the program's version.
# - The worker is a fresh interpreter (exec), so its memory holds neither the tests nor the keeper's configuration
#   (which names the verdict descriptor); the verdict and tests descriptors are close-on-exec and closed in the worker,
#   which keeps only stdin/stdout/stderr and its two pipes (3: requests, 4: replies).
# - The judge is non-dumpable and the worker holds no capability over it (a throwaway uid as root, or a child user
#   namespace otherwise), so the worker cannot ptrace it or read its memory; there is no /proc in the view, and a
#   seccomp filter refuses ptrace, process_vm_*, pidfd_getfd and kcmp anyway.
# - A worker that exits, crashes or kills the judge before the tests finish leaves no verdict, which scores 0.
# What is not defended: the program still decides what its functions return, and a test that needs an object the
# program built (a class instance, a generator) fails with a clear error instead of trusting it.

import builtins
import ctypes
import fcntl
import importlib
import json
import marshal
import os
import resource
import struct
import sys
import traceback
import types

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
CLONE_NEWNS, CLONE_NEWUSER = 0x20000, 0x10000000
PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 4, 22, 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 271, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR, KEYCTL_GET_PERSISTENT = 1, 7, 22
KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -3, -4, -5
DEVICES = ("null", "zero", "urandom")
JUDGE_DIR = "/judge"
# Built-in exceptions a test may expect from the program; never StopIteration, which would end a `map` in a test early.
RAISED_AS_IS = frozenset(
    "ArithmeticError AssertionError AttributeError IndexError KeyError LookupError NotImplementedError OverflowError "
    "RecursionError RuntimeError TypeError ValueError ZeroDivisionError".split()
)
# Stdlib modules a program's import of which the tests may use unimported (`math.isclose` in MBPP's asserts). A fixed
# list of pure modules: importing one cannot start anything the program controls (tkinter, for one, starts Tcl, which
# reads scripts from paths of its own choosing), and the judge imports nothing else on the program's behalf.
JUDGE_MODULES = frozenset(
    "array bisect calendar cmath collections copy datetime decimal fractions functools hashlib heapq itertools json "
    "math numbers operator random re statistics string struct textwrap typing unicodedata".split()
)
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


# ---------------------------------------------------------------- filesystem view


def _mount(source, target, fstype=None, flags=0, data=None):
    encode = lambda value: None if value is None else value.encode()  # noqa: E731
    _check(_libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)), f"mount {target}")


def _bind_read_only(source, target):
    """Binds `source` at `target` read-only, mounts below it included; the flags the kernel locked on the originals
    (nosuid, nodev, noexec...) are kept, as a remount inside a user namespace must."""
    _mount(source, target, flags=MS_BIND | MS_REC)
    with open("/proc/self/mountinfo", encoding="utf-8") as file:  # field 5: mount point, octal-escaped
        points = [line.split()[4].encode().decode("unicode_escape") for line in file]
    for point in [target, *(point for point in points if point.startswith(target + "/"))]:
        kept = os.statvfs(point).f_flag & 0x1C0E  # ST_NOSUID|NODEV|NOEXEC|NOATIME|NODIRATIME|RELATIME = MS_ values
        _mount(None, point, flags=MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def _build_root(root, expose, uid, tmp_mb):
    """Builds the run's whole filesystem in `root` and pivots into it: the runtime read-only, the program's private
    size-capped /tmp (also its working directory), the judge's private /judge, /dev/{null,zero,urandom}, and nothing
    else (no /proc, no /sys, no home, no /etc, no /dev/shm)."""
    _mount(None, "/", flags=MS_REC | MS_PRIVATE)  # nothing done here propagates back to the host
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    # The private /tmp first: a runtime that lives under /tmp (a virtual environment in /tmp/...) is bound on top of it.
    # nr_inodes caps the kernel memory its files and directories hold (inodes lie outside RLIMIT_AS and, on tmpfs, count
    # against no size=); extended attributes, the other such store, are refused by seccomp.
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    for path, size, inodes in (("/tmp", tmp_mb, max(1024, 64 * tmp_mb)), (JUDGE_DIR, 16, 4096)):
        os.makedirs(root + path)
        _mount(
            "tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0700,size={size}m,nr_inodes={inodes}{owner}"
        )
    for path in expose:
        if os.path.islink(path):  # /lib -> usr/lib on merged-/usr systems
            os.symlink(os.readlink(path), root + path)
            continue
        os.makedirs(root + path, exist_ok=True)
        _bind_read_only(path, root + path)
        if path.startswith("/tmp/"):
            # A runtime under /tmp sits in the program's /tmp, where the program can rename the folders above it and
            # plant modules at its old path. The judge's /tmp is /judge (see `_start_judge`): the runtime is bound
            # there too, at the same path, in folders the program never sees.
            os.makedirs(root + JUDGE_DIR + path[len("/tmp") :])
            _bind_read_only(path, root + JUDGE_DIR + path[len("/tmp") :])
    os.makedirs(root + "/dev")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "w").close()
        _mount(f"/dev/{name}", f"{root}/dev/{name}", flags=MS_BIND)
    os.chdir(root)
    # pivot_root(".", "."): the old root ends up stacked under the new one and is detached right away.
    _check(_libc.syscall(SYS_PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    _mount(None, "/", flags=MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


# ---------------------------------------------------------------- kernel objects: keyrings, seccomp


def _keyctl(*args):
    number = SYS_KEYCTL.get(os.uname().machine)
    return -1 if number is None else _libc.syscall(number, *(ctypes.c_long(arg) for arg in args))


def _fresh_session_keyring():
    """Leaves the caller's session keyring (the trainer's: its keys are readable by whoever possesses it) for a new,
    empty, anonymous one."""
    _keyctl(KEYCTL_JOIN_SESSION_KEYRING, 0)


def _clear_user_keyrings(uid):
    """Empties the user, user-session and persistent keyrings of a throwaway uid, which outlive each run that used
    it and would otherwise carry keys to the next run with the same uid."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            _fresh_session_keyring()
            for keyring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
                _keyctl(KEYCTL_CLEAR, keyring)
            persistent = _keyctl(KEYCTL_GET_PERSISTENT, -1, KEY_SPEC_SESSION_KEYRING)
            if persistent > 0:
                _keyctl(KEYCTL_CLEAR, persistent)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


# Syscall numbers (x86_64, aarch64) that the program is refused, with the reason. Refused with ENOSYS/EPERM, so
# Python raises OSError and the run goes on. `None`: the call does not exist on that architecture.
SECCOMP_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
REFUSED_ALWAYS = {
    # Reaching other processes (the judge): ptrace, reading/writing another process's memory, stealing descriptors.
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kcmp": (312, 272),
    "pidfd_getfd": (438, 438),
    # Channels between runs through files every run shares read-only (the runtime): locks and change notifications.
    "flock": (73, 32), "inotify_init": (253, None), "inotify_init1": (294, 26), "fanotify_init": (300, 262),
    # Keys: the kernel keyrings are per uid, not per namespace; the program has no use for them.
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    # New namespaces and mounts: nothing the program needs, and each is kernel attack surface.
    "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "userfaultfd": (323, 282), "perf_event_open": (298, 241), "bpf": (321, 280),
    # The kernel log (a crash address, other runs' messages); io_uring, whose requests no seccomp filter sees; Linux
    # AIO, whose reads take RWF_NOWAIT (whether a page is cached, below).
    "syslog": (103, 116), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "io_setup": (206, 0), "io_submit": (209, 2),
    # The page cache of the shared runtime as a rewritable memory across runs: calls that drop a file's pages
    # (fadvise DONTNEED, process_madvise; madvise's COLD/PAGEOUT below), read them in without a read (readahead), or
    # tell whether they are cached without touching them (mincore, cachestat, preadv2/pwritev2 with RWF_NOWAIT).
    "fadvise64": (221, 223), "readahead": (187, 213), "mincore": (27, 232), "cachestat": (451, 451),
    "preadv2": (327, 286), "pwritev2": (328, 287), "process_madvise": (440, 440),
    # Extended attributes: on the program's tmpfs they are kernel memory outside memory_mb; no program needs them.
    "setxattr": (188, 5), "lsetxattr": (189, 6), "fsetxattr": (190, 7), "setxattrat": (463, 463),
}  # fmt: skip
# Refused only without a cgroup, where the memory limit is RLIMIT_AS of the one worker process: more processes, and
# memory that is not in its address space (memfd files, SysV shared memory and message queues), would escape it.
REFUSED_WITHOUT_CGROUP = {
    "fork": (57, None), "vfork": (58, None), "clone3": (435, 435), "memfd_create": (319, 279),
    "memfd_secret": (447, 447), "shmget": (29, 194), "msgget": (68, 186),
}  # fmt: skip
SYS_CLONE, SYS_FCNTL = {"x86_64": 56, "aarch64": 220}, {"x86_64": 72, "aarch64": 25}
SYS_MADVISE, MADV_EVICTING = {"x86_64": 28, "aarch64": 233}, (20, 21)  # MADV_COLD, MADV_PAGEOUT: page-cache eviction
CLONE_THREAD = 0x10000
FCNTL_LOCKS = (6, 7, 36, 37, 38, 1024, 1026)  # F_SETLK, F_SETLKW, F_OFD_GETLK..SETLKW, F_SETLEASE, F_NOTIFY
ENOSYS, EPERM, EAGAIN = 38, 1, 11


def _seccomp_filter(allow_processes):
    """A classic-BPF program: the calls above fail with an errno (EPERM for ptrace, else ENOSYS), fcntl's lock and
    notify commands with EPERM, clone without CLONE_THREAD (a new process, not a thread) with EAGAIN unless
    `allow_processes`; another architecture's calls (x32 included) kill the process. None on other architectures."""
    machine = os.uname().machine
    column = {"x86_64": 0, "aarch64": 1}.get(machine)
    if column is None:
        return None
    refused = dict(REFUSED_ALWAYS) | ({} if allow_processes else REFUSED_WITHOUT_CGROUP)
    load, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JSET/JGE|K, BPF_RET|K
    allow, kill = 0x7FFF0000, 0x80000000
    errno = lambda code: 0x00050000 | code  # noqa: E731
    # seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (the low half first, little-endian).
    program = [(load, 0, 0, 4), (jeq, 1, 0, SECCOMP_ARCH[machine]), (ret, 0, 0, kill), (load, 0, 0, 0)]
    if machine == "x86_64":
        program += [(jge, 0, 1, 0x40000000), (ret, 0, 0, kill)]
    for name, numbers in sorted(refused.items()):
        if numbers[column] is not None:
            program += [(jeq, 0, 1, numbers[column]), (ret, 0, 0, errno(EPERM if name == "ptrace" else ENOSYS))]
    program += [(jeq, 0, 2 * len(FCNTL_LOCKS) + 2, SYS_FCNTL[machine]), (load, 0, 0, 24)]
    for command in FCNTL_LOCKS:
        program += [(jeq, 0, 1, command), (ret, 0, 0, errno(EPERM))]
    program += [(ret, 0, 0, allow)]
    program += [(jeq, 0, 2 * len(MADV_EVICTING) + 2, SYS_MADVISE[machine]), (load, 0, 0, 32)]
    for advice in MADV_EVICTING:
        program += [(jeq, 0, 1, advice), (ret, 0, 0, errno(EPERM))]
    program += [(ret, 0, 0, allow)]
    if not allow_processes:
        program += [(jeq, 0, 3, SYS_CLONE[machine]), (load, 0, 0, 16), (jset, 1, 0, CLONE_THREAD)]
        program += [(ret, 0, 0, errno(EAGAIN))]
    return program + [(ret, 0, 0, allow)]


def _install_seccomp(allow_processes):
    program = _seccomp_filter(allow_processes)
    if program is None:
        return
    packed = b"".join(struct.pack("<HBBI", *instruction) for instruction in program)
    buffer = ctypes.create_string_buffer(packed)
    fprog = struct.pack("@HP", len(program), ctypes.addressof(buffer))  # struct sock_fprog, native alignment
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0), "seccomp")


# ---------------------------------------------------------------- the worker's code, shared with the judge


def _load_worker():
    """`_worker.py`'s source (for the worker's fresh interpreter, which may not see the file) and, as a module, its
    definitions of what crosses the boundary (for the judge)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")
    with open(path, encoding="utf-8") as file:
        source = file.read()
    module = types.ModuleType("_worker")
    exec(compile(source, path, "exec"), module.__dict__)
    return source, module


WORKER_SOURCE, worker = _load_worker()


def _send(fd, message):
    """To the worker: marshal data, which the worker reads without importing anything."""
    worker.send_frame(fd, marshal.dumps(message))


def _receive(fd):
    """From the worker: one JSON message (only plain data parses), or None at end of file."""
    frame = worker.read_frame(fd)
    return None if frame is None else json.loads(frame)


# ---------------------------------------------------------------- judge: runs the tests, trusted


class CandidateError(Exception):
    """The program's function raised an exception that is not a built-in one."""


class WorkerGone(BaseException):
    """The program's process ended or broke the protocol before the tests finished: no verdict."""


class Unavailable:
    """A name the program defined whose value cannot cross the boundary; any use fails the test that makes it."""

    def __init__(self, name, kind):
        self._why = (
            f"{name!r} is a {kind}, which the tests cannot use: only functions and plain data cross the sandbox"
        )

    def _fail(self, *args, **kwargs):
        raise TypeError(self._why)

    __call__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __len__ = __iter__ = _fail
    __getitem__ = __contains__ = __add__ = __sub__ = __mul__ = __hash__ = __str__ = __int__ = __float__ = _fail

    def __getattr__(self, name):
        self._fail()


class Remote:
    """A function of the program, called in the worker with plain-data arguments and result."""

    def __init__(self, name, requests, replies):
        self._name, self._requests, self._replies = name, requests, replies

    def __call__(self, *args, **kwargs):
        request = {"name": self._name, "args": worker.encode(list(args)), "kwargs": worker.encode(kwargs)}
        _send(self._requests, request)
        try:
            reply = _receive(self._replies)
            if type(reply) is not dict:
                raise ValueError("no reply")
            if "value" in reply:
                return worker.decode(reply["value"])
            kind, message = reply["error"]
        except (ValueError, TypeError, KeyError, RecursionError) as error:
            raise WorkerGone(f"the program's process stopped answering: {error}") from None
        if kind in RAISED_AS_IS:  # lets a test expect, e.g., ValueError from the program
            raise getattr(builtins, kind)(str(message))
        raise CandidateError(f"{kind}: {message}")

    def __repr__(self):
        return f"<program function {self._name}>"


def _program_names(requests, replies):
    """The judge's view of the program's top-level names: proxies for functions, copies of plain data, the judge's
    own import of a module the program imported if it is on `JUDGE_MODULES`, and `Unavailable` for the rest. Names of
    builtins are left out, so the tests' `all`, `abs` or `sorted` stay the judge's own."""
    try:
        exported = _receive(replies)
        if type(exported) is not dict:
            raise ValueError("the program ended before its definitions could be read")
        namespace = {}
        for name, (kind, detail) in exported.items():
            if type(name) is not str or name.startswith("__") or hasattr(builtins, name):
                continue  # a program's `all` or `abs` must not replace the one the tests call
            if kind == "callable":
                namespace[name] = Remote(name, requests, replies)
            elif kind == "value":
                namespace[name] = worker.decode(detail)
            elif kind == "module" and detail in JUDGE_MODULES:
                namespace[name] = importlib.import_module(detail)
            else:
                namespace[name] = Unavailable(name, str(detail if kind == "other" else kind))
    except (ValueError, TypeError, KeyError, RecursionError, ImportError) as error:
        raise WorkerGone(str(error)) from None
    return namespace


def _judge(units, requests, replies, verdict_fd):
    namespace = {**_program_names(requests, replies), "__name__": "__main__"}
    passed = []
    for index, (source, is_test) in enumerate(units):
        try:
            exec(compile(source, f"test_{index}.py", "exec"), namespace)
        except WorkerGone:
            raise
        except BaseException:  # SystemExit too: a test that exits has not passed
            traceback.print_exc()
            if not is_test:
                break  # setup failed, the tests after it cannot run
            continue
        if is_test:
            passed.append(index)
    os.close(requests)  # end of file tells the worker to exit
    worker.send_frame(verdict_fd, json.dumps(passed).encode())


# ---------------------------------------------------------------- process tree


def _in_child(function, *args):
    """Runs `function` in a forked child; an exception ends the child, never returning into the parent's code."""
    try:
        function(*args)
    except BaseException:
        traceback.print_exc()
        os._exit(1)


def _exit_code(pid):
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _set_limits(limits, memory_mb):
    for name, value in (
        ("RLIMIT_CPU", limits["cpu_s"]),
        ("RLIMIT_AS", memory_mb << 20),
        ("RLIMIT_NPROC", limits["max_processes"]),
        ("RLIMIT_FSIZE", limits["max_file_mb"] << 20),
        ("RLIMIT_NOFILE", limits["max_open_files"]),
        ("RLIMIT_MSGQUEUE", 256 << 10),  # POSIX message queues hold kernel memory outside the address space
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))


def _drop_privileges(uid):
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid binaries cannot give root back
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _start_worker(config, home, requests, replies):
    """Confines this child and execs a fresh interpreter in it that runs the program (`_worker_main`)."""
    if config["root"]:
        # Its own mount namespace, without /judge: the judge's working files are not there to read or write.
        _check(_libc.unshare(CLONE_NEWNS), "unshare mount namespace")
        _check(_libc.umount2(JUDGE_DIR.encode(), MNT_DETACH), f"umount {JUDGE_DIR}")
    _set_limits(config["limits"], config["limits"]["worker_memory_mb"])
    _drop_privileges(config["uid"])
    if os.geteuid() == 0:
        # Root of a user namespace holds CAP_SYS_PTRACE over the judge; a child namespace holds nothing here.
        _check(_libc.unshare(CLONE_NEWUSER), "unshare user namespace")
    _fresh_session_keyring()
    # Its descriptors: 0-2, and its two pipes at fixed numbers; everything else is closed before the exec.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 16) for fd in (requests, replies)]
    for fd, target in zip(high, (worker.REQUESTS, worker.REPLIES)):
        os.dup2(fd, target)
    os.closerange(worker.REPLIES + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0] + 64)
    _install_seccomp(allow_processes=bool(config["cgroups"]))
    environment = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": home,
                   "TMPDIR": home}  # fmt: skip
    interpreter = config["interpreter"]
    os.execve(interpreter, [interpreter, "-I", "-S", "-B", "-c", WORKER_SOURCE], environment)


def _start_judge(config, units_fd, verdict_fd, requests, replies):
    home = "/"  # without a view of its own, "/" at least is not writable
    if config["root"]:
        # Its own mount namespace, where /tmp is its private /judge (with the runtime bound at its path when that lies
        # under /tmp): no path the judge may use or import from, not even a literal /tmp in a test, holds the program's
        # files. Its import path is the read-only runtime alone.
        _check(_libc.unshare(CLONE_NEWNS), "unshare mount namespace")
        _mount(JUDGE_DIR, "/tmp", flags=MS_BIND | MS_REC)
        home = "/tmp"
        sys.path[:] = config["judge_path"]
    _set_limits(config["limits"], config["limits"]["memory_mb"])
    _drop_privileges(config["uid"])
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace or /proc/<pid>/mem from a process without capabilities
    _fresh_session_keyring()
    os.chdir(home)
    os.environ.update(HOME=home, TMPDIR=home)
    with os.fdopen(units_fd, encoding="utf-8") as file:
        units = json.load(file)
    try:
        _judge(units, requests, replies, verdict_fd)
    except WorkerGone as gone:
        print(f"sandbox: {gone}", file=sys.stderr, flush=True)
        os._exit(1)
    sys.stdout.flush()  # the tests' own prints, for the logs
    os._exit(0)


def main():
    """Runs one sandboxed program as `run_in_sandbox` configured it (`sys.argv[1]`, JSON), and exits with its code.

    Long: the harness's steps in the order isolation needs them (descriptors closed, cgroups joined, keyrings cleared,
    root built, worker and judge forked, stragglers killed); each depends on the one before.
    """
    config = json.loads(sys.argv[1])
    units_fd, verdict_fd = config["units_fd"], config["verdict_fd"]
    for fd in (units_fd, verdict_fd):
        if fd is not None:
            os.set_inheritable(fd, False)  # no exec, in any process of the run, carries them on
    for procs in config["cgroups"]:
        with open(procs, "w") as file:
            file.write("0")  # this process; everything it starts stays in the run's cgroups
    _fresh_session_keyring()
    # Started with -S, which skips site's imports (a third of a run's start-up): site-packages are added without
    # running their .pth hooks, and exit()/quit() are defined as site would.
    sys.path.extend(config["site_packages"])
    builtins.exit = builtins.quit = worker._quit
    workdir = config["workdir"]
    with open(os.path.join(workdir, "program.py"), encoding="utf-8") as file:
        program = file.read()
    os.remove(os.path.join(workdir, "program.py"))
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    uid = config["uid"]
    if uid is not None:
        _clear_user_keyrings(uid)  # before the run, so that a run killed before its own clean-up leaks nothing
    if config["root"]:
        exposed = config["expose"]
        real = [os.path.realpath(path) for path in sys.path]
        config["judge_path"] = [path for path in real if any(path == e or path.startswith(e + "/") for e in exposed)]
        _build_root(config["root"], exposed, uid, config["limits"]["tmp_mb"])
        home = "/tmp"
    else:
        home = workdir
    os.chdir(home)
    requests, to_worker = os.pipe()
    from_worker, replies = os.pipe()
    sys.stdout.flush()
    worker_pid = os.fork()
    if worker_pid == 0:
        for fd in (units_fd, verdict_fd, to_worker, from_worker):
            if fd is not None:
                os.close(fd)
        _in_child(_start_worker, config, home, requests, replies)
    os.close(requests)
    os.close(replies)
    tests_mode = units_fd is not None
    try:
        _send(to_worker, {"program": program, "tests_mode": tests_mode, "site_packages": config["site_packages"]})
    except OSError:
        pass  # the worker is gone already; its exit status says so
    if not tests_mode:
        os.close(to_worker)
        os.close(from_worker)
        code = _exit_code(worker_pid)
    else:
        judge = os.fork()
        if judge == 0:
            _in_child(_start_judge, config, units_fd, verdict_fd, to_worker, from_worker)
        for fd in (units_fd, verdict_fd, to_worker, from_worker):
            os.close(fd)
        code = _exit_code(judge)
        try:
            os.kill(worker_pid, 9)  # it exits at the judge's end of file; one still running has nothing left to say
        except ProcessLookupError:
            pass
        os.waitpid(worker_pid, 0)
    if uid is not None and not config["pid_namespace"] and os.fork() == 0:
        # Without a pid namespace, processes that left the process group are found by their uid and killed.
        os.setuid(uid)
        os.kill(-1, 9)
        os._exit(0)
    if uid is not None:
        _clear_user_keyrings(uid)
    os._exit(code)


if __name__ == "__main__":
    main()
