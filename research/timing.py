"""Where a compare run's time goes: s/step at 1 vs 2 torch threads, one held-out evaluation, warm-up.

Usage: python research/timing.py [THREADS ...]  (default 1 2 1 2; prints one JSON line per measurement, with the
load average). Two copies started together with `1` show what `compare --jobs 2` pays per run.
"""

import json
import os
import sys
import time

import torch


def main():
    import transformers

    transformers.logging.set_verbosity_error()
    from ts_trl.analysis.compare_protocol import DIFFICULTY, FULL, LEARNING_RATE, MIN_DIFFICULTY
    from ts_trl.embedded import EmbeddedTask, build_warm_model, embedded_reward, sample_rewards
    from ts_trl.embedded.warmup import _batch
    from ts_trl.trainer.seed_grpo_config import SeedGRPOConfig
    from ts_trl.trainer.seed_grpo_trainer import SeedGRPOTrainer

    task = EmbeddedTask(difficulty=DIFFICULTY, min_difficulty=MIN_DIFFICULTY)
    train, held = task.make_splits(FULL.n_train, FULL.n_eval)
    for threads in [int(t) for t in sys.argv[1:]] or (1, 2, 1, 2):
        torch.set_num_threads(threads)
        model, tok = build_warm_model(task, steps=FULL.warmup_steps, progress=False)
        config = SeedGRPOConfig(
            output_dir="/tmp/timing-run", per_device_train_batch_size=FULL.prompts_per_step * FULL.num_generations,
            num_generations=FULL.num_generations, max_completion_length=FULL.max_completion_length, max_steps=11,
            learning_rate=LEARNING_RATE, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
            disable_tqdm=True, seed_method="none", beta=0.0, bf16=False, activation_checkpointing=False,
        )  # fmt: skip
        trainer = SeedGRPOTrainer(model=model, reward_funcs=embedded_reward, args=config, train_dataset=train,
                                  processing_class=tok)  # fmt: skip
        trainer.train()
        steps = [h["step_time"] for h in trainer.state.log_history if "step_time" in h][1:]
        start = time.time()
        sample_rewards(model, tok, held, embedded_reward, 40, batch_size=256, num_samples=FULL.eval_samples,
                       num_threads=threads)  # fmt: skip
        evaluation = time.time() - start
        start = time.time()
        for _ in range(5):
            batch = _batch(tok, task, __import__("random").Random(0), 32)
            model(**batch).loss.backward()
        warm_step = (time.time() - start) / 5
        print(json.dumps({"threads": threads, "s_per_step": round(sum(steps) / len(steps), 3),
                          "eval_s": round(evaluation, 1), "warmup_s_per_step": round(warm_step, 3),
                          "load": os.getloadavg()}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
