"""Refusals under the README's launcher: `accelerate launch ... train.py` answers bad input with the worker's one
`prog: error: ...` line first and a non-zero exit status; what accelerate prints after it (its traceback of the
worker's exit) is accelerate's own convention. The package installs nothing into accelerate's launcher."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.conftest import RANKS

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE = str(Path(sys.executable).parent / "accelerate")  # the command, as the README runs it
CPU = ["--config_file", str(ROOT / "accelerate_configs" / "cpu.yaml")]
TWO_CPU_RANKS = ["--config_file", str(ROOT / "accelerate_configs" / "multi_gpu.yaml"), "--num_processes", "2"]
TWO_CPU_RANKS += ["--mixed_precision", "no"]


def _run(tmp_path, command: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "TS_TRL_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def _refusal(result, prog: str) -> str:
    """The refusal line, checked to be the first thing the launch printed on stderr but accelerate's own CPU notice
    (printed before the worker starts), once, with no traceback before it and a non-zero exit status."""
    lines = result.stderr.splitlines()
    errors = [i for i, line in enumerate(lines) if ": error: " in line]
    assert result.returncode != 0 and errors, result.stderr[-3000:]
    first = errors[0]
    assert lines[first].startswith(f"{prog}: error: "), result.stderr[-3000:]
    before = "\n".join(lines[:first])
    assert "Traceback" not in before, before
    assert sum(line.startswith(f"{prog}: error: ") for line in lines) == 1, result.stderr[-3000:]  # one rank says it
    return lines[first]


def _used_folder(tmp_path) -> Path:
    output_dir = tmp_path / "run"
    (output_dir / "checkpoint-3").mkdir(parents=True)
    return output_dir


def test_no_start_up_hook_is_installed():
    """Installing the package changes nothing outside it: no `.pth` file reaches into accelerate at start-up."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    hooks = [path.name for path in purelib.glob("*.pth") if "accelerate" in path.read_text()]
    assert not hooks, hooks


def test_the_readme_command_into_a_used_folder_refuses_first(tmp_path):
    """The quick start's command again, into the folder of an earlier run: the refusal's line comes first."""
    output_dir = _used_folder(tmp_path)
    result = _run(tmp_path, [ACCELERATE, "launch", *CPU, str(ROOT / "train.py"), "--output_dir", str(output_dir)])
    line = _refusal(result, "train.py")
    assert "--output_dir" in line and "--resume_from_checkpoint" in line


def test_the_module_form_refuses_first(tmp_path):
    """`python -m accelerate.commands.launch ... -m ts_trl train` (the module form of both)."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", *CPU]
    result = _run(tmp_path, [*launcher, "-m", "ts_trl", "train", "--seed_fraction", "2"])
    assert "seed_fraction must lie in [0, 1], got 2.0." in _refusal(result, "ts_trl train")


@RANKS
def test_two_processes_refuse_in_one_line(tmp_path):
    """Two ranks on one machine each find the problem; only local rank 0 prints it."""
    output_dir = _used_folder(tmp_path)
    script = [str(ROOT / "train.py"), "--use_cpu", "--output_dir", str(output_dir)]
    result = _run(tmp_path, [ACCELERATE, "launch", *TWO_CPU_RANKS, *script])
    assert _refusal(result, "train.py").startswith("train.py: error: --output_dir")
