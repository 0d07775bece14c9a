"""The embedded default's learning curve: held-out pass@1 every few steps and training reward, as CSV and PNG; the
held-out figures a run's report gives (every score measured, the last as "after")."""

from __future__ import annotations

import csv
from pathlib import Path

from transformers import Trainer, TrainerCallback

from ts_trl.embedded.agent import AgentTask, agent_pass_at_1
from ts_trl.embedded.evaluate import pass_at_1
from ts_trl.embedded.task import embedded_reward
from ts_trl.trainer.collectives import is_deepspeed

CURVE_PNG, CURVE_CSV = "learning_curve.png", "learning_curve.csv"
# The name under which the trackers see it: the `eval_` prefix files it under "eval/" in TensorBoard, W&B and trackio.
PASS_AT_1_METRIC = "eval_held_out_pass@1"


class LearningCurve(TrainerCallback):
    """Scores sampled held-out pass@1 at the start, every `every` steps and at the last step; writes the curve at
    the end.

    `learning_curve.csv` (step, kind, value) and `learning_curve.png` (held-out pass@1 and training reward against
    optimizer step) go into the output directory. Only the main process evaluates (the others go on to the next
    step's collectives and wait there); under DeepSpeed, whose sharded weights `generate` can't see outside the
    engine, nothing is evaluated and only the training reward is drawn.

    Once `report_through(trainer)` is called, each value during training is also logged through the trainer as
    `eval_held_out_pass@1`, so that every `report_to` tracker, `log_history` and the console see it; a run resumed
    from a checkpoint then draws the whole curve from step 0 (from the checkpoint's `log_history`).
    """

    def __init__(
        self,
        eval_set,
        every: int,
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        task=None,
        reward=embedded_reward,
    ):
        self.eval_set, self.every, self.num_samples, self.task = eval_set, every, num_samples, task
        self.reward = reward  # scores a single-turn task's held-out samples
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.points: list[tuple[int, str, float]] = []
        self.log = None

    def report_through(self, trainer) -> None:

        def log(logs: dict) -> None:
            # transformers' Trainer.log, not GRPOTrainer.log: that one would fold in (and clear) the training metrics
            # of the steps since the last logging step. Logging clears `should_log`, which this step's own training
            # log still needs.
            should_log = trainer.control.should_log
            Trainer.log(trainer, logs)
            trainer.control.should_log = should_log

        self.log = log

    def _evaluate(self, args, state, model, report: bool = True) -> None:
        if not state.is_world_process_zero or is_deepspeed(args) or model is None or not len(self.eval_set):
            return
        if any(step == state.global_step and kind == "held_out_pass@1" for step, kind, _ in self.points):
            return
        sampling = {"temperature": self.temperature, "num_samples": self.num_samples, "seed": self.seed}
        sampling["progress"] = not args.disable_tqdm  # seconds to a minute: a bar, as TRL's steps have
        if isinstance(self.task, AgentTask):  # sampled through the task's tool loop
            value = agent_pass_at_1(model, self.tokenizer, self.eval_set, self.task, self.max_new_tokens, **sampling)
        else:
            value = pass_at_1(model, self.tokenizer, self.eval_set, self.reward, self.max_new_tokens, **sampling)
        self.points.append((state.global_step, "held_out_pass@1", value))
        if report and self.log is not None:
            self.log({PASS_AT_1_METRIC: value})

    @staticmethod
    def _last_step(state) -> bool:
        # A run stopped before its schedule's end (Ctrl-C, SIGTERM) is not scored again: the evaluation takes minutes
        # on a busy CPU, and its resume continues the curve.
        return state.global_step >= state.max_steps

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self.tokenizer = processing_class
        # A resumed run starts from the checkpoint's log history, so its curve goes back to step 0. That history is
        # the checkpoint's own timeline; metrics.jsonl also keeps the steps of a run abandoned after the checkpoint.
        self.points = curve_points(state.log_history)
        if state.global_step == 0:  # a resumed run's curve goes on from its checkpoint's, at the next scheduled step
            self._evaluate(args, state, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        # The last step is scored here, while the trackers are still open (they close in their on_train_end).
        if (self.every and state.global_step % self.every == 0) or self._last_step(state):
            self._evaluate(args, state, model)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            self.points.append((state.global_step, "train_reward", float(logs["reward"])))

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self._last_step(state):
            self._evaluate(args, state, model, report=False)  # a loop that ended without a last step_end
        if state.is_world_process_zero:
            write_curve(self.points, Path(args.output_dir))


def curve_points(log_history: list[dict]) -> list[tuple[int, str, float]]:
    """The learning curve's (step, kind, value) points that a trainer's `log_history` holds."""
    points = []
    for logs in log_history:
        if isinstance(logs.get(PASS_AT_1_METRIC), (int, float)):
            points.append((logs["step"], "held_out_pass@1", float(logs[PASS_AT_1_METRIC])))
        if isinstance(logs.get("reward"), (int, float)):
            points.append((logs["step"], "train_reward", float(logs["reward"])))
    return points


def write_curve(points: list[tuple[int, str, float]], output_dir: Path) -> Path:
    """Writes `learning_curve.csv` and `learning_curve.png` into `output_dir`; returns the PNG's path."""
    import matplotlib  # lazy: start-up time; a figure is drawn once, at the end

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / CURVE_CSV, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "kind", "value"])
        writer.writerows(sorted(points))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for kind, style in (("train_reward", "-"), ("held_out_pass@1", "-o")):
        series = sorted((step, value) for step, k, value in points if k == kind)
        if series:
            ax.plot([s for s, _ in series], [v for _, v in series], style, label=kind.replace("_", " "), markersize=4)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward / pass@1 (temperature of training)")
    ax.set_title("Built-in task: held-out pass@1 and training reward", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(output_dir / CURVE_PNG, dpi=110)
    plt.close(fig)
    return output_dir / CURVE_PNG


def logged_held_out_pass_at_1(trainer, step: int) -> float | None:
    """The held-out pass@1 the learning curve logged at `step` (a resumed run's earlier values come with its
    checkpoint's log history), or None where it logged none (DeepSpeed, other processes, no held-out set)."""
    values = [
        h[PASS_AT_1_METRIC] for h in trainer.state.log_history if h.get("step") == step and PASS_AT_1_METRIC in h
    ]
    return values[-1] if values else None


def held_out_scores(trainer) -> dict[int, float]:
    """Every held-out pass@1 the learning curve logged, by step (a resumed run's earlier ones come with its
    checkpoint's log history; a step logged twice, by a run and a resume that went back before it, keeps the later)."""
    return {h["step"]: h[PASS_AT_1_METRIC] for h in trainer.state.log_history if PASS_AT_1_METRIC in h}


def held_out_figures(trainer, metrics: dict) -> dict:
    """The report's held-out figures: `metrics`' before/after, the last measured score as "after" where the run
    measured none at its last step (it was interrupted), with the step of each, and every score the run measured."""
    if "held_out_pass@1_after" not in metrics:
        return metrics
    scores = held_out_scores(trainer)
    figures = dict(metrics)
    after_step = trainer.state.global_step
    if figures["held_out_pass@1_after"] is None and any(step > 0 for step in scores):
        after_step = max(scores)
        figures["held_out_pass@1_after"] = scores[after_step]
    if figures["held_out_pass@1_after"] is not None:
        figures["held_out_pass@1_after_step"] = after_step
    if scores:
        figures["held_out_pass@1_by_step"] = {str(step): value for step, value in sorted(scores.items())}
    return figures
