"""Hostile programs get reward 0 in bounded time and leave the host as it was; each names the layer that stops it."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from ts_trl.rewards import get_code_reward
from ts_trl.rewards.code import split_test_units
from ts_trl.rewards.sandbox import Limits, detect_isolation, run_in_sandbox

TIMEOUT = 4.0  # seconds: long enough for two sandboxes at once on a loaded 2-core machine, short enough for the suite
ADD_TESTS = "assert add(1, 2) == 3\nassert add(2, 2) == 4"
CORRECT_ADD = "def add(a, b):\n    return a + b\n"

reward = get_code_reward(timeout=TIMEOUT, memory_mb=256, max_processes=16)


def _layers() -> list[str]:
    return detect_isolation().layers


def _need(*layers):
    """Skips when none of `layers` is active here: without them the attack would reach the host for real."""
    active = " ".join(_layers())
    if not any(layer in active for layer in layers):
        pytest.skip(f"needs one of {layers}; active layers here: {_layers()}")


def _run(program: str, tests: str = ADD_TESTS):
    started = time.monotonic()
    score = reward([f"```python\n{program}\n```"], [tests])[0]
    return score, time.monotonic() - started


def _evidence(program: str, tests: str = ADD_TESTS):
    return run_in_sandbox(
        detect_isolation(), program, split_test_units(tests), limits=Limits(timeout=TIMEOUT, memory_mb=256)
    )


def test_layers_are_reported():
    assert {"rlimits", "scrubbed-env", "timeout+killpg", "output-cap", "judge"} <= set(_layers())


def test_infinite_loop_times_out():
    score, wall = _run("def add(a, b):\n    while True:\n        pass\n")
    assert score == 0.0 and wall < TIMEOUT + 3


def test_fork_bomb_is_capped_by_nproc():
    # Under real root without a throwaway uid RLIMIT_NPROC does not apply, and a fork bomb would hit the host.
    if os.geteuid() == 0:
        _need("throwaway-uid")
    program = "import os\nwhile True:\n    os.fork()\n" + CORRECT_ADD
    result = _evidence(program)
    assert "BlockingIOError" in result.stderr or result.timed_out
    score, wall = _run(program)
    assert score == 0.0 and wall < TIMEOUT + 3
    assert not _sandbox_processes(), "forked processes outlived the run"


def _sandbox_processes() -> list[str]:
    from ts_trl.rewards.sandbox import _UID_BASE

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if _UID_BASE <= os.stat(f"/proc/{pid}").st_uid < _UID_BASE + 64:
                found.append(pid)
        except FileNotFoundError:
            pass
    return found


def test_memory_hog_hits_rlimit_as():
    program = "hog = bytearray(4 << 30)\n" + CORRECT_ADD
    assert "MemoryError" in _evidence(program).stderr
    assert _run(program)[0] == 0.0


def test_huge_stdout_is_cut():
    program = "while True:\n    print('x' * 65536)\n" + CORRECT_ADD
    result = _evidence(program)
    assert result.output_overflow and len(result.stdout) <= Limits().max_output_bytes
    score, wall = _run(program)
    assert score == 0.0 and wall < TIMEOUT + 3


def test_network_is_unreachable():
    _need("netns")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'x')\n"
        assert "Network is unreachable" in _evidence(program + CORRECT_ADD).stderr
        assert _run(program + CORRECT_ADD)[0] == 0.0
        with pytest.raises(TimeoutError):
            listener.accept()


def test_parent_environment_is_invisible(monkeypatch):
    monkeypatch.setenv("TS_TRL_FAKE_SECRET", "hunter2")
    program = (
        "import glob, os\n"
        "found = os.environ.get('TS_TRL_FAKE_SECRET')\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        found = found or ('hunter2' if b'TS_TRL_FAKE_SECRET=' in open(path, 'rb').read() else None)\n"
        "    except OSError:\n"
        "        pass\n"
        "assert found == 'hunter2'\n" + CORRECT_ADD
    )
    assert _run(program)[0] == 0.0


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGSTOP"])
def test_killing_or_stopping_the_judge_fails_the_run(signal_name):
    _need("pidns")  # the program signals every low pid: only in a pid namespace are those the run's own
    program = (
        "import os, signal\nfor pid in range(1, 64):\n    if pid != os.getpid():\n        try:\n"
        f"            os.kill(pid, signal.{signal_name})\n        except OSError:\n            pass\n" + CORRECT_ADD
    )
    result = _evidence(program)
    assert result.returncode != 0 and not result.ok and result.passed_units is None
    assert _run(program)[0] == 0.0  # and this test process is still here to say so


@pytest.mark.parametrize(
    "program",
    [
        "import sys\nsys.exit(0)\n",
        "import os\nos._exit(0)\n",
        "def add(a, b):\n    raise SystemExit(0)\n",
        "def add(a, b):\n    import os\n    os._exit(0)\n",
        # Fake verdicts and patched builtins: neither reaches the judge, which runs in another interpreter.
        "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n"
        "print('0' * 32 + ' [0, 1]')\nprint('\\n[0, 1]')\ndef add(a, b):\n    return 0\n",
        "import builtins, os\nprint('0' * 32 + ' [0, 1]', flush=True)\nos._exit(0)\n",
    ],
    ids=["sys.exit", "os._exit", "exit-in-test", "os._exit-in-test", "patched-builtins", "fake-verdict"],
)
def test_early_exit_and_fake_verdicts_do_not_pass(program):
    assert _run(program)[0] == 0.0


def test_program_cannot_read_its_tests():
    program = "import os\nassert not [f for f in os.listdir('.') if f.endswith(('.py', '.json'))], os.listdir('.')\n"
    assert _run(program + CORRECT_ADD)[0] == 1.0


def test_stdio_program_that_hangs_costs_one_timeout_not_one_per_case():
    cases = '{"inputs": ["1\\n", "2\\n", "3\\n"], "outputs": ["1", "2", "3"]}'
    started = time.monotonic()
    assert reward(["```python\nwhile True:\n    pass\n```"], [cases]) == [0.0]
    assert time.monotonic() - started < 2 * TIMEOUT


# ---------------------------------------------------------------- verdict integrity
# Each program's honest answer is wrong (or missing), so it scores 1 only by faking the verdict.
WRONG_ADD = "def add(a, b):\n    return -1\n"
FIND_UNITS = (
    "import gc\n"
    "units = [obj for obj in gc.get_objects() if type(obj) is list and obj\n"
    "         and all(type(u) is list and len(u) == 2 and type(u[0]) is str for u in obj)]\n"
)
VERDICT_ATTACKS = {
    "always-equal": "class Yes:\n    def __eq__(self, other):\n        return True\n\n"
    "def add(a, b):\n    return Yes()\n",
    "int-subclass-eq": "class Int(int):\n    __hash__ = int.__hash__\n\n    def __eq__(self, other):\n        return True\n\n"
    "def add(a, b):\n    return Int(-1)\n",
    "str-subclass-eq": "class Str(str):\n    __hash__ = str.__hash__\n\n    def __eq__(self, other):\n        return True\n\n"
    "def add(a, b):\n    return Str('no')\n",
    "list-subclass-eq": "class List(list):\n    def __eq__(self, other):\n        return True\n\n"
    "def add(a, b):\n    return List()\n",
    # The harness's frames: a verdict descriptor and a nonce in its locals, as on the old single-interpreter harness.
    "frame-walk": "import os, sys\n\ndef add(a, b):\n    frame = sys._getframe()\n    while frame is not None:\n"
    "        found = frame.f_locals\n        if 'verdict_fd' in found and 'nonce' in found:\n"
    "            os.write(found['verdict_fd'], f\"\\n{found['nonce']} [0, 1]\\n\".encode())\n            os._exit(0)\n"
    "        if 'passed' in found and type(found['passed']) is list:\n            found['passed'][:] = [0, 1]\n"
    "        frame = frame.f_back\n    return -1\n",
    "gc-rewrites-tests": FIND_UNITS
    + "for unit in [u for found in units for u in found]:\n    unit[0] = 'pass'\n"
    + WRONG_ADD,
    "patched-compile": "import builtins\nreal = builtins.compile\n"
    "builtins.compile = lambda source, *args, **kwargs: real('pass', *args, **kwargs)\n" + WRONG_ADD,
    "patched-json": "import json, sys\njson.dumps = lambda *args, **kwargs: '[0, 1]'\n"
    "sys.modules['json'] = type(sys)('json')\nsys.modules['json'].dumps = json.dumps\n" + WRONG_ADD,
    "patched-os": "import os\nreal = os.write\n"
    "os.write = lambda fd, data: real(fd, data.replace(b'[]', b'[0, 1]'))\n" + WRONG_ADD,
    "closed-fds": "import os\nfor fd in range(3, 1024):\n    try:\n        os.close(fd)\n    except OSError:\n"
    "        pass\n" + WRONG_ADD,
    "duplicated-fds": "import os, struct\nfor fd in range(3, 64):\n    try:\n        os.dup2(1, fd)\n"
    "    except OSError:\n        pass\n" + WRONG_ADD,
    "exit-1": "import os\nos._exit(1)\n",
    "exit-3-after-one-call": "import os\ncalls = []\n\ndef add(a, b):\n    calls.append(1)\n"
    "    if len(calls) > 1:\n        os._exit(3)\n    return a + b\n",
    "sigkill-self": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "verdict-lookalikes": "import os, struct, sys\nfor line in ('[0, 1]', '0' * 32 + ' [0, 1]', 'PASSED 2/2'):\n"
    "    print(line)\n    print(line, file=sys.stderr)\n"
    "frame = struct.pack('<I', 6) + b'[0, 1]'\nfor fd in range(1, 64):\n    try:\n        os.write(fd, frame)\n"
    "    except OSError:\n        pass\n" + WRONG_ADD,
    "ctypes-rewrites-tests": FIND_UNITS + "import ctypes, sys\nfor unit in [u for found in units for u in found]:\n"
    "    text = unit[0]\n    if text.isascii() and len(text) >= 4:\n"
    "        start = id(text) + sys.getsizeof(text) - len(text) - 1\n"
    "        ctypes.memmove(start, b'pass' + b' ' * (len(text) - 4), len(text))\n" + WRONG_ADD,
    # Tracing the judge (its parent) would let the program write into it; a correct add only if the kernel allowed it.
    "ptrace-the-judge": "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "seized = libc.ptrace(0x4206, os.getppid(), 0, 0) == 0\n\ndef add(a, b):\n    return a + b if seized else -1\n",
}


@pytest.mark.parametrize("program", VERDICT_ATTACKS.values(), ids=VERDICT_ATTACKS.keys())
def test_verdict_attacks_score_zero(program):
    assert _run(program)[0] == 0.0


def test_program_cannot_shadow_the_builtins_the_tests_call():
    program = "def all(values):\n    return True\n\ndef abs(value):\n    return 0\n\n" + WRONG_ADD
    tests = "assert all(add(a, b) == a + b for a, b in [(1, 2), (2, 2)])\nassert abs(add(0.1, 0.2) - 0.3) < 1e-9"
    assert _run(program, tests)[0] == 0.0
    assert _run(CORRECT_ADD, tests)[0] == 1.0


def test_objects_the_program_built_fail_clearly():
    result = _evidence(
        "class Yes:\n    def __eq__(self, other):\n        return True\n\ndef add(a, b):\n    return Yes()\n"
    )
    assert result.passed_units == [] and "a Yes cannot cross the sandbox boundary" in result.stderr


def test_plain_data_and_exceptions_cross_the_boundary():
    program = (
        "import math\nLIMIT = {'n': (1, 2.5, None, True)}\n\n"
        "def echo(*args, **kwargs):\n    return [args, kwargs, {1, 2}, frozenset({b'x'}), {(1, 'a'): [b'\\x00\\xff']}]\n\n"
        "def root(x):\n    if x < 0:\n        raise ValueError('negative')\n    return math.sqrt(x)\n"
    )
    tests = (
        "assert echo(1, 'a', k=[2]) == [(1, 'a'), {'k': [2]}, {1, 2}, frozenset({b'x'}), {(1, 'a'): [b'\\x00\\xff']}]\n"
        "assert LIMIT == {'n': (1, 2.5, None, True)}\n"
        "assert math.isclose(root(2), 1.41421356, rel_tol=1e-6)\n"
        "try:\n    root(-1)\n    raise AssertionError('no error')\nexcept ValueError as error:\n"
        "    assert str(error) == 'negative'"
    )
    assert _run(program, tests)[0] == 1.0


# ---------------------------------------------------------------- files
CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def host_files():
    """A private file in the home (mode 600) and a world-readable one in a world-readable folder, outside the run."""
    tag = uuid.uuid4().hex[:12]
    private = Path.home() / f".ts_trl_sandbox_secret_{tag}"
    private.write_text("secret")
    private.chmod(0o600)
    public_dir = Path(tempfile.mkdtemp(prefix="ts_trl_public_"))
    public_dir.chmod(0o755)
    public = public_dir / "answers.txt"
    public.write_text("answers")
    public.chmod(0o644)
    yield {"home-private": private, "world-readable": public, "checkout": CHECKOUT / "README.md"}
    private.unlink()
    shutil.rmtree(public_dir)


@pytest.mark.parametrize("which", ["home-private", "world-readable", "checkout"])
def test_program_cannot_read_host_files(host_files, which):
    _need("fs-view")
    path = host_files[which]
    assert path.read_bytes()  # this process can read it
    program = f"data = open({str(path)!r}, 'rb').read()\n" + CORRECT_ADD  # add exists only if the read worked
    assert _run(program)[0] == 0.0
    assert "FileNotFoundError" in _evidence(program).stderr


def test_program_reads_and_writes_its_own_folder():
    program = "open('own.txt', 'w').write('mine')\nassert open('own.txt').read() == 'mine'\n" + CORRECT_ADD
    assert _run(program)[0] == 1.0  # the same pattern as the attacks scores 1 where access is allowed


@pytest.mark.parametrize("where", ["home", "checkout"])
def test_program_cannot_write_into_home_or_checkout(where):
    _need("fs-view")
    target = (Path.home() if where == "home" else CHECKOUT) / f"ts_trl_pwned_{uuid.uuid4().hex[:12]}"
    program = f"open({str(target)!r}, 'w').write('pwned')\n" + CORRECT_ADD
    try:
        score = _run(program)[0]
        assert not target.exists()  # nothing reached the host
        if not str(target).startswith("/tmp/"):  # under /tmp the path is in the program's own private /tmp instead
            assert score == 0.0
    finally:
        target.unlink(missing_ok=True)


def test_program_sees_a_minimal_root():
    _need("fs-view")
    program = (
        "import os\nfound = {path: os.path.exists(path) for path in ('/proc/1', '/etc/passwd', '/root/.ssh', '/home')}\n"
        "def add(a, b):\n    return a + b if not any(found.values()) else -1\n"
    )
    assert _run(program)[0] == 1.0


# ---------------------------------------------------------------- as an unprivileged user
UNPRIVILEGED_USER = "tstrl-sandbox"


def _private_ancestor(path: str) -> str | None:
    """The topmost folder above `path` that other users cannot enter (e.g. /root, mode 700), or None."""
    current = "/"
    for part in Path(path).parts[1:]:
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & 0o001:
            return current
    return None


def _reach_script(paths: list[str], staging: str) -> str:
    """Shell lines, run as root in a private mount namespace, that leave `paths` reachable for another user: each
    private ancestor is covered by an empty tmpfs and the path alone is mounted back."""
    moves = [(ancestor, path) for path in paths if (ancestor := _private_ancestor(path))]
    lines = [f"mkdir -p {staging}/{i} && mount --bind {path} {staging}/{i}" for i, (_, path) in enumerate(moves)]
    lines += [f"mount -t tmpfs -o mode=0755 tmpfs {ancestor}" for ancestor in sorted({a for a, _ in moves})]
    lines += [f"mkdir -p {path} && mount --move {staging}/{i} {path}" for i, (_, path) in enumerate(moves)]
    return "\n".join(lines)


def test_everything_above_again_as_an_unprivileged_user():
    """CI runs as root: this reruns the sandbox and code-reward tests as an ordinary user, whose inner sandbox is a user
    namespace, with the user's own home holding the private file."""
    if os.geteuid() != 0:
        pytest.skip("already unprivileged: the tests above ran as this user")
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("cannot run as another user: `useradd` (passwd) and `setpriv` (util-linux) are needed as root")
    if subprocess.run(["id", "-u", UNPRIVILEGED_USER], capture_output=True).returncode != 0:
        created = subprocess.run(["useradd", "--create-home", UNPRIVILEGED_USER], capture_output=True, text=True)
        if created.returncode != 0:
            pytest.skip(f"cannot create user {UNPRIVILEGED_USER!r}: {created.stderr.strip()}")
    uid = int(subprocess.check_output(["id", "-u", UNPRIVILEGED_USER]))
    gid = int(subprocess.check_output(["id", "-g", UNPRIVILEGED_USER]))
    home = Path(os.path.expanduser(f"~{UNPRIVILEGED_USER}"))
    home.mkdir(mode=0o700, exist_ok=True)
    os.chown(home, uid, gid)
    scratch = Path(tempfile.mkdtemp(prefix="ts_trl_as_user_"))  # not under pytest's folder, which is private to root
    os.chown(scratch, uid, gid)
    needed = sorted({os.path.realpath(path) for path in (sys.base_prefix, sys.prefix, CHECKOUT)})
    needed = [path for path in needed if not any(path.startswith(other + "/") for other in needed)]
    stage = tempfile.mkdtemp(prefix="ts_trl_stage_")
    script = _reach_script(needed, stage)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PYTHONPATH": str(CHECKOUT),
           "HF_HUB_OFFLINE": "1", "LANG": "C.UTF-8"}  # fmt: skip
    pytest_args = [
        sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--basetemp={scratch / 'pytest'}",
        str(CHECKOUT / "tests" / "rewards" / "test_sandbox.py"), str(CHECKOUT / "tests" / "rewards" / "test_rewards.py"),
        str(CHECKOUT / "tests" / "rewards" / "test_sandbox_attacks.py"),
        "-k", "(code or sandbox) and not humaneval",  # HumanEval's 328 runs once, as root, keep the suite short
    ]  # fmt: skip
    as_user = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *pytest_args]
    command = as_user
    if script:
        if shutil.which("unshare") is None:
            pytest.skip(f"{needed} are not reachable by another user and `unshare` is missing to expose them")
        command = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-ec",
            script + '\nexec "$@"',
            "sh",
            *as_user,
        ]
    try:
        done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(stage, ignore_errors=True)
    report = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    expected = ("already unprivileged", "only the rerun in a venv under /tmp claims a layout")
    assert all(any(why in line for why in expected) for line in skipped), report
    assert " passed" in done.stdout, report


# ---------------------------------------------------------------- the judge runs nothing the program can name or write
TCL_FORGERY = r'''import os, sys, types
# The judge used to import, by name, a stdlib module the program exposed: tkinter's __main__ starts Tcl, which looks
# for init.tcl next to the interpreter, one entry of its search path being in the program's own writable /tmp. This
# init.tcl hands every inherited descriptor a verdict saying "all passed", then exits 0 through a child interpreter,
# whose start runs init.tcl again and which, unlike tkinter's, still has the `exit` command.
script = """if {{[llength [info commands exit]]}} {{exit 0}}
catch {{exec {python} -c {{import os, struct
frame = struct.pack('<I', 6) + b'[0, 1]'
for fd in range(3, 256):
    try:
        os.set_blocking(fd, False)
        os.write(fd, frame)
    except OSError:
        pass}} 2>/dev/null}}
interp create
""".format(python=os.path.join(sys.base_prefix, "bin", "python3"))
for folder in ("/tmp/lib/tcl8.6", os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "lib", "tcl8.6")):
    try:
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, "init.tcl"), "w").write(script)
    except OSError:
        pass
gui = types.ModuleType("tkinter.__main__")

def add(a, b):
    return -1
'''


def test_judge_imports_nothing_the_program_names_tcl_forgery(tmp_path_factory):
    """The forged-verdict attack end to end, with the interpreter under /tmp as a virtual environment in /tmp has it (Tcl
    then searches /tmp/lib/tcl8.6): a wrong `add` must score 0 in both the assert and the check(fn) layouts."""
    pytest.importorskip("tkinter")
    folder = Path(tempfile.mkdtemp(prefix="ts_trl_tcl_", dir="/tmp"))
    try:
        (folder / "bin").mkdir()
        (folder / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
        check_layout = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n"
        script = (
            "import json, sys\nfrom ts_trl.rewards import get_code_reward\n"
            f"reward = get_code_reward(timeout={TIMEOUT}, memory_mb=256)\n"
            f"program = '```python\\n' + {TCL_FORGERY!r} + '```'\n"
            f"print(json.dumps(reward([program, program], [{ADD_TESTS!r}, {check_layout!r}], ['add', 'add'])))\n"
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CHECKOUT), *sys.path[1:]])}
        done = subprocess.run(
            [str(folder / "bin" / "python"), "-c", script], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.splitlines()[-1]) == [0.0, 0.0]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_program_cannot_read_the_descriptor_numbers():
    """The worker is a fresh interpreter: its argv and memory hold no configuration naming the judge's descriptors."""
    program = (
        "import sys, gc\nseen = ' '.join(sys.argv) + ' '.join(str(o) for o in gc.get_objects() if type(o) is str)\n"
        "def add(a, b):\n    return a + b if 'verdict_fd' in seen or 'units_fd' in seen else -1\n"
    )
    assert _run(program)[0] == 0.0


def test_program_has_only_its_own_descriptors():
    program = (
        "import os\nopen_fds = []\nfor fd in range(3, 1024):\n    try:\n        os.fstat(fd)\n"
        "        open_fds.append(fd)\n    except OSError:\n        pass\n"
        "def add(a, b):\n    return a + b if open_fds == [3, 4] else -1\n"
    )
    assert _run(program)[0] == 1.0


def test_judge_home_cwd_and_tmp_are_not_the_programs():
    program = "import os\nfor name in ('planted', '/tmp/planted'):\n    open(name, 'w').write('x')\n" + CORRECT_ADD
    # The judge's /tmp is its own even when the runtime lives under /tmp (tests/rewards/test_sandbox_attacks.py reruns there).
    folders = "os.getcwd(), os.path.expanduser('~'), tempfile.gettempdir(), '/tmp'"
    tests = (
        ADD_TESTS + "\nimport os, tempfile\nassert not any(os.path.exists(os.path.join(folder, 'planted')) for folder "
        f"in ({folders}))"
    )
    _need("fs-view")
    assert _run(program, tests)[0] == 1.0


# ---------------------------------------------------------------- kernel objects do not outlive a run or connect runs
SECRET = "ts-trl-" + uuid.uuid4().hex[:8]
IPC_KEY = 0x10000 + uuid.uuid4().int % 0x7FFF0000  # fresh per session: a leftover of an earlier run cannot interfere
KEYCTL = (
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "NR = {'x86_64': (248, 250), 'aarch64': (217, 219)}[os.uname().machine]\n"
    "def add_key(description, data, keyring):\n"
    "    return libc.syscall(NR[0], b'user', description.encode(), data.encode(), len(data), keyring)\n"
    "def read_key(description, keyring):\n"
    "    key = libc.syscall(NR[1], 10, keyring, b'user', description.encode(), 0)\n"
    "    buffer = ctypes.create_string_buffer(256)\n"
    "    size = libc.syscall(NR[1], 11, key, buffer, 256) if key > 0 else -1\n"
    "    return buffer.raw[:size].decode() if size > 0 else None\n"
)
# Each channel: code that leaves SECRET behind, and code that sets `found` to what it can read back.
CHANNELS = {
    "sysv-shm": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
        "shm = libc.shmget(" + str(IPC_KEY + 0) + ", 8 << 20, 0o1666)\naddress = libc.shmat(shm, None, 0)\n"
        "ctypes.memmove(address, SECRET.encode(), len(SECRET))\n",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
        "shm = libc.shmget(" + str(IPC_KEY + 0) + ", 0, 0)\naddress = libc.shmat(shm, None, 0) if shm >= 0 else None\n"
        "found = ctypes.string_at(address, len(SECRET)).decode() if address not in (None, 2**64 - 1) else None\n",
    ),
    "sysv-msg": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nqueue = libc.msgget("
        + str(IPC_KEY + 1)
        + ", 0o1666)\n"
        "message = ctypes.create_string_buffer(b'\\x01\\0\\0\\0\\0\\0\\0\\0' + SECRET.encode())\n"
        "libc.msgsnd(queue, message, len(SECRET), 0x800)\n",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nqueue = libc.msgget(" + str(IPC_KEY + 1) + ", 0)\n"
        "message = ctypes.create_string_buffer(64)\n"
        "size = libc.msgrcv(queue, message, 56, 0, 0x800) if queue >= 0 else -1\n"
        "found = message.raw[8 : 8 + size].decode() if size > 0 else None\n",
    ),
    "sysv-sem": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nsem = libc.semget("
        + str(IPC_KEY + 2)
        + ", 1, 0o1666)\n"
        "libc.semctl(sem, 0, 16, 4242)\n",  # SETVAL
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nsem = libc.semget(" + str(IPC_KEY + 2) + ", 1, 0)\n"
        "found = SECRET if sem >= 0 and libc.semctl(sem, 0, 12) == 4242 else None\n",  # GETVAL
    ),
    "posix-mqueue": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "queue = libc.mq_open(b'/' + SECRET.encode(), 0o1 | 0o100 | 0o4000, 0o666, None)\n"
        "libc.mq_send(queue, SECRET.encode(), len(SECRET), 0)\n",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nqueue = libc.mq_open(b'/' + SECRET.encode(), 0o4000)\n"
        "message = ctypes.create_string_buffer(8192)\n"
        "size = libc.mq_receive(queue, message, 8192, None) if queue >= 0 else -1\n"
        "found = message.raw[:size].decode() if size > 0 else None\n",
    ),
    "posix-shm": (
        "from multiprocessing import shared_memory\nmemory = shared_memory.SharedMemory(SECRET, True, 64)\n"
        "memory.buf[: len(SECRET)] = SECRET.encode()\nmemory._mmap = None\n",
        "from multiprocessing import shared_memory\nmemory = shared_memory.SharedMemory(SECRET)\n"
        "found = bytes(memory.buf[: len(SECRET)]).decode()\n",
    ),
    "session-keyring": (
        KEYCTL + "add_key('ts_trl_left', SECRET, -3)\n",
        KEYCTL + "found = read_key('ts_trl_left', -3)\n",
    ),
    "user-keyring": (
        KEYCTL + "add_key('ts_trl_left', SECRET, -4)\n",
        KEYCTL + "found = read_key('ts_trl_left', -4)\n",
    ),
}


def _reads(code: str) -> str:
    """A program that scores 1 exactly when `code` reads SECRET back."""
    body = "\n".join("    " + line for line in code.splitlines())
    return (
        f"SECRET = {SECRET!r}\nfound = None\ntry:\n{body}\nexcept Exception:\n    pass\n\n"
        "def add(a, b):\n    return a + b if found == SECRET else -1\n"
    )


def _leaves(code: str) -> str:
    body = "\n".join("    " + line for line in code.splitlines())
    return f"SECRET = {SECRET!r}\ntry:\n{body}\nexcept Exception:\n    pass\n" + CORRECT_ADD


@pytest.mark.parametrize("channel", CHANNELS)
def test_kernel_objects_do_not_connect_runs(channel):
    """What one sample leaves in SysV/POSIX IPC objects or keyrings is gone for the next: a program that never computes
    the answer cannot learn it from earlier samples (the reader scores 1 only if it reads the writer's secret)."""
    leave, read = CHANNELS[channel]
    ipc_before = Path("/proc/sysvipc/shm").read_text().count("\n") if Path("/proc/sysvipc/shm").exists() else None
    _run(_leaves(leave))
    assert _run(_reads(read))[0] == 0.0
    if ipc_before is not None and channel == "sysv-shm":
        assert Path("/proc/sysvipc/shm").read_text().count("\n") == ipc_before, "a segment outlived the run"


def test_program_cannot_read_the_trainers_session_keyring():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    add_key = {"x86_64": 248, "aarch64": 217}.get(os.uname().machine)
    if add_key is None:
        pytest.skip("add_key's number is known here for x86_64 and aarch64 only")
    key = libc.syscall(add_key, b"user", b"ts_trl_trainer", SECRET.encode(), len(SECRET), -3)
    if key < 0:
        pytest.skip(f"this process cannot add a key to its session keyring (errno {ctypes.get_errno()})")
    assert _run(_reads(KEYCTL + "found = read_key('ts_trl_trainer', -3)\n"))[0] == 0.0


# ---------------------------------------------------------------- runs of one batch, at the same time
def _concurrently(signaller: str, listener: str) -> float:
    """Runs both programs in one batch, two sandboxes at once; returns the listener's score."""
    concurrent = get_code_reward(timeout=TIMEOUT, memory_mb=256, max_processes=16, max_workers=2)
    programs = [f"```python\n{program}\n```" for program in (signaller, listener)]
    return concurrent(programs, [ADD_TESTS] * 2)[1]


@pytest.mark.parametrize(
    "signal_code, listen_code",
    [
        (  # an exclusive lock on a runtime file that every run sees (read-only, but flock needs no write access)
            "import fcntl, os, time\nlock = open(os.__file__)\nfcntl.flock(lock, fcntl.LOCK_EX)\ntime.sleep(2.5)\n",
            "import fcntl, os, time\nlock = open(os.__file__)\nfound = False\nfor _ in range(50):\n"
            "    try:\n        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)\n        fcntl.flock(lock, fcntl.LOCK_UN)\n"
            "    except BlockingIOError:\n        found = True\n        break\n    except OSError:\n        break\n"
            "    time.sleep(0.05)\n",
        ),
        (  # inotify on a runtime file that only the other run opens
            "import time, this\nend = time.time() + 2.5\nwhile time.time() < end:\n"
            "    open(this.__file__).close()\n    time.sleep(0.01)\n",
            "import ctypes, os, select, sysconfig\nlibc = ctypes.CDLL(None, use_errno=True)\nfound = False\n"
            "watch = libc.inotify_init1(0)\npath = os.path.join(sysconfig.get_paths()['stdlib'], 'this.py').encode()\n"
            "if watch >= 0 and libc.inotify_add_watch(watch, path, 0x20) >= 0:\n"
            "    found = bool(select.select([watch], [], [], 2.5)[0])\n",
        ),
        (  # an abstract unix socket, which lives in the network namespace
            "import socket, time\nserver = socket.socket(socket.AF_UNIX)\nserver.bind('\\0ts_trl_abstract')\n"
            "server.listen(1)\ntime.sleep(2.5)\n",
            "import socket, time\nfound = False\nfor _ in range(50):\n    try:\n"
            "        socket.socket(socket.AF_UNIX).connect('\\0ts_trl_abstract')\n        found = True\n        break\n"
            "    except OSError:\n        time.sleep(0.05)\n",
        ),
    ],
    ids=["flock", "inotify", "abstract-socket"],
)
def test_concurrent_runs_cannot_signal_each_other(signal_code, listen_code):
    listener = "found = False\ntry:\n" + "\n".join("    " + line for line in listen_code.splitlines())
    listener += "\nexcept Exception:\n    pass\n\ndef add(a, b):\n    return a + b if found else -1\n"
    assert _concurrently(signal_code + CORRECT_ADD, listener) == 0.0


# ---------------------------------------------------------------- memory_mb holds for the whole run
def test_memory_limit_holds_across_forked_children():
    """6 children each holding 100 MB (each within RLIMIT_AS) must not get 600 MB under memory_mb=256."""
    program = (
        "import os\nheld = 0\nreaders = []\nfor _ in range(6):\n    r, w = os.pipe()\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        try:\n            block = bytearray(100 << 20)\n"
        "            block[::4096] = b'x' * len(block[::4096])\n            os.write(w, b'1')\n"
        "            os.read(os.open('/dev/zero', 0), 0)\n            import time\n            time.sleep(5)\n"
        "        finally:\n            os._exit(0)\n    os.close(w)\n    readers.append(r)\n"
        "held = sum(os.read(r, 1) == b'1' for r in readers)\n"
        "def add(a, b):\n    return a + b if held == 6 else -1\n"
    )
    assert reward([f"```python\n{program}\n```"], [ADD_TESTS]) == [0.0]


def test_memory_limit_counts_memfd_files():
    program = (
        "import os\nheld = 0\nfiles = []\nfor _ in range(20):\n    try:\n        fd = os.memfd_create('x')\n"
        "        os.write(fd, b'x' * (15 << 20))\n        files.append(fd)\n        held += 15\n    except OSError:\n"
        "        break\n"
        "def add(a, b):\n    return a + b if held >= 300 else -1\n"
    )
    small = get_code_reward(timeout=TIMEOUT, memory_mb=128, max_processes=16)
    assert small([f"```python\n{program}\n```"], [ADD_TESTS]) == [0.0]


def test_memory_limit_counts_the_programs_tmp():
    """150 MB in the process and 60 MB in its /tmp: each within a per-process and a tmpfs limit, over 192 MB in all."""
    program = (
        "ok = False\ntry:\n    block = bytearray(150 << 20)\n    block[::4096] = b'x' * len(block[::4096])\n"
        "    for part in range(4):  # 15 MB files, under the 16 MB file-size limit\n"
        "        with open(f'fill{part}', 'wb') as file:\n            file.write(b'x' * (15 << 20))\n"
        "    ok = True\nexcept Exception:\n    pass\n"
        "def add(a, b):\n    return a + b if ok else -1\n"
    )
    small = get_code_reward(timeout=TIMEOUT, memory_mb=192, max_processes=16)
    assert small([f"```python\n{program}\n```"], [ADD_TESTS]) == [0.0]


def test_memory_within_the_limit_still_works():
    program = "block = bytearray(100 << 20)\nblock[::4096] = b'x' * len(block[::4096])\n" + CORRECT_ADD
    assert reward([f"```python\n{program}\n```"], [ADD_TESTS]) == [1.0]


# ---------------------------------------------------------------- host time, and what the reward must survive
def test_stdio_cases_share_one_time_budget():
    """Six wrong cases that each end well within the timeout: one budget for the sample, not six."""
    budget = 3.0
    short = get_code_reward(timeout=budget, memory_mb=256)
    cases = json.dumps({"inputs": ["1\n"] * 6, "outputs": ["2"] * 6})
    started = time.monotonic()
    assert short(["```python\nimport time\ntime.sleep(1.0)\nprint(1)\n```"], [cases]) == [0.0]
    assert time.monotonic() - started < budget + 2.0


def test_long_run_of_backticks_is_parsed_in_linear_time():
    from ts_trl.rewards.code import extract_program

    text = "`" * 48_000
    started = time.monotonic()
    assert extract_program(text) == text
    assert extract_program("```python\nx = 1\n```\n" + text) == "x = 1\n"
    assert time.monotonic() - started < 0.5
    assert reward([text], [ADD_TESTS]) == [0.0]


def test_lone_surrogate_scores_that_sample_zero():
    completions = [f"```python\n{CORRECT_ADD}```", "```python\ndef add(a, b):\n    return a + b  # \ud800\n```"]
    assert reward(completions, [ADD_TESTS] * 2) == [1.0, 0.0]
