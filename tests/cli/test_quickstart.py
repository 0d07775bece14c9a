"""The quick start as a new user meets it: the drop-in swap with no `args`, as TRL's own `test_init_minimal` builds
`GRPOTrainer`, constructs and trains."""

import fcntl
import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import torch
from datasets import Dataset

from tests.conftest import EMBEDDED_TINY
from ts_trl import SeedGRPOTrainer
from ts_trl.analysis.common import run_command
from ts_trl.tiny import build_tiny_model, build_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def _saved_tiny_model(folder):
    """A model folder, as TRL's test names a Hub model: the swap is then the only change to `test_init_minimal`."""
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, max_positions=1024)  # room for GRPOConfig's default max_completion_length
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _odd_length(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def test_init_minimal_with_the_swap_constructs_and_trains(tmp_path, monkeypatch):
    """`SeedGRPOTrainer(model=..., reward_funcs=..., train_dataset=...)`: no args, so no refusal of settings nobody
    chose (the default run cannot seed: its first shard comes after the run ends), GRPOTrainer's defaults otherwise."""
    monkeypatch.chdir(tmp_path)  # the default output_dir is relative, as TRL's is
    model = _saved_tiny_model(tmp_path / "tiny")
    dataset = Dataset.from_dict({"prompt": ["Q: 1+2=", "Q: 3+4="]})
    trainer = SeedGRPOTrainer(model=model, reward_funcs=_odd_length, train_dataset=dataset)
    assert trainer.args.output_dir.endswith("tiny-ThinkingSeeds")
    assert trainer.args.seed_method == "seeds"  # the method stays on; only the refusal became a warning
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step > 0 and "train_loss" in trainer.state.log_history[-1]
    assert any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())


def _threads_under_accelerate(tmp_path, omp: str | None) -> str:
    script = tmp_path / "threads.py"
    script.write_text(
        "from ts_trl.embedded.cpu import embedded_training_threads\nprint(embedded_training_threads())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    config = ROOT / "accelerate_configs" / "cpu.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), str(script)],
        capture_output=True, text=True, env=env, timeout=300, check=True,
    )  # fmt: skip
    return result.stdout.strip().splitlines()[-1]


def test_the_readme_accelerate_command_trains_the_embedded_default_on_one_thread(tmp_path):
    """accelerate sets OMP_NUM_THREADS for its CPU workers by itself; only the user's own setting is followed."""
    assert _threads_under_accelerate(tmp_path, None) == "1"
    assert _threads_under_accelerate(tmp_path, "2") == "None"  # the user's: torch follows OMP_NUM_THREADS


def test_analysis_commands_run_on_one_thread(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = []
    torch.set_num_threads(2)
    assert run_command(lambda argv: seen.append(torch.get_num_threads())) == 0
    assert seen == [1] and torch.get_num_threads() == 2  # put back afterwards


def _run_in_a_terminal(command: list[str], env: dict, then: bytes | int, timeout: float = 300) -> tuple[int, str]:
    """Runs `command` on a pseudo-terminal of its own, as a user's shell would; once a training step is logged,
    types `then` (b"\\x03" is Ctrl-C: the terminal signals its foreground process group) or sends that signal."""
    master, slave = pty.openpty()

    def own_terminal():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen(
        command, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=env, preexec_fn=own_terminal
    )
    os.close(slave)
    output, sent, deadline = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the terminal closed: every process of the job is gone
                    break
                output += data
            elif process.poll() is not None:
                break
            if not sent and re.search(rb"step \d+/\d+ +loss", output):
                os.write(master, then) if isinstance(then, bytes) else os.kill(process.pid, then)
                sent = True
        status = process.wait(30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        os.close(master)
    assert sent, output.decode(errors="replace")[-3000:]
    return status, output.decode(errors="replace").replace("\r\n", "\n")


def _embedded_env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return {**env, "TS_TRL_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


EMBEDDED_RUN = [*EMBEDDED_TINY, "--max_steps", "200", "--save_steps", "100", "--logging_steps", "1"]


def test_ctrl_c_under_the_readme_accelerate_command_saves_exits_130_and_prints_that_command(tmp_path):
    """The README's own command in a terminal, and Ctrl-C: accelerate's launcher gets the signal too, and would stop
    its worker within seconds; the checkpoint is saved, the command exits 130 without a traceback, and the resume
    command printed is the accelerate one."""
    output_dir = tmp_path / "run"
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu.yaml"]
    command = [*launch, "train.py", "--output_dir", str(output_dir), *EMBEDDED_RUN]
    status, output = _run_in_a_terminal(command, _embedded_env(tmp_path), then=b"\x03")
    assert status == 130, output[-3000:]
    assert "Traceback" not in output and "Interrupted: saving a checkpoint" in output
    step = json.loads((output_dir / "report.json").read_text())["steps"]
    assert (output_dir / f"checkpoint-{step}" / "seed_snapshot.json").is_file()
    printed = shlex.split(output.split("Resume with:\n", 1)[1].splitlines()[0])
    assert printed[:4] == ["accelerate", "launch", "--config_file", "accelerate_configs/cpu.yaml"]
    assert printed[4] == "train.py" and printed[-2:] == [
        "--resume_from_checkpoint",
        str(output_dir / f"checkpoint-{step}"),
    ]


def test_sigterm_saves_like_the_first_ctrl_c_and_exits_143(tmp_path):
    """What Slurm and Kubernetes send before they kill a job: a checkpoint and its shard, then exit 143."""
    output_dir = tmp_path / "run"
    command = [sys.executable, "train.py", "--output_dir", str(output_dir), *EMBEDDED_RUN]
    status, output = _run_in_a_terminal(command, _embedded_env(tmp_path), then=signal.SIGTERM)
    assert status == 143, output[-3000:]
    assert "SIGTERM received: saving a checkpoint" in output and "Traceback" not in output
    report = json.loads((output_dir / "report.json").read_text())
    pointer = json.loads((output_dir / f"checkpoint-{report['steps']}" / "seed_snapshot.json").read_text())
    assert pointer["step"] == report["steps"]
    assert report["held_out_pass@1_after"] is None  # the held-out evaluation waits for the resumed run
