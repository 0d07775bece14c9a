"""When a run can seed: the trainer refuses a run that never could, warns when seeding starts late or not at all, and
the step it predicts is the step `trainer.train()` first finds an eligible seed."""

import logging
from pathlib import Path

import pytest
from datasets import Dataset

from tests.conftest import TINY_SETTINGS, count_reward, logged, tiny_prompts
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
from ts_trl.cli.arguments import make_parser, parse_args
from ts_trl.embedded.agent import add
from ts_trl.embedded.tasks import TASKS
from ts_trl.tiny import build_tiny_model
from ts_trl.trainer.schedule import schedule_of

SHARE = "seeds/eligible_group_share"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "seeding-schedule.md"


def _first_eligible_step(trainer) -> int | None:
    return next((h["step"] for h in trainer.state.log_history if h.get(SHARE, 0) > 0), None)


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "ts_trl.trainer.schedule" and r.levelno == logging.WARNING
    ]


@pytest.mark.parametrize(
    "settings",
    [
        dict(max_steps=6, save_steps=2),  # prompts come back at step 5 (8 prompts, 2 a step), with a shard of step 4
        dict(max_steps=8, save_steps=5, shuffle_dataset=False),  # the first shard (step 5) decides: step 6
        dict(max_steps=10, save_steps=1, seed_min_age=6, shuffle_dataset=False),  # the age decides: step 9
        # one generation every two steps (steps_per_generation 4 over 2 accumulation steps); the shard of step 5
        # covers the first epoch, and the next generation is made after step 6
        dict(
            max_steps=8,
            save_steps=5,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            steps_per_generation=4,
        ),
    ],
    ids=["return", "snapshot", "age", "steps-per-generation"],
)
def test_predicted_first_seeded_step_is_where_training_first_finds_a_seed(make_trainer, settings, caplog):
    trainer = make_trainer(**settings)
    schedule = schedule_of(trainer.args, len(trainer.train_dataset), trainer.accelerator.num_processes)
    with caplog.at_level(logging.WARNING, logger="ts_trl.trainer.schedule"):
        trainer.train()
    assert _first_eligible_step(trainer) == schedule.first_seeded_step
    assert max(logged(trainer, "seeds/seeded_group_share")) > 0
    assert not [m for m in _warnings(caplog) if "is still 0" in m]  # no runtime warning where seeding works


def test_a_run_whose_epochs_cannot_seed_is_refused_before_training(make_trainer):
    # One epoch: every prompt is generated once, so no group could ever continue from a seed.
    with pytest.raises(ValueError, match=r"would train plain GRPO: .*no prompt comes back.*num_train_epochs"):
        make_trainer(max_steps=-1, num_train_epochs=1)
    # Three epochs, but the first checkpoint (and shard) would come after the last step.
    with pytest.raises(ValueError, match=r"seed shard is written after step 500.*seed_snapshot_steps"):
        make_trainer(max_steps=-1, num_train_epochs=3, save_steps=500)


@pytest.mark.parametrize("plain", [dict(seed_method="none"), dict(seed_fraction=0.0)])
def test_plain_grpo_is_never_refused_or_warned_about(make_trainer, plain, caplog):
    with caplog.at_level(logging.WARNING, logger="ts_trl.trainer.schedule"):
        make_trainer(max_steps=-1, num_train_epochs=1, **plain)
        make_trainer(max_steps=2, **plain)
    assert _warnings(caplog) == []


def test_late_or_missing_seeding_is_warned_about_with_its_numbers(make_trainer, caplog):
    with caplog.at_level(logging.WARNING, logger="ts_trl.trainer.schedule"):
        make_trainer(max_steps=6)  # 8 prompts at 2 a step: seeding starts at step 5 of 6
        late = _warnings(caplog)
        caplog.clear()
        make_trainer(max_steps=2)  # a smoke test cut short by max_steps: warned about, not refused
        short = _warnings(caplog)
        caplog.clear()
        make_trainer(max_steps=40)  # starts at step 5 of 40: on time
        on_time = _warnings(caplog)
    assert len(late) == 1 and "starts late" in late[0] and "step 5 of 6" in late[0] and "num_train_epochs" in late[0]
    assert len(short) == 1 and "would train plain GRPO" in short[0] and "2 steps in all" in short[0]
    assert on_time == []


def test_a_zero_eligible_share_well_after_it_could_rise_is_warned_about_once(make_trainer, caplog):
    # One-token responses can never be cut (a seed keeps one token and cuts one away), so the share stays 0 although
    # the schedule lets prompts seed from step 5.
    trainer = make_trainer(max_steps=14, save_steps=1, max_completion_length=1)
    expected_by = schedule_of(trainer.args, len(trainer.train_dataset), 1).expected_by_step
    assert expected_by is not None and expected_by < 14
    with caplog.at_level(logging.WARNING, logger="ts_trl.trainer.schedule"):
        trainer.train()
    assert max(logged(trainer, SHARE)) == 0
    warned = [m for m in _warnings(caplog) if "is still 0" in m]
    assert warned == [f"{SHARE} is still 0 at step {expected_by}, " + warned[0].split(", ", 1)[1]]


def test_seed_fraction_zero_without_checkpoints_is_plain_grpo(tmp_path, tokenizer):
    """seed_fraction=0 asks for no seeding: it needs no checkpoint or seed shard, and trains like GRPOTrainer."""
    args = SeedGRPOConfig(
        **{**TINY_SETTINGS, "output_dir": str(tmp_path / "run"), "seed_fraction": 0.0, "save_strategy": "no"}
    )
    trainer = SeedGRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=count_reward,
        args=args,
        train_dataset=tiny_prompts(),
        processing_class=tokenizer,
    )
    trainer.train()
    assert trainer.state.global_step == TINY_SETTINGS["max_steps"]
    assert max(logged(trainer, "seeds/seeded_group_share")) == 0
    assert not list((tmp_path / "run").glob("checkpoint-*"))


def _tool_calling_tokenizer(tokenizer):
    """The tiny tokenizer with a chat template that renders tool calls, so TRL accepts tools and environments."""
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% for c in m.get('tool_calls', []) %}"
        "{{ c['function']['name'] }}{{ c['function']['arguments'] | tojson }}{% endfor %}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    tokenizer.response_schema = {"type": "object", "properties": {"content": {"type": "string"}}}
    return tokenizer


class Echo:
    def reset(self, **kwargs):
        return None

    def echo(self, text: str) -> str:
        """Repeats the text.

        Args:
            text: What to repeat.
        """
        return text


@pytest.mark.parametrize("option", [dict(tools=[add]), dict(environment_factory=Echo)], ids=["tools", "environment"])
def test_multi_turn_options_seed_and_refuse_only_replay(tmp_path, tokenizer, option, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = _tool_calling_tokenizer(tokenizer)
    chats = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}+1?"}] for i in range(8)]})

    def build(**settings):
        args = SeedGRPOConfig(**{**TINY_SETTINGS, "output_dir": str(tmp_path / "run"), **settings})
        return SeedGRPOTrainer(
            model=build_tiny_model(tokenizer),
            reward_funcs=count_reward,
            args=args,
            train_dataset=chats,
            processing_class=tokenizer,
            **option,
        )

    assert build().planner.agent_cuts is not None  # seeds are cut at the admissible points of their turns
    with pytest.raises(
        ValueError, match="seed_method='replay' cannot be combined with `tools` or `environment_factory`"
    ):
        build(seed_method="replay")
    assert build(seed_method="none").args.seed_method == "none"


@pytest.mark.parametrize("task", list(TASKS))
def test_every_builtin_tasks_default_run_seeds_from_the_step_its_docs_say(task, tmp_path, monkeypatch):
    """`ts_trl train --task X` with its defaults seeds early in its run, and docs/seeding-schedule.md says when."""
    monkeypatch.chdir(tmp_path)  # the default output_dir may hold the quick start's run
    script_args, training_args, _ = parse_args(make_parser(), ["--task", task])
    schedule = schedule_of(training_args, script_args.embedded_train_problems, 1)
    assert schedule.first_seeded_step is not None and not schedule.late, schedule.describe()
    (row,) = [line for line in DOCS.read_text().splitlines() if line.startswith(f"| `--task {task}`")]
    assert f"step {schedule.first_seeded_step} of {schedule.total_steps}" in row, row
