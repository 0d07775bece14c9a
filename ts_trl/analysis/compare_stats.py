"""The statistics of `ts_trl compare` (pure: they read the CSV rows, so that a test can recompute them by hand): paired
differences per RNG seed and prompt, at equal steps and equal generated tokens, their intervals and Holm's
correction, and the per-method summary."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence

import numpy as np

from .compare_protocol import (
    BASELINE,
    BOOTSTRAP_SAMPLES,
    PAPER_CLAIMS,
    PASS_K,
    PRIMARY,
    SCALAR_ENDPOINTS,
    ZERO_STD_GAP,
)
from .stats import ALPHA, holm, paired_t


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def paired_bootstrap_ci(
    differences: np.ndarray, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """Mean of a [seeds x prompts] matrix of paired differences and its bootstrap CI over seeds *and* prompts.

    Each replicate draws the RNG seeds with replacement, then the prompts with replacement, and averages the crossed
    sub-matrix: both the training noise (seeds) and the choice of held-out problems (prompts) count. Percentile
    interval; deterministic given `seed`. With one RNG seed only prompts are resampled.
    """
    differences = np.asarray(differences, dtype=np.float64)
    num_seeds, num_prompts = differences.shape
    rng = np.random.default_rng(seed)
    replicates = np.empty(samples)
    for b in range(samples):
        rows = rng.integers(num_seeds, size=num_seeds)
        columns = rng.integers(num_prompts, size=num_prompts)
        replicates[b] = differences[np.ix_(rows, columns)].mean()
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(differences.mean()), float(low), float(high)


def _rates(rows: list[dict], k: int) -> dict[tuple[str, int, int], tuple[float, np.ndarray]]:
    """(method, seed, step) -> (generated tokens at that step, per-prompt pass@k estimates ordered by prompt)."""
    grouped: dict[tuple[str, int, int], list[dict]] = {}
    for row in rows:
        grouped.setdefault((row["method"], int(row["seed"]), int(row["step"])), []).append(row)
    rates = {}
    for key, group in grouped.items():
        group.sort(key=lambda r: int(r["prompt"]))
        values = []
        for r in group:
            n, c = int(r["samples"]), int(r["passes"])
            values.append(1.0 - math.comb(n - c, k) / math.comb(n, k) if n >= k else math.nan)
        rates[key] = (float(group[0]["generated_tokens"]), np.array(values))
    return rates


def interpolate_at_tokens(points: list[tuple[float, np.ndarray]], budget: float) -> np.ndarray:
    """Per-prompt scores at `budget` generated tokens, linear between the two evaluations that bracket it."""
    points = sorted(points, key=lambda p: p[0])
    tokens = np.array([p[0] for p in points])
    if budget < tokens[0] or budget > tokens[-1]:
        raise ValueError(f"budget {budget} lies outside the evaluated tokens [{tokens[0]}, {tokens[-1]}]")
    values = np.stack([p[1] for p in points])
    return np.array([np.interp(budget, tokens, values[:, j]) for j in range(values.shape[1])])


def paired_differences(
    rows: list[dict], k_values=(1, PASS_K), baseline: str = BASELINE, methods: list[str] | None = None
) -> list[dict]:
    """Per method and pass@k: the paired difference against `baseline` at equal steps and at equal generated tokens.

    `rows` are `prompts.csv` rows (method, seed, step, prompt, passes, samples, generated_tokens). Equal steps: the
    last evaluated step. Equal tokens: the smallest final generated-token count over all runs (of every method in
    `rows`, whatever the baseline), where every run's per-prompt curve is interpolated. `methods`: the methods to
    compare with the baseline (default: all). Each difference carries the paired t analysis of its per-seed means
    (`stats.paired_t`: `t_low`, `t_high`, `p_value`, `sd`, `seeds`, `mde`) and, as a sensitivity check, the two-way
    bootstrap interval over seeds and prompts (`boot_low`, `boot_high`).
    """
    methods = methods or list(dict.fromkeys(r["method"] for r in rows))
    runs = sorted({(r["method"], int(r["seed"])) for r in rows})
    last = max(int(r["step"]) for r in rows)
    samples = min(int(r["samples"]) for r in rows)
    out = []
    for k in (k for k in k_values if k <= samples):
        rates = _rates(rows, k)
        budget = min(rates[(m, s, last)][0] for m, s in runs)
        curve = {(m, s): [v for (mm, ss, _), v in rates.items() if (mm, ss) == (m, s)] for m, s in runs}
        at_tokens = {key: interpolate_at_tokens(points, budget) for key, points in curve.items()}
        for method in methods:
            # Only RNG seeds that both this method and the baseline have finished are paired.
            seeds = [s for m, s in runs if m == method and (baseline, s) in curve]
            if method == baseline or not seeds:
                continue
            steps = np.stack([rates[(method, s, last)][1] - rates[(baseline, s, last)][1] for s in seeds])
            tokens = np.stack([at_tokens[(method, s)] - at_tokens[(baseline, s)] for s in seeds])
            for basis, matrix in (("steps", steps), ("tokens", tokens)):
                _, low, high = paired_bootstrap_ci(matrix)
                out.append(
                    {
                        "method": method,
                        "baseline": baseline,
                        "endpoint": f"pass@{k} at equal {basis}",
                        "budget": last if basis == "steps" else budget,
                        **_t_columns(matrix.mean(axis=1)),  # per-seed means: every seed has the same prompts
                        "boot_low": low,
                        "boot_high": high,
                    }
                )
    return out


def scalar_differences(
    results: list[dict],
    columns: Sequence[str] = SCALAR_ENDPOINTS,
    baseline: str = BASELINE,
    methods: list[str] | None = None,
) -> list[dict]:
    """Paired differences against `baseline` of per-run values (`compare.csv` columns such as `coverage`).

    The all-equal-group endpoint is within a run rather than against the baseline: per seed, the share of seeded
    groups whose rewards were all equal minus that share of the same run's plain groups (`ZERO_STD_GAP`), for
    methods that seed. Runs that lack a column (NaN or absent) are left out of its pairs.
    """
    methods = methods or list(dict.fromkeys(r["method"] for r in results))
    by_run = {(r["method"], int(r["seed"])): r for r in results}

    def value(method, seed, column) -> float:
        cell = by_run.get((method, seed), {}).get(column, "")
        return math.nan if cell in ("", None) else float(cell)

    out = []
    for method in (m for m in methods if m != baseline):
        seeds = sorted(s for m, s in by_run if m == method and (baseline, s) in by_run)
        for column in columns:
            differences = [value(method, s, column) - value(baseline, s, column) for s in seeds]
            if any(not math.isnan(d) for d in differences):
                out.append({"method": method, "baseline": baseline, "endpoint": column, **_t_columns(differences)})
        if baseline == BASELINE:
            seeds = sorted(s for m, s in by_run if m == method)
            gaps = [
                value(method, s, "zero_std_share_seeded") - value(method, s, "zero_std_share_plain") for s in seeds
            ]
            if any(not math.isnan(g) for g in gaps):
                out.append(
                    {"method": method, "baseline": "its plain groups", "endpoint": ZERO_STD_GAP, **_t_columns(gaps)}
                )
    return out


def _t_columns(per_seed: Sequence[float]) -> dict:
    result = paired_t(per_seed)
    return {
        "difference": result.mean,
        "seeds": result.n,
        "sd": result.sd,
        "t_low": result.low,
        "t_high": result.high,
        "p_value": result.p_value,
        "mde": result.mde,
    }


def assess(differences: list[dict]) -> list[dict]:
    """Marks the primary endpoint and Holm-corrects the secondary ones; returns the rows with `role`, `p_holm`,
    `significant`.

    Primary (fixed in advance): `PRIMARY`, pass@1 at equal optimizer steps, one test per comparison, judged by its
    paired t p-value at `ALPHA`. Every other endpoint of the same method against the same baseline is secondary: one
    family, Holm-adjusted (`p_holm`) and judged at `ALPHA`. The within-run all-equal gap joins its method's family
    against `none`.
    """
    out = [dict(d) for d in differences]
    families: dict[str, list[dict]] = {}
    for d in out:
        d["role"] = "primary" if d["endpoint"] == PRIMARY else "secondary"
        family = d["method"] if d["baseline"] in (BASELINE, "its plain groups") else f"{d['method']}|{d['baseline']}"
        families.setdefault(family, []).append(d)
    for family in families.values():
        secondary = [d for d in family if d["role"] == "secondary"]
        for d, p in zip(secondary, holm([d["p_value"] for d in secondary])):
            d["p_holm"] = p
    for d in out:
        p = d["p_value"] if d["role"] == "primary" else d["p_holm"]
        d.setdefault("p_holm", math.nan)
        d["significant"] = bool(p < ALPHA)
    return out


def all_differences(prompt_rows: list[dict], results: list[dict], columns: Sequence[str] = SCALAR_ENDPOINTS):
    """Every endpoint of every method against `none`, and the paper's other claims paired directly, assessed.

    `prompt_rows` and `results` are the rows of `prompts.csv` and `compare.csv`; `columns` the per-run endpoints.
    """
    differences = paired_differences(prompt_rows) + scalar_differences(results, columns)
    present = {r["method"] for r in results}
    for method, baseline in PAPER_CLAIMS:
        if {method, baseline} <= present:
            differences += paired_differences(prompt_rows, baseline=baseline, methods=[method])
            differences += scalar_differences(results, columns, baseline=baseline, methods=[method])
    return assess(differences)


def summarize(results: list[dict]) -> list[dict]:
    """Mean and sample std over seeds, per method, in the order the methods ran."""
    summary = []
    for method in dict.fromkeys(r["method"] for r in results):
        runs = [r for r in results if r["method"] == method]
        scores = np.array([r["pass_at_1"] for r in runs])
        start = np.array([r["pass_at_1_start"] for r in runs])
        k_key = next(
            key for key in runs[0] if key.startswith("pass_at_") and key not in ("pass_at_1", "pass_at_1_start")
        )
        summary.append(
            {
                "method": method,
                "runs": len(runs),
                "pass_at_1_mean": float(scores.mean()),
                "pass_at_1_std": float(scores.std(ddof=1)) if len(runs) > 1 else math.nan,
                "gain_mean": float((scores - start).mean()),
                "pass_at_k_mean": float(np.mean([r[k_key] for r in runs])),
                "k": int(k_key.removeprefix("pass_at_")),
                "coverage_mean": float(np.mean([r["coverage"] for r in runs])),
                "generated_tokens": float(np.mean([r["generated_tokens"] for r in runs])),
                "reused_tokens": float(np.mean([r["reused_tokens"] for r in runs])),
                "wall_s": float(np.mean([r["wall_s"] for r in runs])),
            }
        )
    return summary
