"""The quick start as a new user meets it: the drop-in swap with no `args`, as TRL's own `test_init_minimal` builds
`GRPOTrainer`, constructs and trains."""

import os
import subprocess
import sys
from pathlib import Path

import torch
from datasets import Dataset

from ts_trl import SeedGRPOTrainer
from ts_trl.analysis.common import run_command
from ts_trl.tiny import build_tiny_model, build_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def _saved_tiny_model(folder):
    """A model folder, as TRL's test names a Hub model: the swap is then the only change to `test_init_minimal`."""
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, max_positions=1024)  # room for GRPOConfig's default max_completion_length
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _odd_length(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def test_init_minimal_with_the_swap_constructs_and_trains(tmp_path, monkeypatch):
    """`SeedGRPOTrainer(model=..., reward_funcs=..., train_dataset=...)`: no args, so no refusal of settings nobody
    chose (the default run cannot seed: its first shard comes after the run ends), GRPOTrainer's defaults otherwise."""
    monkeypatch.chdir(tmp_path)  # the default output_dir is relative, as TRL's is
    model = _saved_tiny_model(tmp_path / "tiny")
    dataset = Dataset.from_dict({"prompt": ["Q: 1+2=", "Q: 3+4="]})
    trainer = SeedGRPOTrainer(model=model, reward_funcs=_odd_length, train_dataset=dataset)
    assert trainer.args.output_dir.endswith("tiny-ThinkingSeeds")
    assert trainer.args.seed_method == "seeds"  # the method stays on; only the refusal became a warning
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step > 0 and "train_loss" in trainer.state.log_history[-1]
    assert any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())


def _threads_under_accelerate(tmp_path, omp: str | None) -> str:
    script = tmp_path / "threads.py"
    script.write_text(
        "from ts_trl.embedded.cpu import embedded_training_threads\nprint(embedded_training_threads())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    config = ROOT / "accelerate_configs" / "cpu.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), str(script)],
        capture_output=True, text=True, env=env, timeout=300, check=True,
    )  # fmt: skip
    return result.stdout.strip().splitlines()[-1]


def test_the_readme_accelerate_command_trains_the_embedded_default_on_one_thread(tmp_path):
    """accelerate sets OMP_NUM_THREADS for its CPU workers by itself; only the user's own setting is followed."""
    assert _threads_under_accelerate(tmp_path, None) == "1"
    assert _threads_under_accelerate(tmp_path, "2") == "None"  # the user's: torch follows OMP_NUM_THREADS


def test_analysis_commands_run_on_one_thread(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = []
    torch.set_num_threads(2)
    assert run_command(lambda argv: seen.append(torch.get_num_threads())) == 0
    assert seen == [1] and torch.get_num_threads() == 2  # put back afterwards
