"""`train.py` end to end: recipes, local data, error paths in-process; ZeRO-3, LoRA, two ranks, Ctrl-C under `accelerate`.

The `accelerate launch` tests each start fresh interpreters (about 20-40 s of imports on a busy two-core machine), so
every run is as small as it can be: the package's tiny model, two prompts, 12-token completions, 2-3 steps.
"""

import json
import os
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import datasets
import pytest
import torch
import yaml
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM

from tests.conftest import EMBEDDED_TINY, RANKS, seed_manifest, seed_rows
from ts_trl.__main__ import main as ts_trl_main
from ts_trl.analysis.common import load_checkpoint
from ts_trl.cli.arguments import EMBEDDED_DEFAULTS, make_parser, parse_args
from ts_trl.cli.environment import ConfigError
from ts_trl.data.loaders import load_training_data
from ts_trl.rewards import get_reward_funcs
from ts_trl.tiny import build_tiny_model, build_tokenizer

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
# A reward with spread on the untrained model's random text, importable by the launched processes (cwd = ROOT).
COUNT_REWARD = "tests.conftest.count_reward"
# The smallest run that still has two prompt groups per step and a seed bank to draw from (prompts repeat each step).
SMALL = [
    "--per_device_train_batch_size", "8",  # two groups of four
    "--num_generations", "4",  # the smallest group with a spread of rewards
    "--max_completion_length", "12",  # keeps generation to a fraction of a second
    "--save_steps", "1",  # a checkpoint, hence a seed shard, every step
    "--seed_fraction", "1.0",  # seed every group that has an eligible seed
    "--learning_rate", "1e-3",
    "--logging_steps", "1",
    "--report_to", "none",
    "--disable_tqdm", "true",
]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """The tiny model and its tokenizer saved like a Hub checkpoint, plus two-prompt math data with GSM8K's schema."""
    folder = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    rows = [{"question": "1+2=", "answer": "1 plus 2.\n#### 3"}, {"question": "2+3=", "answer": "#### 5"}]
    (folder / "math.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _env(tmp_path, **extra):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update(HF_DATASETS_CACHE=str(tmp_path / "datasets_cache"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("ACCELERATE_USE_CPU", None)
    return {**env, **extra}


def _launch_command(accelerate_args, train_args):
    return [sys.executable, "-m", "accelerate.commands.launch", *accelerate_args, "train.py", *train_args]


def _launch(tmp_path, accelerate_args, train_args, timeout=300, **env):
    result = subprocess.run(
        _launch_command(accelerate_args, train_args),
        cwd=ROOT,
        env=_env(tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def _data_args(tiny_dir, output_dir):
    return [
        "--model_name_or_path", str(tiny_dir / "model"),
        "--dataset_path", str(tiny_dir / "math.jsonl"),
        "--reward_funcs", COUNT_REWARD,
        "--output_dir", str(output_dir),
    ]  # fmt: skip


def _seed_rows(output_dir):
    return seed_manifest(output_dir), seed_rows(output_dir)


# ---------------------------------------------------------------------------------------------------------------------
# Recipes and arguments (in-process)


def test_embedded_recipe_matches_the_builtin_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output_dir, runs/embedded, may hold the quick start's run
    builtin = parse_args(make_parser(), [])
    recipe = parse_args(make_parser(), ["--config", str(RECIPES / "embedded.yaml")])
    values = yaml.safe_load((RECIPES / "embedded.yaml").read_text())
    assert set(EMBEDDED_DEFAULTS) <= set(values)
    for key in values:
        found = [getattr(args, key) for args in builtin if hasattr(args, key)]
        expected = [getattr(args, key) for args in recipe if hasattr(args, key)]
        assert found == expected, key
    assert builtin[2].model_name_or_path is None and builtin[0].dataset_name is None


def test_flags_override_the_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output_dir, runs/embedded, may hold the quick start's run
    script_args, training_args, _ = parse_args(
        make_parser(), ["--config", str(RECIPES / "embedded.yaml"), "--seed_fraction", "0.25", "--max_steps", "7"]
    )
    assert training_args.seed_fraction == 0.25 and training_args.max_steps == 7
    assert training_args.num_generations == EMBEDDED_DEFAULTS["num_generations"]


MATH_ROWS = [
    {"question": "Tom has 3 apples and buys 15. How many?", "answer": "3 + 15 = 18\n#### 18"},
    {"question": "What is 7 times 6?", "answer": "#### 42"},
]
MBPP_ROWS = [
    {
        "task_id": 1,
        "text": "Write a function to add two numbers.",
        "code": "def add(a, b):\n    return a + b",
        "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"],
        "test_setup_code": "",
        "challenge_test_list": [],
    }
]


@pytest.mark.parametrize(
    "recipe, rows, expected",
    [
        ("qwen2.5-math-1.5b_gsm8k.yaml", MATH_ROWS, {"answer": "18", "reward_funcs": ["math", "format"]}),
        ("qwen2.5-coder-1.5b_mbpp.yaml", MBPP_ROWS, {"tests": "assert add(1, 2) == 3", "reward_funcs": ["code"]}),
    ],
)
def test_real_recipes_load_local_data_of_the_same_schema(recipe, rows, expected, tiny_dir, tmp_path):
    """Each real recipe, with its model and dataset swapped for local ones, parses and builds its data and rewards."""
    from datasets import Dataset

    from ts_trl import SeedGRPOTrainer

    data = tmp_path / "data.parquet"
    Dataset.from_list(rows * 4).to_parquet(data)  # at least one generation's prompts (4 at the recipes' batch sizes)
    values = yaml.safe_load((RECIPES / recipe).read_text())
    overrides = ["--model_name_or_path", str(tiny_dir / "model"), "--dataset_path", str(data)]
    overrides += ["--use_vllm", "false", "--bf16", "false", "--use_cpu", "--output_dir", str(tmp_path / "run")]
    overrides += ["--max_completion_length", "64"]  # the tiny model has 512 positions
    script_args, training_args, model_args = parse_args(make_parser(), ["--config", str(RECIPES / recipe), *overrides])

    for key, value in values.items():  # every recipe value landed in one of the three dataclasses
        if key in ("model_name_or_path", "output_dir", "use_vllm", "bf16", "max_completion_length"):
            continue
        holders = [args for args in (script_args, training_args, model_args) if hasattr(args, key)]
        assert holders, key
        expected_value = [] if (key, value) == ("report_to", "none") else value  # TrainingArguments' normal form
        assert getattr(holders[0], key) == expected_value, key
    assert script_args.reward_funcs == expected["reward_funcs"]

    train, evaluation = load_training_data(script_args, training_args.eval_strategy != "no")
    column = "answer" if "answer" in expected else "tests"
    assert set(train.column_names) == {"prompt", "prompt_id", column}
    assert expected[column] in train[0][column]
    assert train[0]["prompt"][0] == {"role": "system", "content": values["system_prompt"]}
    assert evaluation is None  # the recipes do not evaluate during training

    rewards = get_reward_funcs(script_args.reward_funcs)
    trainer = SeedGRPOTrainer(
        model=str(tiny_dir / "model"), reward_funcs=rewards, args=training_args, train_dataset=train
    )
    assert trainer.args.seed_selection == values["seed_selection"] and trainer.args.cut_at_newline


# ---------------------------------------------------------------------------------------------------------------------
# Error paths (in-process: train.py's main() up to the first bad input, no training)


def _run_train_py(monkeypatch, capsys, argv):
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("train.py: error:")]
    assert exit_info.value.code == 2, err[-2000:]
    assert len(errors) == 1 and "Traceback" not in err, err[-2000:]
    return errors[0]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--prompt_column", "nope"], "no column 'nope'"),
        (["--answer_column", "solution"], "no column 'solution'"),
        (["--reward_funcs", "no_such_reward"], "Unknown reward 'no_such_reward'"),
        (["--reward_funcs", "no_such_reward"], "'code', 'embedded', 'format', 'math'"),  # every registered name
        (["--reward_funcs", "tests.conftest.no_such_function"], "Cannot import reward function"),
        (["--model_name_or_path", "./no/such/model"], "no such local folder"),
        (["--model_name_or_path", "ts-trl-tests/not-a-cached-model"], "not in the local Hugging Face cache"),
        (["--dataset_path", "no_such_file.jsonl"], "no such file or folder"),
        (["--seed_fractoin", "0.3"], "seed_fractoin"),
        (["--cut_ratio_min", "0"], "cut_ratio_min must lie strictly between 0 and 1"),
    ],
)
def test_bad_input_is_one_clear_line_before_training(extra, message, tiny_dir, tmp_path, monkeypatch, capsys):
    base = dict(zip(_data_args(tiny_dir, tmp_path / "run")[::2], _data_args(tiny_dir, tmp_path / "run")[1::2]))
    for flag, value in zip(extra[::2], extra[1::2]):
        base[flag] = value
    argv = [item for pair in base.items() for item in pair] + ["--use_cpu", "--max_steps", "1"]
    line = _run_train_py(monkeypatch, capsys, argv)
    assert message in line
    assert not (tmp_path / "run").exists()  # nothing was trained or written


@pytest.mark.parametrize(
    "with_dataset, extra, message",
    [
        (False, ["--max_train_samples", "64"], "--max_train_samples set a dataset's data"),
        (False, ["--prompt_column=q", "--max-train-samples", "8"], "--max_train_samples, --prompt_column set"),
        (True, ["--embedded_train_problems", "64"], "--embedded_train_problems set the built-in task"),
        (True, ["--task", "chain"], "--task set the built-in task"),
    ],
)
def test_a_setting_of_the_other_kind_of_data_is_one_clear_line(
    with_dataset, extra, message, tiny_dir, tmp_path, monkeypatch, capsys
):
    """A built-in task ignores a dataset's settings and a dataset run the built-in task's: refused, not ignored."""
    monkeypatch.chdir(tmp_path)
    data = _data_args(tiny_dir, tmp_path / "run") if with_dataset else ["--output_dir", str(tmp_path / "run")]
    line = _run_train_py(monkeypatch, capsys, [*data, *extra])
    assert message in line
    assert not (tmp_path / "run").exists()


def test_the_schedule_warning_names_the_flag_of_the_runs_data(tiny_dir, tmp_path, monkeypatch, caplog):
    """A run that cannot seed within its steps is told how to train on fewer prompts, by the flag its data reads."""
    monkeypatch.setenv("TS_TRL_CACHE", str(_embedded_warm_cache(tmp_path)))
    one_step = ["--max_steps", "1", "--save_steps", "1", "--disable_tqdm", "true", "--report_to", "none"]
    embedded = ["--output_dir", str(tmp_path / "embedded"), *EMBEDDED_TINY, "--embedded_eval_problems", "0"]
    dataset = [*_data_args(tiny_dir, tmp_path / "dataset"), *SMALL, "--use_cpu"]
    for argv, flag, other in (
        (embedded, "--embedded_train_problems", "--max_train_samples"),
        (dataset, "--max_train_samples", "--embedded_train_problems"),
    ):
        caplog.clear()
        monkeypatch.setattr(sys, "argv", ["train.py", *argv, *one_step])
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
        assert exit_info.value.code == 0
        (warning,) = [r.getMessage() for r in caplog.records if "would train plain GRPO" in r.getMessage()]
        assert f"train on fewer prompts ({flag})" in warning and other not in warning


def test_unknown_recipe_key_is_one_clear_line(tiny_dir, tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("# Seeding\nseed_fraction: 0.5\nseed_fractoin: 0.3\n")
    line = _run_train_py(monkeypatch, capsys, ["--config", str(recipe), *_data_args(tiny_dir, tmp_path / "run")])
    assert "seed_fractoin" in line


def test_quantization_flags_are_refused_for_the_embedded_model(tmp_path, monkeypatch, capsys):
    line = _run_train_py(monkeypatch, capsys, ["--load_in_4bit", "--output_dir", str(tmp_path / "run")])
    assert "--load_in_4bit/--load_in_8bit quantize a model named with --model_name_or_path" in line


def test_a_dataset_without_an_answer_column_says_so_plainly():
    from datasets import Dataset

    from ts_trl.data.loaders import to_prompt_dataset

    with pytest.raises(ValueError, match=r"The dataset has no answer column \(one of answer, "):
        to_prompt_dataset(Dataset.from_list([{"question": "1+1="}]))


def test_parse_args_raises_config_error_on_unknown_flags():
    with pytest.raises(ConfigError, match="no_such_flag"):
        parse_args(make_parser(), ["--no_such_flag", "1"])


# ---------------------------------------------------------------------------------------------------------------------
# Under `accelerate launch` (subprocesses)


ZERO3_CPU = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "DEEPSPEED",
    "deepspeed_config": {
        "zero_stage": 3,
        "zero3_init_flag": True,
        "zero3_save_16bit_model": True,
        "offload_optimizer_device": "none",
        "offload_param_device": "none",
    },
    "mixed_precision": "no",
    "num_machines": 1,
    "num_processes": 1,
    "machine_rank": 0,
    "use_cpu": False,  # DeepSpeed's launcher is skipped under use_cpu; DS_ACCELERATOR=cpu selects the CPU instead
}


@RANKS
def test_zero3_on_cpu_trains_writes_seeds_and_resumes(tiny_dir, tmp_path):
    config = tmp_path / "zero3_cpu.yaml"
    config.write_text(yaml.safe_dump(ZERO3_CPU))
    output_dir = tmp_path / "run"
    launch = ["--config_file", str(config)]
    train = [*_data_args(tiny_dir, output_dir), *SMALL]  # float32: train.py's default under DeepSpeed on CPU
    first = _launch(tmp_path, launch, [*train, "--max_steps", "2"], DS_ACCELERATOR="cpu")
    assert "DeepSpeed: True" in first.stdout
    manifest, rows = _seed_rows(output_dir)
    assert [s["step"] for s in manifest["shards"]] == [1, 2] and len(rows) == 16

    resumed = [*train, "--max_steps", "3", "--resume_from_checkpoint", str(output_dir / "checkpoint-1")]
    second = _launch(tmp_path, launch, resumed, DS_ACCELERATOR="cpu")
    assert "DeepSpeed: True" in second.stdout
    state = json.loads((output_dir / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    pointer = json.loads((output_dir / "checkpoint-3" / "seed_snapshot.json").read_text())
    assert pointer["run_id"] == manifest["run_id"]  # the resumed run continued the same seed dataset
    assert [s["step"] for s in pointer["shards"]] == [1, 2, 3]
    assert list((output_dir / "seeds" / "superseded").glob("*/step-000002.parquet"))  # the abandoned step-2 shard


@RANKS
def test_zero3_on_two_cpu_processes_joins_them_without_a_recipe(tiny_dir, tmp_path):
    """Without a GPU, accelerate starts a process group for DeepSpeed only when the training arguments say `use_cpu`
    (it asks the GPU backend otherwise, finds none, and each rank would train alone, world size 1). The CLI sets it, as
    it does for every CPU run; the embedded recipe's `use_cpu: true` is not needed."""
    config = tmp_path / "zero3_cpu.yaml"
    config.write_text(yaml.safe_dump({**ZERO3_CPU, "num_processes": 2}))
    train = [*_data_args(tiny_dir, tmp_path / "run"), *SMALL, "--max_steps", "1", "--per_device_train_batch_size", "4"]
    result = _launch(tmp_path, ["--config_file", str(config)], train, timeout=600, DS_ACCELERATOR="cpu")
    assert "Training on 2 process(es), DeepSpeed: True" in result.stdout


EMBEDDED_SMALL = [*EMBEDDED_TINY, "--seed_fraction", "1.0", "--disable_tqdm", "true"]


def _embedded_warm_cache(tmp_path) -> Path:
    """The warm-up cache a first run of EMBEDDED_SMALL leaves (built here, in-process, to save a launch)."""
    from ts_trl.embedded import EmbeddedTask, build_warm_model

    cache = tmp_path / "cache"
    os.environ["TS_TRL_CACHE"], previous = str(cache), os.environ.get("TS_TRL_CACHE")
    try:
        build_warm_model(EmbeddedTask(difficulty=2, seed=0), steps=5, seed=0, progress=False)
    finally:
        os.environ.pop("TS_TRL_CACHE") if previous is None else os.environ.update(TS_TRL_CACHE=previous)
    assert list(cache.glob("warmup/*/model.safetensors"))
    return cache


def _first_kl(output_dir) -> float:
    """The KL logged at step 1: the reference scored against the policy before any update (the held-out evaluation
    at step 0 is logged before it)."""
    history = json.loads((output_dir / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    return next(entry["kl"] for entry in history if "kl" in entry)


@RANKS
def test_zero3_on_cpu_runs_the_embedded_default_from_its_cached_warm_up(tmp_path):
    """No model flag under the CPU ZeRO-3 config: the cached warm-up loads into a model ZeRO-3 then partitions, and its
    KL reference (beta > 0) is the same weights."""
    cache = _embedded_warm_cache(tmp_path)
    config = tmp_path / "zero3_cpu.yaml"
    config.write_text(yaml.safe_dump(ZERO3_CPU))
    output_dir = tmp_path / "run"
    train = ["--output_dir", str(output_dir), *EMBEDDED_SMALL, "--max_steps", "2", "--save_steps", "1"]
    # beta > 0: TRL loads the KL reference model by path, and the embedded model is built in memory
    train += ["--beta", "0.04", "--logging_steps", "1"]
    result = _launch(tmp_path, ["--config_file", str(config)], train, DS_ACCELERATOR="cpu", TS_TRL_CACHE=str(cache))
    assert "DeepSpeed: True" in result.stdout and "Thinking Seeds run finished" in result.stdout
    report = json.loads((output_dir / "report.json").read_text())
    assert report["steps"] == 2 and report["seeds"]["rollouts"] == 16
    assert _first_kl(output_dir) == pytest.approx(0.0, abs=1e-6)


@RANKS
def test_zero3_on_two_cpu_processes_builds_the_warm_up_and_the_kl_reference(tmp_path):
    """A first run on 2 ranks under ZeRO-3, from an empty cache: each rank warms up and caches complete weights, and
    TRL's reference model (beta > 0) is partitioned over both ranks (with use_cpu, DeepSpeed did not see the process
    group yet and counted a world of 1: "train_batch_size is not equal to ... 16 != 8 * 1 * 1")."""
    cache = tmp_path / "cache"
    config = tmp_path / "zero3_cpu.yaml"
    config.write_text(yaml.safe_dump({**ZERO3_CPU, "num_processes": 2}))
    output_dir = tmp_path / "run"
    train = ["--output_dir", str(output_dir), *EMBEDDED_SMALL, "--max_steps", "2", "--save_steps", "1"]
    train += ["--beta", "0.04", "--logging_steps", "1"]
    result = _launch(tmp_path, ["--config_file", str(config)], train, DS_ACCELERATOR="cpu", TS_TRL_CACHE=str(cache))
    assert "Training on 2 process(es), DeepSpeed: True" in result.stdout
    assert "Thinking Seeds run finished" in result.stdout
    assert _first_kl(output_dir) == pytest.approx(0.0, abs=1e-6)
    (warm,) = (cache / "warmup").iterdir()
    assert (warm / "model.safetensors").is_file()


@RANKS
def test_two_cpu_processes_give_the_embedded_model_its_kl_reference(tmp_path):
    """beta > 0 on 2 ranks: every rank loads the reference of the model it built in memory (only rank 0 wrote it with
    `save_pretrained`, and rank 1 stopped on a folder with no model in it)."""
    cache = _embedded_warm_cache(tmp_path)
    two_ranks = ["--config_file", str(ROOT / "accelerate_configs" / "multi_gpu.yaml")]
    two_ranks += ["--num_processes", "2", "--mixed_precision", "no"]
    output_dir = tmp_path / "run"
    train = ["--output_dir", str(output_dir), *EMBEDDED_SMALL, "--max_steps", "2", "--save_steps", "1", "--use_cpu"]
    train += ["--beta", "0.04", "--logging_steps", "1"]
    result = _launch(tmp_path, two_ranks, train, TS_TRL_CACHE=str(cache))
    assert "Training on 2 process(es)" in result.stdout and "Thinking Seeds run finished" in result.stdout
    assert _first_kl(output_dir) == pytest.approx(0.0, abs=1e-6)


def test_lora_on_cpu_saves_an_adapter_and_seeds(tiny_dir, tmp_path, capsys):
    output_dir = tmp_path / "run"
    lora = ["--use_peft", "--lora_r", "4", "--lora_alpha", "8"]  # r=4: the tiny model's hidden size is 64
    result = _launch(
        tmp_path,
        ["--config_file", str(ROOT / "accelerate_configs" / "cpu.yaml")],
        [*_data_args(tiny_dir, output_dir), *SMALL, *lora, "--max_steps", "2"],
    )
    assert "DeepSpeed: False" in result.stdout
    assert (output_dir / "adapter_config.json").is_file()
    assert (output_dir / "checkpoint-2" / "adapter_config.json").is_file()
    assert not (output_dir / "model.safetensors").exists()  # only the adapter, not a full copy of the model
    _, rows = _seed_rows(output_dir)
    assert len(rows) == 16 and all(len(r["logprobs"]) == len(r["completion_ids"]) for r in rows)
    card = (output_dir / "README.md").read_text()
    assert "peft" in card and "thinking-seeds" in card

    # The analyses take such a checkpoint as they take a full one: the base model named in the adapter, merged.
    merged, _ = load_checkpoint(output_dir / "checkpoint-2")
    base = AutoModelForCausalLM.from_pretrained(tiny_dir / "model")
    changed = [n for n, w in merged.state_dict().items() if not torch.equal(w, base.state_dict()[n])]
    assert changed and all("proj" in n for n in changed)  # LoRA's target modules, nothing else
    positions = ["positions", "--seeds", str(output_dir), "--checkpoint", str(output_dir / "checkpoint-2")]
    assert ts_trl_main([*positions, "--output-dir", str(tmp_path / "positions")]) == 0
    assert (tmp_path / "positions" / "positions.csv").read_text().count("\n") > 1

    adapter = json.loads((output_dir / "checkpoint-2" / "adapter_config.json").read_text())
    (output_dir / "checkpoint-2" / "adapter_config.json").write_text(
        json.dumps({**adapter, "base_model_name_or_path": None})
    )
    assert ts_trl_main([*positions, "--output-dir", str(tmp_path / "none")]) == 2
    assert "base model was built in memory" in capsys.readouterr().err


@RANKS
def test_two_cpu_processes_agree_on_every_draw(tiny_dir, tmp_path):
    output_dir = tmp_path / "run"
    steps, per_device, processes = 3, 4, 2  # a global batch of 8: two groups of 4, one group per rank
    two_ranks = ["--config_file", str(ROOT / "accelerate_configs" / "multi_gpu.yaml")]
    two_ranks += ["--num_processes", str(processes), "--mixed_precision", "no"]  # torchrun; gloo on CPU
    train = [*_data_args(tiny_dir, output_dir), *SMALL, "--per_device_train_batch_size", str(per_device)]
    result = _launch(tmp_path, two_ranks, [*train, "--max_steps", str(steps), "--use_cpu"])
    assert "Training on 2 process(es)" in result.stdout
    manifest, rows = _seed_rows(output_dir)
    ids = [r["rollout_id"] for r in rows]
    assert len(ids) == len(set(ids)) == steps * per_device * processes  # each rollout exactly once
    # Both ranks drew their seeds from the one memory-mapped copy of each snapshot (seeds/bank/*.arrow).
    assert all((output_dir / "seeds" / s["bank_file"]).is_file() for s in manifest["shards"])
    by_id = {r["rollout_id"]: r for r in rows}
    continuations = [r for r in rows if r["seed_origin"] is not None]
    assert continuations
    for row in continuations:  # every rank spliced the same seed at the same cut
        k = row["prefix_len"]
        assert k >= 1 and row["completion_ids"][:k] == by_id[row["seed_origin"]]["completion_ids"][:k]


def _bank_contents(output_dir):
    """What a run's seed dataset holds, independent of run ids: (prompt, completion tokens, prefix length) rows."""
    _, rows = _seed_rows(output_dir)
    return sorted((r["prompt_id"], tuple(r["completion_ids"]), r["prefix_len"]) for r in rows)


def test_ctrl_c_exits_130_and_its_resume_command_ends_with_the_uninterrupted_bank(
    tiny_dir, tmp_path, monkeypatch, capsys
):
    """`python train.py`, Ctrl-C, then exactly the printed command: same seed bank as a run never interrupted."""
    steps = 6
    # A checkpoint every step (SMALL's save_steps=1), so the Ctrl-C save falls on the schedule: a save off it would
    # snapshot, and so make eligible, seeds the uninterrupted run only sees at its next checkpoint.
    train = [*SMALL, "--max_steps", str(steps), "--use_cpu"]
    # One epoch for the whole run (two prompts a step): transformers replays the sampler on resume within an epoch,
    # not across epochs, so only then does the resumed run see the prompts in the uninterrupted run's order.
    data = tmp_path / "math16.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"{a}+{a + 1}=", "answer": f"#### {2 * a + 1}"}) + "\n" for a in range(16))
    )
    train += ["--dataset_path", str(data)]
    reference = subprocess.run(
        [sys.executable, "train.py", *_data_args(tiny_dir, tmp_path / "reference"), *train],
        cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert reference.returncode == 0, reference.stderr[-3000:]

    output_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "train.py", *_data_args(tiny_dir, output_dir), *train],
        cwd=ROOT,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, like a job in a terminal
    )
    lines, started = [], threading.Event()

    def read():
        for line in process.stdout:
            lines.append(line)
            if line.startswith("step ") and " loss " in line:  # a logged training step: the loop is running
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(240), "".join(lines[-50:])
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: every process of the job gets it
        status = process.wait(120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    reader.join(10)
    output = "".join(lines)
    assert status == 130, output[-3000:]  # not 0: an interrupted run is not a finished one
    assert "Interrupted: saving a checkpoint" in output and "run finished" not in output
    step = json.loads((output_dir / "report.json").read_text())["steps"]
    assert 1 <= step < steps and f"interrupted at step {step}" in output
    checkpoint = output_dir / f"checkpoint-{step}"
    pointer = json.loads((checkpoint / "seed_snapshot.json").read_text())
    assert pointer["step"] == step and pointer["shards"][-1]["step"] == step
    assert json.loads((output_dir / "report.json").read_text())["last_checkpoint"] == str(checkpoint)

    # Running the same command again into the same folder is refused, naming what to pass.
    monkeypatch.chdir(ROOT)
    line = _run_train_py(monkeypatch, capsys, [*_data_args(tiny_dir, output_dir), *train])
    assert "holds an earlier run" in line and f"--resume_from_checkpoint {checkpoint}" in line

    # The printed resume command, as printed.
    command = shlex.split(output.split("Resume with:\n", 1)[1].splitlines()[0])
    assert command[0].startswith("python") and command[1] == "train.py"
    assert command[-2:] == ["--resume_from_checkpoint", str(checkpoint)]
    resumed = subprocess.run(
        [sys.executable, *command[1:]], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((output_dir / "report.json").read_text())["steps"] == steps
    assert _bank_contents(output_dir) == _bank_contents(tmp_path / "reference")


def test_a_checkpoint_whose_shards_were_set_aside_stops_with_one_line(tiny_dir, tmp_path, monkeypatch, capsys):
    """Resuming from a checkpoint whose seeds another run moved to seeds/superseded/: one line, nothing touched."""
    from ts_trl.store.format import SeedManifest

    output_dir = tmp_path / "run"
    (output_dir / "checkpoint-2").mkdir(parents=True)
    (output_dir / "checkpoint-2" / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    shard = {"file": "step-000002.parquet", "step": 2, "rows": 8}
    pointer = {"run_id": "earlier", "step": 2, "shards": [shard], "rows": 8}
    (output_dir / "checkpoint-2" / "seed_snapshot.json").write_text(json.dumps(pointer))
    (output_dir / "seeds").mkdir()
    SeedManifest(output_dir / "seeds", "later", "tiny", "fp").save()  # the folder now holds another run's seeds
    argv = [*_data_args(tiny_dir, output_dir), *SMALL, "--use_cpu", "--resume_from_checkpoint"]
    line = _run_train_py(monkeypatch, capsys, [*argv, str(output_dir / "checkpoint-2")])
    assert "Cannot resume from" in line and "belongs to run earlier" in line and "seeds/superseded/" in line


# ---------------------------------------------------------------------------------------------------------------------
# The embedded default


def _train_py_to_the_end(monkeypatch, argv) -> dict:
    """Runs `train.py` in-process with a checkpoint every step; returns its report once it exited with status 0."""
    monkeypatch.setattr(sys, "argv", ["train.py", *argv, "--save_steps", "1"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    assert exit_info.value.code == 0
    output_dir = Path(argv[argv.index("--output_dir") + 1])
    return json.loads((output_dir / "report.json").read_text())


def test_embedded_default_end_to_end_in_miniature(tmp_path, monkeypatch):
    """`train.py` with no model and no dataset, shrunk: warm-up, pass@1 before/after, seeds, cards, the report."""
    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))
    output_dir = tmp_path / "embedded"
    report = _train_py_to_the_end(monkeypatch, ["--output_dir", str(output_dir), *EMBEDDED_SMALL, "--max_steps", "3"])
    assert 0.0 <= report["held_out_pass@1_before"] <= 1.0 and 0.0 <= report["held_out_pass@1_after"] <= 1.0
    assert report["steps"] == 3 and report["seeds"]["rollouts"] == 24 and report["seeds"]["continuations"] > 0
    assert report["seeds"]["bank_size"] == 24  # the bank at the end, not the last logging window's mean
    assert report["report"] == str(output_dir / "report.json")
    assert Path(report["model_card"]).is_file() and Path(report["dataset_card"]).is_file()
    assert Path(report["last_checkpoint"]).name == "checkpoint-3"
    assert (
        Path(report["learning_curve"]) == output_dir / "learning_curve.png"
        and output_dir.joinpath("learning_curve.csv").read_text().count("held_out_pass@1") == 2
    )  # steps 0 and 3: the report's before and after
    card = ModelCard(Path(report["model_card"]).read_text())
    assert card.data.license == "apache-2.0" and not card.data.base_model and not card.data.datasets  # no made-up ids

    # The local seed folder loads as a dataset, with exactly this run's shards (not superseded/ ones).
    (output_dir / "seeds" / "superseded" / "old").mkdir(parents=True)
    shutil.copy(output_dir / "seeds" / "step-000001.parquet", output_dir / "seeds" / "superseded" / "old")
    local = datasets.load_dataset(str(output_dir / "seeds"), split="train", cache_dir=str(tmp_path / "ds-cache"))
    _, rows = _seed_rows(output_dir)
    assert sorted(local["rollout_id"]) == sorted(r["rollout_id"] for r in rows) and len(rows) == 24
    assert "held_out_pass@1_after" in Path(report["model_card"]).read_text()
    assert list((tmp_path / "cache").glob("warmup/*/model.safetensors"))  # the warm-up was cached


def test_the_on_policy_baseline_reports_itself_with_its_curve(tmp_path, monkeypatch, capsys):
    """`--seed_method none` in the embedded default (the testbed's own target): the report names the method it
    trained, not Thinking Seeds, and its learning curve."""
    monkeypatch.setenv("TS_TRL_CACHE", str(_embedded_warm_cache(tmp_path)))
    output_dir = tmp_path / "on-policy"
    argv = ["--output_dir", str(output_dir), *EMBEDDED_SMALL, "--max_steps", "2", "--seed_method", "none"]
    report = _train_py_to_the_end(monkeypatch, argv)
    output = capsys.readouterr().out
    assert "On-policy GRPO run finished" in output and "Thinking Seeds" not in output
    assert report["steps"] == 2 and Path(report["learning_curve"]) == output_dir / "learning_curve.png"
    assert str(output_dir / "learning_curve.png") in output


@pytest.mark.slow
def test_embedded_default_improves_held_out_pass_at_1(tmp_path):
    """The real embedded default (minutes on two cores): RL must raise held-out pass@1 over the warmed-up model."""
    output_dir = tmp_path / "embedded"
    _launch(
        tmp_path,
        ["--config_file", str(ROOT / "accelerate_configs" / "cpu.yaml")],
        ["--output_dir", str(output_dir)],
        timeout=1200,
    )
    report = json.loads((output_dir / "report.json").read_text())
    assert report["held_out_pass@1_after"] > report["held_out_pass@1_before"]
