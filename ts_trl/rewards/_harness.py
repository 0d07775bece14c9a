"""Sandbox harness, run by `sandbox.py` as `python -I -B _harness.py CONFIG` inside the namespaces it made; stdlib only.

Three processes: the *keeper* (root in the namespaces; pid 1 of the pid namespace when there is one) mounts the
private /tmp, then forks the *guard*, which sets the rlimits, drops to the throwaway uid and forks the *worker*, which
runs the untrusted program and then the tests. A kill of the worker's parent (the guard) is a failure the keeper sees.
In tests mode the worker's one verdict line is `<nonce> <json list of passed test units>`; the nonce came through a
pipe that the keeper read and closed before any untrusted code ran, so the program cannot print a valid verdict
itself, and exiting early (sys.exit, os._exit, a signal) leaves no verdict at all.
"""

import ctypes
import json
import os
import resource
import sys
import traceback

MS_BIND, MS_MOVE, MS_REC = 4096, 8192, 16384
PR_SET_NO_NEW_PRIVS = 38
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source, target, fstype=None, flags=0, data=None):
    encode = lambda value: None if value is None else value.encode()  # noqa: E731
    if _libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def _private_ancestor(path):
    """The topmost directory above `path` that other users cannot traverse (e.g. /root, mode 700), or None."""
    current = "/"
    for part in path.strip("/").split("/")[:-1]:
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & 0o001:
            return current
    return None


def _expose(paths, staging):
    """Keeps each of `paths` reachable for the throwaway uid when it sits under a private home (python in
    /root/.pyenv): the private ancestor is covered by an empty tmpfs, which also hides the rest of it, and the path
    alone is mounted back."""
    moves = []
    for index, path in enumerate(paths):
        ancestor = _private_ancestor(path)
        if ancestor is not None:
            stage = os.path.join(staging, str(index))
            os.makedirs(stage)
            _mount(path, stage, flags=MS_BIND | MS_REC)
            moves.append((ancestor, stage, path))
    for ancestor in sorted({ancestor for ancestor, _, _ in moves}):
        _mount("tmpfs", ancestor, "tmpfs", 0, "mode=0755,size=1m")
    for _, stage, path in moves:
        os.makedirs(path, exist_ok=True)
        _mount(stage, path, flags=MS_MOVE)
        os.rmdir(stage)
    if os.path.isdir(staging):
        os.rmdir(staging)


def _exit_code(pid):
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _worker(config, program, units, nonce):
    # Taken before the program runs, so that closing fd 1 or patching os/sys cannot reach the verdict.
    verdict_fd, write, flush = os.dup(1), os.write, sys.stdout.flush
    namespace = {"__name__": "__main__" if units is None else "__candidate__"}
    try:
        exec(compile(program, "program.py", "exec"), namespace)
    except SystemExit as stop:
        if units is not None or stop.code not in (None, 0):
            traceback.print_exc()
            os._exit(1)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    if units is None:  # stdin/stdout mode: the caller compares what the program printed
        sys.stdout.flush()
        os._exit(0)
    passed = []
    for index, (source, is_test) in enumerate(units):
        try:
            exec(compile(source, f"test_{index}.py", "exec"), namespace)
        except BaseException:  # SystemExit too: a test that exits has not passed
            traceback.print_exc()
            if not is_test:
                break  # setup failed, the tests after it cannot run
            continue
        if is_test:
            passed.append(index)
    try:
        flush()  # the program's own prints first, for the logs
    except BaseException:
        pass
    write(verdict_fd, f"\n{nonce} {json.dumps(passed)}\n".encode())
    os._exit(0)


def _guard(config, program, units, nonce):
    limits = config["limits"]
    for name, value in (
        ("RLIMIT_CPU", limits["cpu_s"]),
        ("RLIMIT_AS", limits["memory_mb"] << 20),
        ("RLIMIT_NPROC", limits["max_processes"]),
        ("RLIMIT_FSIZE", limits["max_file_mb"] << 20),
        ("RLIMIT_NOFILE", limits["max_open_files"]),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid binaries cannot give root back
    if config["uid"] is not None:
        os.setgroups([])
        os.setgid(config["uid"])
        os.setuid(config["uid"])
    pid = os.fork()
    if pid == 0:
        _worker(config, program, units, nonce)
    os._exit(_exit_code(pid))


def main():
    config = json.loads(sys.argv[1])
    workdir = config["workdir"]
    with open(os.path.join(workdir, "program.py"), encoding="utf-8") as file:
        program = file.read()
    units = None
    if config["mode"] == "tests":
        with open(os.path.join(workdir, "units.json"), encoding="utf-8") as file:
            units = json.load(file)
    for name in ("program.py", "units.json"):  # gone before the program runs: it must not read its own tests
        if os.path.exists(os.path.join(workdir, name)):
            os.remove(os.path.join(workdir, name))
    nonce = os.read(config["nonce_fd"], 64).decode()
    os.close(config["nonce_fd"])
    home = workdir
    if config["mount"]:
        _expose(config["expose"], os.path.join(workdir, ".stage"))
        for target in ("/var/tmp", "/dev/shm", "/tmp"):  # /tmp last: it hides the workdir's own path
            if os.path.isdir(target):
                _mount(workdir, target, flags=MS_BIND)
        home = "/tmp"
    os.chdir(home)
    os.environ.update(HOME=home, TMPDIR=home)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _guard(config, program, units, nonce)
    code = _exit_code(pid)
    if config["uid"] is not None and not config["pid_namespace"] and os.fork() == 0:
        # Without a pid namespace, processes that left the process group are found by their uid and killed.
        os.setuid(config["uid"])
        os.kill(-1, 9)
        os._exit(0)
    os._exit(code)


if __name__ == "__main__":
    main()
