"""Testbed search for the embedded task: on-policy GRPO (seed_method="none") on an embedded-task variant, held-out pass@1 curve.

Chooses the embedded default by the on-policy target alone (no seeded method is run here). One torch thread per run.
Usage: python research/testbed.py --lr 3e-4 --steps 200 --n-train 512 --min-difficulty 1 --difficulty 3 --seed 0
"""

import argparse
import json
import os
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--steps", type=int, default=160)
    p.add_argument("--n-train", type=int, default=512)
    p.add_argument("--n-eval", type=int, default=256)
    p.add_argument("--eval-samples", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=40)
    p.add_argument("--difficulty", type=int, default=2)
    p.add_argument("--min-difficulty", type=int, default=None)
    p.add_argument("--max-operand", type=int, default=19)
    p.add_argument("--warmup-steps", type=int, default=600)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--gens", type=int, default=8)
    p.add_argument("--max-len", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-iterations", type=int, default=1)
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--top-entropy-quantile", type=float, default=1.0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers
    from transformers import TrainerCallback

    transformers.logging.set_verbosity_error()
    from ts_trl.embedded import EmbeddedTask, build_warm_model, embedded_reward, sample_rewards
    from ts_trl.trainer.seed_grpo_config import SeedGRPOConfig
    from ts_trl.trainer.seed_grpo_trainer import SeedGRPOTrainer

    task = EmbeddedTask(difficulty=a.difficulty, min_difficulty=a.min_difficulty, max_operand=a.max_operand, seed=0)
    train, held = task.make_splits(a.n_train, a.n_eval)
    t0 = time.time()
    model, tok = build_warm_model(task, steps=a.warmup_steps, progress=False)
    warm_s = time.time() - t0
    records = []

    def evaluate(m, step):
        t = time.time()
        r = sample_rewards(m, tok, held, embedded_reward, a.max_len, num_samples=a.eval_samples, seed=1000)
        levels = {}
        for row, rs in zip(held["prompt"], r):
            n = row.count("+")
            levels.setdefault(n, []).append(sum(rs) / len(rs))
        rec = {
            "step": step,
            "pass1": sum(sum(x) / len(x) for x in r) / len(r),
            "by_level": {k: sum(v) / len(v) for k, v in sorted(levels.items())},
            "eval_s": round(time.time() - t, 1),
        }
        records.append(rec)
        print(json.dumps(rec), flush=True)

    evaluate(model, 0)

    class Cb(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step % a.eval_every == 0 and state.global_step < a.steps:
                evaluate(kw["model"], state.global_step)

    cfg = SeedGRPOConfig(
        output_dir=a.out + ".run",
        per_device_train_batch_size=a.prompts * a.gens,
        num_generations=a.gens,
        max_completion_length=a.max_len,
        max_steps=a.steps,
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        temperature=1.0,
        beta=a.beta,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=a.seed,
        disable_tqdm=True,
        seed_method="none",
        num_iterations=a.num_iterations,
        top_entropy_quantile=a.top_entropy_quantile,
    )
    trainer = SeedGRPOTrainer(
        model=model,
        reward_funcs=embedded_reward,
        args=cfg,
        train_dataset=train,
        processing_class=tok,
        callbacks=[Cb()],
    )
    t1 = time.time()
    trainer.train()
    train_s = time.time() - t1
    evaluate(trainer.model, a.steps)
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    out = {
        "args": vars(a),
        "warm_s": round(warm_s, 1),
        "train_s": round(train_s, 1),
        "s_per_step": round(train_s / a.steps, 3),
        "evals": records,
        "train_reward": rewards,
        "gain": records[-1]["pass1"] - records[0]["pass1"],
        "load": os.getloadavg(),
    }
    with open(a.out, "w") as f:
        json.dump(out, f)
    print("GAIN", out["gain"], "s/step", out["s_per_step"], flush=True)


if __name__ == "__main__":
    main()
