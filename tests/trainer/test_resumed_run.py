"""A run resumed from a checkpoint, as the quick start's user meets it: its learning curve goes back to step 0, its
time per step counts only the steps it trained, and loading the tied tiny model's checkpoint raises no alarm."""

import csv
import logging
import re

import pytest
from transformers import TrainerCallback

from tests.conftest import TINY_SETTINGS
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
from ts_trl.cli.console import use_compact_console
from ts_trl.embedded import EmbeddedTask, embedded_reward
from ts_trl.embedded.curve import LearningCurve
from ts_trl.tiny import build_tiny_model


class StopAt(TrainerCallback):
    """Ends training after `step` (a checkpoint falls there), as a Ctrl-C or a killed job would leave it."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def _curve(path) -> dict[str, dict[int, float]]:
    rows = list(csv.DictReader(open(path)))
    kinds = ("train_reward", "held_out_pass@1")
    return {kind: {int(r["step"]): float(r["value"]) for r in rows if r["kind"] == kind} for kind in kinds}


def _train(tokenizer, output_dir, train, held_out, stop_at=None, resume=None):
    config = SeedGRPOConfig(
        **{
            **TINY_SETTINGS,
            "output_dir": str(output_dir),
            "max_steps": 4,
            "save_steps": 2,
            "max_completion_length": 12,
        }
    )
    curve = LearningCurve(held_out, every=1, num_samples=2, max_new_tokens=12, temperature=1.0, seed=3)
    trainer = SeedGRPOTrainer(
        model=build_tiny_model(tokenizer), reward_funcs=embedded_reward, args=config, train_dataset=train,
        processing_class=tokenizer, callbacks=[curve] + ([StopAt(stop_at)] if stop_at else []),
    )  # fmt: skip
    curve.report_through(trainer)  # as `ts_trl train` does: the values reach log_history, and so the checkpoint
    use_compact_console(trainer)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_resumed_run_draws_its_curve_from_step_0_and_times_only_its_own_steps(tokenizer, tmp_path, capsys, caplog):
    train, held_out = EmbeddedTask(difficulty=1).make_splits(8, 4)
    output_dir = tmp_path / "run"
    _train(tokenizer, output_dir, train, held_out, stop_at=2)
    first = _curve(output_dir / "learning_curve.csv")
    assert sorted(first["held_out_pass@1"]) == [0, 1, 2] and sorted(first["train_reward"]) == [1, 2]
    capsys.readouterr()

    with caplog.at_level(logging.WARNING):
        trainer = _train(tokenizer, output_dir, train, held_out, resume=str(output_dir / "checkpoint-2"))
    curve = _curve(output_dir / "learning_curve.csv")
    assert sorted(curve["held_out_pass@1"]) == [0, 1, 2, 3, 4] and sorted(curve["train_reward"]) == [1, 2, 3, 4]
    for kind in curve:  # the steps before the checkpoint are the first run's own values
        assert {step: value for step, value in curve[kind].items() if step <= 2} == first[kind]

    summary = re.search(r"trained steps 3-4 in [\d.]+ min \(([\d.]+) s/step, wall clock", capsys.readouterr().out)
    assert summary, "no end-of-training line for the resumed steps"
    runtime = trainer.state.log_history[-1]["train_runtime"]
    assert float(summary.group(1)) == pytest.approx(runtime / 2, abs=0.01)  # two steps trained, not four
    # The tiny model ties its LM head to the embedding, so the checkpoint does not hold it: expected, not alarming.
    assert not [r for r in caplog.records if "missing keys" in r.getMessage()]
