"""What a user sees on the command line: flags and help, the console of a run, what reaches the trackers."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EMBEDDED_TINY
from ts_trl.__main__ import main as ts_trl_main

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_RUN = [*EMBEDDED_TINY, "--save_steps", "2"]
# A flag spelled with a dash after `--`, other than a boolean's `--no-` prefix (choices such as seeds-state aside).
DASH_FLAG = re.compile(r"(?<![\w-])--(?!no-)[a-z0-9_]*-[a-z]")


def _run(args, tmp_path, **env):
    """`python -m ts_trl ...` in a fresh interpreter, as a user runs it."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "TS_TRL_CACHE": str(tmp_path / "cache"), **env}
    environment.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-m", "ts_trl", *args], capture_output=True, text=True, env=environment, timeout=600
    )


def test_train_help_shows_general_defaults_and_lists_config(tmp_path):
    first = _run(["train", "--help"], tmp_path, COLUMNS="100")
    assert first.returncode == 0, first.stderr
    text = " ".join(first.stdout.split())
    # TRL's defaults as they hold in general, the embedded default's beside them where it differs
    assert (
        "--learning_rate LEARNING_RATE The initial learning rate for AdamW. (default: 1e-06; embedded default: 0.0001)"
        in text
    )
    assert "(default: other; embedded default: apache-2.0)" in text
    assert "--config RECIPE A recipe: a YAML file of these flags, or a shipped recipe's name (embedded," in text
    assert "--output_dir" in text and not DASH_FLAG.search(first.stdout), DASH_FLAG.findall(first.stdout)
    assert "Setting accelerator to CPU" not in first.stdout + first.stderr


@pytest.mark.parametrize("command", [["-m", "ts_trl", "train"], ["train.py"]])
def test_settings_a_dataset_run_lacks_are_named_at_once(command, tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    environment.pop("PYTHONWARNINGS", None)
    result = subprocess.run(
        [sys.executable, *command, "--dataset_path", str(tmp_path / "none.jsonl"), "--output_dir", str(tmp_path)],
        capture_output=True, text=True, env=environment, cwd=ROOT, timeout=600,
    )  # fmt: skip
    (line,) = result.stderr.splitlines()
    assert result.returncode == 2 and line.startswith(("ts_trl train: error: ", "train.py: error: ")), result.stderr
    for named in ("--model_name_or_path is required", "--reward_funcs is required", "none.jsonl: no such file"):
        assert named in line


def test_the_top_level_help_lists_the_commands_without_importing_trl(tmp_path):
    broken = tmp_path / "broken" / "trl"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('trl imported')\n")
    result = _run(["--help"], tmp_path, PYTHONPATH=f"{broken.parent}{os.pathsep}{ROOT}")
    assert result.returncode == 0 and all(c in result.stdout for c in ("train", "relay", "positions", "compare"))


@pytest.mark.parametrize("command", ["relay", "positions", "compare", "recipe_compare"])
def test_analysis_flags_are_snake_case_and_the_dash_spellings_still_parse(command):
    from importlib import import_module

    parser = import_module(f"ts_trl.analysis.{command}").build_parser()
    help_text = parser.format_help()
    assert not DASH_FLAG.search(help_text), DASH_FLAG.findall(help_text)
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and not option.startswith("--no-") and "_" in option:
                dashed = "--" + option[2:].replace("_", "-")
                assert parser._option_string_actions[dashed] is action, dashed
    required = {
        "relay": ["--checkpoint_a", "a", "--checkpoint-b", "b"],
        "positions": ["--seeds", "s", "--checkpoint", "c"],
        "recipe_compare": ["--config", "embedded"],
    }
    for spelling in ("--output_dir", "--output-dir"):
        assert parser.parse_args([*required.get(command, []), spelling, "out"]).output_dir == "out"


def test_relay_takes_either_spelling_of_each_flag(tmp_path, capsys):
    missing = tmp_path / "missing"
    argv = ["relay", "--checkpoint_a", str(missing), "--checkpoint-b", str(missing), "--output_dir", str(tmp_path)]
    assert ts_trl_main([*argv, "--num_prompts", "2", "--max-new-tokens", "4", "--task_seed", "0"]) == 2
    assert f"checkpoint A '{missing}' does not exist" in capsys.readouterr().err


def test_a_short_run_logs_held_out_pass_at_1_to_tensorboard_and_prints_one_line_per_step(tmp_path, capsys):
    """Every held-out pass@1 of the learning curve reaches the tracker (here TensorBoard's event file) at its step;
    the console shows one line per logging step, the full metrics go to metrics.jsonl."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    output_dir = tmp_path / "run"
    os.environ["TS_TRL_CACHE"], previous = str(tmp_path / "cache"), os.environ.get("TS_TRL_CACHE")
    try:
        argv = ["train", "--output_dir", str(output_dir), *EMBEDDED_RUN, "--max_steps", "3"]
        argv += ["--embedded_eval_every", "2", "--logging_steps", "1", "--report_to", "tensorboard"]
        argv += ["--disable_tqdm", "true"]
        assert ts_trl_main(argv) == 0
    finally:
        os.environ.pop("TS_TRL_CACHE") if previous is None else os.environ.update(TS_TRL_CACHE=previous)
    printed = capsys.readouterr().out

    (events,) = output_dir.rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events.parent))
    accumulator.Reload()
    logged = {event.step: event.value for event in accumulator.Scalars("eval/held_out_pass@1")}
    curve = {}
    for line in (output_dir / "learning_curve.csv").read_text().splitlines()[1:]:
        step, kind, value = line.split(",")
        if kind == "held_out_pass@1":
            curve[int(step)] = float(value)
    assert sorted(logged) == sorted(curve) == [0, 2, 3]  # start, every 2 steps, the end
    assert logged == pytest.approx(curve)
    report = json.loads((output_dir / "report.json").read_text())
    assert logged[3] == pytest.approx(report["held_out_pass@1_after"])
    assert "train/reward" in accumulator.Tags()["scalars"]  # the training metrics still reach it

    assert "{'loss'" not in printed and "'completions/mean_length'" not in printed
    step_lines = [line for line in printed.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in step_lines if "loss" in line] == ["1/3", "2/3", "3/3"]
    assert all(len(line) < 160 for line in step_lines) and any("held-out pass@1" in line for line in step_lines)
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3] and len(rows[1]) > 20  # every metric, in full
    assert "Setting accelerator to CPU" not in printed


def test_one_step_time_is_counted_the_same_way_on_each_line_the_bar_and_the_last_line(monkeypatch, capsys):
    """Wall-clock seconds per step (evaluations and checkpoints included) on every line, in the progress bar and in
    the last line; TRL's training-step time shown beside it is labelled as such."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from ts_trl.cli import console

    clock = iter([100.0, 110.0, 130.0])  # train begins; step 2 logged 10 s later; step 4 20 s after that
    monkeypatch.setattr(console.time, "perf_counter", lambda: next(clock))
    args, control = TrainingArguments(output_dir="unused", report_to=[]), TrainerControl()
    state = TrainerState(max_steps=4, is_world_process_zero=True)
    printer = console.CompactPrinter()
    printer.on_train_begin(args, state, control)
    for step, logs in ((2, {"loss": 0.5, "step_time": 1.25}), (2, {"eval_held_out_pass@1": 0.5}), (4, {"loss": 0.1})):
        state.global_step = step
        printer.on_log(args, state, control, logs=logs)
    printer.on_log(args, state, control, logs={"train_runtime": 30.0, "train_loss": 0.3})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("s/step 5.00 (training 1.25)")  # 10 s over 2 steps, and TRL's step_time labelled
    assert "s/step" not in lines[1]  # the held-out score of the same step: no steps to time
    assert lines[2].endswith("s/step 10.00")
    assert lines[3] == "trained 4 steps in 0.5 min (7.50 s/step, wall clock, evaluations and checkpoints included), " \
        "mean loss 0.3"  # fmt: skip

    monkeypatch.setattr(console.time, "perf_counter", lambda: 0.0)
    bar = console.CompactProgress()
    bar.on_train_begin(args, TrainerState(max_steps=4, is_world_process_zero=True), control)
    assert bar.training_bar.unit == "step" and bar.training_bar.smoothing == 0  # the mean since the start, in s/step
    bar.training_bar.close()


@pytest.mark.parametrize("omp", [None, "2"])
def test_the_embedded_default_trains_on_one_torch_thread_unless_omp_num_threads_says(omp, tmp_path, monkeypatch):
    """Beside other work, torch's default threads made the main job several times slower (see ts_trl.embedded.cpu);
    a user's OMP_NUM_THREADS is followed as torch follows it."""
    import torch

    from ts_trl import SeedGRPOTrainer

    seen = []
    training_step = SeedGRPOTrainer.training_step

    def counting_step(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return training_step(self, *args, **kwargs)

    monkeypatch.setattr(SeedGRPOTrainer, "training_step", counting_step)
    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if omp:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)  # what torch picks on two cores when OMP_NUM_THREADS is unset
    try:
        argv = ["train", "--output_dir", str(tmp_path / "run"), *EMBEDDED_RUN, "--max_steps", "2"]
        assert ts_trl_main([*argv, "--embedded_eval_problems", "0", "--disable_tqdm", "true"]) == 0
        assert torch.get_num_threads() == 2  # restored after training
    finally:
        torch.set_num_threads(previous)
    assert seen == [1, 1] if omp is None else seen == [2, 2]


def _through_a_terminal(command: list[str], tmp_path, columns: int = 200) -> tuple[int, str]:
    """`command` with a pseudo-terminal of `columns` columns as its stdin, stdout and stderr, as in a terminal window:
    (exit status, everything it drew, `\\r\\n` read as `\\n`)."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    main, worker = pty.openpty()
    fcntl.ioctl(worker, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    environment = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TS_TRL_CACHE": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",
    }
    environment.pop("PYTHONWARNINGS", None)
    process = subprocess.Popen(command, stdin=worker, stdout=worker, stderr=worker, env=environment, cwd=tmp_path)
    os.close(worker)
    drawn, deadline = [], time.monotonic() + 600
    while time.monotonic() < deadline:
        if not select.select([main], [], [], 1)[0]:
            if process.poll() is not None:
                break
            continue
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the command ended and closed its side
            break
        if not chunk:
            break
        drawn.append(chunk)
    os.close(main)
    status = process.wait(60)
    return status, b"".join(drawn).decode(errors="replace").replace("\r\n", "\n")


def test_in_a_terminal_the_step_lines_print_above_the_bar_and_the_bar_closes_before_the_last_lines(tmp_path):
    """Through a pseudo-terminal, as a user sees it: each line the run prints is a line of its own (what a line shows
    after its last carriage return starts with the line's words, not with a bar's), and the bar's last drawing comes
    before the `trained ...` line."""
    command = [sys.executable, "-m", "ts_trl", "train", "--output_dir", str(tmp_path / "run"), *EMBEDDED_TINY]
    status, drawn = _through_a_terminal([*command, "--max_steps", "3", "--logging_steps", "1"], tmp_path)
    assert status == 0, drawn[-3000:]
    shown = [re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line).split("\r")[-1] for line in drawn.split("\n")]
    ours = re.compile(r"step \d+/\d+  |Every logged metric goes to |trained \d+ steps in ")
    glued = [line for line in shown if ours.search(line) and not ours.match(line)]
    assert not glued, glued
    assert [line.split()[1] for line in shown if line.startswith("step ") and " loss " in line] == [
        "1/3",
        "2/3",
        "3/3",
    ]
    last_bar = drawn.rindex("3/3 [")
    assert last_bar < drawn.index("\ntrained 3 steps"), drawn[-3000:]
    assert "3/3 [" not in drawn[drawn.index("\ntrained 3 steps") :]
