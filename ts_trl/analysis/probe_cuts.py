"""Before seeding a task: how often a cut seed leaves its group all-equal (no signal), per cut ratio, on one model.

For each training prompt the model samples `--seeds` whole solutions (the seeds) and a plain group of
`--generations` solutions. Each seed is cut at every ratio r as the trainer cuts it (`ts_trl.method.cutting.choose_cut`: the
first floor(r * length) tokens, before EOS), and the model continues it `--generations` times; the reward sees the
prefix and the continuation. Per r it reports the share of seeded groups whose rewards are all equal (split by
whether the seed itself passed or failed), the pass rate of seeded samples, and the same for plain groups. An
all-equal group carries no GRPO signal, so a cut range whose seeded groups are all-equal much more often than plain
ones wastes the seeded rollouts. The suggested `cut_ratio_max` is the largest candidate whose seeded all-equal share,
averaged over the probed ratios in [`--cut-ratio-min`, candidate] (what r ~ U[min, max] sees), is at most the plain
share plus `--margin`. Run `ts_trl probe-cuts --help`.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from ..embedded.tasks import TASKS, build_task_model, make_task, single_turn_only, task_spec
from ..method.cutting import boundary_token_ids, choose_cut
from .common import (
    InputError,
    check_ratios,
    load_checkpoint,
    output_dir,
    prompt_token_ids,
    quiet_libraries,
    run_command,
    sample_continuations,
    write_csv,
)

DEFAULT_RATIOS = (0.1, 0.3, 0.5, 0.7, 0.9)
CANDIDATES = (0.9, 0.7, 0.5, 0.3)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ts_trl probe-cuts", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--task",
        default="add",
        help="Built-in single-turn task: add, chain, chain-strict, chat-add or chat-chain (its prompts and reward).",
    )
    parser.add_argument(
        "--checkpoint",
        help="A model folder to probe (default: the task's model: the tiny tasks' warm model, cached; for chat-add "
        "the real SmolLM2-135M-Instruct).",
    )
    parser.add_argument("--ratios", type=float, nargs="+", default=list(DEFAULT_RATIOS), help="Cut ratios in [0, 1).")
    parser.add_argument("--num-prompts", type=int, default=48, help="Training prompts probed.")
    parser.add_argument("--seeds", type=int, default=4, help="Seeds sampled per prompt (each cut at every ratio).")
    parser.add_argument("--generations", type=int, default=8, help="Group size: continuations per cut seed.")
    parser.add_argument("--max-completion-length", type=int, help="Token budget (default: the task's).")
    parser.add_argument("--cut-ratio-min", type=float, default=0.1, help="Lower end of the cut range to be used.")
    parser.add_argument(
        "--cut-at-newline",
        action=argparse.BooleanOptionalAction,
        help="Snap each cut to a line start, as training with cut_at_newline does (default: the task's recipe).",
    )
    parser.add_argument(
        "--candidates", type=float, nargs="+", default=list(CANDIDATES), help="cut_ratio_max values tried, any order."
    )
    parser.add_argument("--margin", type=float, default=0.10, help="Allowed excess of the seeded all-equal share.")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0, help="Seed of the sampling.")
    parser.add_argument("--output-dir", default="probe-cuts", help="Where probe_cuts.csv and probe_cuts.md go.")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)

    if args.task not in TASKS:
        raise InputError(f"--task {args.task}: unknown built-in task; choose one of {', '.join(TASKS)}.")
    try:
        single_turn_only(args.task, "probe-cuts")
    except ValueError as error:
        raise InputError(str(error)) from None
    ratios = check_ratios(args.ratios)
    for name in ("num_prompts", "seeds", "generations", "batch_size"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}.")
    if args.generations < 2:
        raise InputError("--generations must be at least 2: a group of one is always all-equal.")
    quiet_libraries()

    torch.set_num_threads(1)  # the tiny model gains nothing from a second thread on a busy machine
    spec = task_spec(args.task)
    task = make_task(args.task)
    budget = args.max_completion_length or spec.max_completion_length
    if args.cut_at_newline is None:
        args.cut_at_newline = bool(spec.train_defaults.get("cut_at_newline", False))
    if args.checkpoint:
        model, tokenizer = load_checkpoint(args.checkpoint)
    elif spec.real_model is not None:  # a pretrained model is its own warm start
        model, tokenizer = load_checkpoint(spec.real_model, "model")
    else:
        model, tokenizer = build_task_model(args.task, task, progress=False)
    model.eval()
    rows = task.make_splits(args.num_prompts, 1)[0].to_list()
    records = probe(model, tokenizer, rows, ratios, args, budget)
    summary = summarize(records, ratios)
    choice = choose_cut_ratio_max(summary, args.cut_ratio_min, args.candidates, args.margin)
    out = output_dir(args.output_dir)
    write_csv(out / "probe_cuts.csv", summary)
    write_csv(out / "probe_cuts_groups.csv", records)
    text = format_table(summary, choice, args, budget)
    (out / "probe_cuts.md").write_text(text + "\n")
    print(text)
    print(f"wrote {out / 'probe_cuts.csv'}, {out / 'probe_cuts_groups.csv'}, {out / 'probe_cuts.md'}")
    return {"summary": summary, "cut_ratio_max": choice}


def probe(model, tokenizer, rows: list[dict], ratios: list[float], args, budget: int) -> list[dict]:
    """One record per group: kind (plain / seeded), ratio, the seed's own reward, passes and the group size.

    Long: one sampling pass whose plain and seeded groups share every step; split, they would drift apart.
    """

    reward = task_spec(args.task).reward
    eos = [tokenizer.eos_token_id]
    boundaries = boundary_token_ids(tokenizer) if args.cut_at_newline else None
    prompts = [prompt_token_ids(tokenizer, row["prompt"]) for row in rows]  # chat prompts through the template
    g = args.generations

    def score(row_indices, token_lists):
        texts = tokenizer.batch_decode(token_lists, skip_special_tokens=True)
        return reward(
            completions=texts,
            answer=[rows[i]["answer"] for i in row_indices],
            prompts=[rows[i]["prompt"] for i in row_indices],
        )

    # Seeds and plain groups in one sampling pass: per prompt, `seeds` seeds then `g` plain samples.
    owners = [i for i in range(len(rows)) for _ in range(args.seeds + g)]
    samples = sample_continuations(
        model,
        tokenizer,
        [prompts[i] for i in owners],
        [budget] * len(owners),
        args.seed,
        args.batch_size,
        desc="seeds",
    )
    rewards = score(owners, samples)
    records, seeds = [], []
    for i in range(len(rows)):
        base = i * (args.seeds + g)
        seeds += [(i, samples[base + s], rewards[base + s]) for s in range(args.seeds)]
        plain = rewards[base + args.seeds : base + args.seeds + g]
        records.append(
            {"kind": "plain", "ratio": "", "seed_passed": "", "passes": int(sum(plain)), "size": g, "prompt": i}
        )
    contexts, budgets, jobs = [], [], []
    for ratio in ratios:
        for i, seed_ids, seed_reward in seeds:
            cut = choose_cut(seed_ids, ratio, eos, budget, boundaries)
            if cut is None:
                continue
            jobs.append((ratio, i, seed_ids[: cut.k], seed_reward))
            contexts += [prompts[i] + seed_ids[: cut.k]] * g
            budgets += [budget - cut.k] * g
    continuations = sample_continuations(
        model, tokenizer, contexts, budgets, args.seed + 1, args.batch_size, desc="continuations"
    )
    for j, (ratio, i, prefix, seed_reward) in enumerate(jobs):
        group = [prefix + c for c in continuations[j * g : (j + 1) * g]]
        passes = sum(score([i] * g, group))
        records.append(
            {
                "kind": "seeded",
                "ratio": ratio,
                "seed_passed": int(seed_reward >= 1.0),
                "passes": int(passes),
                "size": g,
                "prompt": i,  # so that a selection by prompt (passrate) can be read off the groups
            }
        )
    return records


def summarize(records: list[dict], ratios: list[float]) -> list[dict]:
    """Per ratio: all-equal shares (seeded, by seed outcome, plain) and pass rates; plain groups repeat per row."""

    def share(groups):
        return float(np.mean([r["passes"] in (0, r["size"]) for r in groups])) if groups else float("nan")

    def rate(groups):
        return float(sum(r["passes"] for r in groups) / sum(r["size"] for r in groups)) if groups else float("nan")

    plain = [r for r in records if r["kind"] == "plain"]
    out = []
    for ratio in ratios:
        seeded = [r for r in records if r["kind"] == "seeded" and r["ratio"] == ratio]
        success = [r for r in seeded if r["seed_passed"] == 1]
        failure = [r for r in seeded if r["seed_passed"] == 0]
        out.append(
            {
                "ratio": ratio,
                "seeded_groups": len(seeded),
                "all_equal_seeded": share(seeded),
                "all_equal_seed_success": share(success),
                "all_equal_seed_failure": share(failure),
                "all_equal_plain": share(plain),
                "pass_seeded": rate(seeded),
                "pass_seed_success": rate(success),
                "pass_seed_failure": rate(failure),
                "pass_plain": rate(plain),
                "seed_success_groups": len(success),
                "seed_failure_groups": len(failure),
            }
        )
    return out


def choose_cut_ratio_max(summary: list[dict], cut_ratio_min: float, candidates, margin: float) -> float | None:
    """The largest candidate whose mean seeded all-equal share over probed ratios in [min, candidate] is at most the
    plain share + `margin`; None when no candidate passes (or none has a probed ratio in its range)."""
    plain = summary[0]["all_equal_plain"]
    for candidate in sorted(candidates, reverse=True):
        shares = [row["all_equal_seeded"] for row in summary if cut_ratio_min <= row["ratio"] <= candidate + 1e-9]
        shares = [s for s in shares if not np.isnan(s)]
        if shares and float(np.mean(shares)) <= plain + margin:
            return candidate
    return None


def format_table(summary: list[dict], choice: float | None, args, budget: int) -> str:
    groups = summary[0]
    lines = [
        f"Cut probe, task {args.task}, {args.checkpoint or 'warm model'}: {args.num_prompts} training prompts x "
        f"{args.seeds} seeds, groups of {args.generations}, budget {budget} tokens, temperature 1"
        f"{', cuts snapped to line starts' if args.cut_at_newline else ''}.",
        "",
        "| r | seeded groups | all-equal seeded | after a passing seed | after a failing seed | all-equal plain | "
        "pass seeded | pass after passing / failing seed | pass plain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary:
        lines.append(
            f"| {row['ratio']:g} | {row['seeded_groups']} | {row['all_equal_seeded']:.2f} | "
            f"{row['all_equal_seed_success']:.2f} ({row['seed_success_groups']}) | "
            f"{row['all_equal_seed_failure']:.2f} ({row['seed_failure_groups']}) | {row['all_equal_plain']:.2f} | "
            f"{row['pass_seeded']:.3f} | {row['pass_seed_success']:.3f} / {row['pass_seed_failure']:.3f} | "
            f"{row['pass_plain']:.3f} |"
        )
    rule = (
        f"the largest of {sorted(args.candidates, reverse=True)} whose mean seeded all-equal share over the probed "
        f"ratios in [{args.cut_ratio_min:g}, it] is at most the plain share ({groups['all_equal_plain']:.2f}) + "
        f"{args.margin:.2f}"
    )
    verdict = f"cut_ratio_max = {choice:g}" if choice is not None else "no candidate passes"
    lines += ["", f"Rule: {rule}. Result: {verdict}."]
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> int:
    return run_command(main, argv, prog="ts_trl probe-cuts")


if __name__ == "__main__":
    raise SystemExit(cli())
