"""Sandbox harness, run by `sandbox.py` as `python -I -S -B _harness.py CONFIG` inside its namespaces; stdlib only."""

# Processes. The *keeper* (root in the namespaces; pid 1 of the pid namespace when there is one) builds the program's
# filesystem view and pivots into it, then forks the *judge*, which sets the rlimits, drops to the throwaway uid and
# forks the *worker*. The worker runs the untrusted program; the judge runs the tests.
#
# Why the verdict is sound. The tests run in the judge, a separate interpreter that no untrusted code ever ran in. The
# judge reaches the program's functions through proxies: a call sends its arguments to the worker over a pipe and gets
# the result back, and both directions carry only plain data (None, bool, int, float, str, bytes, and
# list/tuple/set/frozenset/dict of these), re-built by the judge's own decoder with size and depth limits. So no object
# the program made can take part in a comparison (an always-equal `__eq__` never crosses), and nothing the program does
# inside its interpreter (frames, gc, patched builtins/json/os/sys.modules, ctypes writes) touches the judge's. The
# judge forked before it read the tests (from a file descriptor the worker closes before running anything), so the
# worker's memory never holds them. The judge is non-dumpable and the worker has no capability over it (another uid,
# or, as uid 0 of a user namespace, moved into a child user namespace), so the worker cannot ptrace it or read its
# memory; with the new root there is no /proc at all. The verdict goes to a pipe only the judge holds; a worker that
# exits, crashes or kills the judge before the tests finish leaves no verdict, which scores 0. What is not defended:
# the program still decides what its functions return, and a test that needs an object the program built (a class
# instance, a generator) fails with a clear error instead of trusting it.

import builtins
import ctypes
import json
import os
import resource
import struct
import sys
import traceback

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE = 38, 4
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
DEVICES = ("null", "zero", "urandom")
MAX_FRAME = 16 << 20  # bytes per call or reply: a program cannot make the judge hold more
MAX_DEPTH = 100
# Built-in exceptions a test may expect from the program; never StopIteration, which would end a `map` in a test early.
RAISED_AS_IS = frozenset(
    "ArithmeticError AssertionError AttributeError IndexError KeyError LookupError NotImplementedError OverflowError "
    "RecursionError RuntimeError TypeError ValueError ZeroDivisionError".split()
)
_libc = ctypes.CDLL(None, use_errno=True)


# ---------------------------------------------------------------- filesystem view


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


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
    """Builds the program's whole filesystem in `root` and pivots into it: the runtime read-only, a private size-capped
    /tmp that is also its working directory, /dev/{null,zero,urandom}, and nothing else (no /proc, no home, no /etc)."""
    _mount(None, "/", flags=MS_REC | MS_PRIVATE)  # nothing done here propagates back to the host
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    # The private /tmp first: a runtime that lives under /tmp (a virtual environment in /tmp/...) is bound on top of it.
    os.makedirs(root + "/tmp")
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0700,size={tmp_mb}m{owner}")
    for path in expose:
        if os.path.islink(path):  # /lib -> usr/lib on merged-/usr systems
            os.symlink(os.readlink(path), root + path)
            continue
        os.makedirs(root + path, exist_ok=True)
        _bind_read_only(path, root + path)
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


# ---------------------------------------------------------------- plain data across the boundary


def encode(value, depth=0):
    """JSON-ready form of plain data; anything else (subclasses included) raises TypeError naming its type."""
    kind = type(value)
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply to cross the sandbox boundary")
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [encode(item, depth + 1) for item in value]
    if kind in (tuple, set, frozenset):
        return {kind.__name__: [encode(item, depth + 1) for item in value]}
    if kind is dict:
        return {"dict": [[encode(key, depth + 1), encode(item, depth + 1)] for key, item in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    raise TypeError(f"a {kind.__name__} cannot cross the sandbox boundary: only plain data (None, bool, int, float, "
                    "str, bytes, list, tuple, set, frozenset, dict) is passed between the tests and the program")  # fmt: skip


def decode(value, depth=0):
    """The inverse of `encode`, building only fresh built-in objects; raises ValueError on anything malformed."""
    kind = type(value)
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [decode(item, depth + 1) for item in value]
    if kind is not dict or len(value) != 1:
        raise ValueError("malformed value from the program's process")
    (tag, body), build = next(iter(value.items())), {"tuple": tuple, "set": set, "frozenset": frozenset}
    if tag in build and type(body) is list:
        return build[tag](decode(item, depth + 1) for item in body)
    if tag == "dict" and type(body) is list and all(type(pair) is list and len(pair) == 2 for pair in body):
        return {decode(key, depth + 1): decode(item, depth + 1) for key, item in body}
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    raise ValueError("malformed value from the program's process")


def _send(fd, message):
    data = json.dumps(message).encode()
    data = struct.pack("<I", len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


def _receive(fd, limit=MAX_FRAME):
    """One message, or None at end of file; the length prefix is checked before anything is read."""
    header = _read_exactly(fd, 4)
    if header is None:
        return None
    (size,) = struct.unpack("<I", header)
    if size > limit:
        raise ValueError(f"the program sent {size} bytes in one reply (limit {limit})")
    body = _read_exactly(fd, size)
    if body is None:
        return None
    return json.loads(body)


def _read_exactly(fd, size):
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------- worker: runs the untrusted program


def _fail_worker():
    sys.stdout.flush()  # what it printed before failing, for the logs
    traceback.print_exc()
    os._exit(1)


def _worker(program, tests_mode, requests, replies):
    namespace = {"__name__": "__candidate__" if tests_mode else "__main__"}
    try:
        exec(compile(program, "program.py", "exec"), namespace)
    except SystemExit as stop:
        if tests_mode or stop.code not in (None, 0):
            _fail_worker()
    except BaseException:
        _fail_worker()
    if not tests_mode:  # stdin/stdout mode: the caller compares what the program printed
        sys.stdout.flush()
        os._exit(0)
    exported = {}
    for name, value in list(namespace.items()):
        if name.startswith("__"):
            continue
        if type(value) is type(os):
            exported[name] = ["module", value.__name__]
        elif callable(value):
            exported[name] = ["callable", None]
        else:
            try:
                exported[name] = ["value", encode(value)]
            except (TypeError, ValueError, RecursionError):
                exported[name] = ["other", type(value).__name__]
    _send(replies, exported)
    while (request := _receive(requests)) is not None:
        try:
            args, kwargs = decode(request["args"]), decode(request["kwargs"])
            reply = {"value": encode(namespace[request["name"]](*args, **kwargs))}
        except BaseException as error:  # SystemExit too: the judge decides what an exception in a test means
            reply = {"error": [type(error).__name__, str(error)[:1000]]}
        sys.stdout.flush()
        _send(replies, reply)
    os._exit(0)


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
        _send(self._requests, {"name": self._name, "args": encode(list(args)), "kwargs": encode(kwargs)})
        try:
            reply = _receive(self._replies)
            if type(reply) is not dict:
                raise ValueError("no reply")
            if "value" in reply:
                return decode(reply["value"])
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
    own import of a stdlib module the program imported, and `Unavailable` for the rest. Names of builtins are left
    out, so the tests' `all`, `abs` or `sorted` stay the judge's own."""
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
                namespace[name] = decode(detail)
            elif kind == "module" and type(detail) is str and detail.split(".")[0] in sys.stdlib_module_names:
                namespace[name] = __import__(detail, fromlist=["_"])
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
    _send(verdict_fd, passed)


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


def _set_limits(limits):
    for name, value in (
        ("RLIMIT_CPU", limits["cpu_s"]),
        ("RLIMIT_AS", limits["memory_mb"] << 20),
        ("RLIMIT_NPROC", limits["max_processes"]),
        ("RLIMIT_FSIZE", limits["max_file_mb"] << 20),
        ("RLIMIT_NOFILE", limits["max_open_files"]),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))


def _guard(config, program, units_fd, verdict_fd):
    _set_limits(config["limits"])
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid binaries cannot give root back
    if config["uid"] is not None:
        os.setgroups([])
        os.setgid(config["uid"])
        os.setuid(config["uid"])
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace or /proc/<pid>/mem from a process without capabilities
    requests, to_worker = os.pipe()
    from_worker, replies = os.pipe()
    pid = os.fork()
    if pid == 0:
        for fd in (units_fd, verdict_fd, to_worker, from_worker):
            if fd is not None:
                os.close(fd)
        if os.geteuid() == 0:
            # Root of a user namespace holds CAP_SYS_PTRACE over the judge; a child namespace holds nothing here.
            _in_child(_check, _libc.unshare(CLONE_NEWUSER), "unshare user namespace")
        _in_child(_worker, program, units_fd is not None, requests, replies)
    os.close(requests)
    os.close(replies)
    if units_fd is None:
        os._exit(_exit_code(pid))
    with os.fdopen(units_fd, encoding="utf-8") as file:
        units = json.load(file)
    try:
        _judge(units, to_worker, from_worker, verdict_fd)
    except WorkerGone as gone:
        print(f"sandbox: {gone}", file=sys.stderr, flush=True)
        os._exit(1)
    sys.stdout.flush()  # the tests' own prints, for the logs
    os._exit(0)


def _quit(code=None):
    raise SystemExit(code)


def main():
    config = json.loads(sys.argv[1])
    # Started with -S, which skips site's imports (a third of a run's start-up): site-packages are added without
    # running their .pth hooks, and exit()/quit() are defined as site would.
    sys.path.extend(config["site_packages"])
    builtins.exit = builtins.quit = _quit
    workdir = config["workdir"]
    with open(os.path.join(workdir, "program.py"), encoding="utf-8") as file:
        program = file.read()
    os.remove(os.path.join(workdir, "program.py"))
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if config["root"]:
        _build_root(config["root"], config["expose"], config["uid"], config["limits"]["tmp_mb"])
        home = "/tmp"
    else:
        home = workdir
    os.chdir(home)
    os.environ.update(HOME=home, TMPDIR=home)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _in_child(_guard, config, program, config["units_fd"], config["verdict_fd"])
    for fd in (config["units_fd"], config["verdict_fd"]):
        if fd is not None:
            os.close(fd)
    code = _exit_code(pid)
    if config["uid"] is not None and not config["pid_namespace"] and os.fork() == 0:
        # Without a pid namespace, processes that left the process group are found by their uid and killed.
        os.setuid(config["uid"])
        os.kill(-1, 9)
        os._exit(0)
    os._exit(code)


if __name__ == "__main__":
    main()
