"""Refusals under the README's launcher: `accelerate launch ... train.py` answers bad input with the worker's one
line and exit status 2, without accelerate's traceback (ts_trl/cli/launcher_exit.py, installed as
`ts_trl_accelerate.pth`); any other failure keeps that traceback."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = str(Path(sys.executable).parent / "accelerate")  # the command, as the README runs it
CPU = ["--config_file", str(ROOT / "accelerate_configs" / "cpu.yaml")]
TWO_CPU_RANKS = ["--config_file", str(ROOT / "accelerate_configs" / "multi_gpu.yaml"), "--num_processes", "2"]
TWO_CPU_RANKS += ["--mixed_precision", "no"]


@pytest.fixture(autouse=True)
def _installed():
    pth = Path(sysconfig.get_paths()["purelib"], "ts_trl_accelerate.pth")
    assert pth.is_file(), f"{pth} is missing: install the package (pip install -e .) as the README says"


def _run(tmp_path, command: list[str], **env) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "TS_TRL_CACHE": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(ROOT),
        **env,
    }
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def _launch(tmp_path, launcher: list[str], script: list[str], **env) -> subprocess.CompletedProcess:
    return _run(tmp_path, [ACCELERATE, "launch", *launcher, *script], **env)


def _errors(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if ": error: " in line]


def _used_folder(tmp_path) -> Path:
    output_dir = tmp_path / "run"
    (output_dir / "checkpoint-3").mkdir(parents=True)
    return output_dir


def test_the_readme_command_into_a_used_folder_is_one_line_and_exit_2(tmp_path):
    """The issue's case: the quick start's command again, into the folder of an earlier run."""
    output_dir = _used_folder(tmp_path)
    result = _launch(tmp_path, CPU, [str(ROOT / "train.py"), "--output_dir", str(output_dir)])
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "CalledProcessError" not in result.stderr, result.stderr[-3000:]
    (line,) = _errors(result)
    assert line.startswith("train.py: error: --output_dir") and "--resume_from_checkpoint" in line
    assert result.stderr.rstrip().endswith(line)  # nothing after it


def test_the_module_form_and_an_early_refusal(tmp_path):
    """`python -m accelerate.commands.launch ... -m ts_trl train` (the module form of both), and a refusal made
    before TRL is imported."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", *CPU]
    result = _run(tmp_path, [*launcher, "-m", "ts_trl", "train", "--seed_fraction", "2"])
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = _errors(result)
    assert line.startswith("ts_trl train: error: ") and "seed_fraction" in line


def test_two_processes_refuse_in_one_line(tmp_path):
    """Two ranks on one machine: the first rank's line once (each rank finds it), no elastic summary, exit 2."""
    output_dir = _used_folder(tmp_path)
    result = _launch(tmp_path, TWO_CPU_RANKS, [str(ROOT / "train.py"), "--use_cpu", "--output_dir", str(output_dir)])
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr, result.stderr[-3000:]
    assert "exitcode" not in result.stderr, result.stderr[-3000:]
    (line,) = _errors(result)
    assert line.startswith("train.py: error: --output_dir")


def test_a_crash_keeps_the_launchers_traceback(tmp_path):
    """Only refusals lose the launcher's traceback: a worker that fails otherwise is accelerate's as before."""
    script = tmp_path / "crash.py"
    script.write_text("raise RuntimeError('a genuine crash')\n")
    result = _launch(tmp_path, CPU, [str(script)])
    assert result.returncode == 1 and "a genuine crash" in result.stderr
    assert "subprocess.CalledProcessError" in result.stderr, result.stderr[-3000:]


def test_a_crash_of_one_rank_keeps_the_traceback_and_torchs_notices(tmp_path):
    """Two ranks, one crashes: the launcher's `ChildFailedError` and torch's notices of the failure and of the rank it
    stopped, as without the package."""
    script = tmp_path / "crash.py"
    script.write_text(
        "import os, time\nif os.environ['RANK'] == '1':\n    raise RuntimeError('rank 1 crashed')\ntime.sleep(5)\n"
    )
    result = _launch(tmp_path, TWO_CPU_RANKS, [str(script)])
    assert result.returncode == 1 and "rank 1 crashed" in result.stderr, result.stderr[-3000:]
    assert "ChildFailedError" in result.stderr and "failed (exitcode: 1)" in result.stderr, result.stderr[-3000:]


def test_exit_2_without_a_refusal_line_keeps_the_traceback_and_the_switch_turns_it_off(tmp_path):
    script = tmp_path / "two.py"
    script.write_text("import sys\nprint('not a refusal', file=sys.stderr)\nsys.exit(2)\n")
    result = _launch(tmp_path, CPU, [str(script)])
    assert result.returncode == 1 and "subprocess.CalledProcessError" in result.stderr, result.stderr[-3000:]
    output_dir = _used_folder(tmp_path)
    train = [str(ROOT / "train.py"), "--output_dir", str(output_dir)]
    result = _launch(tmp_path, CPU, train, TS_TRL_ACCELERATE_EXIT="0")
    assert result.returncode == 1 and "subprocess.CalledProcessError" in result.stderr, result.stderr[-3000:]
