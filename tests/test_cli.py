"""`train.py` end to end: recipes, local data, error paths in-process; ZeRO-3, LoRA, two ranks, Ctrl-C under `accelerate`.

The `accelerate launch` tests each start fresh interpreters (about 20-40 s of imports on a busy two-core machine), so
every run is as small as it can be: the package's tiny model, two prompts, 12-token completions, 2-3 steps.
"""

import json
import os
import runpy
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
import yaml

from ts_trl.cli import EMBEDDED_DEFAULTS, ConfigError, load_training_data, make_parser, parse_args, resolve_rewards
from ts_trl.tiny import build_tiny_model, build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
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
    seeds = Path(output_dir) / "seeds"
    manifest = json.loads((seeds / "manifest.json").read_text())
    return manifest, [row for s in manifest["shards"] for row in pq.read_table(seeds / s["file"]).to_pylist()]


# ---------------------------------------------------------------------------------------------------------------------
# Recipes and arguments (in-process)


def test_embedded_recipe_matches_the_builtin_defaults():
    builtin = parse_args(make_parser(), [])
    recipe = parse_args(make_parser(), ["--config", str(RECIPES / "embedded.yaml")])
    values = yaml.safe_load((RECIPES / "embedded.yaml").read_text())
    assert set(EMBEDDED_DEFAULTS) <= set(values)
    for key in values:
        found = [getattr(args, key) for args in builtin if hasattr(args, key)]
        expected = [getattr(args, key) for args in recipe if hasattr(args, key)]
        assert found == expected, key
    assert builtin[2].model_name_or_path is None and builtin[0].dataset_name is None


def test_flags_override_the_recipe():
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
    Dataset.from_list(rows).to_parquet(data)
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

    train, evaluation = load_training_data(script_args, training_args)
    column = "answer" if "answer" in expected else "tests"
    assert set(train.column_names) == {"prompt", "prompt_id", column}
    assert expected[column] in train[0][column]
    assert train[0]["prompt"][0] == {"role": "system", "content": values["system_prompt"]}
    assert evaluation is None  # the recipes do not evaluate during training

    rewards = resolve_rewards(script_args.reward_funcs, embedded=False)
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


def test_unknown_recipe_key_is_one_clear_line(tiny_dir, tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("# Seeding\nseed_fraction: 0.5\nseed_fractoin: 0.3\n")
    line = _run_train_py(monkeypatch, capsys, ["--config", str(recipe), *_data_args(tiny_dir, tmp_path / "run")])
    assert "seed_fractoin" in line


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


def test_lora_on_cpu_saves_an_adapter_and_seeds(tiny_dir, tmp_path):
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


def test_ctrl_c_leaves_a_resumable_checkpoint_with_its_seed_snapshot(tiny_dir, tmp_path):
    output_dir = tmp_path / "run"
    train = [*_data_args(tiny_dir, output_dir), *SMALL, "--max_steps", "10000", "--save_steps", "10000"]
    process = subprocess.Popen(
        _launch_command(["--config_file", str(ROOT / "accelerate_configs" / "cpu.yaml")], train),
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
            if "'loss'" in line:  # a logged training step: the loop is running
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(240), "".join(lines[-50:])
        family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: every process of the job gets it
        _, alive = psutil.wait_procs(family, timeout=120)
        assert not alive, "".join(lines[-50:])
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    reader.join(10)
    output = "".join(lines)
    assert "Interrupted: saving a checkpoint" in output
    checkpoints = sorted(output_dir.glob("checkpoint-*"))
    assert len(checkpoints) == 1, output[-3000:]
    step = int(checkpoints[0].name.split("-")[1])
    pointer = json.loads((checkpoints[0] / "seed_snapshot.json").read_text())
    assert pointer["step"] == step and pointer["shards"][-1]["step"] == step
    assert (output_dir / "seeds" / f"step-{step:06d}.parquet").is_file()

    # Resume in this process (no new interpreter needed) and take one more step.
    _, rows_before = _seed_rows(output_dir)
    argv = [*train[: train.index("--max_steps")], "--max_steps", str(step + 1), "--use_cpu"]
    argv += ["--resume_from_checkpoint", str(checkpoints[0])]
    from unittest import mock

    with mock.patch.object(sys, "argv", ["train.py", *argv]):
        runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    assert json.loads((output_dir / "report.json").read_text())["steps"] == step + 1
    _, rows_after = _seed_rows(output_dir)
    assert {r["rollout_id"] for r in rows_before} < {r["rollout_id"] for r in rows_after}


# ---------------------------------------------------------------------------------------------------------------------
# The embedded default


def test_embedded_default_end_to_end_in_miniature(tmp_path, monkeypatch):
    """`train.py` with no model and no dataset, shrunk: warm-up, pass@1 before/after, seeds, cards, the report."""
    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))
    output_dir = tmp_path / "embedded"
    argv = [
        "--output_dir", str(output_dir),
        "--embedded_warmup_steps", "5",  # the real warm-up takes minutes; five steps exercise the same path
        "--embedded_train_problems", "4",  # few prompts, so prompts repeat and later steps draw seeds
        "--embedded_eval_problems", "8",
        "--embedded_eval_samples", "1",
        "--per_device_train_batch_size", "8",
        "--num_generations", "4",
        "--max_completion_length", "16",
        "--max_steps", "3",
        "--save_steps", "1",
        "--seed_fraction", "1.0",
        "--disable_tqdm", "true",
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    report = json.loads((output_dir / "report.json").read_text())
    assert 0.0 <= report["held_out_pass@1_before"] <= 1.0 and 0.0 <= report["held_out_pass@1_after"] <= 1.0
    assert report["steps"] == 3 and report["seeds"]["rollouts"] == 24 and report["seeds"]["continuations"] > 0
    assert Path(report["model_card"]).is_file() and Path(report["dataset_card"]).is_file()
    assert Path(report["last_checkpoint"]).name == "checkpoint-3"
    assert "held_out_pass@1_after" in Path(report["model_card"]).read_text()
    assert list((tmp_path / "cache").glob("warmup/*/model.safetensors"))  # the warm-up was cached


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
