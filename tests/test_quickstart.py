"""The quick start as a new user meets it: the drop-in swap with no `args`, as TRL's own `test_init_minimal` builds
`GRPOTrainer`, constructs and trains."""

import torch
from datasets import Dataset

from ts_trl import SeedGRPOTrainer
from ts_trl.tiny import build_tiny_model, build_tokenizer


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
