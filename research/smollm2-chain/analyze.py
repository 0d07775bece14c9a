"""Every figure of the chat-chain comparison, recomputed from the committed runs (research/prereg-smollm2-chain.md).

    python research/smollm2-chain/analyze.py [--arms seeds [paper]] [--runs research/smollm2-chain/runs]

Round 1's script (research/smollm2/analyze.py) with round 2's protocol: RNG seeds 0-7, each seeded arm (`seeds`, the
probe-picked one, and `paper` where it ran) against `none`, Holm over every (arm, endpoint) test, the smallest
detectable difference after Holm, and the plateau check. Committed before any run existed.

Reads each run's `metrics.jsonl` (training logs) and `learning_curve.csv` (held-out pass@1 at steps 0, 20, ..., 80),
prints the record's tables as Markdown, and writes `summary.json` and `curves.png` beside the runs. Written and
committed before any run's data was read; it decides nothing the protocol does not fix.

Cumulative counts. TRL logs the mean of each metric over a logging window (`logging_steps` 2 here), so a window's
total is its logged mean times the steps it covers (`step` minus the previous logged step). Generated tokens are
`seeds/generated_tokens` (tokens the policy sampled; a seed prefix is not generated). The on-policy arm logs no
`seeds/*` metrics; there every sampled token is generated, and its count is TRL's `completions/mean_length` times the
16 rows of a step. For the seeded arm both counts are printed side by side (they must agree: its
`completions/mean_length` is also taken over what was generated). Wall time is TRL's `step_time` (a training step,
generation included; the held-out evaluations are not in it).

A run cut off by a session's end resumes from its last checkpoint (the protocol's section on sessions), and
`metrics.jsonl` is appended to, so it also holds the steps the cut-off run logged after that checkpoint. Those steps
were abandoned and done again: every count here follows the timeline that reached the end (`logged`). This rule was
added after seed 0 and before any run was resumed or any outcome read; a run that was never resumed reads the same.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import numpy as np

from ts_trl.analysis.stats import ALPHA, holm, paired_t

SEEDS = tuple(range(8))
SEEDED = ("seeds",)  # the seeded arms compared with `none`; `--arms seeds paper` where the third arm ran
GATE = 0.05  # on-policy must gain at least this much held-out pass@1 (mean over seeds, last evaluation against step 0)
PLATEAU = 0.03  # on-policy's mean rise over its last 20 steps above which the plateau was not reached
ROWS_PER_STEP = 16  # the recipe's per_device_train_batch_size (4 prompts x 4 samples), one process
ENDPOINTS = (("tokens", "equal generated tokens"), ("seconds", "equal wall time"))
HERE = Path(__file__).resolve().parent
ARMS = ("none", *SEEDED)


def logged(folder: Path) -> list[dict]:
    """The run's logged dicts along the timeline that reached its end: where a training step's log goes back to or
    before one already logged (a resume from a checkpoint), what the cut-off run had logged from that step on is
    dropped. (An evaluation logs at the step of the training log before it, so only training logs are compared.)"""
    kept: list[dict] = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        h = json.loads(line)
        trained = [k["step"] for k in kept if "step_time" in k]
        if "step_time" in h and trained and h["step"] <= trained[-1]:
            kept = [k for k in kept if k["step"] < h["step"]]
        kept.append(h)
    return kept


def load_run(folder: Path) -> dict:
    """A run's evaluation grid: steps, held-out pass@1, and cumulative generated tokens and seconds at each step."""
    logs = logged(folder)
    training = sorted((h for h in logs if "step_time" in h), key=lambda h: h["step"])
    steps, tokens, seconds, by_length = [0], [0.0], [0.0], 0.0
    for h in training:
        width = h["step"] - steps[-1]
        if width < 1:
            raise ValueError(f"{folder}: logged step {h['step']} repeats or goes back (a resumed run?)")
        steps.append(h["step"])
        by_length += width * h["completions/mean_length"] * ROWS_PER_STEP
        tokens.append(
            tokens[-1] + width * h.get("seeds/generated_tokens", h["completions/mean_length"] * ROWS_PER_STEP)
        )
        seconds.append(seconds[-1] + width * h["step_time"])
    with open(folder / "learning_curve.csv") as f:
        curve = {int(r["step"]): float(r["value"]) for r in csv.DictReader(f) if r["kind"] == "held_out_pass@1"}
    eval_steps = sorted(curve)
    at = {s: i for i, s in enumerate(steps)}
    missing = [s for s in eval_steps if s not in at]
    if missing:
        raise ValueError(f"{folder}: evaluations at steps {missing} fall between logged steps")
    seeded = [h.get("seeds/seeded_group_share", math.nan) for h in training]
    return {
        "steps": eval_steps,
        "pass": [curve[s] for s in eval_steps],
        "tokens": [tokens[at[s]] for s in eval_steps],
        "seconds": [seconds[at[s]] for s in eval_steps],
        "final_step": steps[-1],
        "tokens_by_mean_length": by_length,
        "seeded_share": float(np.nanmean(seeded)) if not np.isnan(seeded).all() else math.nan,
    }


def value_at(run: dict, axis: str, budget: float) -> float:
    """Held-out pass@1 at `budget` on `axis`, linearly interpolated between the evaluations that bracket it."""
    return float(np.interp(budget, run[axis], run["pass"]))


def calibration(runs: dict) -> dict:
    gains = [runs["none", s]["pass"][-1] - runs["none", s]["pass"][0] for s in SEEDS]
    return {"gains": gains, "mean_gain": float(np.mean(gains)), "passed": bool(np.mean(gains) >= GATE)}


def primary(runs: dict) -> list[dict]:
    rows = []
    for arm in ARMS[1:]:
        for axis, name in ENDPOINTS:
            per_seed, budgets = [], []
            for s in SEEDS:
                budget = min(runs["none", s][axis][-1], runs[arm, s][axis][-1])
                budgets.append(budget)
                per_seed.append(value_at(runs[arm, s], axis, budget) - value_at(runs["none", s], axis, budget))
            t = paired_t(per_seed)
            rows.append(
                {
                    "arm": arm,
                    "endpoint": name,
                    "axis": axis,
                    "budgets": budgets,
                    "per_seed": per_seed,
                    "mean": t.mean,
                    "low": t.low,
                    "high": t.high,
                    "p": t.p_value,
                    "mde": t.mde,
                }
            )
    # Smallest detectable after Holm: an endpoint is shown for sure only if it passes Holm's first step, a test at
    # ALPHA / (number of tests); so the MDE is the paired t's at that level (power 0.8, the observed SD).
    for row in rows:
        row["mde_holm"] = paired_t(row["per_seed"], alpha=ALPHA / len(rows)).mde
    for row, p in zip(rows, holm([r["p"] for r in rows])):
        row["p_holm"] = p
        row["shown"] = bool(p < 0.05 and row["mean"] > 0)
    return rows


def plateau(runs: dict) -> dict:
    """On-policy's mean pass@1 (over seeds) at its last evaluation against the one before it (20 steps apart)."""
    last = float(np.mean([runs["none", s]["pass"][-1] for s in SEEDS]))
    before = float(np.mean([runs["none", s]["pass"][-2] for s in SEEDS]))
    return {"last": last, "before": before, "rise": last - before, "reached": bool(last - before <= PLATEAU)}


def moonshot(runs: dict, arm: str) -> list[dict]:
    """Per seed: where `arm` first reaches on-policy's final pass@1, and whether within half on-policy's tokens."""
    out = []
    for s in SEEDS:
        none, seeds = runs["none", s], runs[arm, s]
        target, half = none["pass"][-1], none["tokens"][-1] / 2
        reached = [i for i, v in enumerate(seeds["pass"]) if v >= target]
        first = reached[0] if reached else None
        tokens = seeds["tokens"][first] if first is not None else math.nan
        out.append(
            {
                "seed": s,
                "target": target,
                "step": seeds["steps"][first] if first is not None else None,
                "tokens": tokens,
                "half_of_none": half,
                "met": bool(first is not None and tokens <= half),
            }
        )
    return out


def within_run(folder: Path) -> dict:
    """The mechanism (descriptive): a seeded run's seeded and plain groups side by side, as means over its logging
    windows that had such groups."""
    logs = logged(folder)

    def mean(key: str) -> float:
        values = [h[key] for h in logs if isinstance(h.get(key), (int, float)) and not math.isnan(h[key])]
        return float(np.mean(values)) if values else math.nan

    keys = ("seeds/reward_seeded", "seeds/reward_unseeded", "seeds/zero_std_share_seeded")
    return {key.split("/")[1]: mean(key) for key in (*keys, "seeds/zero_std_share_plain", "seeds/prefix_len_mean")}


def probe_table(folder: Path) -> str | None:
    table = folder / "probe_cuts.md"
    return table.read_text().strip() if table.exists() else None


def draw(runs: dict, path: Path) -> None:
    import matplotlib  # lazy: only the picture needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    colors = {"none": "tab:gray", "seeds": "tab:blue", "paper": "tab:orange"}
    labels = {"none": "on-policy (none)", "seeds": "seeds, probe-picked", "paper": "seeds, uniform r ~ U[0.1, 0.9]"}
    for ax, axis, xlabel in ((axes[0], "tokens", "generated tokens"), (axes[1], "steps", "optimizer step")):
        for arm in ARMS:
            for s in SEEDS:
                run = runs[arm, s]
                ax.plot(run[axis], run["pass"], "-o", color=colors[arm], alpha=0.35, markersize=3, linewidth=1)
            grid = runs[arm, SEEDS[0]]["steps"]
            mean_pass = np.mean([runs[arm, s]["pass"] for s in SEEDS], axis=0)
            mean_x = np.mean([runs[arm, s][axis] for s in SEEDS], axis=0) if axis == "tokens" else grid
            ax.plot(
                mean_x,
                mean_pass,
                "-o",
                color=colors[arm],
                linewidth=2.5,
                markersize=5,
                label=f"{labels[arm]}: mean of seeds {', '.join(map(str, SEEDS))}",
            )
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out pass@1 (56 prompts x 4 samples)")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(
        "SmolLM2-135M-Instruct, chat-chain, LoRA: on-policy GRPO against Thinking Seeds (thin: each seed)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _f(value: float, signed: bool = True) -> str:
    return (
        "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else (f"{value:+.3f}" if signed else f"{value:.3f}")
    )


def report(runs: dict, probe: Path, folder: Path) -> dict:
    gate = calibration(runs)
    print("## Runs\n")
    print(
        "| arm | seed | pass@1 at steps "
        + ", ".join(map(str, runs["none", 0]["steps"]))
        + " | generated tokens | (by mean length) | training seconds | seeded share |"
    )
    print("|---|---|---|---|---|---|---|")
    for arm in ARMS:
        for s in SEEDS:
            r = runs[arm, s]
            print(
                f"| {arm} | {s} | {' / '.join(f'{v:.3f}' for v in r['pass'])} | {r['tokens'][-1]:,.0f} | "
                f"{r['tokens_by_mean_length']:,.0f} | {r['seconds'][-1]:,.0f} | {_f(r['seeded_share'], False)} |"
            )
    print("\n## Calibration gate\n")
    print(
        f"On-policy gains (last evaluation - step 0): {', '.join(_f(g) for g in gate['gains'])}; mean "
        f"{_f(gate['mean_gain'])} against the gate {GATE:+.2f}: {'passed' if gate['passed'] else 'FAILED'}."
    )
    summary = {"calibration": gate, "runs": {f"{a}-seed{s}": runs[a, s] for a in ARMS for s in SEEDS}}
    kind = "Primary endpoints" if gate["passed"] else "Exploratory only (calibration failed): the primary endpoints"
    print(f"\n## {kind}\n")
    print(
        "| arm - none | endpoint | per seed | mean | 95% t interval | p | p (Holm) | smallest detectable "
        "(without / with Holm) | shown |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rows = primary(runs)
    for r in rows:
        print(
            f"| {r['arm']} | {r['endpoint']} | {', '.join(_f(v) for v in r['per_seed'])} | {_f(r['mean'])} | "
            f"[{_f(r['low'])}, {_f(r['high'])}] | {r['p']:.3f} | {r['p_holm']:.3f} | "
            f"{_f(r['mde'], False)} / {_f(r['mde_holm'], False)} | "
            f"{'yes' if r['shown'] and gate['passed'] else 'no'} |"
        )
    shape = plateau(runs)
    print(
        f"\nPlateau check: on-policy's mean pass@1 {shape['before']:.3f} -> {shape['last']:.3f} over its last 20 "
        f"steps ({_f(shape['rise'])}): {'reached' if shape['reached'] else 'plateau NOT reached'}."
    )
    shots = {}
    for arm in ARMS[1:]:
        print(f"\n## Moonshot (secondary), {arm}: on-policy's final pass@1 with at most half its generated tokens\n")
        shots[arm] = moonshot(runs, arm)
        for m in shots[arm]:
            where = (
                f"reaches it at step {m['step']}, {m['tokens']:,.0f} tokens" if m["step"] is not None else "never does"
            )
            print(
                f"- seed {m['seed']}: target {m['target']:.3f}; {arm} {where} "
                f"(half of on-policy's tokens: {m['half_of_none']:,.0f}): {'met' if m['met'] else 'not met'}"
            )
        print(f"\n{sum(m['met'] for m in shots[arm])} of {len(shots[arm])} seeds.")
    table = probe_table(probe)
    print("\n## Probe\n")
    print(table if table else f"(no probe table at {probe})")
    print("\n## Mechanism (descriptive): seeded and plain groups within the seeded runs\n")
    print(
        "| arm | seed | reward, seeded groups | reward, plain groups | all-equal, seeded | all-equal, plain | "
        "prefix tokens |"
    )
    print("|---|---|---|---|---|---|---|")
    inside = {f"{a}-seed{s}": within_run(folder / f"{a}-seed{s}") for a in ARMS[1:] for s in SEEDS}
    for name, w in inside.items():
        arm, s = name.rsplit("-seed", 1)
        print(
            f"| {arm} | {s} | {w['reward_seeded']:.3f} | {w['reward_unseeded']:.3f} | {w['zero_std_share_seeded']:.3f} | "
            f"{w['zero_std_share_plain']:.3f} | {w['prefix_len_mean']:.1f} |"
        )
    summary["within_seeded_runs"] = inside
    verdict = "calibration failed" if not gate["passed"] else "shown" if any(r["shown"] for r in rows) else "not shown"
    print(f"\n## Verdict: {verdict}")
    summary.update({"primary": rows, "plateau": shape, "moonshot": shots, "verdict": verdict})
    return summary


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=Path, default=HERE / "runs")
    parser.add_argument("--probe", type=Path, default=HERE / "probe")
    parser.add_argument("--arms", nargs="+", choices=["seeds", "paper"], default=list(SEEDED), help="Seeded arms run.")
    args = parser.parse_args(argv)
    global ARMS
    ARMS = ("none", *args.arms)
    runs = {(arm, s): load_run(args.runs / f"{arm}-seed{s}") for arm in ARMS for s in SEEDS}
    summary = report(runs, args.probe, args.runs)
    (args.runs.parent / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    draw(runs, args.runs.parent / "curves.png")
    return summary


if __name__ == "__main__":
    main()
