"""Bad input to `ts_trl train` and `train.py`: one `prog: error: ...` line, exit status 2, the line the parser
(`arguments.parse_args`) raises in-process; a broken recipe is refused before torch, transformers and TRL are imported.
Which module owns which refusal: ts_trl/cli/__init__.py."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port
from ts_trl.cli.arguments import make_parser, parse_args, run_kind
from ts_trl.cli.refusals import ConfigError
from ts_trl.rewards import get_reward_funcs
from ts_trl.store.checkpoints import TRAINER_STATE, last_checkpoint

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "trl")
COMMANDS = {"ts_trl train": ["-m", "ts_trl", "train"], "train.py": [str(ROOT / "train.py")]}


def _run(command: str, argv: list[str], tmp_path: Path, cwd: Path = ROOT, env: dict | None = None):
    """The command in a fresh interpreter under `-X importtime`: (exit status, stderr lines, top-level imports)."""
    environment = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TS_TRL_CACHE": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",
        **(env or {}),
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
        "value that does not parse": (
            ["--learning_rate", "abc", *fresh],
            ["argument --learning_rate: invalid float value: 'abc'."],
        ),
        "value not among the choices": (["--task", "nope", *fresh], ["argument --task: invalid choice: 'nope'"]),
        "bad recipe": (
            ["--config", str(recipe), *fresh],
            [
                "unknown key(s): seed_fractoin (did you mean seed_fraction?)",
                "learning_rate: [1, 2]: expected a single value",
                "task: nope: choose one of add, chain,",
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
            [
                "not in the local Hugging Face cache, and HF_HUB_OFFLINE is set",
                "Name a local folder that holds a saved model, or a Hub id that is reachable or cached",
            ],
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
def test_bad_input_is_one_line_and_the_parsers_own(case, tmp_path, monkeypatch):
    """Every refusal: one line and exit status 2 from the command, the line `parse_args` raises in-process, and
    nothing written."""
    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))
    argv, named = _cases(tmp_path)[case]
    status, lines, _ = _run("ts_trl train", argv, tmp_path)
    assert status == 2 and len(lines) == 1 and lines[0].startswith("ts_trl train: error: "), lines
    assert all(part in lines[0] for part in named), lines[0]
    assert not (tmp_path / "fresh").exists() and (tmp_path / "resumable" / "checkpoint-8").exists()
    with pytest.raises(ConfigError) as refused:
        parse_args(make_parser(prog="ts_trl train"), argv)
    assert lines == [f"ts_trl train: error: {' '.join(str(refused.value).split())}"]


def test_a_model_name_the_hub_does_not_answer_for_is_one_line_without_retries(tmp_path):
    """Online, with the Hub at a loopback port where nothing listens (as with no network): the name is asked once and
    refused in one line with both fixes, instead of the downloads' retries (each printed) and a line about the network.
    """
    hub = f"http://127.0.0.1:{free_port()}"
    argv = ["--model_name_or_path", "nonsense/model-xyz", "--output_dir", str(tmp_path / "fresh")]
    started = time.monotonic()
    status, lines, _ = _run("ts_trl train", argv, tmp_path, env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub})
    seconds = time.monotonic() - started
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith("ts_trl train: error: --model_name_or_path nonsense/model-xyz: "), lines[0]
    assert f"{hub} did not answer" in lines[0]
    assert "a local folder that holds a saved model, or a Hub id that is reachable or cached" in lines[0]
    assert seconds < 120 and not (tmp_path / "fresh").exists()  # the imports' time at load; no run started


@pytest.mark.parametrize("command", COMMANDS)
def test_a_broken_recipe_is_refused_before_the_heavy_imports(command, tmp_path):
    """The one refusal that needs no parser comes before torch, transformers and TRL, under both commands."""
    (tmp_path / "list.yaml").write_text("- a list\n")
    for argv, named in (
        (["--config", "no_such_recipe"], "no such recipe file, nor a shipped recipe"),
        (["--config", str(tmp_path / "list.yaml")], "a recipe must be a YAML mapping"),
        (["--config"], "--config needs a recipe file"),
    ):
        status, lines, imported = _run(command, argv, tmp_path)
        assert status == 2 and len(lines) == 1 and lines[0].startswith(f"{command}: error: "), lines
        assert named in lines[0] and not imported & set(HEAVY), (lines, sorted(imported & set(HEAVY)))


def test_train_py_refuses_in_its_own_name(tmp_path):
    status, lines, _ = _run("train.py", ["--seed_fraction", "2", "--output_dir", str(tmp_path / "out")], tmp_path)
    assert status == 2 and lines == ["train.py: error: seed_fraction must lie in [0, 1], got 2.0."], lines


def test_the_checkpoint_found_is_transformers_one(tmp_path):
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_utils import get_last_checkpoint

    assert TRAINER_STATE == TRAINER_STATE_NAME

    for name in ("checkpoint-9", "checkpoint-10", "checkpoint-x", "checkpoint-2-old", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-99").write_text("a file, not a checkpoint")
    assert str(last_checkpoint(tmp_path)) == get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")


def test_trls_own_rules_refuse_in_one_line(tmp_path):
    """What only TRL knows (GRPOConfig's own rule) is refused in the same one-line form."""
    status, lines, _ = _run("ts_trl train", ["--num_generations", "7", "--output_dir", str(tmp_path)], tmp_path)
    assert status == 2 and lines[-1].startswith("ts_trl train: error: generation_batch_size (256) must be"), lines


@pytest.mark.parametrize("name", ["accuracy", "no_such_package.rewards:f", "no_such_module.f"])
def test_a_reward_name_refused_by_the_parser_is_refused_by_the_registry_in_the_same_words(name, tmp_path):
    """The parser's check imports no reward; what it refuses, `get_reward_funcs` (which does) refuses alike."""
    _, lines, _ = _run("ts_trl train", ["--reward_funcs", name, "--output_dir", str(tmp_path / "out")], tmp_path)
    with pytest.raises(ValueError) as refused:
        get_reward_funcs([name])
    assert lines == [f"ts_trl train: error: {refused.value}"]


def test_a_reward_module_of_the_working_folder_is_found_by_the_parser(tmp_path):
    """`get_reward_funcs` imports from the working folder: a module there is not refused (nor imported) by the
    parser's check."""
    (tmp_path / "my_rewards.py").write_text("raise SystemExit('imported early')\n")
    status, lines, imported = _run(
        "train.py", ["--reward_funcs", "my_rewards:f", "--num_generations", "7"], tmp_path, cwd=tmp_path
    )
    assert status == 2 and "generation_batch_size (256) must be divisible" in lines[-1], lines
    assert "my_rewards" not in imported


def test_a_checkpoint_to_resume_from_is_not_refused(tmp_path):
    """A checkpoint folder (its trainer state written) is not refused, nor its output folder as an earlier run's."""
    _cases(tmp_path)
    resume = ["--resume_from_checkpoint", "resumable/checkpoint-4", "--output_dir", "resumable"]
    argv = [*resume, "--num_generations", "7"]
    status, lines, _ = _run("ts_trl train", argv, tmp_path, cwd=tmp_path)
    assert status == 2 and "generation_batch_size (256) must be divisible" in lines[-1], lines


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
def test_a_data_files_columns_are_told_before_loading_as_the_loaded_dataset_tells_them(rows, settings, tmp_path):
    """The columns read from a file's first row or schema are those of the dataset `datasets` loads, and the columns
    refused early are refused by `to_prompt_dataset` in the same words."""
    from ts_trl.data.columns import columns_problem, first_row_columns
    from ts_trl.data.loaders import read_local, to_prompt_dataset

    for path in _data_files(tmp_path, rows):
        dataset = read_local(str(path))
        assert first_row_columns(path) == dataset.column_names, path.name
        early = columns_problem({"dataset_path": str(path), **settings})
        try:
            to_prompt_dataset(dataset, **settings)
            loaded = None
        except ValueError as error:
            loaded = str(error)
        assert early == loaded, path.name


def test_the_kind_of_run_picks_the_defaults():
    """A model or dataset named anywhere: the dataclasses' defaults; else the built-in task's, from the flag or the
    recipe."""
    assert run_kind({}) == "default" and run_kind({"task": "chain"}) == "chain"
    assert run_kind({"task": "chain", "dataset_path": "d.jsonl"}) == run_kind({"model_name_or_path": "m"}) == ""
