"""Bad input to `ts_trl train` and `train.py`, answered before torch, transformers and TRL are imported: one line, exit
status 2, the same line the full parser gives, and the table of flags that makes it possible kept equal to the parser."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ts_trl.cli.arguments import make_parser, parse_args, run_defaults
from ts_trl.cli.early import input_problems, read_recipe, rule_values, run_kind
from ts_trl.cli.flag_table import SHIPPED_TABLE, load_table, table_of
from ts_trl.cli.refusals import ConfigError
from ts_trl.method.settings import RULE_FIELDS
from ts_trl.rewards import REWARD_NAMES, get_reward_funcs
from ts_trl.store.checkpoints import TRAINER_STATE, last_checkpoint

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "trl")
COMMANDS = {"ts_trl train": ["-m", "ts_trl", "train"], "train.py": [str(ROOT / "train.py")]}


def _run(command: str, argv: list[str], tmp_path: Path, cwd: Path = ROOT):
    """The command in a fresh interpreter under `-X importtime`: (exit status, stderr lines, top-level imports)."""
    environment = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TS_TRL_CACHE": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",
    }
    environment.pop("PYTHONWARNINGS", None)
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *COMMANDS[command], *argv],
        capture_output=True, text=True, env=environment, cwd=cwd, timeout=600,
    )  # fmt: skip
    lines = result.stderr.splitlines()
    imported = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}
    return result.returncode, [line for line in lines if not line.startswith("import time:")], imported


def _cases(tmp: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Bad inputs of every kind answered early: (argv, what the one line names)."""
    used = tmp / "used"
    (used / "checkpoint-5").mkdir(parents=True, exist_ok=True)
    resumable = tmp / "resumable"
    (resumable / "checkpoint-8").mkdir(parents=True, exist_ok=True)  # a save cut short: no trainer state
    (resumable / "checkpoint-4").mkdir(exist_ok=True)
    (resumable / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4}')
    recipe = tmp / "recipe.yaml"
    recipe.write_text("seed_fractoin: 0.3\nlearning_rate: [1, 2]\ntask: nope\n")
    no_prompt = tmp / "no_prompt.jsonl"
    no_prompt.write_text('{"text": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "4"}\n')
    no_tests = tmp / "no_tests.csv"
    no_tests.write_text("prompt,solution\nWrite f.,def f(): pass\n")
    model = tmp / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")
    fresh = ["--output_dir", str(tmp / "fresh")]
    dataset = ["--model_name_or_path", str(model), "--reward_funcs", "math", *fresh]
    return {
        "used output folder": (["--output_dir", str(used)], ["holds an earlier run (checkpoints up to checkpoint-5)"]),
        "resume from a checkpoint that does not exist": (
            ["--resume_from_checkpoint", str(resumable / "checkpoint-9"), *fresh],
            ["checkpoint-9' does not exist: the checkpoints in", "resumable are checkpoint-4. Pass one of those"],
        ),
        "resume from a checkpoint named without its folder": (
            ["--resume_from_checkpoint", "checkpoint-8", "--output_dir", str(resumable)],
            ["'checkpoint-8' does not exist:", "resumable are checkpoint-4."],
        ),
        "resume from a save cut short": (
            ["--resume_from_checkpoint", str(resumable / "checkpoint-8"), *fresh],
            ["checkpoint-8' is not a checkpoint folder (it has no trainer_state.json): the checkpoints in"],
        ),
        "data file without a prompt column": (
            ["--dataset_path", str(no_prompt), *dataset],
            [
                "The dataset has no prompt column (one of problem, question, prompt, instruction, query); its columns",
                "are ['text', 'answer']. Name the right one with --prompt_column.",
            ],
        ),
        "data file without the column named": (
            ["--dataset_path", str(no_prompt), "--prompt_column", "query", *dataset],
            ["The dataset has no column 'query'; its columns are ['text', 'answer']."],
        ),
        "code data without tests": (
            ["--dataset_path", str(no_tests), "--domain", "code", *dataset],
            ["The dataset has no tests column (one of tests, test_list,", "Name the right one with --answer_column."],
        ),
        "unknown flags": (
            ["--seed_fractoin", "0.3", "--no_such_flag", "1", *fresh],
            ["unknown flag(s): --seed_fractoin (did you mean --seed_fraction?), --no_such_flag."],
        ),
        "bad values": (
            ["--learning_rate", "abc", "--use_cpu", "maybe", "--task", "nope", *fresh],
            ["--learning_rate abc: expected a number.", "--use_cpu maybe: expected true or false.", "--task nope"],
        ),
        "bad recipe": (
            ["--config", str(recipe), *fresh],
            [
                "unknown key(s): seed_fractoin (did you mean seed_fraction?)",
                "learning_rate: [1, 2]: expected a single",
            ],
        ),
        "no such recipe": (["--config", "no_such_recipe", *fresh], ["no such recipe file, nor a shipped recipe"]),
        "settings of the other data": (["--max_train_samples", "8", *fresh], ["--max_train_samples set a dataset's"]),
        "model that cannot load": (
            [
                "--dataset_path",
                str(recipe),
                "--reward_funcs",
                "math",
                "--model_name_or_path",
                "./no/such/model",
                *fresh,
            ],
            ["--model_name_or_path ./no/such/model: no such local folder."],
        ),
        "model not cached offline": (
            ["--model_name_or_path", "ts-trl-tests/not-a-cached-model", *fresh],
            ["not in the local Hugging Face cache, and HF_HUB_OFFLINE is set"],
        ),
        "quantized tiny model": (["--load_in_4bit", *fresh], ["the embedded default's tiny model is not quantized"]),
        "seeding settings out of range": (
            ["--seed_fraction", "2", "--cut_ratio_min", "0.8", "--cut_ratio_max", "0.2", *fresh],
            [
                "seed_fraction must lie in [0, 1], got 2.0.",
                "cut_ratio_min (0.8) must not exceed cut_ratio_max (0.2).",
            ],
        ),
        "seeding rule against a default": (
            ["--cut_ratio_min", "0.95", *fresh],
            ["cut_ratio_min (0.95) must not exceed cut_ratio_max (0.9)."],
        ),
        "reward names": (
            ["--reward_funcs", "embedded", "accuracy", "no_such_package.rewards:f", "ts_trl.rewards:later", *fresh],
            [
                "Unknown reward 'accuracy'; known rewards are ['binary_code', 'chat_add', 'chat_chain', 'code', 'embedded',",
                "Cannot import reward function 'no_such_package.rewards:f': No module named 'no_such_package'",
            ],
        ),
        "missing settings": (
            ["--dataset_path", str(tmp / "none.jsonl"), *fresh],
            ["--model_name_or_path is required", "--reward_funcs is required", "none.jsonl: no such file"],
        ),
    }


CASES = list(_cases(Path("/nonexistent")))  # the names only: the folders are made under each test's tmp_path


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", COMMANDS)
def test_bad_input_is_one_line_before_the_heavy_imports(command, case, tmp_path):
    argv, named = _cases(tmp_path)[case]
    status, lines, imported = _run(command, argv, tmp_path)
    assert status == 2 and len(lines) == 1 and lines[0].startswith(f"{command}: error: "), lines
    assert all(part in lines[0] for part in named), lines[0]
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    assert not (tmp_path / "fresh").exists() and (tmp_path / "resumable" / "checkpoint-8").exists()


@pytest.mark.parametrize("case", CASES)
def test_the_full_parser_says_the_same_line(case, tmp_path, monkeypatch):
    """One source of truth: the parser, once TRL is imported, refuses each case with the line given before it."""
    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))
    argv, _ = _cases(tmp_path)[case]
    _, lines, _ = _run("ts_trl train", argv, tmp_path)
    with pytest.raises(ConfigError) as refused:
        parse_args(make_parser(prog="ts_trl train"), argv)
    assert lines == [f"ts_trl train: error: {' '.join(str(refused.value).split())}"]


def test_the_shipped_table_is_the_parsers(tmp_path, monkeypatch):
    """`train_flags.json` holds the flags of the live parser (regenerate it with `python -m ts_trl.cli.flag_table`);
    with other TRL or transformers versions than it was made with, it is not used: the checks wait for the parser."""
    live = json.loads(json.dumps(table_of(make_parser(), run_defaults(), REWARD_NAMES)))
    shipped = json.loads(SHIPPED_TABLE.read_text())
    if shipped["versions"] != live["versions"]:
        monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "empty-cache"))
        assert load_table() is None
        return
    assert shipped == live, "the flags changed: python -m ts_trl.cli.flag_table writes the table again"


def test_the_checkpoint_found_is_transformers_one(tmp_path):
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_utils import get_last_checkpoint

    assert TRAINER_STATE == TRAINER_STATE_NAME

    for name in ("checkpoint-9", "checkpoint-10", "checkpoint-x", "checkpoint-2-old", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-99").write_text("a file, not a checkpoint")
    assert str(last_checkpoint(tmp_path)) == get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")


def test_good_input_reaches_the_full_parser(tmp_path):
    """A command line with nothing wrong that the table can see is not refused early: the run goes on to import TRL
    (stopped here by GRPOConfig's own rule, which only TRL knows)."""
    status, lines, imported = _run("ts_trl train", ["--num_generations", "7", "--output_dir", str(tmp_path)], tmp_path)
    assert status == 2 and lines[-1].startswith("ts_trl train: error: generation_batch_size (256) must be"), lines
    assert set(HEAVY) <= imported


@pytest.mark.parametrize("name", ["accuracy", "no_such_package.rewards:f", "no_such_module.f"])
def test_a_reward_name_refused_early_is_refused_by_the_registry_in_the_same_words(name, tmp_path):
    """The early check imports no reward; what it refuses, `get_reward_funcs` (which does) refuses alike."""
    _, lines, _ = _run("ts_trl train", ["--reward_funcs", name, "--output_dir", str(tmp_path / "out")], tmp_path)
    with pytest.raises(ValueError) as refused:
        get_reward_funcs([name])
    assert lines == [f"ts_trl train: error: {refused.value}"]


def test_a_reward_module_of_the_working_folder_is_found_early(tmp_path):
    """`get_reward_funcs` imports from the working folder: a module there is not refused early (nor imported)."""
    (tmp_path / "my_rewards.py").write_text("raise SystemExit('imported early')\n")
    status, lines, imported = _run(
        "train.py", ["--reward_funcs", "my_rewards:f", "--num_generations", "7"], tmp_path, cwd=tmp_path
    )
    assert status == 2 and "generation_batch_size (256) must be divisible" in lines[-1], lines
    assert "my_rewards" not in imported


def test_a_checkpoint_to_resume_from_reaches_the_full_parser(tmp_path):
    """A checkpoint folder (its trainer state written) is not refused early, nor its output folder as an earlier run's."""
    _cases(tmp_path)
    resume = ["--resume_from_checkpoint", "resumable/checkpoint-4", "--output_dir", "resumable"]
    argv = [*resume, "--num_generations", "7"]
    status, lines, imported = _run("ts_trl train", argv, tmp_path, cwd=tmp_path)
    assert status == 2 and "generation_batch_size (256) must be divisible" in lines[-1], lines
    assert set(HEAVY) <= imported


def _data_files(tmp: Path, rows: list[dict]) -> list[Path]:
    """`rows` as each kind of local file that `--dataset_path` reads and whose columns are told early."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    files = [tmp / "rows.jsonl", tmp / "rows.json", tmp / "rows.csv", tmp / "rows.parquet"]
    frame.to_json(files[0], orient="records", lines=True)
    frame.to_json(files[1], orient="records", lines=True)
    frame.to_csv(files[2], index=False)
    frame.to_parquet(files[3])
    return files


@pytest.mark.parametrize(
    "rows, settings",
    [
        ([{"question": "1+1?", "answer": "2", "id": 1}], {}),
        ([{"text": "1+1?", "answer": "2"}], {}),
        ([{"question": "1+1?", "gold": "2"}], {"answer_column": "answer"}),
        ([{"question": "1+1?", "answer": "2"}], {"domain": "code"}),
    ],
)
def test_a_data_files_columns_are_told_early_as_the_loaded_dataset_tells_them(rows, settings, tmp_path):
    """The columns read from a file's first row or schema are those of the dataset `datasets` loads, and the columns
    refused early are refused by `to_prompt_dataset` in the same words."""
    from ts_trl.cli.columns import first_row_columns
    from ts_trl.cli.data import read_local, to_prompt_dataset
    from ts_trl.cli.early import _columns_problem

    for path in _data_files(tmp_path, rows):
        dataset = read_local(str(path))
        assert first_row_columns(path) == dataset.column_names, path.name
        early = _columns_problem({"dataset_path": str(path), **settings})
        try:
            to_prompt_dataset(dataset, **settings)
            loaded = None
        except ValueError as error:
            loaded = str(error)
        assert early == loaded, path.name


def _rule_runs(tmp: Path) -> dict[str, list[str]]:
    """Command lines of every kind of run, each with its own defaults of the seeding settings."""
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    data = tmp / "data.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n')
    recipe = tmp / "recipe.yaml"
    recipe.write_text("task: chain\nseed_method: replay\nnum_generations: 4\ncut_ratio_max: 0.5\n")
    dataset = ["--dataset_path", str(data), "--model_name_or_path", str(model), "--reward_funcs", "math"]
    return {
        "embedded default": [],
        "task": ["--task", "chat-add", "--seed_fraction", "0.25"],
        "task=": ["--task=calculator", "--cut_ratio_min", "0.3"],
        "dataset": [*dataset, "--seed_snapshot_steps", "3"],
        "shipped recipe": ["--config", "smollm2-135m_chat-add_lora", "--replay_per_group", "2"],
        "recipe under flags": ["--config", str(recipe), "--replay_per_group", "3"],
    }


@pytest.mark.parametrize("run", list(_rule_runs(Path("/nonexistent"))))
def test_the_early_rule_values_are_the_configs(run, tmp_path, monkeypatch):
    """The seeding settings the early checks read (the run's defaults under the given values) are those
    `SeedGRPOConfig` ends with: early never refuses what the full parser accepts, nor checks other values."""
    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))
    argv = [*_rule_runs(tmp_path)[run], "--output_dir", str(tmp_path / "out")]
    table = json.loads(json.dumps(table_of(make_parser(), run_defaults(), REWARD_NAMES)))  # as read back from the file
    early_argv = list(argv)
    path, recipe = read_recipe(early_argv)
    settings, problems = input_problems(table, early_argv, recipe, path)
    assert not problems
    _, training_args, _ = parse_args(make_parser(prog="ts_trl train"), argv)
    assert rule_values(table, settings) == {name: getattr(training_args, name) for name in RULE_FIELDS}


def test_the_kind_of_run_picks_the_defaults():
    """A model or dataset named anywhere: the dataclasses' defaults; else the built-in task's, from the flag or the
    recipe (`--task X`, `--task=X` and abbreviations all parse to one value)."""
    assert run_kind({}) == "default" and run_kind({"task": "chain"}) == "chain"
    assert run_kind({"task": "chain", "dataset_path": "d.jsonl"}) == run_kind({"model_name_or_path": "m"}) == ""
    assert set(run_defaults()) == {"", "default", *make_parser()._option_string_actions["--task"].choices}


def test_the_first_help_says_it_is_building_before_the_heavy_imports(tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "TS_TRL_CACHE": str(tmp_path / "cache"), "COLUMNS": "100"}
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ts_trl", "train", "--help"],
        capture_output=True, text=True, env=environment, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0 and "--output_dir" in result.stdout
    lines = result.stderr.splitlines()
    (building,) = [i for i, line in enumerate(lines) if line.startswith("ts_trl train: building the help: importing")]
    first_heavy = min(i for i, line in enumerate(lines) if line.rsplit("|", 1)[-1].strip() in HEAVY)
    assert building < first_heavy
