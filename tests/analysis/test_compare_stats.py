"""The statistics of `compare`, recomputed from hand-made CSVs: the primary endpoint's paired t interval and
bootstrap, the equal-token interpolation, the per-run endpoints, Holm's correction, and the printed tables."""

import math
import statistics

import numpy as np
import pytest

from ts_trl.analysis.common import write_csv
from ts_trl.analysis.compare_protocol import FULL, PRIMARY, ZERO_STD_GAP
from ts_trl.analysis.compare_report import differences_tables, format_table
from ts_trl.analysis.compare_stats import all_differences, paired_differences, read_csv

T_975_DF2 = 4.302652729749464  # t_{0.975, 2}: the closed form 0.95 / sqrt(2 * 0.975 * 0.025)
T_80_DF2 = 0.6 / math.sqrt(2 * 0.8 * 0.2)  # t_{0.8, 2}, same closed form


def _two_sided_p_df2(t: float) -> float:
    """With 2 degrees of freedom the t CDF is 1/2 + t / (2 sqrt(2 + t^2)): an independent check of the p-value."""
    return 1 - abs(t) / math.sqrt(2 + t * t)


def _prompt_rows(method, seed, points):
    """prompts.csv rows of one run: points are (step, generated tokens, [passes per prompt]) with 8 samples each."""
    return [
        {"method": method, "seed": seed, "step": step, "prompt": j, "passes": passes, "samples": 8,
         "generated_tokens": tokens}
        for step, tokens, per_prompt in points
        for j, passes in enumerate(per_prompt)
    ]  # fmt: skip


def _through_csv(tmp_path, rows, name="prompts.csv"):
    write_csv(tmp_path / name, rows)
    return read_csv(tmp_path / name)


NONE = {0: [0, 2, 4, 8], 1: [1, 1, 3, 6], 2: [0, 0, 2, 8]}
SEEDS = {0: [2, 2, 6, 8], 1: [1, 4, 3, 7], 2: [4, 2, 2, 8]}  # per-seed pass@1 gains: 4/32, 4/32, 6/32


def _three_seed_rows():
    rows = []
    for s in range(3):
        rows += _prompt_rows("none", s, [(0, 0, [0, 0, 0, 0]), (10, 1000, NONE[s])])
        rows += _prompt_rows("seeds-state", s, [(0, 0, [0, 0, 0, 0]), (10, 1000, SEEDS[s])])
    return rows


def test_primary_endpoint_paired_t_and_bootstrap_recomputed_by_hand(tmp_path):
    found = {d["endpoint"]: d for d in paired_differences(_through_csv(tmp_path, _three_seed_rows()))}
    d = found[PRIMARY]
    per_seed = [4 / 32, 4 / 32, 6 / 32]  # each seed's mean over its 4 prompts of (passes difference) / 8
    mean, sd = statistics.mean(per_seed), statistics.stdev(per_seed)
    error = sd / math.sqrt(3)
    assert (d["difference"], d["sd"], d["seeds"]) == (pytest.approx(mean), pytest.approx(sd), 3)
    assert (d["t_low"], d["t_high"]) == pytest.approx((mean - T_975_DF2 * error, mean + T_975_DF2 * error))
    assert d["p_value"] == pytest.approx(_two_sided_p_df2(mean / error), rel=1e-9)
    assert d["mde"] == pytest.approx((T_975_DF2 + T_80_DF2) * error)
    # The sensitivity check: a two-way bootstrap (RNG seeds, then prompts, with replacement) of the per-prompt matrix.
    matrix = np.array([[(a - b) / 8 for a, b in zip(SEEDS[s], NONE[s])] for s in range(3)])
    rng = np.random.default_rng(0)
    replicates = []
    for _ in range(2000):
        rows_drawn, columns = rng.integers(3, size=3), rng.integers(4, size=4)
        replicates.append(np.mean([matrix[r, c] for r in rows_drawn for c in columns]))
    assert (d["boot_low"], d["boot_high"]) == pytest.approx(tuple(np.percentile(replicates, [2.5, 97.5])))
    # pass@8 per prompt is "any of the 8 passed"; both runs stop at the same tokens, so equal tokens = equal steps.
    pass8 = [np.mean([(a > 0) - (b > 0) for a, b in zip(SEEDS[s], NONE[s])]) for s in range(3)]
    assert found["pass@8 at equal steps"]["difference"] == pytest.approx(np.mean(pass8))
    assert found["pass@1 at equal tokens"]["difference"] == pytest.approx(mean)


def test_constant_paired_difference_has_a_zero_width_interval(tmp_path):
    rows = []
    for s in range(2):
        rows += _prompt_rows("none", s, [(0, 0, [1, 2, 3]), (4, 500, [2, 3, 4])])
        rows += _prompt_rows("replay", s, [(0, 0, [1, 2, 3]), (4, 500, [4, 5, 6])])
    d = next(d for d in paired_differences(_through_csv(tmp_path, rows)) if d["endpoint"] == PRIMARY)
    assert d["difference"] == d["t_low"] == d["t_high"] == d["boot_low"] == d["boot_high"] == pytest.approx(2 / 8)
    assert d["p_value"] == 0.0 and d["mde"] == 0.0


def test_equal_token_comparison_interpolates_each_curve_where_the_cheapest_run_stops(tmp_path):
    """Seeds stop at 600 generated tokens, on-policy at 1000: on-policy is read at 600 on its straight segment."""
    rows = []
    for s in range(3):
        rows += _prompt_rows("none", s, [(0, 0, [0, 0]), (5, 400, [2, 4]), (10, 1000 + s, [8, 4])])
        rows += _prompt_rows("seeds-state", s, [(0, 0, [0, 0]), (5, 300, [1, 1]), (10, 600 + 100 * s, [6, 2])])
    found = {d["endpoint"]: d for d in paired_differences(_through_csv(tmp_path, rows))}
    tokens = found["pass@1 at equal tokens"]
    assert tokens["budget"] == 600  # the smallest final token count of any run
    # none at 600: a third of the way from 400 to 1000 (to 1000 + s for seed s); seeds-state at 600: its end (seed 0),
    # 3/4 of the way from 300 to 700 (seed 1), 3/5 of the way from 300 to 800 (seed 2).
    none_at = [[2 + (8 - 2) * 200 / (1000 + s - 400), 4.0] for s in range(3)]
    seeds_at = [[6.0, 2.0]] + [[1 + (6 - 1) * f, 1 + (2 - 1) * f] for f in (300 / 400, 300 / 500)]
    per_seed = [np.mean([(a - b) / 8 for a, b in zip(seeds_at[s], none_at[s])]) for s in range(3)]
    assert tokens["difference"] == pytest.approx(np.mean(per_seed))
    error = statistics.stdev(per_seed) / math.sqrt(3)
    assert tokens["t_high"] == pytest.approx(np.mean(per_seed) + T_975_DF2 * error)
    steps = found[PRIMARY]
    assert steps["budget"] == 10 and steps["difference"] == pytest.approx(np.mean([6 - 8, 2 - 4]) / 8)


def _results(coverage, seeded, plain):
    """compare.csv rows: per method, one value per seed of coverage and of the all-equal shares."""
    return [
        {"method": m, "seed": s, "coverage": coverage[m][s], "zero_std_share_seeded": seeded.get(m, [""] * 3)[s],
         "zero_std_share_plain": plain[m][s]}
        for m in coverage
        for s in range(3)
    ]  # fmt: skip


def test_secondary_endpoints_are_holm_corrected_within_each_comparison(tmp_path):
    prompts = _through_csv(tmp_path, _three_seed_rows())
    coverage = {"none": [0.50, 0.60, 0.55], "seeds-state": [0.70, 0.71, 0.80]}  # gains 0.20, 0.11, 0.25
    seeded = {"seeds-state": [0.60, 0.50, 0.70]}
    plain = {"none": [0.30, 0.20, 0.25], "seeds-state": [0.20, 0.22, 0.10]}  # gaps 0.40, 0.28, 0.60
    results = _through_csv(tmp_path, _results(coverage, seeded, plain), "compare.csv")
    differences = all_differences(prompts, results)
    by_endpoint = {d["endpoint"]: d for d in differences}
    assert by_endpoint[PRIMARY]["role"] == "primary" and math.isnan(by_endpoint[PRIMARY]["p_holm"])
    assert by_endpoint[PRIMARY]["significant"] == (by_endpoint[PRIMARY]["p_value"] < 0.05)
    gains = [0.20, 0.11, 0.25]
    t = statistics.mean(gains) / (statistics.stdev(gains) / math.sqrt(3))
    assert by_endpoint["coverage"]["p_value"] == pytest.approx(_two_sided_p_df2(t), rel=1e-9)
    gaps = [0.40, 0.28, 0.60]
    gap = by_endpoint[ZERO_STD_GAP]
    assert gap["difference"] == pytest.approx(np.mean(gaps)) and gap["baseline"] == "its plain groups"
    t = statistics.mean(gaps) / (statistics.stdev(gaps) / math.sqrt(3))
    assert gap["p_value"] == pytest.approx(_two_sided_p_df2(t), rel=1e-9)
    # Holm by hand over the family of secondaries: sort, multiply the i-th smallest by (m - i), running maximum, cap.
    secondary = [d for d in differences if d["role"] == "secondary"]
    assert {d["endpoint"] for d in secondary} == {
        "pass@8 at equal steps", "pass@1 at equal tokens", "pass@8 at equal tokens", "coverage", ZERO_STD_GAP,
    }  # fmt: skip
    ordered = sorted(secondary, key=lambda d: d["p_value"])
    running = 0.0
    for i, d in enumerate(ordered):
        running = max(running, min(1.0, (len(ordered) - i) * d["p_value"]))
        assert d["p_holm"] == pytest.approx(running)
        assert d["significant"] == (running < 0.05)
    assert ordered[0]["p_holm"] > ordered[0]["p_value"]  # the correction did something
    # The tables print what the CSV holds: the primary row with its t interval, bootstrap and MDE, Holm p beside.
    lines = differences_tables(differences)
    d = by_endpoint[PRIMARY]
    row = next(line for line in lines if line.startswith("| seeds-state | none | +"))
    assert (
        f"[{d['t_low']:+.3f}, {d['t_high']:+.3f}]" in row and f"[{d['boot_low']:+.3f}, {d['boot_high']:+.3f}]" in row
    )
    assert row.endswith(f"| {d['mde']:.3f} |")
    row = next(line for line in lines if line.startswith("| seeds-state | its plain groups |"))
    assert row.endswith(f"| {gap['p_holm']:.3f} |")


def test_the_papers_pairwise_claims_are_paired_directly_and_printed(tmp_path):
    """seeds-state against seeds-action uses the same statistics, with the other as the baseline, in its own family."""
    from types import SimpleNamespace

    rows = []
    for s in range(2):
        rows += _prompt_rows("none", s, [(0, 0, [1, 2, 3]), (4, 500, [2, 3, 4])])
        rows += _prompt_rows("seeds-action", s, [(0, 0, [1, 2, 3]), (4, 400, [1, 2, 3])])
        rows += _prompt_rows("seeds-state", s, [(0, 0, [1, 2, 3]), (4, 400, [3, 4, 5])])
    results = [
        {"method": m, "seed": s, "coverage": 0.5} for m in ("none", "seeds-action", "seeds-state") for s in (0, 1)
    ]
    differences = all_differences(_through_csv(tmp_path, rows), _through_csv(tmp_path, results, "compare.csv"))
    claim = next(d for d in differences if d["baseline"] == "seeds-action" and d["endpoint"] == PRIMARY)
    assert claim["method"] == "seeds-state" and claim["role"] == "primary"
    assert claim["difference"] == claim["t_low"] == claim["t_high"] == pytest.approx(2 / 8) and claim["significant"]
    # Against none instead, seeds-state is 1/8 ahead: the baseline really changes what is subtracted.
    vs_none = next(
        d for d in differences if (d["method"], d["baseline"], d["endpoint"]) == ("seeds-state", "none", PRIMARY)
    )
    assert vs_none["difference"] == pytest.approx(1 / 8)
    summary = [{"method": "none", "pass_at_1_mean": 0.3, "gain_mean": 0.1, "k": 8, "runs": 2, "pass_at_1_std": 0.0,
                "pass_at_k_mean": 0.5, "coverage_mean": 0.5, "generated_tokens": 500, "reused_tokens": 0,
                "wall_s": 1.0}]  # fmt: skip
    args = SimpleNamespace(min_difficulty=1, difficulty=2, jobs=1)
    table = format_table(summary, differences, FULL, args, 60.0)
    assert "| seeds-state | seeds-action | +0.250 * | [+0.250, +0.250] | <0.001 | [+0.250, +0.250] | 0.000 |" in table
