"""Runs untrusted Python in a throwaway sandbox; `python -m ts_trl.rewards.sandbox` prints the layers active here."""

# Layers, each used when this machine allows it, because a reward must never let a sampled program touch the host:
# - `unshare`: new mount, network (loopback only, down), pid, IPC and UTS namespaces, as root or inside a user
#   namespace; SysV and POSIX IPC objects die with the run;
# - a filesystem of its own (with a mount namespace): a fresh tmpfs root holding only the Python runtime and the
#   system libraries read-only, a private size- and inode-capped /tmp as its working directory, /dev/{null,zero,urandom};
#   no home, no project checkout, no caches, no /proc (see `_harness._build_root`);
# - a throwaway uid per concurrent run (as root), which makes RLIMIT_NPROC bite;
# - a cgroup per run (memory and pids) where this process may make one, else a single-process program (below);
# - seccomp, rlimits (CPU, address space, processes, file size, open files, no core dumps) and no_new_privs;
# - a fresh session keyring per process, and throwaway uids' user keyrings emptied around each run;
# - a scrubbed environment, a wall-clock timeout that SIGKILLs the whole process group, capped output;
# - a judge: the tests run in a separate interpreter that talks to the program's only in plain data, and only the
#   judge can report a verdict (see `_harness.py` for why that is sound).
# docs/sandbox.md says what each layer stops, and what none does, as measured.
# bubblewrap or nsjail would do the namespace work; neither installs with pip (a system package, which CI and users
# would have to add), so the layers are built here, on `unshare` from util-linux, and tested everywhere the same way.

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import queue
import selectors
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

logger = logging.getLogger(__name__)

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_harness.py")
# IPC: SysV shared memory, message queues, semaphores and POSIX message queues of their own, gone with the run.
NAMESPACES = ("--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child")
# What the program sees of the host, read-only: the system libraries that the interpreter and its extension modules
# link against (on merged-/usr systems /lib and /lib64 are symlinks into /usr), plus the interpreter and venv prefixes.
SYSTEM_LIBRARIES = ("/usr/lib", "/usr/lib64", "/lib", "/lib64")
STDERR_CAP = 64 << 10


@dataclass(frozen=True)
class Limits:
    """Per-run limits; `timeout` is wall-clock seconds, CPU time is capped at the same number of seconds."""

    timeout: float = 10.0
    memory_mb: int = 1024
    max_processes: int = 32
    max_file_mb: int = 16
    max_open_files: int = 64
    max_output_bytes: int = 1 << 20
    tmp_mb: int = 64


@dataclass(frozen=True)
class Isolation:
    """Which layers this machine allows: the command prefix that enters the namespaces, whether to drop uid, and
    whether each run gets its own cgroup (memory and process limits for the whole run)."""

    prefix: tuple[str, ...] = ()
    drop_uid: bool = False
    cgroup: bool = False

    @property
    def layers(self) -> list[str]:
        found = ["rlimits", "seccomp", "scrubbed-env", "timeout+killpg", "output-cap", "judge"]
        if self.prefix:
            spaces = "netns+pidns+mountns+ipcns"
            found[:0] = ["userns+" + spaces if "--user" in self.prefix else spaces, "fs-view"]
        else:
            found.insert(1, "tempdir")
        if self.drop_uid:
            found.insert(2 if self.prefix else 0, "throwaway-uid")
        found.append("cgroup" if self.cgroup else "single-process")
        return found


@dataclass
class RunResult:
    """What one sandboxed run left: `passed_units` is None unless the judge reported a verdict."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    output_overflow: bool = False
    passed_units: list[int] | None = None
    wall_s: float = 0.0
    layers: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The program ran to the end, in time, within the output cap, and exited 0."""
        return self.returncode == 0 and not self.timed_out and not self.output_overflow


# Each concurrent run gets its own uid, so that RLIMIT_NPROC (counted per uid) and the clean-up by uid see only it.
_UID_BASE = 1_000_000 + (os.getpid() % 10_000) * 64
_FREE_UIDS: queue.SimpleQueue[int] = queue.SimpleQueue()
for _uid in range(_UID_BASE, _UID_BASE + 64):
    _FREE_UIDS.put(_uid)


def _scrubbed_env(workdir: str) -> dict[str, str]:
    # Nothing from the host environment: no tokens, no HF_*, no proxies; -I already ignores PYTHON* variables.
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir,
            "TMPDIR": workdir}  # fmt: skip


@functools.cache
def _site_packages() -> list[str]:
    """This interpreter's site-packages folders, which the harness (started with -S) puts on its path itself."""
    return [path for path in site.getsitepackages() if os.path.isdir(path)]


@functools.cache
def _exposed_paths() -> tuple[str, ...]:
    """The host paths bound read-only into the program's root, none inside another."""
    paths = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    paths |= {path for path in SYSTEM_LIBRARIES if os.path.lexists(path)}
    return tuple(sorted(path for path in paths if not any(path.startswith(other + "/") for other in paths)))


# ---------------------------------------------------------------- a cgroup per run
# `memory_mb` and `max_processes` hold for the whole run (every process, tmpfs and memfd pages, SysV shared memory)
# only in a cgroup; without one (an ordinary user on cgroup v1, or v2 without delegation) the harness keeps the program
# to one process and refuses memory outside its address space (see `_harness.REFUSED_WITHOUT_CGROUP`).
_RUNS = itertools.count()
CGROUP_FILES = {
    "memory": ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"),
    "pids": ("pids.max",),
    "v2": ("memory.max", "memory.swap.max", "pids.max"),
}
OPTIONAL_CGROUP_FILES = {"memory.memsw.limit_in_bytes", "memory.swap.max"}  # absent where swap is not accounted


def _cgroup_mounts() -> dict[str, tuple[str, str]]:
    """`{"memory"|"pids"|"v2": (mount point, hierarchy path mounted there)}` from /proc/self/mountinfo."""
    mounts = {}
    with open("/proc/self/mountinfo", encoding="utf-8") as file:
        for line in file:
            fields = line.split()
            tail = fields[fields.index("-") + 1 :]
            point = fields[4].encode().decode("unicode_escape")
            if tail[0] == "cgroup2":
                mounts.setdefault("v2", (point, fields[3]))
            elif tail[0] == "cgroup":
                for controller in set(tail[2].split(",")) & {"memory", "pids"}:
                    mounts.setdefault(controller, (point, fields[3]))
    return mounts


def _own_cgroup(kind: str, mounts: dict) -> str | None:
    """The folder of this process's cgroup in the hierarchy `kind`, or None."""
    with open("/proc/self/cgroup", encoding="utf-8") as file:
        for line in file:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if (kind == "v2" and not controllers) or kind in controllers.split(","):
                point, mounted = mounts[kind]
                if path == mounted or path.startswith(mounted.rstrip("/") + "/"):
                    return os.path.join(point, path[len(mounted.rstrip("/")) :].lstrip("/"))
    return None


@functools.cache
def _cgroup_parents() -> tuple[tuple[str, str], ...]:
    """`(kind, folder)` pairs under which this process can make a cgroup per run with a memory and a pids limit:
    cgroup v1's memory and pids hierarchies (as root), or one cgroup v2 folder (root, or delegated). Empty if none."""
    try:
        mounts = _cgroup_mounts()
        options = [("memory", "pids"), ("v2",)]
        for kinds in options:
            if not all(kind in mounts for kind in kinds):
                continue
            parents = tuple((kind, _own_cgroup(kind, mounts)) for kind in kinds)
            if all(folder for _, folder in parents):
                try:
                    _remove_cgroups(_make_cgroups(parents, Limits()))
                    _remove_stale_cgroups(parents)
                    return parents
                except OSError as error:
                    logger.debug("no cgroup per run under %s: %s", parents, error)
    except (OSError, ValueError, IndexError) as error:
        logger.debug("cgroups not readable: %s", error)
    return ()


def _remove_stale_cgroups(parents) -> None:
    """Removes the per-run cgroups that a process killed mid-run (kill -9, OOM) left behind."""
    for _, parent in parents:
        for name in os.listdir(parent):
            if name.startswith("ts_trl_sandbox_") and not _alive(int(name.split("_")[3])):
                _remove_cgroups([os.path.join(parent, name)])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _make_cgroups(parents, limits: Limits) -> list[str]:
    """One new cgroup per hierarchy for a run, its memory and process limits set; removed again if any step fails."""
    name = f"ts_trl_sandbox_{os.getpid()}_{next(_RUNS)}"
    values = {"memory.limit_in_bytes": limits.memory_mb << 20, "memory.memsw.limit_in_bytes": limits.memory_mb << 20,
              "memory.max": limits.memory_mb << 20, "memory.swap.max": 0,
              "pids.max": limits.max_processes + 3}  # fmt: skip  # + the keeper, the judge and the worker
    made = []
    try:
        for kind, parent in parents:
            folder = os.path.join(parent, name)
            os.mkdir(folder)
            made.append(folder)
            for setting in CGROUP_FILES[kind]:
                try:
                    with open(os.path.join(folder, setting), "w") as file:
                        file.write(str(values[setting]))
                except FileNotFoundError:
                    if setting not in OPTIONAL_CGROUP_FILES:
                        raise
    except OSError:
        _remove_cgroups(made)
        raise
    return made


def _remove_cgroups(folders: list[str]) -> None:
    """Kills whatever is still in the run's cgroups (processes that left its process group included), then removes
    them; a cgroup is busy for a moment after its last process died."""
    for _ in range(200):
        busy = False
        for folder in folders:
            try:
                with open(os.path.join(folder, "cgroup.procs"), encoding="utf-8") as file:
                    pids = [int(pid) for pid in file.read().split()]
            except FileNotFoundError:
                continue
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.rmdir(folder)
            except FileNotFoundError:
                pass
            except OSError:
                busy = True
        if not busy:
            return
        time.sleep(0.005)
    logger.warning("could not remove the sandbox cgroups %s", folders)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _communicate(
    process: subprocess.Popen, stdin: bytes, verdict_fd: int | None, deadline: float, cap: int
) -> tuple[bytes, bytes, bytes, str]:
    """Feeds stdin and reads stdout, stderr and the judge's verdict pipe until EOF; stops early ("timeout" /
    "overflow") without holding more than `cap` bytes of stdout, so a program printing forever costs the host nothing."""
    selector = selectors.DefaultSelector()
    out, err, verdict = bytearray(), bytearray(), bytearray()
    selector.register(process.stdout, selectors.EVENT_READ, out)
    selector.register(process.stderr, selectors.EVENT_READ, err)
    if verdict_fd is not None:
        selector.register(verdict_fd, selectors.EVENT_READ, verdict)
    if process.stdin is not None:
        os.set_blocking(process.stdin.fileno(), False)
        selector.register(process.stdin, selectors.EVENT_WRITE, None)
    sent, stop = 0, ""
    try:
        while selector.get_map() and not stop:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stop = "timeout"
                break
            for key, _ in selector.select(remaining):
                if key.data is None:  # stdin
                    try:
                        sent += os.write(key.fd, stdin[sent : sent + 65536])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        sent = len(stdin)  # the program stopped reading: the rest of its input is dropped
                    if sent >= len(stdin):
                        selector.unregister(key.fileobj)
                        key.fileobj.close()
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer = key.data
                if buffer is not err and len(buffer) + len(chunk) > cap:
                    stop = "overflow"
                    break
                if buffer is not err or len(err) < STDERR_CAP:
                    buffer += chunk
    finally:
        selector.close()
    return bytes(out), bytes(err[:STDERR_CAP]), bytes(verdict), stop


def run_in_sandbox(
    isolation: Isolation, program: str, units: list | None = None, stdin: str = "", limits: Limits = Limits()
) -> RunResult:
    """Runs `program`, then (tests mode) each `(source, is_test)` unit in the judge; or (stdio mode, `units` None)
    runs it as `__main__` with `stdin`. Never raises for anything the program does.

    Long: the run's set-up and tear-down in one place, in the order isolation needs them, so that every descriptor,
    cgroup and folder opened here is closed on every path.
    """
    started = time.monotonic()
    uid = _FREE_UIDS.get() if isolation.drop_uid else None
    workdir = tempfile.mkdtemp(prefix="ts_trl_sandbox_")
    pass_fds, verdict_read, cgroups = [], None, []
    try:
        if isolation.cgroup:
            cgroups = _make_cgroups(_cgroup_parents(), limits)
            tmp_mb, worker_memory_mb = limits.tmp_mb, limits.memory_mb
        else:  # one process: its address space and its /tmp together stay within memory_mb
            tmp_mb = min(limits.tmp_mb, limits.memory_mb // 4)
            worker_memory_mb = limits.memory_mb - tmp_mb
        with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8") as file:
            file.write(program)
        units_fd = verdict_fd = None
        if units is not None:
            # The tests reach only the judge: an unlinked file whose descriptor the worker closes before the program
            # runs, and a verdict pipe that only the judge keeps.
            with tempfile.TemporaryFile("w+", encoding="utf-8") as file:
                json.dump(units, file)
                file.seek(0)
                units_fd = os.dup(file.fileno())
            pass_fds.append(units_fd)
            verdict_read, verdict_fd = os.pipe()
            pass_fds.append(verdict_fd)
        if uid is not None:
            os.chown(workdir, uid, uid)
        root = os.path.join(workdir, "root") if isolation.prefix else None
        if root:
            os.mkdir(root)
        config = {
            "workdir": workdir,
            "root": root,
            "expose": _exposed_paths(),
            "site_packages": _site_packages(),
            "interpreter": os.path.realpath(sys.executable),  # the binary itself lies in the exposed runtime
            "units_fd": units_fd,
            "verdict_fd": verdict_fd,
            "uid": uid,
            "pid_namespace": bool(isolation.prefix),
            "cgroups": [os.path.join(folder, "cgroup.procs") for folder in cgroups],
            "limits": {
                **asdict(limits),
                "cpu_s": max(1, int(limits.timeout + 0.999)),
                "tmp_mb": tmp_mb,
                "worker_memory_mb": worker_memory_mb,
            },  # fmt: skip
        }
        command = [*isolation.prefix, sys.executable, "-I", "-S", "-B", HARNESS, json.dumps(config)]
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=_scrubbed_env(workdir),
            pass_fds=pass_fds,
            start_new_session=True,  # its own process group, so one killpg reaches every process it started
        )
        while pass_fds:
            os.close(pass_fds.pop())
        try:
            out, err, verdict, stop = _communicate(
                process, stdin.encode(), verdict_read, started + limits.timeout, limits.max_output_bytes
            )
            if stop:
                _kill_group(process)
            try:
                returncode = process.wait(timeout=max(0.1, started + limits.timeout - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop = stop or "timeout"
                _kill_group(process)
                returncode = process.wait()
        finally:
            _kill_group(process)  # stragglers that kept running after the harness returned
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None and not stream.closed:
                    stream.close()
        return RunResult(
            returncode=returncode,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            timed_out=stop == "timeout",
            output_overflow=stop == "overflow",
            passed_units=_verdict(verdict) if units is not None and returncode == 0 else None,
            wall_s=time.monotonic() - started,
            layers=isolation.layers,
        )
    finally:
        for fd in [*pass_fds, verdict_read]:
            if fd is not None:
                os.close(fd)
        _remove_cgroups(cgroups)
        shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None:
            _FREE_UIDS.put(uid)


def _verdict(framed: bytes) -> list[int] | None:
    """The judge's one message (a length-prefixed JSON list of passed unit indices), or None if it wrote none."""
    if len(framed) <= 4 or int.from_bytes(framed[:4], "little") != len(framed) - 4:
        return None
    try:
        passed = json.loads(framed[4:])
        return [int(index) for index in passed] if isinstance(passed, list) else None
    except (ValueError, TypeError):
        return None


def _works(isolation: Isolation) -> bool:
    probe = run_in_sandbox(isolation, "import fractions\nx = 1", [("assert x == 1", True)], limits=Limits(timeout=20))
    if probe.passed_units != [0]:
        logger.debug("sandbox layers %s unavailable: %s", isolation.layers, probe.stderr[-500:])
    return probe.ok and probe.passed_units == [0]


@functools.cache
def detect_isolation() -> Isolation:
    """The strongest isolation that works here, probed once; logs the active layers (a warning when degraded)."""
    root = os.geteuid() == 0
    unshare = shutil.which("unshare")
    prefixes = []
    if unshare:
        if root:
            prefixes += [((unshare, *NAMESPACES), True), ((unshare, *NAMESPACES), False)]
        prefixes.append(((unshare, "--user", "--map-root-user", *NAMESPACES), False))
    prefixes += [((), True)] if root else []
    cgroup = [True, False] if _cgroup_parents() else [False]
    candidates = [Isolation(prefix, drop_uid, with_cgroup) for prefix, drop_uid in prefixes for with_cgroup in cgroup]
    for isolation in candidates:
        if _works(isolation):
            break
    else:
        isolation = Isolation()
    if not isolation.prefix:
        logger.warning(
            "Code sandbox: FILES ARE NOT CONTAINED. Without namespaces, sampled programs can read and write whatever "
            "this user can (home, checkpoints, caches) and reach the network; active layers %s. Namespaces need "
            "`unshare` (util-linux) with root or unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone"
            "=1, user.max_user_namespaces > 0).",
            isolation.layers,
        )
    else:
        logger.info("Code sandbox layers: %s", isolation.layers)
    return isolation


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    layers = detect_isolation().layers
    print("active layers:", layers)
    print("files:", "contained (own read-only root)" if "fs-view" in layers else "NOT contained (no mount namespace)")
