"""The four methods on the embedded task with the same budget, over several RNG seeds: table and learning curves.

Methods: `none` (on-policy GRPO), `replay` (whole old rollouts in the group, truncated IS), `seeds-action` (Thinking
Seeds with prefix actions trained) and `seeds-state` (Thinking Seeds, the method). Every run starts from the same
warmed-up tiny model (the warm-up is cached), trains the same number of optimizer steps on the same prompts, and is
scored by sampled pass@1 on the held-out split with the same sampling seed (common random numbers). Generated tokens
are counted apart from seed-prefix and replayed tokens, which cost no generation.

The learning curve is the training reward of *plain* groups (neither seeded nor replayed: the policy from the prompt),
so the methods are compared on the same quantity. Run `ts_trl compare --help`.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from dataclasses import dataclass

import numpy as np

from .common import InputError, output_dir, quiet_libraries, run_command, write_csv

METHODS = {
    "none": {"seed_method": "none"},
    "replay": {"seed_method": "replay"},
    "seeds-action": {"seed_method": "seeds", "prefix_mode": "action"},
    "seeds-state": {"seed_method": "seeds", "prefix_mode": "state"},
}


@dataclass
class Budget:
    """Sizes of one comparison; `--quick` picks the small one."""

    steps: int
    n_train: int
    n_eval: int
    prompts_per_step: int
    num_generations: int
    max_completion_length: int
    eval_samples: int
    eval_every: int
    warmup_steps: int


# The embedded default's settings (ts_trl/train.py): same warm-up (hence the same cache), 8 groups of 8 per step, and
# 64 training prompts, so each prompt comes back every 8 steps and finds seeds.
FULL = Budget(160, 64, 256, 8, 8, 40, 4, 20, 600)
QUICK = Budget(40, 64, 128, 8, 8, 40, 4, 0, 600)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ts_trl compare", description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--num-seeds", type=int, default=3, help="RNG seeds per method (0, 1, ...).")
    parser.add_argument("--quick", action="store_true", help="A small budget that finishes in minutes on 2 CPU cores.")
    parser.add_argument("--steps", type=int, help="Optimizer steps per run (overrides the budget's).")
    parser.add_argument("--n-train", type=int, help="Training prompts.")
    parser.add_argument("--n-eval", type=int, help="Held-out prompts for pass@1.")
    parser.add_argument("--eval-samples", type=int, help="Samples per held-out prompt.")
    parser.add_argument("--eval-every", type=int, help="Also score held-out pass@1 every N steps (0: start and end).")
    parser.add_argument("--warmup-steps", type=int, help="Supervised warm-up steps (cached across runs).")
    parser.add_argument("--difficulty", type=int, default=2, help="Additions per problem of the embedded task.")
    parser.add_argument("--seed-fraction", type=float, default=0.5, help="Share of groups seeded / replayed.")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="The embedded default's (3e-4 collapsed).")
    parser.add_argument("--output-dir", default="compare", help="Where compare.md, compare.csv, compare.png go.")
    return parser


def budget_from(args) -> Budget:
    budget = copy.copy(QUICK if args.quick else FULL)
    for name in ("steps", "n_train", "n_eval", "eval_samples", "eval_every", "warmup_steps"):
        if getattr(args, name) is not None:
            setattr(budget, name, getattr(args, name))
    for name in ("steps", "n_train", "n_eval", "eval_samples", "warmup_steps"):
        if getattr(budget, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be positive, got {getattr(budget, name)}.")
    if budget.n_train < budget.prompts_per_step:
        raise InputError(
            f"--n-train must be at least the {budget.prompts_per_step} prompts one step draws, got {budget.n_train}."
        )
    if args.num_seeds < 1:
        raise InputError(f"--num-seeds must be positive, got {args.num_seeds}.")
    if not 0.0 < args.seed_fraction <= 1.0:
        raise InputError(f"--seed-fraction must lie in (0, 1], got {args.seed_fraction}.")
    return budget


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    budget = budget_from(args)
    quiet_libraries()
    from tqdm.auto import tqdm

    from ..embedded.task import EmbeddedTask, embedded_reward
    from ..embedded.warmup import build_warm_model

    out = output_dir(args.output_dir)
    started = time.time()
    task = EmbeddedTask(difficulty=args.difficulty, seed=0)
    train_set, eval_set = task.make_splits(budget.n_train, budget.n_eval)
    warm_model, tokenizer = build_warm_model(task, steps=budget.warmup_steps, progress=True)
    warm_model.save_pretrained(out / "warm")
    tokenizer.save_pretrained(out / "warm")

    def evaluate(model, seed) -> float:
        from ..embedded.evaluate import pass_at_1

        return pass_at_1(
            model,
            tokenizer,
            eval_set,
            embedded_reward,
            budget.max_completion_length,
            num_samples=budget.eval_samples,
            seed=1000 + seed,  # the same sampling noise for every method at a given seed
        )

    seeds = list(range(args.num_seeds))
    start_scores = {seed: evaluate(warm_model, seed) for seed in tqdm(seeds, desc="held-out pass@1 of the warm model")}
    results, curves = [], []
    progress = tqdm(total=len(args.methods) * len(seeds) * budget.steps, desc="training", unit="step")
    for method in args.methods:
        for seed in seeds:
            progress.set_description(f"training {method} seed {seed}")
            result, curve = run_one(
                method, seed, copy.deepcopy(warm_model), tokenizer, train_set, budget, args, out, progress, evaluate
            )
            result["pass_at_1_start"] = start_scores[seed]
            results.append(result)
            curves.extend(curve)
            curves.append({"method": method, "seed": seed, "step": 0, "kind": "eval", "value": start_scores[seed]})
    progress.close()

    runs_path, curves_path = out / "compare.csv", out / "curves.csv"
    table_path, plot_path = out / "compare.md", out / "compare.png"
    write_csv(runs_path, results)
    write_csv(curves_path, curves)
    table = format_table(summarize(results), budget, args, time.time() - started)
    table_path.write_text(table + "\n")
    plot(curves, plot_path, budget, args)
    print(table)
    print(f"wrote {table_path}, {runs_path}, {curves_path} and {plot_path}")
    return results


def run_one(method, seed, model, tokenizer, train_set, budget, args, out, progress, evaluate):
    """Trains one method at one RNG seed; returns its result row and its curve points."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from ..config import SeedGRPOConfig
    from ..embedded.task import embedded_reward
    from ..trainer import SeedGRPOTrainer

    run_dir = out / "runs" / f"{method}-seed{seed}"
    evals = []

    class Progress(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            progress.update(1)
            if budget.eval_every and state.global_step % budget.eval_every == 0 and state.global_step < budget.steps:
                evals.append((state.global_step, evaluate(kwargs["model"], seed)))

    config = SeedGRPOConfig(
        output_dir=str(run_dir),
        per_device_train_batch_size=budget.prompts_per_step * budget.num_generations,
        num_generations=budget.num_generations,
        max_completion_length=budget.max_completion_length,
        max_steps=budget.steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        temperature=1.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=seed,
        disable_tqdm=True,
        seed_fraction=args.seed_fraction,
        # Seeds from one step back, without waiting for a checkpoint: the runs compare methods, not snapshot cadence.
        seed_snapshot_only=False,
        seed_min_age=1,
        replay_per_group=max(1, budget.num_generations // 4),
        **METHODS[method],
    )
    trainer = SeedGRPOTrainer(
        model=model,
        reward_funcs=embedded_reward,
        args=config,
        train_dataset=train_set,
        processing_class=tokenizer,
        callbacks=[Progress()],
    )
    trainer.remove_callback(PrinterCallback)  # the progress bar above says enough; the numbers go to the CSVs
    started = time.time()
    trainer.train()
    wall = time.time() - started
    final = evaluate(trainer.model, seed)
    trainer.model.save_pretrained(run_dir / "final")
    tokenizer.save_pretrained(run_dir / "final")

    logs = [h for h in trainer.state.log_history if "reward" in h]
    rows_per_step = config.per_device_train_batch_size
    generated = prefix = 0.0
    curve = []
    for step, h in enumerate(logs, start=1):
        if "seeds/generated_tokens" in h:
            generated += h["seeds/generated_tokens"]
            prefix += h["seeds/prefix_tokens"]
        else:
            generated += h["completions/mean_length"] * rows_per_step
        plain = h["reward"] if method == "none" else h.get("seeds/reward_unseeded", math.nan)
        curve.append({"method": method, "seed": seed, "step": step, "kind": "train_reward", "value": plain})
    for step, value in evals:
        curve.append({"method": method, "seed": seed, "step": step, "kind": "eval", "value": value})
    curve.append({"method": method, "seed": seed, "step": budget.steps, "kind": "eval", "value": final})
    result = {
        "method": method,
        "seed": seed,
        "pass_at_1": final,
        "generated_tokens": int(round(generated)),
        "reused_tokens": int(round(prefix)),
        "wall_s": round(wall, 1),
        "steps": len(logs),
    }
    return result, curve


def summarize(results: list[dict]) -> list[dict]:
    """Mean and sample std over seeds, per method, in the order the methods ran."""
    summary = []
    for method in dict.fromkeys(r["method"] for r in results):
        runs = [r for r in results if r["method"] == method]
        scores = np.array([r["pass_at_1"] for r in runs])
        start = np.array([r["pass_at_1_start"] for r in runs])
        summary.append(
            {
                "method": method,
                "runs": len(runs),
                "pass_at_1_mean": float(scores.mean()),
                "pass_at_1_std": float(scores.std(ddof=1)) if len(runs) > 1 else math.nan,
                "gain_mean": float((scores - start).mean()),
                "generated_tokens": float(np.mean([r["generated_tokens"] for r in runs])),
                "reused_tokens": float(np.mean([r["reused_tokens"] for r in runs])),
                "wall_s": float(np.mean([r["wall_s"] for r in runs])),
            }
        )
    return summary


def format_table(summary: list[dict], budget: Budget, args, total_s: float) -> str:
    start = summary[0]["pass_at_1_mean"] - summary[0]["gain_mean"]
    lines = [
        f"Embedded task (difficulty {args.difficulty}), {budget.steps} steps x {budget.prompts_per_step} prompts x "
        f"{budget.num_generations} generations, {summary[0]['runs']} RNG seeds; held-out pass@1 over {budget.n_eval} "
        f"prompts x {budget.eval_samples} samples at temperature 1 (warm start: {start:.3f}).",
        "",
        "| method | held-out pass@1 (mean ± std) | change vs. warm start | generated tokens | reused tokens | wall time (s) |",
        "|---|---|---|---|---|---|",
    ]
    for s in summary:
        std = "n/a" if math.isnan(s["pass_at_1_std"]) else f"{s['pass_at_1_std']:.3f}"
        lines.append(
            f"| {s['method']} | {s['pass_at_1_mean']:.3f} ± {std} | {s['gain_mean']:+.3f} | "
            f"{s['generated_tokens']:,.0f} | {s['reused_tokens']:,.0f} | {s['wall_s']:.0f} |"
        )
    lines += ["", f"Total time including warm-up and evaluation: {total_s / 60:.1f} min."]
    return "\n".join(lines)


def plot(curves: list[dict], path, budget: Budget, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    methods = list(dict.fromkeys(c["method"] for c in curves))
    for method in methods:
        for ax, kind in ((left, "train_reward"), (right, "eval")):
            points = [c for c in curves if c["method"] == method and c["kind"] == kind]
            steps = sorted({c["step"] for c in points})
            values = [[c["value"] for c in points if c["step"] == s and not _isnan(c["value"])] for s in steps]
            keep = [i for i, v in enumerate(values) if v]
            steps = [steps[i] for i in keep]
            mean = np.array([np.mean(values[i]) for i in keep])
            low = np.array([np.min(values[i]) for i in keep])
            high = np.array([np.max(values[i]) for i in keep])
            if kind == "train_reward" and len(mean) >= 3:  # a 3-step moving average: single steps are noisy
                mean = np.convolve(np.pad(mean, 1, mode="edge"), np.ones(3) / 3, mode="valid")
            line = ax.plot(steps, mean, "-o" if kind == "eval" else "-", label=method, markersize=4)[0]
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.12)
    left.set_title("Training reward of plain groups (3-step mean; band: min-max over seeds)", fontsize=9)
    left.set_ylabel("mean reward (from the prompt, no seed)")
    right.set_title(f"Held-out pass@1 ({budget.n_eval} prompts x {budget.eval_samples} samples)", fontsize=9)
    right.set_ylabel("pass@1 (temperature 1)")
    for ax in (left, right):
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"Embedded task, {args.num_seeds} RNG seeds per method, same steps and prompts "
        f"({budget.prompts_per_step} x {budget.num_generations} rollouts per step)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _isnan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def cli(argv: list[str] | None = None) -> int:
    return run_command(main, argv)


if __name__ == "__main__":
    raise SystemExit(cli())
