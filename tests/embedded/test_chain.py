"""The chain task (errors that can be repaired), `--task` across the commands, and `probe-cuts`."""

import csv
import random

import numpy as np
import pytest

from ts_trl.embedded import EmbeddedTask, Problem, embedded_reward
from ts_trl.embedded.chain import ChainTask, read_trace, trace_rates
from ts_trl.embedded.tasks import TASKS, make_task


def test_a_repaired_error_passes_and_an_unrepaired_one_fails():
    answer = "18"  # Q: 3+8+1+6
    right = " 3+8=11\n11+1=12\n12+6=18\n#### 18"
    repaired = " 3+8=11\n11+1=13\n? 11+1=12\n12+6=18\n#### 18"
    unrepaired = " 3+8=11\n11+1=13\n13+6=19\n#### 19"
    wrong_repair = " 3+8=11\n11+1=13\n? 11+1=14\n14+6=20\n#### 20"
    recheck = " 3+8=11\n? 3+8=11\n11+1=12\n12+6=18\n#### 18"
    rewards = embedded_reward([right, repaired, unrepaired, wrong_repair, recheck], [answer] * 5)
    assert rewards == [1.0, 1.0, 0.0, 0.0, 1.0]
    traces = [read_trace(c, answer) for c in (right, repaired, unrepaired, wrong_repair, recheck)]
    assert [(t.has_error, t.has_repair, t.passed) for t in traces] == [
        (False, False, True),
        (True, True, True),
        (True, False, False),
        (True, True, False),
        (False, True, True),
    ]
    rates = trace_rates(traces)
    assert rates["error_share"] == pytest.approx(3 / 5) and rates["repair_share"] == pytest.approx(3 / 5)
    assert rates["error_or_repair_share"] == pytest.approx(4 / 5)
    assert rates["recovery_rate"] == pytest.approx(1 / 3)  # of the three with an error, the repaired one passed
    assert np.isnan(trace_rates([traces[0]])["recovery_rate"])
    # Noise lines are skipped, and only the first answer counts.
    assert read_trace(" 1+2=3\nxx\n#### 3\n#### 4", "3") == read_trace(" 1+2=3\n#### 3", "3")


def test_the_strict_chain_reward_counts_every_line():
    """`chain_reward` (task chain-strict): a repaired error passes; an unrepaired one fails even when a second slip
    brings the total back; a chain must use each operand once, from the running total, and end on it."""
    from ts_trl.embedded.chain import chain_reward

    prompt, answer = "Q: 3+8+1+6\nA:", "18"
    cases = {
        " 3+8=11\n11+1=12\n12+6=18\n#### 18": 1.0,
        " 3+8=11\n11+1=13\n? 11+1=12\n12+6=18\n#### 18": 1.0,  # repaired
        " 3+8=11\n? 3+8=11\n11+1=12\n12+6=18\n#### 18": 1.0,  # a recheck of a right line
        " 3+8=11\n11+1=13\n13+6=19\n#### 19": 0.0,  # unrepaired
        " 3+8=11\n11+1=13\n13+6=18\n#### 18": 0.0,  # two slips that cancel: the answer reward passes it
        " 3+8=11\n11+1=13\n? 11+1=14\n14+6=20\n#### 20": 0.0,  # a wrong repair
        " 3+8=11\n11+1=12\n? 3+8=11\n12+6=18\n#### 18": 0.0,  # a "?" line must recompute the line before it
        " 3+9=12\n12+6=18\n#### 18": 0.0,  # not the operands
        " 3+8=11\n11+6=17\n#### 17": 0.0,  # an operand left out
        " 3+8=11\n12+1=13\n13+6=19\n#### 18": 0.0,  # not from the running total, and the answer is not its end
        " #### 18": 0.0,
    }
    assert chain_reward(list(cases), [answer] * len(cases), [prompt] * len(cases)) == list(cases.values())
    assert embedded_reward([" 3+8=11\n11+1=13\n13+6=18\n#### 18"], [answer]) == [1.0]
    # Every warm-up trace the answer reward passes, the chain reward passes too, but for rare cancelling slips.
    task, rng = ChainTask(), random.Random(0)
    problems = [task.sample_problem(rng) for _ in range(2000)]
    traces = [task.sample_solution(p, rng) for p in problems]
    answers, prompts = [p.answer for p in problems], [p.prompt for p in problems]
    strict, loose = chain_reward(traces, answers, prompts), embedded_reward(traces, answers)
    assert all(s <= a for s, a in zip(strict, loose)) and 0 <= sum(loose) - sum(strict) <= 0.01 * len(traces)


def test_warm_up_traces_make_errors_and_repair_them_at_the_set_rates():
    task, rng = ChainTask(), random.Random(0)
    traces, lengths = [], []
    for _ in range(3000):
        problem = task.sample_problem(rng)
        assert 4 <= len(problem.operands) <= 6 and len(set(problem.operands)) == len(problem.operands)
        assert all(1 <= d <= 9 for d in problem.operands)
        solution = task.sample_solution(problem, rng)
        lengths.append(len(solution))
        traces.append(read_trace(solution, problem.answer))
    rates = trace_rates(traces)
    # Per line p(error) = 0.15 over 3-5 lines: 1 - 0.85^4 ~ 0.48 of traces hold an error on average.
    assert 0.4 < rates["error_share"] < 0.56
    # A trace passes iff each wrong line was repaired (0.6 each): far above chance (0), far below certainty.
    assert 0.45 < rates["recovery_rate"] < 0.65
    assert all(t.passed for t in traces if not t.has_error)
    assert 40 < np.mean(lengths) < 50 and np.mean([n + 1 > task.max_completion_tokens for n in lengths]) < 0.02
    # No errors, no repairs: exactly the addition task's solutions.
    clean = ChainTask(error_rate=0.0, recheck_rate=0.0)
    problem = Problem((3, 8, 1, 6))
    assert clean.sample_solution(problem, random.Random(1)) in clean.solutions(problem)


def test_chain_splits_and_bad_rates():
    train, held_out = ChainTask().make_splits(300, 256)
    operand_sets = [{tuple(sorted(Problem.from_prompt(p).operands)) for p in d["prompt"]} for d in (train, held_out)]
    assert not operand_sets[0] & operand_sets[1] and len(set(held_out["prompt"])) == 256
    with pytest.raises(ValueError, match="error_rate"):
        ChainTask(error_rate=1.5)
    with pytest.raises(ValueError, match="--task nope"):
        make_task("nope")


def test_the_addition_task_is_unchanged_by_the_registry():
    """`--task add` builds the very task, model size and warm-up the addition default always had (same cache key)."""
    from ts_trl.embedded.warmup import DEFAULT_MODEL_KWARGS

    assert make_task("add") == EmbeddedTask(difficulty=2, min_difficulty=1, seed=0)
    assert vars(make_task("add", seed=3)) == vars(EmbeddedTask(difficulty=2, min_difficulty=1, seed=3))
    assert TASKS["add"].model_kwargs == DEFAULT_MODEL_KWARGS and TASKS["add"].warmup_steps == 600


def test_chain_trains_through_the_trainer(tmp_path, tokenizer):
    """A few steps of Thinking Seeds on the chain task with a tiny budget: seeds are found and spliced."""
    from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
    from ts_trl.tiny import build_tiny_model

    train, _ = ChainTask().make_splits(4, 1)
    model = build_tiny_model(tokenizer, num_layers=3)
    args = SeedGRPOConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=12,
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed_fraction=1.0,
        seed_snapshot_only=False,
        disable_tqdm=True,
    )
    trainer = SeedGRPOTrainer(
        model=model, reward_funcs=embedded_reward, args=args, train_dataset=train, processing_class=tokenizer
    )
    trainer.train()
    assert trainer.state.global_step == 3
    assert sum(h.get("seeds/seeded_group_share", 0) for h in trainer.state.log_history) > 0


def test_train_cli_runs_the_chain_task(tmp_path, monkeypatch):
    """`ts_trl train --task chain`: the chain's 3-layer warm model, its prompts and its 72-token budget by default."""
    import json

    from ts_trl.__main__ import main

    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "chain"
    argv = ["train", "--task", "chain", "--output_dir", str(out), "--embedded_warmup_steps", "3",
            "--embedded_train_problems", "4", "--embedded_eval_problems", "4", "--embedded_eval_samples", "1",
            "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_steps", "2",
            "--save_steps", "2", "--disable_tqdm", "true"]  # fmt: skip
    assert main(argv) == 0
    settings = json.loads(next((tmp_path / "cache").glob("warmup/*/warmup_settings.json")).read_text())
    assert settings["model_config"]["num_hidden_layers"] == 3 and settings["task"]["max_operand"] == 9
    assert settings["steps"] == 3
    config = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert config["global_step"] == 2
    assert json.loads((out / "report.json").read_text())["steps"] == 2
    training_args = __import__("torch").load(out / "checkpoint-2" / "training_args.bin", weights_only=False)
    assert training_args.max_completion_length == 72
    try:  # bad input: one line and status 2, before anything is built (returned when answered before TRL's import)
        status = main(["train", "--task", "nope", "--output_dir", str(tmp_path / "x")])
    except SystemExit as exit_info:
        status = exit_info.code
    assert status == 2 and not (tmp_path / "x").exists()


def test_probe_cuts_end_to_end(tmp_path, capsys):
    """`ts_trl probe-cuts` on a tiny setting: its table and suggested cut_ratio_max are recomputed from its groups."""
    from ts_trl.__main__ import main
    from ts_trl.analysis.probe_cuts import choose_cut_ratio_max
    from ts_trl.embedded.tasks import build_task_model

    model, tokenizer = build_task_model("add", warmup_steps=3, cache_dir=tmp_path / "cache", progress=False)
    model.save_pretrained(tmp_path / "warm")
    tokenizer.save_pretrained(tmp_path / "warm")
    out = tmp_path / "probe"
    argv = ["probe-cuts", "--checkpoint", str(tmp_path / "warm"), "--num-prompts", "3", "--seeds", "2",
            "--generations", "4", "--ratios", "0.1", "0.5", "0.9", "--max-completion-length", "12",
            "--output-dir", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    groups = list(csv.DictReader(open(out / "probe_cuts_groups.csv")))
    plain = [g for g in groups if g["kind"] == "plain"]
    assert len(plain) == 3 and all(g["size"] == "4" for g in groups)
    summary = list(csv.DictReader(open(out / "probe_cuts.csv")))
    assert [float(r["ratio"]) for r in summary] == [0.1, 0.5, 0.9]
    for row in summary:
        seeded = [g for g in groups if g["kind"] == "seeded" and float(g["ratio"]) == float(row["ratio"])]
        assert int(row["seeded_groups"]) == len(seeded) == 6  # every seed has a cut at every ratio
        equal = np.mean([int(g["passes"]) in (0, 4) for g in seeded])
        assert float(row["all_equal_seeded"]) == pytest.approx(equal)
        assert float(row["all_equal_plain"]) == pytest.approx(np.mean([int(g["passes"]) in (0, 4) for g in plain]))
        assert float(row["pass_seeded"]) == pytest.approx(sum(int(g["passes"]) for g in seeded) / 24)
        line = next(line for line in printed.splitlines() if line.startswith(f"| {float(row['ratio']):g} |"))
        assert f"{equal:.2f}" in line
    summary = [{k: float(v) for k, v in r.items()} for r in summary]
    choice = choose_cut_ratio_max(summary, 0.1, [0.9, 0.7, 0.5, 0.3], 0.10)
    assert (f"cut_ratio_max = {choice:g}" if choice is not None else "no candidate passes") in printed


def test_choose_cut_ratio_max_by_hand():
    from ts_trl.analysis.probe_cuts import choose_cut_ratio_max

    rows = [
        {"ratio": r, "all_equal_seeded": s, "all_equal_plain": 0.28}
        for r, s in [(0.1, 0.30), (0.3, 0.36), (0.5, 0.48), (0.7, 0.80), (0.9, 1.0)]
    ]
    # Means over [0.1, c]: 0.3 -> 0.33, 0.5 -> 0.38, 0.7 -> 0.485, 0.9 -> 0.588; the bar is 0.38.
    assert choose_cut_ratio_max(rows, 0.1, [0.9, 0.7, 0.5, 0.3], 0.10) == 0.5
    assert choose_cut_ratio_max(rows, 0.1, [0.9, 0.7, 0.5, 0.3], 0.0) is None
    assert choose_cut_ratio_max(rows, 0.1, [0.9, 0.7, 0.5, 0.3], 0.40) == 0.9


def test_probe_cuts_rejects_bad_input(capsys):
    from ts_trl.__main__ import main

    assert main(["probe-cuts", "--task", "nope"]) == 2
    assert "--task nope" in capsys.readouterr().err
    assert main(["probe-cuts", "--generations", "1"]) == 2
    assert "--generations" in capsys.readouterr().err


def test_relay_prompts_follow_the_task():
    """`relay --prompts embedded --task chain` reads the chain's held-out problems, the default the addition's."""
    from ts_trl.analysis.common import InputError, load_prompts

    chain = load_prompts("embedded", 5, task_seed=0, task="chain")
    assert [row["prompt"] for row in chain] == ChainTask(seed=0).make_splits(1, 5)[1]["prompt"]
    add = load_prompts("embedded", 5, task_seed=0)
    assert [row["prompt"] for row in add] == EmbeddedTask(difficulty=2, seed=0).make_splits(1, 5)[1]["prompt"]
    with pytest.raises(InputError, match="--task nope"):
        load_prompts("embedded", 5, task="nope")


@pytest.mark.slow  # two minutes on 2 busy cores
def test_compare_runs_the_chain_task_with_its_endpoints(tmp_path, monkeypatch):
    """`compare --task chain-strict` in miniature: the chain's columns are written, the recovery rate is a secondary
    endpoint, and the warm start is scored with the strict reward (never above the answer reward's pass rate)."""
    import argparse

    from ts_trl.__main__ import main
    from ts_trl.analysis.compare_report import endpoints_of
    from ts_trl.analysis.compare_stats import read_csv

    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "compare"
    argv = ["compare", "--task", "chain-strict", "--quick", "--methods", "seeds-state", "--num-seeds", "2",
            "--steps", "3", "--n-train", "4", "--n-eval", "4", "--eval-every", "0", "--n-probe", "2",
            "--warmup-steps", "2", "--prompts-per-step", "2", "--learning-rate", "1e-3", "--cut-ratio-max", "0.3",
            "--jobs", "1", "--output-dir", str(out)]  # fmt: skip
    assert main(argv) == 0
    runs = read_csv(out / "compare.csv")
    assert {"error_share", "repair_share", "error_or_repair_share", "recovery_rate"} <= set(runs[0])
    assert all(0.0 <= float(r["error_or_repair_share"]) <= 1.0 for r in runs)
    endpoints = {d["endpoint"] for d in read_csv(out / "differences.csv")}
    assert "pass@1 at equal steps" in endpoints
    # The task's own endpoint joins the secondaries (here all NaN: a 2-step warm-up makes no sums to get wrong).
    assert endpoints_of(argparse.Namespace(task="chain-strict", difficulty=2, min_difficulty=1)) == (
        "coverage",
        "recovery_rate",
    )
    assert "Chain task, scored by the whole chain" in (out / "compare.md").read_text()


def test_compare_asks_for_what_the_chain_task_has_no_default_for(capsys):
    from ts_trl.__main__ import main

    assert main(["compare", "--task", "chain", "--output-dir", "unused"]) == 2
    assert "--learning-rate" in capsys.readouterr().err
    assert main(["compare", "--task", "chain-strict", "--learning-rate", "1e-4", "--output-dir", "unused"]) == 2
    assert "--cut-ratio-max" in capsys.readouterr().err


def test_task_chain_brings_its_own_defaults(tmp_path, monkeypatch):
    """`--task chain` changes the embedded default's budget, warm-up and folder; the addition's stay as they were."""
    from ts_trl.cli.arguments import make_parser, parse_args

    monkeypatch.chdir(tmp_path)
    script_args, training_args, _ = parse_args(make_parser(), ["--task", "chain"])
    assert (script_args.task, script_args.embedded_warmup_steps) == ("chain", 700)
    assert training_args.max_completion_length == 72 and training_args.output_dir == "runs/chain"
    script_args, training_args, _ = parse_args(
        make_parser(), ["--task", "chain-strict", "--max_completion_length", "80"]
    )
    assert (
        script_args.reward_funcs == ["ts_trl.embedded.chain:chain_reward"]
        and training_args.max_completion_length == 80
    )
    script_args, training_args, _ = parse_args(make_parser(), [])
    assert (script_args.task, script_args.embedded_warmup_steps, training_args.max_completion_length) == (
        "add",
        600,
        32,
    )
