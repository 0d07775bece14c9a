"""One "machine" of a two-machine seeded run on localhost (tests/launch/test_node_local.py launches both).

    python -m accelerate.commands.launch --config_file accelerate_configs/multi_gpu.yaml --num_machines 2 \
        --machine_rank R --main_process_ip 127.0.0.1 --main_process_port P --num_processes 2 --mixed_precision no \
        tests/support/two_node_seeds.py OUTPUT_DIR REPORT [--max_steps N] [--resume CHECKPOINT|newest] \
        [--save_on_each_node] [--seed_dataset PATH]

Each machine passes its own OUTPUT_DIR (node-local disks) or both the same (a shared disk). The rank writes REPORT
(JSON): the step it reached and a digest of its whole seed bank (ids, prompts, tokens, log-probs), or the one line it
was refused with.
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

from tests.conftest import TINY_SETTINGS, count_reward, tiny_prompts
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
from ts_trl.tiny import build_tiny_model, build_tokenizer


def bank_digest(bank) -> str:
    digest = hashlib.sha256()
    for index in range(len(bank)):
        seed = bank.get(index)
        digest.update(f"{seed.rollout_id}|{seed.prompt_id}|".encode())
        digest.update(seed.completion_ids.tobytes() + seed.logprobs.tobytes())
    return digest.hexdigest()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("report")
    parser.add_argument("--max_steps", type=int, default=2)
    parser.add_argument("--resume", help="a checkpoint folder's name in output_dir, or 'newest' (True)")
    parser.add_argument("--save_on_each_node", action="store_true")
    parser.add_argument("--seed_dataset")
    options = parser.parse_args()
    settings = {
        **TINY_SETTINGS,
        "per_device_train_batch_size": 4,  # one group of four per rank, two a step
        "output_dir": options.output_dir,
        "max_steps": options.max_steps,
        "save_steps": 1,
        "save_on_each_node": options.save_on_each_node,
        "seed_dataset": options.seed_dataset,
    }
    tokenizer = build_tokenizer()
    trainer = SeedGRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=count_reward,
        args=SeedGRPOConfig(**settings),
        train_dataset=tiny_prompts(2),  # each step both prompts: seeds from step 2 on
        processing_class=tokenizer,
    )
    resume = None
    if options.resume:
        resume = True if options.resume == "newest" else str(Path(options.output_dir) / options.resume)
    rank = trainer.accelerator.process_index
    try:
        trainer.train(resume_from_checkpoint=resume)
    except ValueError as error:
        Path(options.report).write_text(json.dumps({"rank": rank, "refused": str(error)}))
        trainer.end()
        sys.exit(3)
    report = {"rank": rank, "step": trainer.state.global_step, "bank": bank_digest(trainer.seed_bank)}
    Path(options.report).write_text(json.dumps({**report, "rows": len(trainer.seed_bank)}))
    trainer.end()
