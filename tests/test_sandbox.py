"""Hostile programs get reward 0 in bounded time and leave the host as it was; each names the layer that stops it."""

import os
import socket
import time

import pytest

from ts_trl.rewards import get_code_reward
from ts_trl.rewards.code import split_test_units
from ts_trl.rewards.sandbox import Limits, detect_isolation, run_in_sandbox

TIMEOUT = 2.0  # seconds: long enough for a python start on a loaded 2-core machine, short enough for the suite
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
    assert {"rlimits", "scrubbed-env", "timeout+killpg", "output-cap", "nonce"} <= set(_layers())


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


def test_writing_outside_the_workdir_fails(tmp_path):
    _need("mountns", "throwaway-uid")
    target = tmp_path / "escaped.txt"
    program = f"open({str(target)!r}, 'w').write('pwned')\n" + CORRECT_ADD
    assert _run(program)[0] == 0.0
    assert not target.exists()


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


def test_killing_the_parent_fails_the_run():
    program = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + CORRECT_ADD
    result = _evidence(program)
    assert result.returncode != 0 and not result.ok
    assert _run(program)[0] == 0.0  # and this test process is still here to say so


@pytest.mark.parametrize(
    "program",
    [
        "import sys\nsys.exit(0)\n",
        "import os\nos._exit(0)\n",
        "def add(a, b):\n    raise SystemExit(0)\n",
        "def add(a, b):\n    import os\n    os._exit(0)\n",
        # Fake verdicts and patched builtins: the nonce is unknown, so neither reaches the harness's verdict.
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
