"""`benchmarks/run.py --quick` runs end to end and reports its targets; the timing gates themselves run with -m slow.

Wall-clock targets on a shared CI machine fail on load, not on code: CI runs the step-time section (its correctness
check, `seed_fraction=0` gives GRPO's losses, does not depend on time), and the whole quick benchmark with every
target's CI margin is marked slow.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _quick_benchmark(tmp_path, *only: str) -> tuple[dict, str]:
    command = [sys.executable, str(REPO / "benchmarks" / "run.py"), "--quick", "--out", str(tmp_path)]
    command += ["--only", *only] if only else []
    result = subprocess.run(command, capture_output=True, text=True, timeout=540, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads((tmp_path / "latest.json").read_text()), (tmp_path / "latest.md").read_text()


@pytest.mark.timeout(600)
def test_quick_step_time_benchmark_runs_and_reports_its_targets(tmp_path):
    report, table = _quick_benchmark(tmp_path, "step_time")
    assert report["machine"]["cpu"] and report["machine"]["torch"]
    assert report["results"]["step_time"]["seed_fraction_0_matches_grpo"], table
    assert any(t["name"].startswith("step time ratio") for t in report["targets"]), report["targets"]
    assert "physical bound" in table and "static-batching bound" in table and "generated tokens" in table


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_benchmark_meets_its_targets(tmp_path):
    # About 2 minutes on a loaded 2-core machine: step times of 4 trainers, banks of 10^4 and 10^5 (each resumed by two
    # ranks at once), rewards.
    report, table = _quick_benchmark(tmp_path)
    assert report["results"]["step_time"]["seed_fraction_0_matches_grpo"], table
    assert [row["size"] for row in report["results"]["bank"]["sizes"]] == [10**4, 10**5]
    names = {t["name"].split(",")[0] for t in report["targets"]}
    assert names >= {"step time ratio", "SeedBank.sample", "metadata per rollout", "resume time per 10^6 rollouts"}
    assert any(name.startswith("2 ranks resuming one bank") for name in names)
    missed = [f"{t['name']}: {t['value']} > {t['ci_limit']}" for t in report["targets"] if not t["ci_ok"]]
    assert not missed, "\n".join(missed) + "\n\n" + table


def _agent_seeding():
    """`benchmarks/agent_seeding.py` as a module (it puts `benchmarks/` on the path for its `step_time` import)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("agent_seeding", REPO / "benchmarks" / "agent_seeding.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(600)
def test_agent_seeding_benchmark_reports_seeded_groups_that_never_regenerate_their_prefix(tmp_path):
    # About a minute on 2 busy cores: two 60-step warm-ups, then 3 trainers x 6 steps of 16 rollouts per task.
    out = tmp_path / "out"
    command = [sys.executable, str(REPO / "benchmarks" / "agent_seeding.py"), "--quick", "--warmup-steps", "60"]
    env = {**os.environ, "TS_TRL_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, timeout=540, check=False, env=env
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    report = json.loads((out / "agent_seeding.json").read_text())
    table = (out / "agent_seeding.md").read_text()
    assert report["machine"]["commit"] and report["load"]["load1_mean"] is not None
    assert set(report["results"]) == {"calculator", "register"}
    for task, r in report["results"].items():
        check, v = r["no_regeneration"], r["variants"]
        assert check["violation_count"] == 0, check["violations"]
        # the check saw seeded rows whose prefix holds tool calls: it could have caught a call run again
        assert check["seeded_rows_with_prefix_calls"] > 0, check
        assert v["plain"]["generated_tokens_per_row"]["seeded"]["rows"] == 0
        assert v["seeded"]["seeded_group_share"]["median"] > 0
        assert v["mixed"]["generated_tokens_per_row"]["seeded"]["rows"] > 0
        assert v["mixed"]["generated_tokens_per_row"]["plain"]["rows"] > 0
        for name, variant in v.items():
            assert variant["steps"] == report["settings"]["measured_steps"], name
            assert variant["generated_tokens_metric_mismatches"] == 0, name  # the trainer's seeds/generated_tokens
            assert variant["step_wall_s"]["median"] > 0 and variant["generate_s"]["median"] > 0
        cost = v["seeded"]["replay_cost_per_seeded_group_ms"]
        assert cost["total"]["median"] > 0 and cost["prefix_turns"]["median"] > 0
        assert (cost["replay_calls"]["median"] > 0) == (task == "register")  # the calculator replays nothing
        assert f"## {task}" in table
    assert table.count("No regeneration: holds") == 2, table
    again = subprocess.run(
        [sys.executable, command[1], "--report", str(out / "agent_seeding.json")], capture_output=True, text=True
    )
    assert again.stdout == table  # the tables are recomputed from the saved JSON alone


def _batch(**changes):
    """One generation batch as `Recorder` leaves it: a plain row and a seeded row whose prefix called `add` once."""
    call, answer = ("add", '{"a": 1, "b": 2}'), ("add", '{"a": 3, "b": 4}')
    seeded = {
        "seeded": True,
        "dropped": False,
        "k": 3,
        "prompt_ids": [5, 6],
        "seed_prefix": [7, 8, 9],
        "completion_ids": [7, 8, 9, 10, 11],
        "tool_mask": [1, 0, 0, 1, 1],
        "prefix_calls": [call],
        "new_calls": [answer],
        "executed": [("loop", *answer, True)],
        "environment_log": None,
    }
    plain = {**seeded, "seeded": False, "k": 0, "seed_prefix": [], "prefix_calls": [], "executed": []}
    plain |= {"new_calls": [], "completion_ids": [10, 11], "tool_mask": [1, 1]}
    batch = {
        "step": 4,
        "rows": [plain, seeded],
        "calls": [{"inputs": [[5, 6], [5, 6, 7, 8, 9]], "max_new_tokens": 8}],
        "max_completion_length": 8,
        "environment": False,
        "tool_log": [("loop", *answer)],
    }
    for key, value in changes.items():
        if key in seeded:
            batch["rows"][1] = {**seeded, key: value}
        else:
            batch[key] = value
    return batch


def test_agent_seeding_check_fails_when_a_prefix_is_run_or_generated_again():
    check_rows = _agent_seeding().check_rows
    assert check_rows(_batch()) == []
    call, answer = ("add", '{"a": 1, "b": 2}'), ("add", '{"a": 3, "b": 4}')
    # the tool loop runs the prefix's call again
    again = check_rows(_batch(executed=[("loop", *call, True), ("loop", *answer, True)], tool_log=[call, answer]))
    assert any("the tool loop ran" in p for p in again), again
    # a function tool is called for the prefix before generation
    restored = check_rows(
        _batch(executed=[("restore", *call, True), ("loop", *answer, True)], tool_log=[call, answer])
    )
    assert any("before generation" in p for p in restored), restored
    # the first generate call gets the prompt alone: the model would generate the prefix again
    regenerated = check_rows(_batch(calls=[{"inputs": [[5, 6], [5, 6]], "max_new_tokens": 8}]))
    assert any("prompt + prefix" in p for p in regenerated), regenerated
    # a budget other than max_completion_length minus the shortest prefix
    budget = check_rows(_batch(calls=[{"inputs": [[5, 6], [5, 6, 7, 8, 9]], "max_new_tokens": 5}]))
    assert any("budget" in p for p in budget), budget
    # an environment replay that skips the prefix's call, or runs a call nobody's table saw
    replay = check_rows(_batch(environment=True, environment_log=[("loop", *answer)]))
    assert any("before generation" in p for p in replay), replay
    assert any("the tools ran" in p for p in check_rows(_batch(tool_log=[call, answer])))


@pytest.mark.timeout(600)
def test_quick_trace_benchmark_reports_its_row(tmp_path):
    """The text-seed benchmark's row stands in the quick run: 10^4 traces, every one a seed (its time is not judged)."""
    report, table = _quick_benchmark(tmp_path, "traces")
    (row,) = report["results"]["traces"]["sizes"]
    assert row["traces"] == row["kept"] == 10**4 and row["cuts_per_seed"] > 0 and row["peak_rss_mb"] > 0
    assert any(t["name"].startswith("text seeds of 10^4") for t in report["targets"]), report["targets"]
    assert "## Text seeds of trace datasets" in table
