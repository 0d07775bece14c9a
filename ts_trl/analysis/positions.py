"""Token-position analysis: how far the current policy has moved from the seeds' behaviour policies, along the seed.

For each rollout of a seed dataset, the current checkpoint scores every completion token; with `d = logp_current -
logp_behaviour` per token (tokens were sampled by the behaviour policy q, the current policy is p):

- `mean_log_ratio`: mean of `d` per relative-position bucket (positive: p likes q's tokens more than q did);
- `kl_k3`: the per-token KL(q || p) estimate `exp(d) - 1 - d` (Schulman's k3, unbiased and >= 0) per bucket;
- `cum_kl_k3`, `cum_log_ratio`: the same summed along the prefix up to the bucket's end, per rollout, then averaged:
  the divergence a restart at that cut has accumulated (what bounds the state-distribution mismatch);
- `coverage`: the share of seed prefixes, cut at the bucket's end, whose mean per-token log-prob under the current
  policy is at least `--threshold`: states the current policy still reaches with non-negligible probability.

Run `ts_trl positions --help`.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from ..snapshots import load_seed_table, tokenizer_fingerprint
from .common import (
    InputError,
    load_checkpoint,
    output_dir,
    prompt_token_ids,
    quiet_libraries,
    run_command,
    token_logprobs,
    write_csv,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ts_trl positions", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seeds", required=True, help="Seed dataset: a run's output_dir, its seeds/ folder or shards."
    )
    parser.add_argument("--checkpoint", required=True, help="Folder of the current checkpoint.")
    parser.add_argument("--buckets", type=int, default=10, help="Number of relative-position buckets.")
    parser.add_argument(
        "--threshold",
        type=float,
        default=-1.0,
        help="State coverage: a prefix counts as covered when its mean per-token log-prob is >= this (nats).",
    )
    parser.add_argument("--max-rollouts", type=int, default=2000, help="Score at most this many rollouts (sampled).")
    parser.add_argument("--min-length", type=int, default=2, help="Skip rollouts shorter than this many tokens.")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="Which rollouts are sampled when there are too many.")
    parser.add_argument("--output-dir", default="positions", help="Where positions.csv and positions.png go.")
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    if args.buckets < 1 or args.max_rollouts < 1:
        raise InputError("--buckets and --max-rollouts must be positive.")
    quiet_libraries()
    model, tokenizer = load_checkpoint(args.checkpoint, "checkpoint")
    try:
        table = load_seed_table(args.seeds, tokenizer_fingerprint(tokenizer), len(tokenizer))
    except ValueError as error:  # missing dataset, missing columns, another tokenizer: the library's one-line reason
        raise InputError(str(error).split("\n")[0]) from error
    rollouts = [r for r in table.to_pylist() if len(r["completion_ids"]) >= args.min_length]
    if not rollouts:
        raise InputError(f"seed dataset {args.seeds!r} has no rollout of at least {args.min_length} tokens.")
    if len(rollouts) > args.max_rollouts:
        chosen = np.random.default_rng(args.seed).choice(len(rollouts), args.max_rollouts, replace=False)
        rollouts = [rollouts[i] for i in sorted(chosen)]
    contexts = [prompt_token_ids(tokenizer, r["prompt"]) for r in rollouts]
    current = token_logprobs(model, contexts, [r["completion_ids"] for r in rollouts], args.batch_size)
    summary = bucket_statistics(
        [np.asarray(c) for c in current],
        [np.asarray(r["logprobs"], float) for r in rollouts],
        args.buckets,
        args.threshold,
    )
    out = output_dir(args.output_dir)
    csv_path, plot_path = out / "positions.csv", out / "positions.png"
    write_csv(csv_path, summary)
    steps = sorted({r["step"] for r in rollouts})
    plot(summary, plot_path, args, len(rollouts), steps)
    print(format_table(summary))
    covered = np.nanmean([s["coverage"] for s in summary])
    print(f"{len(rollouts)} rollouts (steps {steps[0]}..{steps[-1]}); mean state coverage {covered:.3f}")
    print(f"wrote {csv_path} and {plot_path}")
    return summary


def bucket_statistics(current: list[np.ndarray], behaviour: list[np.ndarray], buckets: int, threshold: float):
    """The per-bucket statistics of the module docstring; tokens with an unknown behaviour log-prob are skipped."""
    sums = {name: np.zeros(buckets) for name in ("log_ratio", "kl", "tokens")}
    cum = {name: [[] for _ in range(buckets)] for name in ("log_ratio", "kl", "covered")}
    for logp, beh in zip(current, behaviour):
        n = len(logp)
        d = logp - beh
        known = ~np.isnan(d)
        k3 = np.where(known, np.exp(np.where(known, d, 0)) - 1 - np.where(known, d, 0), 0.0)
        bucket_of = np.minimum((np.arange(n) * buckets) // n, buckets - 1)
        for b in range(buckets):
            in_bucket = (bucket_of == b) & known
            sums["log_ratio"][b] += d[in_bucket].sum()
            sums["kl"][b] += k3[in_bucket].sum()
            sums["tokens"][b] += in_bucket.sum()
            end = math.ceil((b + 1) * n / buckets)  # the prefix up to the bucket's end
            if end == 0 or not (bucket_of == b).any():
                continue
            cum["log_ratio"][b].append(np.where(known[:end], d[:end], 0).sum())
            cum["kl"][b].append(k3[:end].sum())
            cum["covered"][b].append(float(logp[:end].mean() >= threshold))
    summary = []
    for b in range(buckets):
        tokens = sums["tokens"][b]
        summary.append(
            {
                "bucket": b,
                "rel_start": b / buckets,
                "rel_end": (b + 1) / buckets,
                "tokens": int(tokens),
                "prefixes": len(cum["kl"][b]),
                "mean_log_ratio": sums["log_ratio"][b] / tokens if tokens else math.nan,
                "kl_k3": sums["kl"][b] / tokens if tokens else math.nan,
                "cum_log_ratio": float(np.mean(cum["log_ratio"][b])) if cum["log_ratio"][b] else math.nan,
                "cum_kl_k3": float(np.mean(cum["kl"][b])) if cum["kl"][b] else math.nan,
                "coverage": float(np.mean(cum["covered"][b])) if cum["covered"][b] else math.nan,
            }
        )
    return summary


def format_table(summary: list[dict]) -> str:
    lines = ["bucket  position    tokens  mean_log_ratio  kl_k3     cum_kl_k3  coverage"]
    for s in summary:
        lines.append(
            f"{s['bucket']:<6}  {s['rel_start']:.2f}-{s['rel_end']:.2f}  {s['tokens']:<6}  {s['mean_log_ratio']:<14.4f}"
            f"  {s['kl_k3']:<8.4f}  {s['cum_kl_k3']:<9.4f}  {s['coverage']:.3f}"
        )
    return "\n".join(lines)


def plot(summary: list[dict], path, args, num_rollouts: int, steps: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [(s["rel_start"] + s["rel_end"]) / 2 for s in summary]
    ends = [s["rel_end"] for s in summary]
    panels = (
        (x, "mean_log_ratio", "mean log p_current - log p_behaviour", "Per-token log-ratio"),
        (x, "kl_k3", "KL(behaviour || current) per token (k3)", "Per-token KL estimate"),
        (ends, "cum_kl_k3", "summed k3 KL up to the cut", "Divergence accumulated along the prefix"),
        (ends, "coverage", f"share with mean log p >= {args.threshold:g}", "State coverage of seed prefixes"),
    )
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (xs, key, ylabel, title) in zip(axes.flat, panels):
        ax.plot(xs, [s[key] for s in summary], "-o", label=key)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("relative position in the seed" if xs is x else "cut position (share of the seed)")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes.flat[0].axhline(0, color="grey", linewidth=0.8)
    axes.flat[3].set_ylim(-0.02, 1.02)
    fig.suptitle(
        f"Current policy vs. seeds' behaviour policies: {num_rollouts} rollouts, steps {steps[0]}..{steps[-1]}\n"
        f"checkpoint = {args.checkpoint}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cli(argv: list[str] | None = None) -> int:
    return run_command(main, argv)


if __name__ == "__main__":
    raise SystemExit(cli())
