"""Builds a SeedGRPOTrainer on the tiny model with `use_cpu` as given, prints the world size it trains in, and trains
one step. Run on two CPU processes (`tests/support/ranks.py`):

    python -m accelerate.commands.launch --config_file CONFIG --num_processes 2 tests/support/cpu_ranks.py OUT USE_CPU
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(output_dir: str, use_cpu: bool) -> None:
    from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
    from ts_trl.tiny import build_tiny_model, build_tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.conftest import count_reward, tiny_prompts

    tokenizer = build_tokenizer()
    args = SeedGRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        bf16=False,
        report_to=[],
        use_cpu=use_cpu,
        disable_tqdm=True,
    )
    trainer = SeedGRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=count_reward,
        args=args,
        train_dataset=tiny_prompts(4),
        processing_class=tokenizer,
    )
    print(f"rank {args.process_index}: world size {args.world_size}", flush=True)
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "1")
