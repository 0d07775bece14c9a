"""`ts_trl compare --config <recipe>` end to end on CPU: a tiny model saved to a folder, local .jsonl data, a reward
from a module of the working directory, two arms; then a rerun that skips the finished arm and resumes the other."""

import csv
import json
import shutil

import numpy as np
import pytest

from ts_trl.tiny import build_tiny_model, build_tokenizer

REWARDS_MODULE = '''
def digit_parity(completions, answer, **kwargs):
    """1.0 when the response has an even number of digits: cheap, and spread on the tiny model's random text."""
    assert len(answer) == len(completions)  # the row's columns reach the reward, as in TRL
    return [float(sum(ch.isdigit() for ch in c) % 2 == 0) for c in completions]
'''


@pytest.fixture
def recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the reward module is found in the working directory, as TRL's scripts do
    (tmp_path / "my_rewards.py").write_text(REWARDS_MODULE)
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    for name, numbers in (("train", range(4)), ("test", range(20, 25))):  # 4 prompts come back at step 3
        rows = [{"question": f"Q: {i}+{i + 1}=", "answer": str(2 * i + 1)} for i in numbers]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "recipe.yaml"
    path.write_text(
        f"""# Model arguments
model_name_or_path: {tmp_path / "model"}
# Data arguments
dataset_path: {tmp_path / "train.jsonl"}
reward_funcs: [my_rewards.digit_parity]
# Seeding
seed_fraction: 1.0
seed_snapshot_only: false  # seeds from the step before, so that a 4-step arm seeds
# Training: small and fast; each value is what keeps an arm to seconds on CPU
output_dir: {tmp_path / "unused"}
per_device_train_batch_size: 8  # two prompt groups per step
num_generations: 4
max_completion_length: 12
max_steps: 4
save_steps: 2  # checkpoints at 2 and 4: resume points and the learning curve
learning_rate: 1.0e-3
use_cpu: true
bf16: false
report_to: none
disable_tqdm: true
"""
    )
    return path


def _argv(recipe, tmp_path, *methods):
    return ["compare", "--config", str(recipe), "--methods", *methods, "--num-seeds", "1",
            "--eval_dataset", str(tmp_path / "test.jsonl"), "--eval-samples", "4", "--n-probe", "4",
            "--output-dir", str(tmp_path / "out")]  # fmt: skip


def test_compare_config_runs_the_arms_on_the_recipe_and_resumes(recipe, tmp_path, monkeypatch, capsys):
    from ts_trl.__main__ import main
    from ts_trl.analysis.compare_protocol import PRIMARY
    from ts_trl.cli import train as script

    trained = []
    real_train = script.main

    def spy(script_args, training_args, model_args):
        trained.append((training_args.output_dir, training_args.seed_method, training_args.resume_from_checkpoint))
        return real_train(script_args, training_args, model_args)

    monkeypatch.setattr(script, "main", spy)
    out = tmp_path / "out"
    assert main(_argv(recipe, tmp_path, "seeds-state")) == 0
    printed = capsys.readouterr().out
    assert [(m, r) for _, m, r in trained] == [("none", None), ("seeds", None)]
    runs = list(csv.DictReader(open(out / "compare.csv")))
    assert sorted(r["method"] for r in runs) == ["none", "seeds-state"]
    assert all(r["steps"] == "4" for r in runs)
    assert int(next(r for r in runs if r["method"] == "seeds-state")["reused_tokens"]) > 0  # it really seeded
    # Held-out: the 5 prompts of test.jsonl x 4 samples, scored at the start and at both checkpoints of each arm.
    prompts = list(csv.DictReader(open(out / "prompts.csv")))
    for run in runs:
        rows = [p for p in prompts if p["method"] == run["method"]]
        assert sorted({int(p["step"]) for p in rows}) == [0, 2, 4] and all(p["samples"] == "4" for p in rows)
        last = [p for p in rows if p["step"] == "4"]
        assert len(last) == 5
        assert float(run["pass_at_1"]) == pytest.approx(np.mean([int(p["passes"]) / 4 for p in last]))
    # Common random numbers: the start model's samples are the same for both arms.
    start = {(p["method"], p["prompt"]): p["passes"] for p in prompts if p["step"] == "0"}
    assert all(start[("none", j)] == start[("seeds-state", j)] for _, j in start)
    # The passes are the reward's verdicts on what the model wrote: not all equal on random text.
    assert {p["passes"] for p in prompts} - {"0", "4"}
    differences = list(csv.DictReader(open(out / "differences.csv")))
    primary = next(d for d in differences if d["endpoint"] == PRIMARY)
    assert primary["method"] == "seeds-state" and primary["seeds"] == "1"
    assert "Recipe recipe.yaml" in printed and "| seeds-state | none |" in printed
    assert (out / "compare.png").stat().st_size > 10_000
    assert (out / "runs" / "seeds-state-seed0" / "seeds" / "manifest.json").exists()

    # The seeds-state arm stopped after its checkpoint at step 2 (its later files gone); none had finished.
    before = (out / "runs" / "none-seed0" / "output.json").read_text()
    arm = out / "runs" / "seeds-state-seed0"
    (arm / "output.json").unlink()
    shutil.rmtree(arm / "checkpoint-4")
    trained.clear()
    assert main(_argv(recipe, tmp_path, "seeds-state")) == 0
    assert trained == [(str(arm), "seeds", str(arm / "checkpoint-2"))]  # only the unfinished arm, from its checkpoint
    assert (out / "runs" / "none-seed0" / "output.json").read_text() == before
    resumed = json.loads((arm / "output.json").read_text())["result"]
    assert resumed["steps"] == 4  # the log history runs over the whole arm, steps before the resume included
    capsys.readouterr()


def test_compare_config_refuses_bad_input_in_one_line(recipe, tmp_path, capsys):
    from ts_trl.__main__ import main

    assert main(["compare", "--config", str(recipe), "--seed", "3"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "ts_trl compare: error: --seed: set per arm by compare --config; leave it out."
    )
    # A local one-file dataset has no test split: the held-out prompts must be named.
    assert main(["compare", "--config", str(recipe), "--output-dir", str(tmp_path / "o")]) == 2
    assert "give --eval_dataset" in capsys.readouterr().err
    assert main(["compare", "--config", "embedded", "--output-dir", str(tmp_path / "o")]) == 2
    assert "without --config" in capsys.readouterr().err
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(recipe.read_text().replace("my_rewards.digit_parity", "no_such_reward"))
    argv = ["compare", "--config", str(unknown), "--eval_dataset", str(tmp_path / "test.jsonl")]
    assert main([*argv, "--output-dir", str(tmp_path / "o")]) == 2
    assert "Unknown reward 'no_such_reward'" in capsys.readouterr().err
    assert not (tmp_path / "o" / "settings.json").exists()  # a corrected rerun into the same folder is not refused
