"""Several CPU processes from Python: accelerate joins them only under `use_cpu`, and SeedGRPOTrainer says so rather
than let each rank train alone."""

import pytest
import yaml

from tests.cli.test_cli import ZERO3_CPU
from tests.conftest import RANKS
from tests.support.ranks import DDP, run_on_two_ranks

pytestmark = RANKS  # tests/conftest.py: one launch at a time


@pytest.fixture(params=["ddp", "zero3"])
def config(request, tmp_path):
    if request.param == "ddp":
        return DDP
    path = tmp_path / "zero3_cpu.yaml"
    path.write_text(yaml.safe_dump({**ZERO3_CPU, "num_processes": 2}))
    return path


def test_two_cpu_processes_without_use_cpu_are_refused_before_the_run_starts(config, tmp_path):
    output_dir = tmp_path / "run"
    result = run_on_two_ranks(
        "cpu_ranks.py", str(output_dir), "0", config=config, env={"DS_ACCELERATOR": "cpu"}, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "2 processes were launched (WORLD_SIZE=2), but this one trains alone" in output, output[-3000:]
    assert "set use_cpu=True" in output
    assert "world size 1" not in result.stdout  # refused in the constructor, before the rank printed or trained
    assert "in use by another run" not in output and "train_batch_size is not equal" not in output
    assert not (output_dir / "seeds").exists() and not list(output_dir.glob("checkpoint-*"))


def test_two_cpu_processes_with_use_cpu_train_together(config, tmp_path):
    result = run_on_two_ranks("cpu_ranks.py", str(tmp_path / "run"), "1", config=config, env={"DS_ACCELERATOR": "cpu"})
    assert "rank 0: world size 2" in result.stdout and "rank 1: world size 2" in result.stdout
    assert (tmp_path / "run" / "checkpoint-1").is_dir()
