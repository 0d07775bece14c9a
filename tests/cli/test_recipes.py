"""The shipped recipes as a user launches them: each seeds early in its run, and MBPP's prompts can score."""

import json
import re
from pathlib import Path

import pytest
import yaml
from datasets import load_dataset

from ts_trl.cli import arguments
from ts_trl.cli.arguments import make_parser, parse_args
from ts_trl.data.loaders import to_prompt_dataset
from ts_trl.rewards import get_reward_funcs
from ts_trl.trainer.schedule import schedule_of

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
# Training rows of the Hub splits the recipes name (the dataset cards' counts); the embedded task's comes from its
# own setting.
SPLIT_ROWS = {
    ("openai/gsm8k", "main", "train"): 7473,
    ("google-research-datasets/mbpp", "full", "train"): 374,
}
EARLY_SHARE = 0.1


def _launched(recipe: Path):
    """The recipe parsed as its own launch line runs it, and the number of processes that line starts."""
    text = recipe.read_text()
    launch = re.search(r"--config_file (\S+\.yaml) train\.py --config recipes/" + re.escape(recipe.name), text)
    assert launch, f"{recipe.name} names no `accelerate launch --config_file ... train.py --config` line"
    processes = yaml.safe_load((ROOT / launch.group(1)).read_text())["num_processes"]
    # bf16 and vLLM are left out only because this machine has no GPU: neither changes the run's steps.
    argv = ["--config", str(recipe), "--use_cpu", "--bf16", "false", "--use_vllm", "false"]
    script_args, training_args, _ = parse_args(make_parser(), argv)
    return text, script_args, training_args, processes


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_seeds_within_the_first_tenth_of_its_run(recipe, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.chdir(tmp_path)  # the embedded default's output_dir, runs/embedded, may hold the quick start's run
    # The GPU recipes' Hub models are not cached on this offline machine, and the Hub cannot be asked, which the parser
    # refuses; only the schedule is read here, and no model is loaded.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(arguments, "model_source_problem", lambda name: None)
    text, script_args, training_args, processes = _launched(recipe)
    if script_args.dataset_name is None:
        rows = script_args.embedded_train_problems
    else:
        key = (script_args.dataset_name, script_args.dataset_config, script_args.dataset_train_split)
        rows = SPLIT_ROWS[key]
    if script_args.max_train_samples is not None:
        rows = min(rows, script_args.max_train_samples)
    schedule = schedule_of(training_args, rows, processes)
    assert schedule.first_seeded_step is not None, f"{recipe.name} never seeds: {schedule.describe()}"
    assert schedule.first_seeded_step <= EARLY_SHARE * schedule.total_steps, schedule.describe()
    # The recipe says when seeding starts, and says it right.
    said = f"seeding starts at step {schedule.first_seeded_step} of {schedule.total_steps}"
    assert said in " ".join(line.lstrip("# ") for line in text.splitlines()), f"{recipe.name} should say: {said}"


# MBPP-format rows written for this test (text, reference code, asserts), and a wrong program for each.
MBPP_ROWS = [
    {
        "task_id": 1,
        "text": "Write a function to find the shared elements of two tuples.",
        "code": "def common_items(a, b):\n    return tuple(sorted(set(a) & set(b)))",
        "test_list": [
            "assert common_items((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)",
            "assert common_items((1, 2), (3, 4)) == ()",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 2,
        "text": "Write a python function to count the vowels of a string.",
        "code": "def vowel_count(s):\n    return sum(ch in 'aeiou' for ch in s.lower())",
        "test_list": ["assert vowel_count('Banana') == 3", "assert vowel_count('xyz') == 0"],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
]
WRONG = ["def common_items(a, b):\n    return a", "def vowel_count(s):\n    return len(s)"]


def test_mbpp_prompts_name_the_function_and_references_score_one(tmp_path):
    recipe = ROOT / "recipes" / "qwen2.5-coder-1.5b_mbpp.yaml"
    data = tmp_path / "mbpp.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in MBPP_ROWS))
    settings = yaml.safe_load(recipe.read_text())
    rows = to_prompt_dataset(
        load_dataset("json", data_files=str(data), split="train"),
        prompt_column=settings["prompt_column"],
        answer_column=settings["answer_column"],
        system_prompt=settings["system_prompt"],
        conversational=settings["conversational"],
        domain=settings["domain"],
    )
    (reward,) = get_reward_funcs(settings["reward_funcs"])
    for row, source in zip(rows, MBPP_ROWS):
        called = re.search(r"assert (\w+)\(", source["test_list"][0]).group(1)
        user = next(m["content"] for m in row["prompt"] if m["role"] == "user")
        assert called in user, f"the prompt never names {called}(), which every test calls: {user!r}"
    answer = lambda program: [{"role": "assistant", "content": f"```python\n{program}\n```"}]  # noqa: E731
    prompts, tests = list(rows["prompt"]), list(rows["tests"])
    assert reward([answer(r["code"]) for r in MBPP_ROWS], tests, prompts=prompts) == [1.0, 1.0]
    assert reward([answer(w) for w in WRONG], tests, prompts=prompts) == [0.0, 0.0]
