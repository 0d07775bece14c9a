"""The rule of research/prereg-smollm2-chain.md that picks the seeded arm from the cut probe's groups.

    python research/smollm2-chain/probe_selection.py [--groups research/smollm2-chain/probe/probe_cuts_groups.csv]

Reads `ts_trl probe-cuts`' per-group rows (kind, ratio, seed_passed, passes, size, prompt) and, for each seed
selection and cut range [0.1, c], estimates the all-equal (no-signal) share of the seeded groups that selection would
make, against the plain groups' share:

- `uniform`: every seeded group (the seeds as the untrained model's samples come: mostly failures);
- `success`: the groups after a passing seed;
- `passrate`: per prompt, the groups after a passing seed where the prompt's plain group passed less than half the
  time, else after a failing seed (as `seed_selection="passrate"` draws them; a prompt without such a seed is left
  plain, as the trainer leaves it).

A(S, c) is the mean over the probed ratios in [0.1, c] of the all-equal share of S's groups at that ratio (what
r ~ U[0.1, c] sees, as `probe-cuts` averages); n(S, c) the number of those groups. The rule, fixed before the probe
ran: among the (S, c) with n(S, c) >= MIN_GROUPS, the smallest A(S, c) - plain share wins; candidates within TIE of
the smallest count as tied, and a tie goes to `uniform`, then `passrate`, then `success` (the fewest assumptions
about the bank), then to the larger c (more of the paper's range). With no candidate, the arm is `uniform` over
[0.1, 0.9] (the recipe's setting). `cut_selection` stays `ratio`: a static probe cannot judge `target`, an online
choice among bins, without crediting it with an oracle's pick.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SELECTIONS = ("uniform", "passrate", "success")  # the tie order
CUT_RATIO_MIN = 0.1
CANDIDATE_MAX = (0.9, 0.7, 0.5, 0.3)
MIN_GROUPS = 24  # pooled seeded groups a candidate needs for its share to be read at all
TIE = 0.02


def load_groups(path: Path) -> list[dict]:
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if rows and "prompt" not in rows[0]:
        raise SystemExit(f"{path}: no 'prompt' column; rerun the probe with a ts_trl that writes it")
    for row in rows:
        row["passes"], row["size"], row["prompt"] = int(row["passes"]), int(row["size"]), int(row["prompt"])
        row["ratio"] = float(row["ratio"]) if row["ratio"] != "" else None
        row["seed_passed"] = int(row["seed_passed"]) if row["seed_passed"] != "" else None
    return rows


def all_equal(groups: list[dict]) -> float:
    return float(np.mean([g["passes"] in (0, g["size"]) for g in groups])) if groups else float("nan")


def selected(rows: list[dict], selection: str) -> list[dict]:
    """The seeded groups that `selection` would have made."""
    seeded = [r for r in rows if r["kind"] == "seeded"]
    if selection == "uniform":
        return seeded
    if selection == "success":
        return [r for r in seeded if r["seed_passed"] == 1]
    plain_rate = {r["prompt"]: r["passes"] / r["size"] for r in rows if r["kind"] == "plain"}
    return [r for r in seeded if r["seed_passed"] == int(plain_rate[r["prompt"]] < 0.5)]


def pick(rows: list[dict]) -> dict:
    plain = all_equal([r for r in rows if r["kind"] == "plain"])
    ratios = sorted({r["ratio"] for r in rows if r["ratio"] is not None})
    table = []
    for selection in SELECTIONS:
        groups = selected(rows, selection)
        for c in CANDIDATE_MAX:
            inside = [r for r in ratios if CUT_RATIO_MIN <= r <= c + 1e-9]
            shares = [all_equal([g for g in groups if g["ratio"] == r]) for r in inside]
            shares = [s for s in shares if not np.isnan(s)]
            n = sum(1 for g in groups if g["ratio"] in inside)
            share = float(np.mean(shares)) if shares else float("nan")
            table.append(
                {
                    "selection": selection,
                    "cut_ratio_max": c,
                    "groups": n,
                    "all_equal": share,
                    "minus_plain": share - plain,
                }
            )
    eligible = [t for t in table if t["groups"] >= MIN_GROUPS and not np.isnan(t["all_equal"])]
    if not eligible:
        choice = {"selection": "uniform", "cut_ratio_max": 0.9, "why": "no candidate had enough groups"}
    else:
        best = min(t["minus_plain"] for t in eligible)
        tied = [t for t in eligible if t["minus_plain"] <= best + TIE]
        tied.sort(key=lambda t: (SELECTIONS.index(t["selection"]), -t["cut_ratio_max"]))
        choice = {**tied[0], "why": f"smallest all-equal excess over plain ({best:+.3f}), ties within {TIE}"}
    return {"plain_all_equal": plain, "candidates": table, "choice": choice}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=Path, default=HERE / "probe" / "probe_cuts_groups.csv")
    args = parser.parse_args(argv)
    result = pick(load_groups(args.groups))
    print(f"Plain groups all-equal: {result['plain_all_equal']:.3f}\n")
    print("| seed_selection | cut range | seeded groups | all-equal seeded | minus plain |")
    print("|---|---|---|---|---|")
    for t in result["candidates"]:
        print(
            f"| {t['selection']} | [{CUT_RATIO_MIN:g}, {t['cut_ratio_max']:g}] | {t['groups']} | "
            f"{t['all_equal']:.3f} | {t['minus_plain']:+.3f} |"
        )
    c = result["choice"]
    print(
        f"\nSeeded arm: seed_selection={c['selection']}, cut_ratio_min={CUT_RATIO_MIN:g}, "
        f"cut_ratio_max={c['cut_ratio_max']:g}, cut_selection=ratio ({c['why']})."
    )
    (args.groups.parent / "selection.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
