"""ZeRO-3 on two CPU processes does not compile DeepSpeed's shared-memory all-reduce op, which training never uses."""

import yaml

from tests.cli.test_cli import EMBEDDED_SMALL, ZERO3_CPU, _embedded_warm_cache, _launch
from tests.conftest import RANKS

pytestmark = RANKS  # tests/conftest.py: one launch at a time


def test_zero3_on_two_cpu_processes_trains_without_compiling_the_shm_op(tmp_path):
    cache = _embedded_warm_cache(tmp_path)
    extensions = tmp_path / "torch_extensions"  # empty: a build of the op would land here, after minutes of g++
    config = tmp_path / "zero3_cpu.yaml"
    config.write_text(yaml.safe_dump({**ZERO3_CPU, "num_processes": 2}))
    train = ["--output_dir", str(tmp_path / "run"), *EMBEDDED_SMALL, "--max_steps", "1", "--save_steps", "1"]
    result = _launch(
        tmp_path, ["--config_file", str(config)], train, timeout=600,
        DS_ACCELERATOR="cpu", TS_TRL_CACHE=str(cache), TORCH_EXTENSIONS_DIR=str(extensions),
    )  # fmt: skip
    assert "Training on 2 process(es), DeepSpeed: True" in result.stdout and "run finished" in result.stdout
    output = result.stdout + result.stderr
    assert "shm_comm" not in output and "built successfully" not in output, output[-3000:]
    assert not extensions.exists() or not any(extensions.rglob("*shm*"))
