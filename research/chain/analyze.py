"""The pre-registered analysis of the chain-task comparison (research/prereg-chain.md), from `ts_trl compare`'s CSVs.

    python research/chain/analyze.py calibration research/chain/cal-3e-4 research/chain/cal-1e-3 ...
    python research/chain/analyze.py main research/chain/main [--complete-seeds]
    python research/chain/analyze.py explore FOLDER [FOLDER ...]

`explore` reads the exploratory arms of research/target-cuts.md (`seeds-state-target`, `seeds-state-rescue`) beside the
main run's `none` and `seeds-state` from several `compare` folders (a run found in two folders is the same run, copied),
keeps the RNG seeds whose four arms all finished and reports the mechanism (seeded minus plain all-equal share), the
comparisons with `none` as `compare` assesses them (pass@1 at equal steps, then its secondaries Holm-corrected within
each arm) and the comparisons with `seeds-state` (pass@1 and pass@8 at equal steps, Holm over those four).

`calibration` applies the on-policy pass rule to each grid point; `main` keeps the RNG seeds whose four arms all
finished and reports the three claims: the primary endpoint with Holm's correction over the claims, and the four
pre-registered secondary endpoints with Holm's correction within each claim. The statistics are `compare`'s own
(`all_differences`: paired t over per-seed means, bootstrap, smallest detectable effect; `stats.holm`).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from ts_trl.analysis.compare_protocol import ZERO_STD_GAP
from ts_trl.analysis.compare_stats import all_differences, paired_differences, read_csv
from ts_trl.analysis.stats import holm

ARMS = ("none", "seeds-state", "seeds-action", "replay")
CLAIMS = [  # (method, against, the paper's claim)
    ("seeds-state", "none", "seeds-state > on-policy"),
    ("seeds-state", "seeds-action", "seeds-state > seeds-action"),
    ("seeds-state", "replay", "seeds > replay"),
]
PRIMARY = "pass@1 at equal steps"
SECONDARY = ("pass@8 at equal steps", "pass@1 at equal tokens", "recovery_rate", "coverage")


def _curve(curves, kind, step):
    return {int(c["seed"]): float(c["value"]) for c in curves if c["kind"] == kind and int(c["step"]) == step}


def calibration(folders: list[str]) -> None:
    print("| learning rate | gain per seed | mean gain | coverage at end (mean) | error-or-repair share start -> end "
          "(mean) | passes |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for folder in folders:
        runs = [r for r in read_csv(Path(folder) / "compare.csv") if r["method"] == "none"]
        curves = read_csv(Path(folder) / "curves.csv")
        last = max(int(r["steps"]) for r in runs)
        gains = [float(r["pass_at_1"]) - float(r["pass_at_1_start"]) for r in runs]
        coverage = float(np.mean([float(r["coverage"]) for r in runs]))
        start = float(np.mean(list(_curve(curves, "error_or_repair_share", 0).values())))
        end = float(np.mean(list(_curve(curves, "error_or_repair_share", last).values())))
        gain_ok = np.mean(gains) >= 0.10 and min(gains) >= 0.05
        collapse = coverage <= 0.6 or end <= 0.5 * start
        rate = folder.rstrip("/").rsplit("cal-", 1)[-1]
        print(
            f"| {rate} | {', '.join(f'{g:+.3f}' for g in gains)} | {np.mean(gains):+.3f} | {coverage:.3f} | "
            f"{start:.3f} -> {end:.3f} | {'yes' if gain_ok and collapse else 'no'} (gain {'ok' if gain_ok else 'no'},"
            f" collapse {'ok' if collapse else 'no'}) |"
        )


def _mean(runs: list[dict], key: str) -> float:
    values = [float(r[key]) for r in runs if r.get(key) not in (None, "")]
    values = [v for v in values if not math.isnan(v)]
    return float(np.mean(values)) if values else math.nan


def arm_table(results: list[dict], arms: tuple[str, ...]) -> None:
    """Per arm, means over its RNG seeds of `compare.csv`'s columns."""
    print("| arm | pass@1 (mean ± sd) | gain over start | pass@8 | coverage | recovery rate | error share | "
          "repair share | all-equal seeded / plain | generated tokens |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for arm in arms:
        runs = [r for r in results if r["method"] == arm]
        if not runs:
            continue
        p1 = np.array([float(r["pass_at_1"]) for r in runs])
        print(
            f"| {arm} | {p1.mean():.3f} ± {p1.std(ddof=1):.3f} | "
            f"{_mean(runs, 'pass_at_1') - _mean(runs, 'pass_at_1_start'):+.3f} | {_mean(runs, 'pass_at_8'):.3f} | "
            f"{_mean(runs, 'coverage'):.3f} | {_mean(runs, 'recovery_rate'):.3f} | {_mean(runs, 'error_share'):.3f} | "
            f"{_mean(runs, 'repair_share'):.3f} | {_mean(runs, 'zero_std_share_seeded'):.3f} / "
            f"{_mean(runs, 'zero_std_share_plain'):.3f} | {_mean(runs, 'generated_tokens'):,.0f} |"
        )


def main_run(folder: str, complete_seeds: bool = False) -> None:
    """The three claims, each over the RNG seeds at which both of its arms finished (`replay` runs as a second stage
    and may have fewer); with `complete_seeds`, only over seeds at which all four arms finished."""
    folder = Path(folder)
    results = read_csv(folder / "compare.csv")
    prompts = read_csv(folder / "prompts.csv")
    seeds = sorted({int(r["seed"]) for r in results})
    runs = {m: sorted(int(r["seed"]) for r in results if r["method"] == m) for m in ARMS}
    print(f"RNG seeds per arm: {runs}")
    if complete_seeds:
        complete = [s for s in seeds if all(s in runs[m] for m in ARMS)]
        print(f"Only the seeds at which all four arms finished: {complete}")
        results = [r for r in results if int(r["seed"]) in complete]
        prompts = [r for r in prompts if int(r["seed"]) in complete]
    print()
    differences = all_differences(prompts, results, ("coverage", "recovery_rate"))

    def row(method, against, endpoint):
        return next(
            d for d in differences if (d["method"], d["baseline"], d["endpoint"]) == (method, against, endpoint)
        )

    arm_table(results, ARMS)

    claims = [c for c in CLAIMS if runs[c[0]] and runs[c[1]]]  # a claim whose arm has no run is not tested
    primaries = [row(m, a, PRIMARY) for m, a, _ in claims]
    adjusted = holm([p["p_value"] for p in primaries])
    print("\nPrimary: pass@1 difference at equal steps, paired t over per-seed means (df = seeds - 1), Holm over the "
          "three claims; bootstrap (seeds x prompts) as sensitivity.\n")  # fmt: skip
    print("| claim | seeds | difference | 95% paired t CI | p | Holm p | bootstrap 95% CI | MDE | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (method, against, claim), p, p_holm in zip(claims, primaries, adjusted):
        if p_holm < 0.05:
            verdict = "supported" if p["difference"] > 0 else "contradicted"
        else:
            verdict = "not shown"
        print(
            f"| {claim} ({method} − {against}) | {p['seeds']} | {p['difference']:+.3f} | [{p['t_low']:+.3f}, {p['t_high']:+.3f}] | "
            f"{p['p_value']:.3f} | {p_holm:.3f} | [{p['boot_low']:+.3f}, {p['boot_high']:+.3f}] | {p['mde']:.3f} | "
            f"{verdict} |"
        )
    print("\nSecondary endpoints, Holm over the four within each claim.\n")
    print("| claim | endpoint | difference | 95% paired t CI | p | Holm p | MDE |")
    print("|---|---|---|---|---|---|---|")
    for method, against, claim in claims:
        rows = [row(method, against, endpoint) for endpoint in SECONDARY]
        for d, p_holm in zip(rows, holm([d["p_value"] for d in rows])):
            star = " *" if p_holm < 0.05 else ""
            print(
                f"| {claim} | {d['endpoint']} | {d['difference']:+.3f} | [{d['t_low']:+.3f}, {d['t_high']:+.3f}] | "
                f"{d['p_value']:.3f} | {p_holm:.3f}{star} | {d['mde']:.3f} |"
            )


EXTENSIONS = ("seeds-state-target", "seeds-state-rescue")
EXPLORED = ("none", "seeds-state", *EXTENSIONS)


def _ci(d: dict) -> str:
    return f"{d['difference']:+.3f} [{d['t_low']:+.3f}, {d['t_high']:+.3f}]"


def explore(folders: list[str]) -> None:
    results, prompts = {}, {}
    for folder in map(Path, folders):
        for r in read_csv(folder / "compare.csv"):
            results[(r["method"], r["seed"])] = r
        for r in read_csv(folder / "prompts.csv"):
            prompts[(r["method"], r["seed"], r["step"], r["prompt"])] = r
    seeds = sorted({int(s) for _, s in results})
    complete = [s for s in seeds if all((m, str(s)) in results for m in EXPLORED)]
    print(f"Complete seeds: {complete}; left out: {sorted(set(seeds) - set(complete)) or 'none'}\n")
    results = [r for (m, s), r in results.items() if m in EXPLORED and int(s) in complete]
    prompts = [r for (m, s, _, _), r in prompts.items() if m in EXPLORED and int(s) in complete]

    arm_table(results, EXPLORED)

    against_none = [d for d in all_differences(prompts, results, ("coverage", "recovery_rate"))
                    if d["method"] in ("seeds-state", *EXTENSIONS) and d["baseline"] in ("none", "its plain groups")]  # fmt: skip
    print("\nMechanism: seeded minus plain all-equal share within each run, paired t over seeds (it holds if <= 0); "
          "Holm p within the arm's family of secondaries.\n")  # fmt: skip
    print("| arm | seeded - plain | p | Holm p | holds |")
    print("|---|---|---|---|---|")
    for d in (d for d in against_none if d["endpoint"] == ZERO_STD_GAP):
        print(f"| {d['method']} | {_ci(d)} | {d['p_value']:.3f} | {d['p_holm']:.3f} | "
              f"{'yes' if d['difference'] <= 0 else 'no'} |")  # fmt: skip
    print("\nAgainst on-policy GRPO (`none`): pass@1 at equal steps (paired t, its own test), then the secondaries with "
          "Holm within each arm.\n")  # fmt: skip
    print("| arm | endpoint | difference [95% paired t] | p | Holm p | bootstrap 95% | MDE |")
    print("|---|---|---|---|---|---|---|")
    for d in (d for d in against_none if d["endpoint"] != ZERO_STD_GAP):
        holm_p = "–" if d["role"] == "primary" else f"{d['p_holm']:.3f}"
        boot = f"[{d['boot_low']:+.3f}, {d['boot_high']:+.3f}]" if "boot_low" in d else "–"
        print(f"| {d['method']} | {d['endpoint']} | {_ci(d)} | {d['p_value']:.3f} | {holm_p} | {boot} | "
              f"{d['mde']:.3f} |")  # fmt: skip
    against_method = [
        d for d in paired_differences(prompts, baseline="seeds-state", methods=list(EXTENSIONS))
        if d["endpoint"].endswith("at equal steps")
    ]  # fmt: skip
    print("\nAgainst the method (`seeds-state`): pass@1 and pass@8 at equal steps, paired t, Holm over these four.\n")
    print("| arm | endpoint | difference [95% paired t] | p | Holm p | MDE |")
    print("|---|---|---|---|---|---|")
    for d, p_holm in zip(against_method, holm([d["p_value"] for d in against_method])):
        print(f"| {d['method']} | {d['endpoint']} | {_ci(d)} | {d['p_value']:.3f} | {p_holm:.3f} | {d['mde']:.3f} |")


if __name__ == "__main__":
    command, *folders = sys.argv[1:]
    if command == "main":
        main_run(folders[0], complete_seeds="--complete-seeds" in folders)
    else:
        {"calibration": calibration, "explore": explore}[command](folders)
