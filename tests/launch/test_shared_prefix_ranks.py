"""The shared-prefix forward under `accelerate launch` on 2 CPU processes (DDP and ZeRO-3): the same losses as TRL's
row-by-row forward, and an exact resume with it on."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli.test_cli import ZERO3_CPU

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", ["ddp", "zero3"])
def test_two_processes_train_alike_with_and_without_sharing_and_resume_exactly(tmp_path, backend):
    if backend == "ddp":
        accelerate = ["--config_file", str(ROOT / "accelerate_configs" / "multi_gpu.yaml"), "--mixed_precision", "no"]
        extra = {}
    else:
        config = tmp_path / "zero3_cpu.yaml"
        config.write_text(yaml.safe_dump(ZERO3_CPU))
        accelerate, extra = ["--config_file", str(config)], {"DS_ACCELERATOR": "cpu"}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}
    env.pop("ACCELERATE_USE_CPU", None)
    launch = [sys.executable, "-m", "accelerate.commands.launch", *accelerate, "--num_processes", "2"]
    result = subprocess.run(
        [*launch, str(ROOT / "tests" / "support" / "shared_prefix_ranks.py"), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    runs = json.loads((tmp_path / "losses.json").read_text())
    on, off, resumed = runs["on"], runs["off"], runs["resumed"]
    assert len(on["loss"]) == 4 and max(on["seeds/seeded_group_share"]) > 0  # steps 3 and 4 draw seeds
    shares = on["shared_prefix/token_share"]
    assert len(shares) == 4 and all(share < 1.0 for share in shares)  # every loss forward packed
    assert not off["shared_prefix/token_share"]
    for key in ("loss", "grad_norm", "seeds/seeded_group_share"):
        assert on[key] == pytest.approx(off[key], rel=1e-4, abs=1e-6), key
    # the resumed run's history: steps 1 and 2 from the checkpoint, then steps 3 and 4 trained again
    assert len(resumed["loss"]) == 4
    for key in ("loss", "grad_norm", "shared_prefix/token_share", "seeds/seeded_group_share"):
        assert resumed[key][2:] == pytest.approx(on[key][2:], rel=1e-5, abs=1e-7), key
