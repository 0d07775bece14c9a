"""What a new user's first commands print: one error prefix per command, and the untrained model's held-out pass@1
before the first training step."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import EMBEDDED_TINY

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path) -> dict:
    return {**os.environ, "TS_TRL_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def _error_line(command: list[str], tmp_path) -> str:
    result = subprocess.run(command, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


def test_errors_of_one_command_share_its_name(tmp_path):
    """A bad flag (found by the parser) and a missing file (found while the run is built) start alike."""
    train = [sys.executable, "-m", "ts_trl", "train"]
    parsing = _error_line([*train, "--no_such_flag", "1"], tmp_path)
    missing = tmp_path / "missing.jsonl"
    building = _error_line(
        [*train, "--model_name_or_path", str(tmp_path), "--dataset_path", str(missing), "--reward_funcs", "math"],
        tmp_path,
    )
    assert parsing.startswith("ts_trl train: error: ") and building.startswith("ts_trl train: error: "), (
        parsing,
        building,
    )
    script = _error_line([sys.executable, str(ROOT / "train.py"), "--no_such_flag", "1"], tmp_path)
    assert script.startswith("train.py: error: ")


def test_the_untrained_models_held_out_pass_at_1_is_printed_before_training(tmp_path):
    command = [sys.executable, "train.py", "--output_dir", str(tmp_path / "run"), *EMBEDDED_TINY]
    command += ["--max_steps", "1", "--logging_steps", "1"]  # with the progress bar, as a user runs it
    result = subprocess.run(command, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    first = re.search(r"^step 0/1 .*held-out pass@1 ([\d.]+)$", result.stdout, re.MULTILINE)
    assert first, result.stdout[-3000:]
    trained = result.stdout.index("step 1/1")
    assert first.start() < trained  # before the first step's line, and the same value the report calls "before"
    assert re.search(rf"held_out_pass@1_before +{re.escape(first.group(1))}\b", result.stdout)
    # The held-out evaluation has a bar of its own; saving the model adds none ("Writing model shards").
    assert "held-out samples" in result.stderr and "Writing model shards" not in result.stderr, result.stderr[-3000:]


def test_held_out_set_is_sampled_only_where_the_curve_needs_it(tmp_path, monkeypatch, capsys):
    """`ts_trl train`: the report's before and after are the learning curve's step-0 and last-step values, not two more
    passes over the held-out set; a SIGTERM (or Ctrl-C) stops without one, and the resumed run's report and curve
    still start from the untrained model's score."""
    import json
    import signal

    from ts_trl.cli.interrupt import SaveOnInterrupt
    from ts_trl.cli.train import run
    from ts_trl.embedded import evaluate

    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))
    sampled = []
    sample_rewards = evaluate.sample_rewards
    monkeypatch.setattr(evaluate, "sample_rewards", lambda *a, **k: sampled.append(1) or sample_rewards(*a, **k))
    on_step_end = SaveOnInterrupt.on_step_end

    def terminated_at_step_2(self, args, state, control, **kwargs):
        if state.global_step == 2 and not self.interrupted:
            os.kill(os.getpid(), signal.SIGTERM)  # as Slurm would: the handler runs before the next line
        return on_step_end(self, args, state, control, **kwargs)

    output_dir = tmp_path / "run"
    argv = ["--output_dir", str(output_dir), *EMBEDDED_TINY, "--max_steps", "4", "--save_steps", "4"]
    argv += ["--embedded_eval_every", "0", "--logging_steps", "1", "--disable_tqdm", "true", "--report_to", "none"]
    with monkeypatch.context() as patch:
        patch.setattr(SaveOnInterrupt, "on_step_end", terminated_at_step_2)
        assert run(argv) == 143
    assert "held_out_pass@1_after" not in capsys.readouterr().out  # not measured: not printed as None
    assert len(sampled) == 1  # step 0 only
    report = json.loads((output_dir / "report.json").read_text())
    assert report["steps"] == 2 and report["held_out_pass@1_after"] is None
    before = report["held_out_pass@1_before"]
    assert isinstance(before, float)

    sampled.clear()
    assert run([*argv, "--resume_from_checkpoint", str(output_dir / "checkpoint-2")]) == 0
    assert len(sampled) == 1  # the last step only: step 0's score comes with the checkpoint
    report = json.loads((output_dir / "report.json").read_text())
    assert report["held_out_pass@1_before"] == before and isinstance(report["held_out_pass@1_after"], float)
    # The resumed segment's figures, labelled: the whole run's steps, the segment's own steps and minutes (issue 58).
    assert report["steps"] == 4 and report["resumed_at_step"] == 2 and report["steps_this_segment"] == 2
    assert report["minutes_this_segment"] > 0 and "minutes" not in report
    assert report["held_out_pass@1_after_step"] == 4
    assert report["held_out_pass@1_by_step"] == {"0": before, "4": report["held_out_pass@1_after"]}
    held = [line.split(",") for line in (output_dir / "learning_curve.csv").read_text().splitlines()[1:]]
    assert [(int(step), float(value)) for step, kind, value in held if kind == "held_out_pass@1"] == [
        (0, before),
        (4, report["held_out_pass@1_after"]),
    ]


def test_ctrl_c_prints_the_resume_command_as_the_user_typed_it(tmp_path):
    """`ts_trl train ...` (the console script the package installs), Ctrl-C: the command printed to resume is
    `ts_trl train ...` with the checkpoint, not the Python interpreter and the script's path in the venv."""
    import shlex
    import signal
    import threading

    script = Path(sys.executable).parent / "ts_trl"
    assert script.is_file(), "the package's console script is installed beside the interpreter"
    argv = ["train", "--output_dir", str(tmp_path / "run"), *EMBEDDED_TINY]
    argv += ["--max_steps", "50", "--logging_steps", "1"]
    process = subprocess.Popen(
        [str(script), *argv], cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    lines, stepped = [], threading.Event()

    def read():
        for line in process.stdout:
            lines.append(line)
            if re.match(r"step [1-9]\d*/50 ", line):
                stepped.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert stepped.wait(300), "".join(lines[-40:])
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in a terminal
        status = process.wait(120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    reader.join(10)
    output = "".join(lines)
    assert status == 130 and "Resume with:\n" in output, output[-3000:]
    command = shlex.split(output.split("Resume with:\n", 1)[1].splitlines()[0])
    step = json.loads((tmp_path / "run" / "report.json").read_text())["steps"]
    assert command == ["ts_trl", *argv, "--resume_from_checkpoint", str(tmp_path / "run" / f"checkpoint-{step}")]


def test_an_interrupted_runs_report_keeps_every_held_out_score_it_measured(tmp_path, monkeypatch, capsys):
    """Scored at every step, stopped by SIGTERM at step 3: the report's "after" is the last score the run measured,
    with its step, and every score is kept, as the console showed them (it was `null`: issue 58)."""
    import json
    import signal

    from ts_trl.cli.interrupt import SaveOnInterrupt
    from ts_trl.cli.train import run

    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))
    on_step_end = SaveOnInterrupt.on_step_end

    def terminated_at_step_3(self, args, state, control, **kwargs):
        if state.global_step == 3 and not self.interrupted:
            os.kill(os.getpid(), signal.SIGTERM)
        return on_step_end(self, args, state, control, **kwargs)

    output_dir = tmp_path / "run"
    argv = ["--output_dir", str(output_dir), *EMBEDDED_TINY, "--max_steps", "6", "--save_steps", "6"]
    argv += ["--embedded_eval_every", "1", "--logging_steps", "1", "--disable_tqdm", "true", "--report_to", "none"]
    monkeypatch.setattr(SaveOnInterrupt, "on_step_end", terminated_at_step_3)
    assert run(argv) == 143
    printed = capsys.readouterr().out
    report = json.loads((output_dir / "report.json").read_text())
    held = [line.split(",") for line in (output_dir / "learning_curve.csv").read_text().splitlines()[1:]]
    curve = {step: float(value) for step, kind, value in held if kind == "held_out_pass@1"}
    assert sorted(curve) == ["0", "1", "2", "3"]
    assert report["steps"] == 3 and report["held_out_pass@1_by_step"] == curve and "resumed_at_step" not in report
    assert report["held_out_pass@1_after"] == curve["3"] and report["held_out_pass@1_after_step"] == 3
    assert re.search(r"held_out_pass@1_after +\d", printed) and "held_out_pass@1_after_step 3" in printed
