"""Trains the tiny model with `shared_prefix` on and off, then resumes a copy of the "on" run (without its step-4
checkpoint) from its step-2 checkpoint, and writes each run's per-step losses, token shares and seeded shares as JSON
(rank 0). Four prompts, each four times: one epoch of 4 steps of 4 groups, in which every prompt recurs, so that the
resume replays the uninterrupted run's data order (transformers fast-forwards within an epoch, not across epochs).

Run under `accelerate launch --num_processes 2` with the DDP or the CPU ZeRO-3 config; the three runs share one launch
(one start-up of both processes instead of three).

    python -m accelerate.commands.launch --config_file CONFIG --num_processes 2 tests/support/shared_prefix_ranks.py OUT
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path


def run(output_dir: Path, shared: bool, resume: Path | None = None) -> dict:
    import torch

    from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
    from ts_trl.tiny import build_tiny_model, build_tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from datasets import concatenate_datasets

    from tests.conftest import count_reward, tiny_prompts

    tokenizer = build_tokenizer()
    args = SeedGRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=8,  # two groups of 4 a rank
        num_generations=4,
        max_completion_length=12,
        max_steps=4,
        save_steps=2,  # the step-2 shard seeds steps 3 and 4; the step-2 checkpoint is resumed from
        logging_steps=1,
        learning_rate=1e-3,
        optim="sgd",  # SGD: parameters differ as the gradients do (Adam magnifies rounding in tiny coordinates)
        bf16=False,
        report_to=[],
        use_cpu=True,  # a gloo group of both processes, which SeedGRPOTrainer hands to DeepSpeed under ZeRO-3
        seed=0,
        seed_fraction=1.0,
        disable_tqdm=True,
        shared_prefix=shared,
    )
    trainer = SeedGRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=count_reward,
        args=args,
        train_dataset=concatenate_datasets([tiny_prompts(4)] * 4),
        processing_class=tokenizer,
    )
    calls = []  # the model calls of each packed forward under gradient (the loss's)
    shared_forward = trainer._shared_forward

    def counted(model, packed, compute_entropy):
        if torch.is_grad_enabled():
            calls.append(len(packed.calls))
        return shared_forward(model, packed, compute_entropy)

    trainer._shared_forward = counted
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    history = trainer.state.log_history
    keys = ("loss", "grad_norm", "shared_prefix/token_share", "seeds/seeded_group_share")
    return {"calls": calls} | {key: [h[key] for h in history if key in h] for key in keys}


if __name__ == "__main__":
    import torch.distributed as dist

    from ts_trl.cli.environment import skip_deepspeed_shm_build

    skip_deepspeed_shm_build()
    out = Path(sys.argv[1])
    main = int(os.environ.get("RANK", "0")) == 0  # the process group starts with the first trainer
    results = {"on": run(out / "on", True), "off": run(out / "off", False)}
    if main:
        ignore = shutil.ignore_patterns("checkpoint-4", ".ts_trl.running")
        shutil.copytree(out / "on", out / "resumed", ignore=ignore)
    if dist.is_initialized():
        dist.barrier()
    results["resumed"] = run(out / "resumed", True, resume=out / "resumed" / "checkpoint-2")
    if main:
        (out / "losses.json").write_text(json.dumps(results))
