"""Trains the tiny model on two ranks and leaves through a normal interpreter exit (tests/launch/test_clean_exit.py).

python -m torch.distributed.run --nproc_per_node 2 tests/support/two_rank_exit.py OUTPUT_DIR [PREFIX_MODE] [--end]

With `--end` the script finishes as `ts_trl train` and the transformers docs do: `trainer.end()` destroys the process
group (DDP still holds its backend and worker threads) before the interpreter exits.
"""

import sys

from tests.conftest import TINY_SETTINGS, count_reward, tiny_prompts
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
from ts_trl.tiny import build_tiny_model, build_tokenizer

if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if a != "--end"]
    output_dir, prefix_mode = arguments[0], (arguments[1:] or ["state"])[0]
    settings = {**TINY_SETTINGS, "per_device_train_batch_size": 4, "output_dir": output_dir, "disable_tqdm": True}
    tokenizer = build_tokenizer()
    trainer = SeedGRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=count_reward,
        args=SeedGRPOConfig(**{**settings, "seed_fraction": 0.5, "prefix_mode": prefix_mode}),
        train_dataset=tiny_prompts(),
        processing_class=tokenizer,
    )
    trainer.train()
    print(f"rank {trainer.accelerator.process_index} finished training", flush=True)
    if "--end" in sys.argv:
        trainer.end()
