"""What the seed store keeps and writes: shards under every save strategy, pass rates across resume, success by a
named reward, and the compact buffer of rollouts waiting for the next shard."""

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from accelerate import Accelerator

from tests.conftest import TARGET_CUTS, seed_rows, tiny_prompts
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
from ts_trl.store.schema import Rollout
from ts_trl.store.seed_store import PendingRollout, SeedStore, StoreSettings


def _seeded_share(trainer) -> float:
    return max(h.get("seeds/seeded_group_share", 0.0) for h in trainer.state.log_history)


@pytest.mark.parametrize(
    "settings",
    [
        dict(save_strategy="epoch", num_train_epochs=3, max_steps=-1),  # 2 prompts, 8 rows a step: a step an epoch
        dict(save_strategy="steps", save_steps=1, max_steps=3),
        dict(save_strategy="no", seed_snapshot_steps=1, max_steps=3),
    ],
    ids=["epoch", "steps", "no+seed_snapshot_steps"],
)
def test_every_save_strategy_seeds(make_trainer, settings):
    trainer = make_trainer(dataset=tiny_prompts(2), **settings)
    trainer.train()
    output_dir = Path(trainer.args.output_dir)
    manifest = json.loads((output_dir / "seeds" / "manifest.json").read_text())
    assert [s["step"] for s in manifest["shards"]][:2] == [1, 2]  # a shard after each of the first steps
    for checkpoint in output_dir.glob("checkpoint-*"):  # and each checkpoint lists its own step's shard
        pointer = json.loads((checkpoint / "seed_snapshot.json").read_text())
        assert pointer["shards"][-1]["step"] == pointer["step"] and pointer["rows"] > 0
    assert _seeded_share(trainer) > 0


def test_save_strategy_best_seeds_before_every_checkpoint_it_keeps(make_trainer):
    """`best` decides to save only after an evaluation, later in the step than `steps` does: still a shard first."""
    trainer = make_trainer(
        dataset=tiny_prompts(2),
        eval_dataset=tiny_prompts(2),
        save_strategy="best",
        metric_for_best_model="reward",
        eval_strategy="steps",
        eval_steps=1,
        per_device_eval_batch_size=8,
        max_steps=4,
    )
    trainer.train()
    output_dir = Path(trainer.args.output_dir)
    checkpoints = sorted(output_dir.glob("checkpoint-*"))
    assert checkpoints, "save_strategy='best' saved no checkpoint"  # the first evaluation is always the best so far
    steps = {s["step"] for s in json.loads((output_dir / "seeds" / "manifest.json").read_text())["shards"]}
    for checkpoint in checkpoints:
        pointer = json.loads((checkpoint / "seed_snapshot.json").read_text())
        assert pointer["step"] in steps and pointer["shards"][-1]["step"] == pointer["step"] and pointer["rows"] > 0
    assert _seeded_share(trainer) > 0  # the step-1 checkpoint's shard made its prompts' seeds eligible


def test_save_strategy_no_without_a_shard_cadence_is_refused(tmp_path):
    with pytest.raises(ValueError, match="seed_snapshot_steps"):
        SeedGRPOConfig(str(tmp_path), save_strategy="no", use_cpu=True, report_to=[])
    SeedGRPOConfig(str(tmp_path), save_strategy="no", seed_snapshot_only=False, use_cpu=True, report_to=[])


@pytest.mark.parametrize(
    "extension",
    # research/target-cuts.md: every prompt whose last plain group was all-equal ("Q: 2+3=" always passes) is seeded
    # from its second batch on, step 2; resumed from checkpoint-3, after continuations were counted
    [{}, dict(TARGET_CUTS, save_steps=1, seed_fraction=1.0, max_steps=5)],
    ids=["paper", "target-cuts"],
)
def test_resumed_run_plans_the_same_seeds_from_its_pass_rates(make_trainer, extension):
    class Spy(SeedGRPOTrainer):
        def _plan_groups(self, inputs):
            state = json.dumps(self.planner.state(), sort_keys=True)  # what the plan below was made from
            plan = super()._plan_groups(inputs)
            self.plans[plan.step] = (
                [s.rollout_id if s is not None else None for s in plan.seeds],
                [(c.k, c.ratio) if c is not None else 0 for c in plan.cuts],
                dict(self.planner.pass_rates),
                state,
            )
            return plan

    from datasets import Dataset

    # Two prompts, four times each: an epoch of 4 steps, so the resumed run's data order is the uninterrupted one's
    # (transformers fast-forwards within an epoch, not across epochs), while both prompts recur.
    prompts = Dataset.from_dict({"prompt": ["Q: 1+2=", "Q: 2+3="] * 4})
    settings = dict(
        trainer_cls=Spy,
        seed_selection="passrate",
        seed_fraction=0.5,  # plain groups keep measuring the pass rates
        dataset=prompts,
        max_steps=3,
        save_steps=2,
    )
    settings.update(extension)
    Spy.plans = {}
    first = make_trainer(**settings)
    first.train()
    uninterrupted = dict(Spy.plans)
    assert uninterrupted[2][2], "the run should have measured pass rates by step 2"
    Spy.plans = {}
    resumed = make_trainer(**settings)
    at = 3 if extension else 2
    resumed.train(resume_from_checkpoint=str(Path(first.args.output_dir) / f"checkpoint-{at}"))
    assert min(Spy.plans) == at and any(uninterrupted[at][0])  # the first step after the checkpoint is seeded
    assert Spy.plans == {step: plan for step, plan in uninterrupted.items() if step >= at}  # same statistics, cuts
    if extension:
        assert json.loads(uninterrupted[at][3])["planner"]["cut_outcomes"], "nothing counted before the checkpoint"


def correct(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c) % 2 == 0) for c in completions]


def format_bonus(completions, **kwargs):  # like the math recipe's format reward: paid to every answer
    return [0.1] * len(completions)


@pytest.mark.parametrize("selection", ["success", "failure"])
def test_success_is_the_named_reward_above_its_threshold(make_trainer, selection):
    trainer = make_trainer(
        reward=[correct, format_bonus], seed_selection=selection, dataset=tiny_prompts(2), max_steps=4, save_steps=1
    )
    trainer.train()
    rows = seed_rows(trainer.args.output_dir, by_id=True)
    seeded = [r for r in rows.values() if r["seed_origin"] is not None]
    assert seeded, f"seed_selection={selection!r} found no seed"
    for row in seeded:
        origin = rows[row["seed_origin"]]
        assert (origin["reward_correct"] > 0) == (selection == "success"), origin  # the format bonus never counts


def test_success_reward_must_name_a_reward_function(make_trainer):
    with pytest.raises(ValueError, match="success_reward='math'"):
        make_trainer(reward=[correct, format_bonus], success_reward="math")


def test_unsnapshotted_rollouts_are_kept_compact(tmp_path, tokenizer, tiny_model):
    """The buffer of rollouts waiting for the next shard costs about what the shard does, not Python lists."""
    args = SeedGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    store = SeedStore(StoreSettings.of(args), Accelerator(cpu=True), tiny_model, tokenizer, ["r"])
    store.start(None)
    tokens, rows = 2000, 64
    rng = np.random.default_rng(0)
    for i in range(rows):
        ids = rng.integers(0, 30000, size=tokens).tolist()  # as the backends hand them over: Python ints
        pending = PendingRollout(Rollout(f"id-{i}", "p", "q", "", ids, (), 1.0, 0), np.zeros(0, np.float32))
        pending.logprobs = rng.normal(size=tokens).astype(np.float32)
        store.queue([pending])
        del ids, pending
    store.flush()
    buffered = sum(table.nbytes for table in store.unsnapshotted)  # Arrow buffers: ids, log-probs, offsets, text
    # int32 id + float32 log-prob is 8 bytes a token; Python lists would cost ~36 (a pointer and an int).
    assert buffered / (tokens * rows) < 8.5, f"{buffered / (tokens * rows):.1f} bytes per token held until the shard"
    path = store.write_snapshot(1)
    table = pq.read_table(path)
    assert table.num_rows == rows and len(table.column("completion_ids")[0]) == tokens
    assert table.column("checkpoint").to_pylist() == ["checkpoint-1"] * rows
