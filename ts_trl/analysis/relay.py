"""Relay inference: checkpoint A writes the first r of a solution, checkpoint B finishes it; pass rates against r.

For every prompt and sample, A writes a whole solution; for each ratio r it is cut at `k = floor(r * len)` (EOS not
counted, so the prefix never ends the answer; snapped to a line end, as the trainer snaps, with `--cut_at_newline`)
and B continues from `prompt + A[:k]` with the budget that is left. The reward sees `A[:k] + continuation`. "A alone"
is the reward of A's whole solutions, "B alone" that of B's own solutions from scratch; both are flat lines. Every
condition samples with common random numbers (one stream per prompt and sample, one number per response position), so
identical conditions give identical figures: B from an empty prefix of A's (r = 0) is "B alone", sample for sample.

A sample passes when its success reward (`--success_reward`, by default the first reward function) is above
`--success_threshold` (default 0), the rule the trainer's seed selection uses. Pass rates carry 95% Wilson intervals;
the comparisons that matter are paired: B-from-A minus A-alone on the same A solution, and B-from-A minus B-alone on
the same prompt, each with a 95% bootstrap interval that resamples prompts (a prompt's samples share its difficulty).
Sampling settings (temperature, top-k, top-p, budget, newline snapping) and the built-in task's seed default to the
run's, as its seed shards record them. Run `ts_trl relay --help`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import defaultdict

import pyarrow.parquet as pq

from ..flags import accept_both_spellings
from ..method.cutting import boundary_token_ids, choose_cut
from ..rewards import get_reward_funcs
from ..store.schema import prompt_id_of, tokenizer_fingerprint
from .common import (
    InputError,
    Sampling,
    as_chat,
    check_ratios,
    load_checkpoint,
    load_prompts,
    output_dir,
    paired_bootstrap,
    prompt_token_ids,
    quiet_libraries,
    read_sampling,
    run_command,
    run_seed_shards,
    sample_continuations,
    save_figure,
    wilson_interval,
    write_csv,
)

DEFAULT_RATIOS = tuple(round(0.1 * i, 1) for i in range(10))
CONDITIONS = ("b_from_a", "a_alone", "b_alone")
PAIRED = {"b_from_a_minus_a_alone": "a_alone", "b_from_a_minus_b_alone": "b_alone"}
FALLBACK_SAMPLING = Sampling(temperature=1.0, max_completion_length=64)  # for runs whose shards record nothing


def build_parser() -> argparse.ArgumentParser:
    """The parser of `ts_trl relay`. Long: one flag per line."""
    parser = argparse.ArgumentParser(prog="ts_trl relay", description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint_a", required=True, help="Folder of the checkpoint that starts the solution.")
    parser.add_argument("--checkpoint_b", required=True, help="Folder of the checkpoint that finishes it.")
    parser.add_argument(
        "--prompts", default="embedded", help="A .jsonl/.parquet file with prompt and answer, or 'embedded'."
    )
    parser.add_argument(
        "--task",
        default="add",
        help="The built-in task whose held-out set 'embedded' means: add, chain, chat-add (a real model's).",
    )
    parser.add_argument("--ratios", type=float, nargs="+", default=list(DEFAULT_RATIOS), help="Cut ratios in [0, 1).")
    parser.add_argument("--num_prompts", type=int, default=64, help="Use the first N prompts.")
    parser.add_argument("--samples", type=int, default=4, help="Solutions of A per prompt (each relayed at every r).")
    parser.add_argument(
        "--max_new_tokens",
        type=int,
        default=None,
        help="Budget of a whole solution, A's part + B's (default: the run's max_completion_length, else 64).",
    )
    parser.add_argument("--temperature", type=float, default=None, help="Default: the run's, else 1.")
    parser.add_argument("--top_k", type=int, default=None, help="Default: the run's, else 0 (off).")
    parser.add_argument("--top_p", type=float, default=None, help="Default: the run's, else 1 (off).")
    parser.add_argument(
        "--cut_at_newline",
        "--cut-at-newline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Snap each cut to the nearest line end, as the trainer does (default: the run's setting).",
    )
    parser.add_argument(
        "--reward",
        nargs="+",
        default=["embedded"],
        help="Reward functions: registry names (embedded, math, format, code, ...) or module:function.",
    )
    parser.add_argument(
        "--success_reward",
        default=None,
        help="The reward that decides a pass, by name or function name (default: the first of --reward).",
    )
    parser.add_argument(
        "--success_threshold",
        type=float,
        default=0.0,
        help="A sample passes when its success reward is above this.",
    )
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="Seed of the sampling and of the bootstrap.")
    parser.add_argument(
        "--task_seed",
        type=int,
        default=None,
        help="Seed of the built-in task's train / held-out split (default: the run's training seed).",
    )
    parser.add_argument("--output_dir", default="relay", help="Where relay.csv, relay_samples.csv, relay.png go.")
    return accept_both_spellings(parser)


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    ratios = check_ratios(args.ratios)
    if args.samples < 1 or args.num_prompts < 1 or (args.max_new_tokens is not None and args.max_new_tokens < 1):
        raise InputError("--samples, --num_prompts and --max_new_tokens must be positive.")
    rewards = resolve_rewards(args.reward)
    success = success_index(args.reward, rewards, args.success_reward)
    quiet_libraries()
    model_a, tokenizer = load_checkpoint(args.checkpoint_a, "checkpoint A")
    model_b, tokenizer_b = load_checkpoint(args.checkpoint_b, "checkpoint B")
    if tokenizer_fingerprint(tokenizer) != tokenizer_fingerprint(tokenizer_b):
        raise InputError("checkpoints A and B use tokenizers of different vocabularies; a relay needs the same one.")
    shards_a, shards_b = run_seed_shards(args.checkpoint_a), run_seed_shards(args.checkpoint_b)
    recorded = read_sampling(shards_b or shards_a)  # B's run, where A and B come from different runs
    sampling = relay_sampling(recorded, args)
    task_seed = args.task_seed if args.task_seed is not None else (recorded.seed if recorded else None)
    if task_seed is None and (args.prompts == "embedded" or args.prompts.startswith("embedded:")):
        raise InputError(
            "the built-in task's held-out split depends on the run's training seed, which no seed shard of the run "
            "records; pass --task_seed with that seed."
        )
    rows = load_prompts(args.prompts, args.num_prompts, task_seed or 0, task=args.task)
    warn_training_overlap(rows, list(dict.fromkeys(shards_a + shards_b)))
    out = output_dir(args.output_dir)

    samples = relay_samples(model_a, model_b, tokenizer, rows, ratios, args, sampling, rewards, success)
    summary = summarize(samples, ratios, args.seed)
    samples_path, summary_path, plot_path = out / "relay_samples.csv", out / "relay.csv", out / "relay.png"
    write_csv(samples_path, samples)
    write_csv(summary_path, summary)
    plot(summary, plot_path, args)
    print(format_table(summary))
    print(format_paired_table(summary))
    print(
        f"{len(rows)} prompts x {args.samples} samples; {sampling.describe()}, {sampling.max_completion_length} tokens"
        f"{', cuts at line ends' if sampling.cut_at_newline else ''}; pass: {rewards[success][0]} > "
        f"{args.success_threshold:g}" + (f"; task seed {task_seed}" if task_seed is not None else "")
    )
    print(f"wrote {summary_path}, {samples_path} and {plot_path}")
    return summary


def resolve_rewards(specs: list[str]) -> list[tuple[str, callable]]:
    """(name, function) for each spec, resolved as `train.py --reward_funcs` resolves them."""

    functions = []
    for spec in specs:
        try:
            functions.extend((spec, f) for f in get_reward_funcs([spec]))
        except (ValueError, ImportError, AttributeError) as error:
            reason = " ".join(str(error).split())
            raise InputError(
                f"reward {spec!r} cannot be loaded ({reason}); give a registry name or module:function."
            ) from error
    return functions


def success_index(specs: list[str], rewards: list[tuple[str, callable]], success_reward: str | None) -> int:
    """Which reward decides a pass: the one named (as given, or by its function's name), else the first."""
    if success_reward is None:
        return 0
    for index, (spec, function) in enumerate(rewards):
        if success_reward in (spec, getattr(function, "__name__", None)):
            return index
    names = [n for spec, f in rewards for n in dict.fromkeys((spec, getattr(f, "__name__", spec)))]
    raise InputError(f"--success_reward {success_reward!r} is none of the rewards given ({', '.join(names)}).")


def relay_sampling(recorded: Sampling | None, args) -> Sampling:
    """The run's sampling settings (or the fallback), with what the command line sets explicitly on top."""

    base = recorded or FALLBACK_SAMPLING
    if recorded is None:
        print("note: the run's seed shards record no sampling settings; using temperature 1, 64 tokens where unset.")
    overrides = {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "max_completion_length": args.max_new_tokens,
        "cut_at_newline": args.cut_at_newline,
    }
    sampling = dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
    if sampling.max_completion_length is None:
        sampling = dataclasses.replace(sampling, max_completion_length=FALLBACK_SAMPLING.max_completion_length)
    if sampling.temperature < 0 or not 0 < sampling.top_p <= 1 or sampling.top_k < 0:
        raise InputError("--temperature must be >= 0, --top_p in (0, 1] and --top_k >= 0.")
    return sampling


def warn_training_overlap(rows: list[dict], shards) -> None:
    """Warns when relay prompts were training prompts of the run (its seed shards hold every prompt it trained on)."""
    if not shards:
        return

    trained = {
        prompt_id_of(as_chat(p)) for shard in shards for p in pq.read_table(shard, columns=["prompt"])[0].to_pylist()
    }
    seen = sum(prompt_id_of(as_chat(row["prompt"])) in trained for row in rows)
    if seen:
        print(f"warning: {seen} of {len(rows)} relay prompts are training prompts of the run.", file=sys.stderr)


def relay_samples(model_a, model_b, tokenizer, rows, ratios, args, sampling, rewards, success) -> list[dict]:
    """One record per (prompt, sample, condition, ratio) with the token counts, the response text and its rewards."""
    eos = tokenizer.eos_token_id
    contexts = [prompt_token_ids(tokenizer, row["prompt"]) for row in rows for _ in range(args.samples)]
    sources = [(row, s) for row in rows for s in range(args.samples)]
    budget = sampling.max_completion_length
    full = [budget] * len(contexts)
    # Common random numbers: sample s of a prompt draws the same uniform number at each response position in every
    # condition, so identical conditions give identical figures (B from an empty prefix of A's is B alone).
    streams = list(range(len(contexts)))
    a_solutions = sample_continuations(
        model_a, tokenizer, contexts, full, args.seed, args.batch_size, sampling, "A alone", streams
    )
    b_solutions = sample_continuations(
        model_b, tokenizer, contexts, full, args.seed, args.batch_size, sampling, "B alone", streams
    )
    boundaries = None
    if sampling.cut_at_newline:
        boundaries = boundary_token_ids(tokenizer)
    relay_contexts, relay_budgets, relay_keys, relay_streams = [], [], [], []
    for index, (context, solution) in enumerate(zip(contexts, a_solutions)):
        text = solution[:-1] if solution and solution[-1] == eos else solution  # EOS is not part of the text
        for ratio in ratios:
            k = relay_cut(text, ratio, boundaries)
            relay_contexts.append(context + solution[:k])
            relay_budgets.append(budget - k)
            relay_keys.append((index, ratio, k))
            relay_streams.append(streams[index])
    continuations = sample_continuations(
        model_b,
        tokenizer,
        relay_contexts,
        relay_budgets,
        args.seed,
        args.batch_size,
        sampling,
        "B from A",
        streams=relay_streams,
        offsets=[k for _, _, k in relay_keys],
    )
    records = []
    for (row, sample), a_ids, b_ids in zip(sources, a_solutions, b_solutions):
        for condition, ids in (("a_alone", a_ids), ("b_alone", b_ids)):
            records.append(_record(row, sample, condition, math.nan, 0, ids, tokenizer))
    for (index, ratio, k), continuation in zip(relay_keys, continuations):
        row, sample = sources[index]
        records.append(_record(row, sample, "b_from_a", ratio, k, a_solutions[index][:k] + continuation, tokenizer))
    score(records, rows, rewards, success, args.success_threshold)
    return records


def relay_cut(text_ids, ratio: float, boundaries) -> int:
    """`floor(ratio * len)`; with `boundaries`, a positive cut snaps to the nearest line end as the trainer's does."""
    k = math.floor(ratio * len(text_ids))
    if boundaries is None or ratio == 0 or len(text_ids) < 2:
        return k

    return choose_cut(text_ids, ratio, (), len(text_ids) + 1, boundaries).k


def score(records: list[dict], rows: list[dict], rewards, success: int, threshold: float) -> None:
    """Adds each reward, the success reward as `reward`, and `passed`; rewards get TRL's arguments.

    Like TRL, chat prompts give the reward the completion as a message list, and every dataset column as a keyword.
    """
    by_id = {row["prompt_id"]: row for row in rows}
    prompts = [as_chat(by_id[r["prompt_id"]]["prompt"]) for r in records]
    completions = [
        [{"role": "assistant", "content": r["response"]}] if isinstance(p, list) else r["response"]
        for r, p in zip(records, prompts)
    ]
    completion_ids = [[int(t) for t in r["response_ids"].split()] for r in records]
    columns = {k for row in rows for k in row} - {"prompt", "completion", "completion_ids"}
    extra = {k: [by_id[r["prompt_id"]].get(k) for r in records] for k in sorted(columns)}
    for index, (spec, function) in enumerate(rewards):
        scores = function(completions=completions, prompts=prompts, completion_ids=completion_ids, **extra)
        name = getattr(function, "__name__", spec)
        for record, value in zip(records, scores):
            value = math.nan if value is None else float(value)  # None: cannot score this sample (not a pass)
            record[f"reward_{name}"] = value
            if index == success:
                record["reward"] = value
                record["passed"] = int(value > threshold)


def _record(row, sample, condition, ratio, k, ids, tokenizer) -> dict:
    prompt = row["prompt"]
    return {
        "prompt_id": row["prompt_id"],
        "sample": sample,
        "condition": condition,
        "ratio": ratio,
        "prefix_tokens": k,
        "response_tokens": len(ids),
        "prompt": prompt if isinstance(prompt, str) else json.dumps(prompt),
        "answer": row.get("answer"),
        "response": tokenizer.decode(ids, skip_special_tokens=True),
        "response_ids": " ".join(map(str, ids)),
    }


def summarize(samples: list[dict], ratios: list[float], rng_seed: int = 0) -> list[dict]:
    """Per ratio: each condition's pass rate with its Wilson interval, and the paired differences with bootstrap ones.

    The flat baselines are repeated at every r. A difference is averaged over (prompt, sample) pairs; its interval
    resamples prompts.

    Long: one table's columns, computed in the order they are printed.
    """
    summary = []
    alone = {
        (s["condition"], s["prompt_id"], s["sample"]): s["passed"]
        for s in samples
        if s["condition"] in PAIRED.values()
    }
    prompt_ids = list(dict.fromkeys(s["prompt_id"] for s in samples))
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
                    "interval": "wilson",
                }
            )
        for name, baseline in PAIRED.items():
            per_prompt = defaultdict(list)
            for s in samples:
                if s["condition"] == "b_from_a" and s["ratio"] == ratio:
                    per_prompt[s["prompt_id"]].append(s["passed"] - alone[(baseline, s["prompt_id"], s["sample"])])
            mean, low, high = paired_bootstrap([per_prompt[p] for p in prompt_ids], rng_seed=rng_seed)
            summary.append(
                {
                    "ratio": ratio,
                    "condition": name,
                    "n": sum(len(v) for v in per_prompt.values()),
                    "passes": None,
                    "pass_rate": mean,
                    "ci_low": low,
                    "ci_high": high,
                    "interval": "paired bootstrap over prompts",
                }
            )
    return summary


def format_table(summary: list[dict]) -> str:
    return _ratio_table(summary, "ratio  B from A              A alone               B alone", CONDITIONS, ".3f")


def format_paired_table(summary: list[dict]) -> str:
    header = "ratio  B from A - A alone    B from A - B alone    (paired, 95% bootstrap over prompts)"
    return _ratio_table(summary, header, PAIRED, "+.3f")


def _ratio_table(summary: list[dict], header: str, conditions, number: str) -> str:
    """One line per cut ratio: each condition's pass rate (or difference) with its interval."""
    lines = [header]
    by_key = {(s["ratio"], s["condition"]): s for s in summary}
    for ratio in sorted({s["ratio"] for s in summary}):
        cells = []
        for condition in conditions:
            s = by_key[(ratio, condition)]
            cells.append(f"{s['pass_rate']:{number}} [{s['ci_low']:{number}}, {s['ci_high']:{number}}]")
        lines.append(f"{ratio:<5.2f}  " + "  ".join(f"{cell:<20}" for cell in cells))
    return "\n".join(lines)


def plot(summary: list[dict], path, args) -> None:
    import matplotlib  # lazy: start-up time; a figure is drawn once, at the end

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    fig, (ax, diff_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
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
    diff_labels = {"b_from_a_minus_a_alone": "B from A - A alone", "b_from_a_minus_b_alone": "B from A - B alone"}
    for name, label in diff_labels.items():
        points = sorted((s for s in summary if s["condition"] == name), key=lambda s: s["ratio"])
        x = [s["ratio"] for s in points]
        low = [s["pass_rate"] - s["ci_low"] for s in points]
        high = [s["ci_high"] - s["pass_rate"] for s in points]
        diff_ax.errorbar(x, [s["pass_rate"] for s in points], yerr=[low, high], fmt="-o", capsize=3, label=label)
    diff_ax.axhline(0, color="grey", linewidth=0.8)
    diff_ax.set_title("Paired differences in pass rate (95% bootstrap over prompts)", fontsize=9)
    diff_ax.set_xlabel("cut ratio r")
    diff_ax.set_ylabel("difference in pass rate")
    diff_ax.grid(alpha=0.3)
    diff_ax.legend(loc="best", fontsize=8)
    fig.text(0.01, 0.01, f"A = {args.checkpoint_a}\nB = {args.checkpoint_b}", fontsize=6, va="bottom")
    save_figure(fig, path, rect=(0, 0.05, 1, 1))


if __name__ == "__main__":
    raise SystemExit(run_command(main, prog="ts_trl relay"))
