"""A support script on two CPU ranks, started as a user starts a training script: `accelerate launch`, two processes."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DDP = ROOT / "accelerate_configs" / "multi_gpu.yaml"  # two processes over gloo on a machine without GPUs


def run_on_two_ranks(
    script: str,
    *arguments: str,
    config: Path = DDP,
    env: dict | None = None,
    timeout: int = 600,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Runs tests/support/`script` with `arguments` on two ranks under the accelerate `config`, one torch thread each;
    with `check`, fails the calling test with the launch's last output when a rank fails. Mark the test
    `tests.conftest.RANKS`."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    environment.pop("ACCELERATE_USE_CPU", None)  # the config decides, not a variable an earlier launch left behind
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    command += [
        "--num_processes",
        "2",
        "--mixed_precision",
        "no",
        str(ROOT / "tests" / "support" / script),
        *arguments,
    ]
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout)
    assert not check or result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result
