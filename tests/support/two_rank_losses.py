"""Trains "action" and "replay" seeding on two prompts where only one has seeds, and writes each step's loss as JSON.

Run under `accelerate launch --num_processes 2` (one prompt group per rank, so exactly one rank is seeded) and
in-process with one rank holding the whole global batch: the losses must agree. Generation is replaced by a
deterministic stand-in keyed by the row's spliced prompt ids, so both layouts train on identical rollouts; every
other part of the step (planning, splicing, rewards, weights, loss, collectives) is the trainer's own.

    python -m accelerate.commands.launch --num_processes 2 tests/support/two_rank_losses.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from trl import GRPOTrainer

GROUP = 4
PROMPTS = ["Q: 1+2=", "Q: 2+3="]  # seeds exist for the first prompt only
MODES = {
    "action": dict(seed_method="seeds", prefix_mode="action"),
    "replay": dict(seed_method="replay"),
    # research/target-cuts.md: the first prompt always fails, so it is seeded (from its passed seed) from step 1 on
    "target": dict(seed_method="seeds", prefix_mode="action", cut_selection="target", seed_trigger="zero_std"),
    "target-state": dict(seed_method="seeds", prefix_mode="state", cut_selection="target", seed_trigger="zero_std"),
}


def _stand_in_generation(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
    """Continuations drawn from a generator keyed by (step, prompt ids, occurrence): the same on any number of ranks."""
    vocab, eos = len(self.processing_class), self.processing_class.eos_token_id
    # Like HF `generate`, emit the seed-prefix tokens the trainer forces (mixed batches) before the row's own ones.
    processors = getattr(self.accelerator.unwrap_model(self.model).generate, "keywords", {}).get("logits_processor")
    forced = processors[0].forced if processors else None
    seen, completions = {}, []
    for row, ids in enumerate(prompt_ids):
        prefix = forced[row] if forced else []
        key = (*map(int, ids), *prefix)  # the whole spliced context, however much of it was forced
        occurrence = seen[key] = seen.get(key, -1) + 1
        rng = np.random.default_rng([self.state.global_step, occurrence, *key])
        length = int(rng.integers(2, self.max_completion_length + 1))
        tokens = rng.integers(3, vocab, size=length).tolist()
        completions.append(prefix + (tokens[:-1] + [eos] if rng.random() < 0.5 else tokens))
    return completions, None


def _external_seeds(folder: Path, tokenizer) -> Path:
    from ts_trl.store.format import write_shard
    from ts_trl.store.schema import Rollout, prompt_id_of, rollouts_to_table, tokenizer_fingerprint

    rng = np.random.default_rng(0)
    rollouts = []
    for i in range(3):
        ids = rng.integers(3, len(tokenizer), size=8).tolist()
        logps = rng.uniform(-6.0, -1.0, size=8).tolist()
        rollouts.append(Rollout(f"ext-{i}", prompt_id_of(PROMPTS[0]), PROMPTS[0], "x", ids, logps, float(i % 2), 0))
    folder.mkdir(parents=True, exist_ok=True)
    table = rollouts_to_table(rollouts, "checkpoint-0", "other", tokenizer_fingerprint(tokenizer), [])
    write_shard(table, folder / "step-000000.parquet")
    return folder


def count_reward(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c) % 2 == 0) + 0.01 * len(c) for c in completions]


def first_prompt_fails(completions, prompts, **kwargs):
    return [0.0 if p == PROMPTS[0] else r for p, r in zip(prompts, count_reward(completions))]


def run(mode: str, output_dir: Path, num_processes: int) -> dict:
    from datasets import Dataset

    from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
    from ts_trl.tiny import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    args = SeedGRPOConfig(
        output_dir=str(output_dir / mode),
        per_device_train_batch_size=2 * GROUP // num_processes,  # a global batch of two groups, however split
        num_generations=GROUP,
        max_completion_length=12,
        max_steps=3,
        save_strategy="no",
        logging_steps=1,
        learning_rate=1e-2,  # large, so the later steps' losses depend on the earlier updates
        report_to=[],
        use_cpu=True,
        seed=0,
        seed_fraction=1.0,
        seed_snapshot_only=False,  # nothing is saved: the run seeds from memory
        seed_min_age=100,  # only the external seeds (of the first prompt) are ever old enough
        seed_dataset=str(_external_seeds(output_dir / "external", tokenizer)),
        disable_tqdm=True,
        **MODES[mode],
    )
    trainer = SeedGRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=first_prompt_fails if mode.startswith("target") else count_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tokenizer,
    )
    real_generation = GRPOTrainer._generate_single_turn
    GRPOTrainer._generate_single_turn = _stand_in_generation
    try:
        trainer.train()
    finally:
        GRPOTrainer._generate_single_turn = real_generation
    history = trainer.state.log_history
    keys = ("loss", "seeds/prefix_is_ratio_mean", "seeds/replayed_rows", "seeds/seeded_group_share")
    keys += ("seeds/mean_cut_ratio", "seeds/seeded_pass_rate")
    results = {key: [h[key] for h in history if key in h] for key in keys}
    return {**results, "planner": trainer.planner.state()["planner"]}


if __name__ == "__main__":
    import os

    import torch.distributed as dist

    out = Path(sys.argv[1])
    results = {mode: run(mode, out, int(os.environ.get("WORLD_SIZE", "1"))) for mode in MODES}
    if not dist.is_initialized() or dist.get_rank() == 0:
        (out / "losses.json").write_text(json.dumps(results))
