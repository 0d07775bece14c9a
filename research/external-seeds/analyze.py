"""Per-seed table and the paired t interval of seeded - on-policy held-out pass@1 (and pass@8) at equal steps.

    python research/external-seeds/analyze.py

Reads results/*.json (evaluate.py + train_one.sh) and each seeded run's metrics.jsonl; writes summary.csv,
summary.json and prints a markdown table.
"""

import csv
import json
import math
from pathlib import Path

from ts_trl.analysis.stats import paired_t

here = Path(__file__).resolve().parent
results = here / "results"
seeds = sorted(int(p.stem.rsplit("-seed", 1)[1]) for p in results.glob("seeded-seed*.json"))


def load(name):
    return json.loads((results / f"{name}.json").read_text())


def seeding_metrics(run: str) -> dict:
    path = here / "runs" / run / "metrics.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = {}
    for key in (
        "seeds/seeded_group_share",
        "seeds/external_share",
        "seeds/prefix_len_mean",
        "seeds/refused_cut_share",
    ):
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])]
        out[key.split("/")[1]] = sum(values) / len(values) if values else float("nan")
    return out


table = []
for s in seeds:
    warm, on, sd = load(f"warm-seed{s}"), load(f"onpolicy-seed{s}"), load(f"seeded-seed{s}")
    table.append(
        {
            "seed": s,
            "warm_pass_at_1": warm["pass_at_1"],
            "onpolicy_pass_at_1": on["pass_at_1"],
            "seeded_pass_at_1": sd["pass_at_1"],
            "diff_pass_at_1": sd["pass_at_1"] - on["pass_at_1"],
            "warm_pass_at_8": warm["pass_at_8"],
            "onpolicy_pass_at_8": on["pass_at_8"],
            "seeded_pass_at_8": sd["pass_at_8"],
            "diff_pass_at_8": sd["pass_at_8"] - on["pass_at_8"],
            "onpolicy_train_wall_s": on["train_wall_s"],
            "seeded_train_wall_s": sd["train_wall_s"],
            "steps": on["steps"],
            **{f"seeded_{k}": v for k, v in seeding_metrics(f"seeded-seed{s}").items()},
        }
    )
with open(here / "summary.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(table[0]))
    writer.writeheader()
    writer.writerows(table)

summary = {"per_seed": table}
for kind in ("pass_at_1", "pass_at_8"):
    t = paired_t([row[f"diff_{kind}"] for row in table])
    summary[f"paired_t_{kind}"] = t.__dict__
    for arm in ("onpolicy", "seeded"):
        summary[f"{arm}_mean_gain_{kind}"] = sum(r[f"{arm}_{kind}"] - r[f"warm_{kind}"] for r in table) / len(table)
stronger = results / "stronger-seed100.json"
if stronger.exists():
    d = json.loads(stronger.read_text())
    summary["stronger"] = {k: d[k] for k in ("pass_at_1", "pass_at_8", "steps", "train_wall_s")}
traces = here / "traces.summary.json"
if traces.exists():
    summary["traces"] = json.loads(traces.read_text())
(here / "summary.json").write_text(json.dumps(summary, indent=1))

print(
    "| RNG seed | warm pass@1 | on-policy pass@1 | seeded pass@1 | difference | on-policy pass@8 | seeded pass@8 | difference |"
)
print("|---|---|---|---|---|---|---|---|")
for r in table:
    print(
        f"| {r['seed']} | {r['warm_pass_at_1']:.3f} | {r['onpolicy_pass_at_1']:.3f} | {r['seeded_pass_at_1']:.3f} | "
        f"{r['diff_pass_at_1']:+.3f} | {r['onpolicy_pass_at_8']:.3f} | {r['seeded_pass_at_8']:.3f} | {r['diff_pass_at_8']:+.3f} |"
    )
for kind in ("pass_at_1", "pass_at_8"):
    t = summary[f"paired_t_{kind}"]
    print(
        f"{kind}: mean diff {t['mean']:+.4f}, 95% paired t [{t['low']:+.4f}, {t['high']:+.4f}], p {t['p_value']:.3f}, "
        f"sd {t['sd']:.4f}, n {t['n']}, MDE {t['mde']:.4f}"
    )
print(
    json.dumps({k: v for k, v in summary.items() if k not in ("per_seed",) and not k.startswith("paired")}, indent=1)
)
