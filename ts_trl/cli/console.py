"""What `ts_trl train` prints at each logging step: one short line, where TRL prints a dict of some 35 metrics.

The metrics themselves are unchanged: every logged value still reaches the `report_to` trackers, the trainer's
`log_history` and `<output_dir>/metrics.jsonl`; only the console shows fewer of them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

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
    ("step_time", "s/step", "{:.2f}"),
)


def compact_line(state, logs: dict, first_step: int = 0) -> str:
    """One line for a logging step: the step and the few values in `SHOWN`; the end-of-training summary in words.

    `first_step` is the step this `train()` call started from (a resumed run's checkpoint): transformers' runtime
    covers only the steps after it, and so does the time per step shown.
    """
    if "train_runtime" in logs:
        runtime, trained = float(logs["train_runtime"]), state.global_step - first_step
        steps = f"steps {first_step + 1}-{state.global_step}" if first_step else f"{trained} steps"
        line = f"trained {steps} in {runtime / 60:.1f} min ({runtime / max(trained, 1):.2f} s/step)"
        loss = logs.get("train_loss")
        return line + (f", mean loss {loss:.4g}" if isinstance(loss, (int, float)) else "")
    parts = [f"step {state.global_step}/{state.max_steps}" if state.max_steps else f"step {state.global_step}"]
    for key, label, form in SHOWN:
        value = logs.get(key)
        if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
            parts.append(f"{label} {form.format(value)}")
    return "  ".join(parts)


class CompactProgress(ProgressCallback):
    """TRL's progress bar, with `compact_line` printed above it at each logging step."""

    first_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self.first_step = state.global_step  # after a resume, the checkpoint's step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        line = compact_line(state, logs, self.first_step)
        # What is logged before the bar exists (the held-out pass@1 of step 0, from a callback that begins first)
        # is printed plainly rather than lost.
        self.training_bar.write(line) if self.training_bar is not None else print(line, flush=True)


class CompactPrinter(PrinterCallback):
    """`compact_line` at each logging step, for `disable_tqdm` runs."""

    first_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self.first_step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            print(compact_line(state, logs, self.first_step), flush=True)


class MetricsFile(TrainerCallback):
    """Appends every logged dict, with its step, to `<output_dir>/metrics.jsonl` (main process)."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            print(f"Every logged metric goes to {Path(args.output_dir) / METRICS_FILE}", flush=True)

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
