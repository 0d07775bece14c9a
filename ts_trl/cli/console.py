"""What `ts_trl train` prints at each logging step: one short line, where TRL prints a dict of some 35 metrics.

The metrics themselves are unchanged: every logged value still reaches the `report_to` trackers, the trainer's
`log_history` and `<output_dir>/metrics.jsonl`; only the console shows fewer of them.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

METRICS_FILE = "metrics.jsonl"

# (logged key, label, format): what one line shows, in this order, when the step logged it.
SHOWN = (
    ("loss", "loss", "{:.4g}"),
    ("reward", "reward", "{:.3f}"),
    ("reward_std", "std", "{:.3f}"),
    ("seeds/seeded_group_share", "seeded", "{:.2f}"),
    ("seeds/eligible_group_share", "eligible", "{:.2f}"),
    ("completions/mean_length", "length", "{:.1f}"),
    ("eval_held_out_pass@1", "held-out pass@1", "{:.3f}"),
    ("eval_reward", "eval reward", "{:.3f}"),
    ("eval_loss", "eval loss", "{:.4g}"),
)
# TRL's `step_time`: the training steps alone (generation, rewards, loss and update), not the evaluations and
# checkpoints between them; shown beside the wall-clock s/step, labelled with what it counts.
TRAINING_STEP_TIME = "step_time"
# One step time, measured one way everywhere (each line, the progress bar, the last line, report.json): wall-clock
# seconds per optimizer step, held-out evaluations and checkpoints included, which is what sizes a run.
WALL_NOTE = "wall clock, evaluations and checkpoints included"


def compact_line(state, logs: dict, first_step: int = 0, wall_s_per_step: float | None = None) -> str:
    """One line for a logging step: the step and the few values in `SHOWN`; the end-of-training summary in words.

    `first_step` is the step this `train()` call started from (a resumed run's checkpoint): transformers' runtime
    covers only the steps after it, and so does the time per step shown. `wall_s_per_step` is the wall-clock time per
    step since the previous line.
    """
    if "train_runtime" in logs:
        runtime, trained = float(logs["train_runtime"]), state.global_step - first_step
        steps = f"steps {first_step + 1}-{state.global_step}" if first_step else f"{trained} steps"
        line = f"trained {steps} in {runtime / 60:.1f} min ({runtime / max(trained, 1):.2f} s/step, {WALL_NOTE})"
        loss = logs.get("train_loss")
        return line + (f", mean loss {loss:.4g}" if isinstance(loss, (int, float)) else "")
    parts = [f"step {state.global_step}/{state.max_steps}" if state.max_steps else f"step {state.global_step}"]
    for key, label, form in SHOWN:
        value = logs.get(key)
        if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
            parts.append(f"{label} {form.format(value)}")
    if wall_s_per_step is not None:
        training = logs.get(TRAINING_STEP_TIME)
        training = f" (training {training:.2f})" if isinstance(training, (int, float)) else ""
        parts.append(f"s/step {wall_s_per_step:.2f}{training}")
    return "  ".join(parts)


def say(line: str) -> None:
    """Prints `line` on a line of its own above any open progress bar (tqdm clears the bars, prints, redraws them):
    a plain print while a bar is drawn would glue the line to the bar."""
    tqdm.write(line)
    sys.stdout.flush()


class _StepClock:
    """Wall-clock seconds per optimizer step since the previous line (None on a line of the same step)."""

    # Before training begins (the step-0 held-out score is logged by a callback that begins first): no steps to time.
    first_step = last_step = 0
    last_time = 0.0

    def start(self, state) -> None:
        self.first_step = self.last_step = state.global_step  # after a resume, the checkpoint's step
        self.last_time = time.perf_counter()

    def lap(self, state) -> float | None:
        if state.global_step <= self.last_step:
            return None
        now = time.perf_counter()
        seconds = (now - self.last_time) / (state.global_step - self.last_step)
        self.last_step, self.last_time = state.global_step, now
        return seconds


class CompactProgress(_StepClock, ProgressCallback):
    """TRL's progress bar counting s/step as the lines do (the mean since the start, not tqdm's moving average),
    with `compact_line` printed above it at each logging step."""

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        if self.training_bar is not None:
            self.training_bar.unit, self.training_bar.smoothing = "step", 0
        self.start(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        line = compact_line(state, logs, self.first_step, self.lap(state))
        if "train_runtime" in logs and self.training_bar is not None:
            self.training_bar.close()  # the bar's last state, then the last lines below it, not the bar after them
            self.training_bar = None
        # What is logged before the bar exists (the held-out pass@1 of step 0, from a callback that begins first)
        # or after it closed is printed plainly; while it is open, above it.
        say(line)

    def on_train_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:  # closed by the last line already: transformers' own would fail on None
            super().on_train_end(args, state, control, **kwargs)


class CompactPrinter(_StepClock, PrinterCallback):
    """`compact_line` at each logging step, for `disable_tqdm` runs."""

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self.start(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            say(compact_line(state, logs, self.first_step, self.lap(state)))


class MetricsFile(TrainerCallback):
    """Appends every logged dict, with its step, to `<output_dir>/metrics.jsonl` (main process)."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            say(f"Every logged metric goes to {Path(args.output_dir) / METRICS_FILE}")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        path = Path(args.output_dir) / METRICS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps({"step": state.global_step, **logs}, default=str) + "\n")


def use_compact_console(trainer) -> None:
    """Makes `trainer` print `compact_line` instead of each step's full dict, and write the dicts to metrics.jsonl.

    TRL's progress bar stays (the lines print above it); with `disable_tqdm`, the lines are printed alone.
    """
    for full, compact in ((ProgressCallback, CompactProgress), (PrinterCallback, CompactPrinter)):
        if trainer.pop_callback(full) is not None:
            trainer.add_callback(compact)
    trainer.add_callback(MetricsFile())
