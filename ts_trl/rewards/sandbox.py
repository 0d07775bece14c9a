"""Runs untrusted Python in a throwaway sandbox: namespaces, a throwaway uid, rlimits, a scrubbed env, capped output.

Layers, each used when this machine allows it (`python -m ts_trl.rewards.sandbox` prints which are active):
- `unshare`: new mount, network (loopback only, down), and pid namespaces, as root or inside a user namespace;
- a throwaway uid per concurrent run (as root), which makes RLIMIT_NPROC bite and the host's files read-only;
- rlimits (CPU, address space, processes, file size, open files, no core dumps) and no_new_privs;
- a fresh working directory, also mounted as /tmp, /var/tmp and /dev/shm, removed afterwards;
- a scrubbed environment, a wall-clock timeout that SIGKILLs the whole process group, capped output;
- a per-run nonce so that only the harness, after the tests ran, can report a pass (see `_harness.py`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

logger = logging.getLogger(__name__)

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_harness.py")
NAMESPACES = ("--mount", "--net", "--pid", "--fork", "--kill-child", "--mount-proc")
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


@dataclass(frozen=True)
class Isolation:
    """Which layers this machine allows: the command prefix that enters the namespaces, and whether to drop uid."""

    prefix: tuple[str, ...] = ()
    drop_uid: bool = False

    @property
    def layers(self) -> list[str]:
        found = ["rlimits", "scrubbed-env", "tempdir", "timeout+killpg", "output-cap", "nonce"]
        if self.prefix:
            found.insert(0, "userns+netns+pidns+mountns" if "--user" in self.prefix else "netns+pidns+mountns")
        if self.drop_uid:
            found.insert(1 if self.prefix else 0, "throwaway-uid")
        return found


@dataclass
class RunResult:
    """What one sandboxed run left: `passed_units` is None unless the harness itself reported a verdict."""

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


def _interpreter_paths() -> list[str]:
    return sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)})


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _communicate(process: subprocess.Popen, stdin: bytes, deadline: float, cap: int) -> tuple[bytes, bytes, str]:
    """Feeds stdin and reads stdout/stderr until EOF; stops early ("timeout" / "overflow") without holding more than
    `cap` bytes of stdout, so a program printing forever costs the host nothing."""
    selector = selectors.DefaultSelector()
    out, err = bytearray(), bytearray()
    selector.register(process.stdout, selectors.EVENT_READ, out)
    selector.register(process.stderr, selectors.EVENT_READ, err)
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
                if buffer is out and len(out) + len(chunk) > cap:
                    stop = "overflow"
                    break
                if buffer is out or len(err) < STDERR_CAP:
                    buffer += chunk
    finally:
        selector.close()
    return bytes(out), bytes(err[:STDERR_CAP]), stop


def run_in_sandbox(
    isolation: Isolation, program: str, units: list | None = None, stdin: str = "", limits: Limits = Limits()
) -> RunResult:
    """Runs `program`, then (tests mode) each `(source, is_test)` unit in its namespace; or (stdio mode, `units` None)
    runs it as `__main__` with `stdin`. Never raises for anything the program does."""
    started = time.monotonic()
    uid = _FREE_UIDS.get() if isolation.drop_uid else None
    workdir = tempfile.mkdtemp(prefix="ts_trl_sandbox_")
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    try:
        with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8") as file:
            file.write(program)
        if units is not None:
            with open(os.path.join(workdir, "units.json"), "w", encoding="utf-8") as file:
                json.dump(units, file)
        if uid is not None:
            os.chown(workdir, uid, uid)
        config = {
            "workdir": workdir,
            "mode": "stdio" if units is None else "tests",
            "nonce_fd": read_fd,
            "uid": uid,
            "mount": bool(isolation.prefix),
            "pid_namespace": bool(isolation.prefix),
            "expose": _interpreter_paths() if uid is not None and isolation.prefix else [],
            "limits": {**asdict(limits), "cpu_s": max(1, int(limits.timeout + 0.999))},
        }
        os.write(write_fd, nonce.encode())
        os.close(write_fd)
        write_fd = None
        command = [*isolation.prefix, sys.executable, "-I", "-B", HARNESS, json.dumps(config)]
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=_scrubbed_env(workdir),
            pass_fds=(read_fd,),
            start_new_session=True,  # its own process group, so one killpg reaches every process it started
        )
        os.close(read_fd)
        read_fd = None
        try:
            out, err, stop = _communicate(process, stdin.encode(), started + limits.timeout, limits.max_output_bytes)
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
        stdout = out.decode("utf-8", errors="replace")
        return RunResult(
            returncode=returncode,
            stdout=_strip_verdict(stdout, nonce),
            stderr=err.decode("utf-8", errors="replace"),
            timed_out=stop == "timeout",
            output_overflow=stop == "overflow",
            passed_units=_verdict(stdout, nonce) if units is not None else None,
            wall_s=time.monotonic() - started,
            layers=isolation.layers,
        )
    finally:
        for fd in (read_fd, write_fd):
            if fd is not None:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None:
            _FREE_UIDS.put(uid)


def _verdict(stdout: str, nonce: str) -> list[int] | None:
    lines = [line for line in stdout.splitlines() if line.startswith(nonce + " ")]
    if len(lines) != 1:  # the harness prints exactly one; none means it never got past the tests
        return None
    try:
        return [int(index) for index in json.loads(lines[0][len(nonce) + 1 :])]
    except (ValueError, TypeError):
        return None


def _strip_verdict(stdout: str, nonce: str) -> str:
    return "\n".join(line for line in stdout.splitlines() if not line.startswith(nonce)) if nonce in stdout else stdout


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
    candidates = []
    if unshare:
        if root:
            candidates.append(Isolation((unshare, *NAMESPACES), drop_uid=True))
            candidates.append(Isolation((unshare, *NAMESPACES), drop_uid=False))
        candidates.append(Isolation((unshare, "--user", "--map-root-user", *NAMESPACES), drop_uid=False))
    candidates += [Isolation((), drop_uid=True)] if root else []
    for isolation in candidates:
        if _works(isolation):
            break
    else:
        isolation = Isolation()
    missing = {"namespaces": not isolation.prefix, "throwaway-uid": not isolation.drop_uid}
    if any(missing.values()):
        logger.warning(
            "Code sandbox runs with reduced isolation: active layers %s; missing %s (%s).",
            isolation.layers,
            [name for name, gone in missing.items() if gone],
            "namespaces need `unshare` with root or user namespaces; the uid drop needs root",
        )
    else:
        logger.info("Code sandbox layers: %s", isolation.layers)
    return isolation


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print("active layers:", detect_isolation().layers)
