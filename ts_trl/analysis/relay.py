"""Relay inference: checkpoint A writes the first r of a solution, checkpoint B finishes it; pass rates against r.

For every prompt and sample, A writes a whole solution; for each ratio r it is cut at `k = floor(r * len)` (EOS not
counted, so the prefix never ends the answer) and B continues from `prompt + A[:k]` with the budget that is left. The
reward sees `A[:k] + continuation`. "A alone" is the reward of A's whole solutions, "B alone" that of B's own
solutions from scratch; both are flat lines. Run `ts_trl relay --help`.
"""

from __future__ import annotations

import argparse
import math

from ..snapshots import tokenizer_fingerprint
from .common import (
    DEFAULT_REWARD,
    InputError,
    check_ratios,
    load_checkpoint,
    load_prompts,
    load_reward,
    output_dir,
    prompt_token_ids,
    quiet_libraries,
    run_command,
    sample_continuations,
    wilson_interval,
    write_csv,
)

DEFAULT_RATIOS = tuple(round(0.1 * i, 1) for i in range(10))
CONDITIONS = ("b_from_a", "a_alone", "b_alone")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ts_trl relay", description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint-a", required=True, help="Folder of the checkpoint that starts the solution.")
    parser.add_argument("--checkpoint-b", required=True, help="Folder of the checkpoint that finishes it.")
    parser.add_argument(
        "--prompts", default="embedded", help="A .jsonl/.parquet file with prompt and answer, or 'embedded'."
    )
    parser.add_argument("--ratios", type=float, nargs="+", default=list(DEFAULT_RATIOS), help="Cut ratios in [0, 1).")
    parser.add_argument("--num-prompts", type=int, default=64, help="Use the first N prompts.")
    parser.add_argument("--samples", type=int, default=4, help="Solutions of A per prompt (each relayed at every r).")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="Budget of a whole solution (A's part + B's).")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--reward", default=DEFAULT_REWARD, help="Reward function as module:function.")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="relay", help="Where relay.csv, relay_samples.csv, relay.png go.")
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    ratios = check_ratios(args.ratios)
    if args.samples < 1 or args.num_prompts < 1 or args.max_new_tokens < 1:
        raise InputError("--samples, --num-prompts and --max-new-tokens must be positive.")
    quiet_libraries()
    model_a, tokenizer = load_checkpoint(args.checkpoint_a, "checkpoint A")
    model_b, tokenizer_b = load_checkpoint(args.checkpoint_b, "checkpoint B")
    if tokenizer_fingerprint(tokenizer) != tokenizer_fingerprint(tokenizer_b):
        raise InputError("checkpoints A and B use tokenizers of different vocabularies; a relay needs the same one.")
    reward_fn = load_reward(args.reward)
    rows = load_prompts(args.prompts, args.num_prompts, args.seed)
    out = output_dir(args.output_dir)

    samples = relay_samples(model_a, model_b, tokenizer, rows, ratios, args, reward_fn)
    summary = summarize(samples, ratios)
    samples_path, summary_path, plot_path = out / "relay_samples.csv", out / "relay.csv", out / "relay.png"
    write_csv(samples_path, samples)
    write_csv(summary_path, summary)
    plot(summary, plot_path, args)
    print(format_table(summary))
    print(f"wrote {summary_path}, {samples_path} and {plot_path}")
    return summary


def relay_samples(model_a, model_b, tokenizer, rows, ratios, args, reward_fn) -> list[dict]:
    """One record per (prompt, sample, condition, ratio) with the token counts, the response text and its reward."""
    eos = tokenizer.eos_token_id
    contexts = [prompt_token_ids(tokenizer, row["prompt"]) for row in rows for _ in range(args.samples)]
    sources = [(row, s) for row in rows for s in range(args.samples)]
    budget = args.max_new_tokens
    a_solutions = sample_continuations(
        model_a, tokenizer, contexts, [budget] * len(contexts), args.seed, args.batch_size, args.temperature, "A alone"
    )
    b_solutions = sample_continuations(
        model_b,
        tokenizer,
        contexts,
        [budget] * len(contexts),
        args.seed + 1,
        args.batch_size,
        args.temperature,
        "B alone",
    )
    relay_contexts, relay_budgets, relay_keys = [], [], []
    for index, (context, solution) in enumerate(zip(contexts, a_solutions)):
        length = len(solution) - (1 if solution and solution[-1] == eos else 0)  # EOS is not part of the text
        for ratio in ratios:
            k = math.floor(ratio * length)
            relay_contexts.append(context + solution[:k])
            relay_budgets.append(budget - k)
            relay_keys.append((index, ratio, k))
    continuations = sample_continuations(
        model_b, tokenizer, relay_contexts, relay_budgets, args.seed + 2, args.batch_size, args.temperature, "B from A"
    )
    records = []
    for (row, sample), a_ids, b_ids in zip(sources, a_solutions, b_solutions):
        for condition, ids in (("a_alone", a_ids), ("b_alone", b_ids)):
            records.append(_record(row, sample, condition, math.nan, 0, ids, tokenizer))
    for (index, ratio, k), continuation in zip(relay_keys, continuations):
        row, sample = sources[index]
        records.append(_record(row, sample, "b_from_a", ratio, k, a_solutions[index][:k] + continuation, tokenizer))
    texts = [r["response"] for r in records]
    scores = reward_fn(
        completions=texts,
        prompts=[r["prompt"] for r in records],
        answer=[r["answer"] for r in records],
    )
    for record, score in zip(records, scores):
        record["reward"] = 0.0 if score is None else float(score)
        record["passed"] = int(record["reward"] > 0)
    return records


def _record(row, sample, condition, ratio, k, ids, tokenizer) -> dict:
    return {
        "prompt_id": row["prompt_id"],
        "sample": sample,
        "condition": condition,
        "ratio": ratio,
        "prefix_tokens": k,
        "response_tokens": len(ids),
        "prompt": row["prompt"],
        "answer": row["answer"],
        "response": tokenizer.decode(ids, skip_special_tokens=True),
        "response_ids": " ".join(map(str, ids)),
    }


def summarize(samples: list[dict], ratios: list[float]) -> list[dict]:
    """Pass rate with its 95% Wilson interval per condition and ratio (the flat baselines repeated at every r)."""
    summary = []
    for ratio in ratios:
        for condition in CONDITIONS:
            chosen = [
                s for s in samples if s["condition"] == condition and (condition != "b_from_a" or s["ratio"] == ratio)
            ]
            passes, n = sum(s["passed"] for s in chosen), len(chosen)
            low, high = wilson_interval(passes, n)
            summary.append(
                {
                    "ratio": ratio,
                    "condition": condition,
                    "n": n,
                    "passes": passes,
                    "pass_rate": passes / n if n else math.nan,
                    "ci_low": low,
                    "ci_high": high,
                }
            )
    return summary


def format_table(summary: list[dict]) -> str:
    lines = ["ratio  B from A              A alone               B alone"]
    by_key = {(s["ratio"], s["condition"]): s for s in summary}
    for ratio in sorted({s["ratio"] for s in summary}):
        cells = []
        for condition in CONDITIONS:
            s = by_key[(ratio, condition)]
            cells.append(f"{s['pass_rate']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]")
        lines.append(f"{ratio:<5.2f}  " + "  ".join(f"{cell:<20}" for cell in cells))
    return "\n".join(lines)


def plot(summary: list[dict], path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = {"b_from_a": "B continues from A's prefix", "a_alone": "A alone", "b_alone": "B alone"}
    styles = {"b_from_a": "-o", "a_alone": "--", "b_alone": ":"}
    for condition in CONDITIONS:
        points = sorted((s for s in summary if s["condition"] == condition), key=lambda s: s["ratio"])
        x = [s["ratio"] for s in points]
        y = [s["pass_rate"] for s in points]
        line = ax.plot(x, y, styles[condition], label=labels[condition])[0]
        ax.fill_between(
            x, [s["ci_low"] for s in points], [s["ci_high"] for s in points], color=line.get_color(), alpha=0.15
        )
    n = next(s["n"] for s in summary if s["condition"] == "b_from_a")
    ax.set_title(f"Relay: A writes the first r of a solution, B finishes it (n = {n} per point, 95% Wilson CI)")
    ax.title.set_fontsize(9)
    ax.set_xlabel("cut ratio r (share of A's solution kept as prefix)")
    ax.set_ylabel("pass rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.text(0.01, 0.01, f"A = {args.checkpoint_a}\nB = {args.checkpoint_b}", fontsize=6, va="bottom")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cli(argv: list[str] | None = None) -> int:
    return run_command(main, argv)


if __name__ == "__main__":
    raise SystemExit(cli())
