"""`benchmarks/run.py --quick` runs end to end, and no target is missed by more than its CI margin."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_quick_benchmark_meets_its_targets(tmp_path):
    # About 2 minutes on a loaded 2-core machine: step times of 4 trainers, banks of 10^4 and 10^5 (each resumed by two
    # ranks at once), rewards.
    command = [sys.executable, str(REPO / "benchmarks" / "run.py"), "--quick", "--out", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=540, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    report = json.loads((tmp_path / "latest.json").read_text())
    table = (tmp_path / "latest.md").read_text()
    assert report["machine"]["cpu"] and report["machine"]["torch"]
    assert report["results"]["step_time"]["seed_fraction_0_matches_grpo"], table
    assert [row["size"] for row in report["results"]["bank"]["sizes"]] == [10**4, 10**5]
    names = {t["name"].split(",")[0] for t in report["targets"]}
    assert names >= {"step time ratio", "SeedBank.sample", "metadata per rollout", "resume time per 10^6 rollouts"}
    assert any(name.startswith("2 ranks resuming one bank") for name in names)
    assert "physical bound" in table and "static-batching bound" in table and "generated tokens" in table
    missed = [f"{t['name']}: {t['value']} > {t['ci_limit']}" for t in report["targets"] if not t["ci_ok"]]
    assert not missed, "\n".join(missed) + "\n\n" + table
