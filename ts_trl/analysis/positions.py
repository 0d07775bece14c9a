"""Token-position analysis: how far the current policy has moved from the seeds' behaviour policies, along the seed.

For each rollout of a seed dataset, the current checkpoint scores the tokens that rollout's policy generated; a
seeded row's first `prefix_len` tokens were copied from its origin (another policy, scored with that row) and are
context here, not scored again. With the behaviour policy q (the policy that sampled the tokens), the current
policy p, both read at the run's sampling temperature, and `d = log p(token) - log q(token)` per token:

- `mean_log_ratio`: mean of `d` per relative-position bucket of the generated part;
- `kl_k3`: the per-token KL(q || p) estimate `exp(d) - 1 - d` (Schulman's k3, unbiased and >= 0) per bucket;
- `cum_log_ratio`, `cum_kl_k3`: the same summed along the prefix up to the bucket's end, per rollout, then
  averaged: the divergence a restart at that cut has accumulated (what bounds the state-distribution mismatch);
- `coverage`: `E_q[min(1, p(prefix) / q(prefix))]` over the prefixes cut at the bucket's end (`prefix_overlap`),
  the share of the seeds' prefix mass the current policy still reaches: 1 when p = q at any depth, falling as p
  moves away; `share_ratio_ge_c`: the share of those prefixes with `p(prefix) / q(prefix) >= c` (`--min_ratio`).

The same statistics over whole generated parts, grouped by seed age (checkpoint step minus the rollout's step), go
to `positions_by_age.csv`. Run `ts_trl positions --help`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import numpy as np

from ..flags import accept_both_spellings
from ..store.format import load_seed_table, resolve_seed_dataset
from ..store.resume import checkpoint_step
from ..store.schema import tokenizer_fingerprint
from .common import (
    InputError,
    Sampling,
    load_checkpoint,
    output_dir,
    prefix_overlap,
    prompt_token_ids,
    quiet_libraries,
    read_sampling,
    run_command,
    save_figure,
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
        "--min_ratio",
        type=float,
        default=0.1,
        help="c of the share_ratio_ge_c column: share of prefixes with p(prefix) / q(prefix) >= c.",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="Sampling temperature of the seeds' run (default: the one its shards record).",
    )
    parser.add_argument("--max_rollouts", type=int, default=2000, help="Score at most this many rollouts (sampled).")
    parser.add_argument("--min_length", type=int, default=2, help="Skip rollouts that generated fewer tokens.")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="Which rollouts are sampled when there are too many.")
    parser.add_argument("--output_dir", default="positions", help="Where positions.csv and positions.png go.")
    return accept_both_spellings(parser)


def main(argv: list[str] | None = None) -> list[dict]:
    """Runs `ts_trl positions` on `argv`; returns its rows.

    Long: the command's linear script (parse, check, load, measure, write), as TRL's scripts are.
    """
    args = build_parser().parse_args(argv)
    if args.buckets < 1 or args.max_rollouts < 1:
        raise InputError("--buckets and --max_rollouts must be positive.")
    if not args.min_ratio > 0:
        raise InputError(f"--min_ratio must be positive, got {args.min_ratio}.")
    quiet_libraries()
    model, tokenizer = load_checkpoint(args.checkpoint, "checkpoint")
    try:
        table = load_seed_table(args.seeds, tokenizer_fingerprint(tokenizer), len(tokenizer))
        shards = resolve_seed_dataset(args.seeds)
    except ValueError as error:  # missing dataset, missing columns, another tokenizer: the library's one-line reason
        raise InputError(str(error).split("\n")[0]) from error
    sampling = read_sampling(shards)
    if sampling is None and args.temperature is None:
        raise InputError(
            f"seed dataset {args.seeds!r} does not record its sampling temperature (written by an older ts_trl); "
            "pass --temperature with the run's value."
        )
    if args.temperature is not None:
        if not args.temperature > 0:
            raise InputError(f"--temperature must be positive, got {args.temperature}.")
        sampling = dataclasses.replace(sampling or Sampling(), temperature=args.temperature)
    rollouts = [r for r in table.to_pylist() if len(r["completion_ids"]) - _copied(r) >= args.min_length]
    if not rollouts:
        raise InputError(f"seed dataset {args.seeds!r} has no rollout that generated {args.min_length} tokens.")
    if len(rollouts) > args.max_rollouts:
        chosen = np.random.default_rng(args.seed).choice(len(rollouts), args.max_rollouts, replace=False)
        rollouts = [rollouts[i] for i in sorted(chosen)]
    try:
        step = checkpoint_step(args.checkpoint)
    except ValueError:  # a bare model folder: ages count back from the newest rollout
        step = None
    newest = max(r["step"] for r in rollouts)
    if step is not None and newest > step:
        later = sum(r["step"] > step for r in rollouts)
        print(
            f"warning: {later} of {len(rollouts)} rollouts were generated after the checkpoint (step {step}, rollouts "
            f"up to step {newest}); their behaviour policy is newer than the one scored (negative ages).",
            file=sys.stderr,
        )
    contexts = [prompt_token_ids(tokenizer, r["prompt"]) + list(r["completion_ids"][: _copied(r)]) for r in rollouts]
    generated = [r["completion_ids"][_copied(r) :] for r in rollouts]
    current = [np.asarray(c) for c in token_logprobs(model, contexts, generated, args.batch_size, sampling)]
    behaviour = [np.asarray(r["logprobs"][_copied(r) :], float) for r in rollouts]
    summary = bucket_statistics(current, behaviour, args.buckets, args.min_ratio)
    ages = [(step if step is not None else newest) - r["step"] for r in rollouts]
    by_age = age_statistics(current, behaviour, ages, args.min_ratio)
    out = output_dir(args.output_dir)
    csv_path, age_path, plot_path = out / "positions.csv", out / "positions_by_age.csv", out / "positions.png"
    write_csv(csv_path, summary)
    write_csv(age_path, by_age)
    steps = sorted({r["step"] for r in rollouts})
    plot(summary, plot_path, args, len(rollouts), steps, sampling)
    print(format_table(summary))
    print(format_age_table(by_age))
    seeded = sum(_copied(r) > 0 for r in rollouts)
    print(
        f"{len(rollouts)} rollouts (steps {steps[0]}..{steps[-1]}; {seeded} seeded, scored on their generated part "
        f"only), scored at {sampling.describe()}"
    )
    print(f"wrote {csv_path}, {age_path} and {plot_path}")
    return summary


def _copied(rollout: dict) -> int:
    """How many leading tokens of a row were copied from its seed rather than generated by its own policy."""
    return int(rollout.get("prefix_len") or 0)


def _divergences(logp: np.ndarray, beh: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per token: d = log p - log q, k3 = exp(d) - 1 - d, and whether q's log-prob is known (NaN when not)."""
    d = logp - beh
    known = ~np.isnan(d)
    safe = np.where(known, d, 0.0)
    return d, np.where(known, np.exp(safe) - 1 - safe, 0.0), known


def bucket_statistics(current: list[np.ndarray], behaviour: list[np.ndarray], buckets: int, min_ratio: float = 0.1):
    """The per-bucket statistics of the module docstring; tokens with an unknown behaviour log-prob are skipped.

    A prefix holding such a token has no known q(prefix) and is left out of the cumulative and coverage columns.
    """
    sums = {name: np.zeros(buckets) for name in ("log_ratio", "kl", "tokens")}
    cum = {name: [[] for _ in range(buckets)] for name in ("log_ratio", "kl", "logp", "beh")}
    for logp, beh in zip(current, behaviour):
        n = len(logp)
        d, k3, known = _divergences(logp, beh)
        bucket_of = np.minimum((np.arange(n) * buckets) // n, buckets - 1)
        for b in range(buckets):
            in_bucket = (bucket_of == b) & known
            sums["log_ratio"][b] += d[in_bucket].sum()
            sums["kl"][b] += k3[in_bucket].sum()
            sums["tokens"][b] += in_bucket.sum()
            end = math.ceil((b + 1) * n / buckets)  # the prefix up to the bucket's end
            if end == 0 or not (bucket_of == b).any() or not known[:end].all():
                continue
            cum["log_ratio"][b].append(d[:end].sum())
            cum["kl"][b].append(k3[:end].sum())
            cum["logp"][b].append(logp[:end].sum())
            cum["beh"][b].append(beh[:end].sum())
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
                "cum_log_ratio": _mean(cum["log_ratio"][b]),
                "cum_kl_k3": _mean(cum["kl"][b]),
                **_coverage(cum["logp"][b], cum["beh"][b], min_ratio),
            }
        )
    return summary


def age_statistics(current, behaviour, ages: list[int], min_ratio: float = 0.1) -> list[dict]:
    """Per seed age (checkpoint step - rollout step), the statistics of whole generated parts."""
    rows = []
    for age in sorted(set(ages)):
        chosen = [i for i, a in enumerate(ages) if a == age]
        d_all, k3_all, whole = [], [], {"log_ratio": [], "kl": [], "logp": [], "beh": []}
        for i in chosen:
            d, k3, known = _divergences(current[i], behaviour[i])
            d_all.append(d[known])
            k3_all.append(k3[known])
            if known.all():
                whole["log_ratio"].append(d.sum())
                whole["kl"].append(k3.sum())
                whole["logp"].append(current[i].sum())
                whole["beh"].append(behaviour[i].sum())
        d_all, k3_all = np.concatenate(d_all), np.concatenate(k3_all)
        rows.append(
            {
                "age": age,
                "rollouts": len(chosen),
                "tokens": len(d_all),
                "mean_log_ratio": float(d_all.mean()) if len(d_all) else math.nan,
                "kl_k3": float(k3_all.mean()) if len(k3_all) else math.nan,
                "cum_log_ratio": _mean(whole["log_ratio"]),
                "cum_kl_k3": _mean(whole["kl"]),
                **_coverage(whole["logp"], whole["beh"], min_ratio),
            }
        )
    return rows


def _mean(values) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def _coverage(logp_prefix, beh_prefix, min_ratio: float) -> dict:
    log_ratio = np.asarray(logp_prefix, float) - np.asarray(beh_prefix, float)
    return {
        "coverage": prefix_overlap(logp_prefix, beh_prefix) if len(log_ratio) else math.nan,
        "share_ratio_ge_c": float(np.mean(log_ratio >= math.log(min_ratio))) if len(log_ratio) else math.nan,
    }


def format_table(summary: list[dict]) -> str:
    rows = [(f"{s['bucket']:<6}  {s['rel_start']:.2f}-{s['rel_end']:.2f}", s) for s in summary]
    return _divergence_table("bucket  position  ", rows)


def format_age_table(by_age: list[dict]) -> str:
    return _divergence_table("age     rollouts", [(f"{s['age']:<6}  {s['rollouts']:<8}", s) for s in by_age])


def _divergence_table(header: str, rows: list[tuple[str, dict]]) -> str:
    """One line per row: its label, then tokens and the divergence statistics."""
    lines = [f"{header}  tokens  mean_log_ratio  kl_k3     cum_kl_k3  coverage"]
    for label, s in rows:
        lines.append(
            f"{label}  {s['tokens']:<6}  {s['mean_log_ratio']:<14.4f}  {s['kl_k3']:<8.4f}  {s['cum_kl_k3']:<9.4f}"
            f"  {s['coverage']:.3f}"
        )
    return "\n".join(lines)


def plot(summary: list[dict], path, args, num_rollouts: int, steps: list[int], sampling: Sampling) -> None:
    import matplotlib  # lazy: start-up time; a figure is drawn once, at the end

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    x = [(s["rel_start"] + s["rel_end"]) / 2 for s in summary]
    ends = [s["rel_end"] for s in summary]
    panels = (
        (x, "mean_log_ratio", "mean log p_current - log p_behaviour", "Per-token log-ratio"),
        (x, "kl_k3", "KL(behaviour || current) per token (k3)", "Per-token KL estimate"),
        (ends, "cum_kl_k3", "summed k3 KL up to the cut", "Divergence accumulated along the prefix"),
        (ends, "coverage", "E_q[min(1, p(prefix) / q(prefix))]", "State coverage of seed prefixes"),
    )
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (xs, key, ylabel, title) in zip(axes.flat, panels):
        ax.plot(xs, [s[key] for s in summary], "-o", label=key)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("relative position in the generated part" if xs is x else "cut position (share of it)")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes.flat[0].axhline(0, color="grey", linewidth=0.8)
    axes.flat[3].set_ylim(-0.02, 1.02)
    fig.suptitle(
        f"Current policy vs. seeds' behaviour policies: {num_rollouts} rollouts, steps {steps[0]}..{steps[-1]}, "
        f"generated tokens only, {sampling.describe()}\ncheckpoint = {args.checkpoint}",
        fontsize=10,
    )
    save_figure(fig, path)


if __name__ == "__main__":
    raise SystemExit(run_command(main, prog="ts_trl positions"))
