"""Issue 6: the replay baseline and pass-rate seed selection through `trainer.train()`, and the analysis commands."""

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import tests.conftest as c
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer

G = 4  # num_generations of every run below


def _shard_rows(output_dir) -> dict[str, dict]:
    seeds = Path(output_dir) / "seeds"
    manifest = json.loads((seeds / "manifest.json").read_text())
    rows = {}
    for shard in manifest["shards"]:
        for row in pq.read_table(seeds / shard["file"]).to_pylist():
            assert row["rollout_id"] not in rows
            rows[row["rollout_id"]] = row
    return rows


def _config(output_dir, **overrides):
    settings = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=8,  # two prompt groups per step
        num_generations=G,
        max_completion_length=12,  # short responses keep a step around a second on CPU
        max_steps=6,
        save_steps=2,
        logging_steps=1,
        learning_rate=1e-2,  # large, so the policy drifts from the replayed rollouts' behaviour policy in a few steps
        report_to=[],
        use_cpu=True,
        seed=0,
        seed_fraction=1.0,
        disable_tqdm=True,
    )
    settings.update(overrides)
    return SeedGRPOConfig(**settings)


class _Recorder(SeedGRPOTrainer):
    """Keeps, per generation, the plan, the training batch, and the policy's log-probs of every row at that time."""

    def _record_rollouts(self, inputs, output, plan):
        super()._record_rollouts(inputs, output, plan)
        prompt_ids = [self._tokenizer(x["prompt"])["input_ids"] for x in inputs]
        logps = []
        with torch.no_grad():  # an independent plain forward pass, one row at a time (no padding)
            for ids, row, mask in zip(prompt_ids, output["completion_ids"], output["completion_mask"]):
                completion = row[mask.bool()].tolist()
                logits = self.model(torch.tensor([ids + completion])).logits[0, len(ids) - 1 : -1]
                token_logps = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(completion)[:, None])[:, 0]
                logps.append(token_logps)
        self.records.append(
            {
                "step": self.state.global_step,
                "replayed": list(plan.replayed),
                "origins": [s.rollout_id if r else None for s, r in zip(plan.seeds, plan.replayed)],
                "completion_ids": output["completion_ids"].clone(),
                "completion_mask": output["completion_mask"].clone(),
                "tool_mask": output.get("tool_mask"),
                "advantages": output["advantages"].clone(),
                "logps": logps,
            }
        )


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("replay") / "run"
    tokenizer = c.build_tokenizer()
    model = c.build_tiny_model(tokenizer)
    generate_rows, rewards = [], []
    original_generate = model.generate

    def spy_generate(*args, **kwargs):
        generate_rows.append(len(kwargs["input_ids"]))
        return original_generate(*args, **kwargs)

    def spy_reward(completions, **kwargs):
        scores = c.count_reward(completions)
        rewards.append(scores)
        return scores

    model.generate = spy_generate
    args = _config(output_dir, seed_method="replay", replay_per_group=2, prefix_is_clip=1.05)
    trainer = _Recorder(
        model=model, reward_funcs=spy_reward, args=args, train_dataset=c.tiny_prompts(4), processing_class=tokenizer
    )
    trainer.records = []
    trainer.train()
    return {
        "trainer": trainer,
        "records": trainer.records,
        "rows": _shard_rows(output_dir),
        "generate_rows": generate_rows,
        "rewards": rewards,
    }


def test_replay_fills_group_slots_with_stored_rollouts(replay_run):
    history = replay_run["trainer"].state.log_history
    replayed_metric = [h["seeds/replayed_rows"] for h in history if "seeds/replayed_rows" in h]
    assert replayed_metric[0] == 0  # nothing is old enough at step 0
    assert max(replayed_metric) == 4  # replay_per_group=2 slots of both groups
    rows = replay_run["rows"]
    checked = 0
    for record in replay_run["records"]:
        for i, origin in enumerate(record["origins"]):
            if origin is None:
                continue
            stored = rows[origin]  # read back from the seed dataset on disk
            assert stored["step"] <= record["step"] - 1  # seed_min_age = 1
            ids = record["completion_ids"][i][record["completion_mask"][i].bool()].tolist()
            assert ids == stored["completion_ids"]
            assert i % G >= G - 2  # the last replay_per_group rows of the group
            checked += 1
    assert checked >= 8


def test_replay_generates_fewer_rows_and_banks_no_duplicates(replay_run):
    records, rows = replay_run["records"], replay_run["rows"]
    assert replay_run["generate_rows"] == [8 - sum(r["replayed"]) for r in records]
    assert min(replay_run["generate_rows"]) == 4
    per_step = {}
    for row in rows.values():
        per_step[row["step"]] = per_step.get(row["step"], 0) + 1
    for record in records:  # replayed rows are not banked again
        assert per_step[record["step"]] == 8 - sum(record["replayed"])
    assert all(row["seed_origin"] is None and row["prefix_len"] == 0 for row in rows.values())
    history = [h for h in replay_run["trainer"].state.log_history if "seeds/generated_tokens" in h]
    for record, h in zip(records, history):
        replayed_tokens = sum(int(record["completion_mask"][i].sum()) for i, r in enumerate(record["replayed"]) if r)
        assert h["seeds/prefix_tokens"] == replayed_tokens  # replayed tokens are not counted as generated


def test_replayed_rows_are_weighted_by_the_truncated_ratio(replay_run):
    """Advantage of a replayed token = group advantage x min(exp(logp_now - logp_behaviour), clip)."""
    clip = replay_run["trainer"].args.prefix_is_clip
    rows = replay_run["rows"]
    clipped = unclipped = 0
    for record, scores in zip(replay_run["records"], replay_run["rewards"]):
        r = torch.tensor(scores).view(-1, G)  # recomputed group advantages, GRPO's formula
        group_advantage = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).flatten()
        advantages = record["advantages"]
        if advantages.dim() == 1:  # no replayed row in this batch: TRL's plain per-row advantages
            advantages = advantages[:, None].expand_as(record["completion_mask"])
        assert record["tool_mask"] is None or bool(record["tool_mask"].all())  # replayed tokens are all trained
        for i, origin in enumerate(record["origins"]):
            mask = record["completion_mask"][i].bool()
            if origin is None:  # generated rows keep the plain group advantage on every token
                assert advantages[i][mask].tolist() == pytest.approx([group_advantage[i].item()] * int(mask.sum()))
                continue
            behaviour = torch.tensor(rows[origin]["logprobs"])
            expected = torch.exp(record["logps"][i] - behaviour).clamp(max=clip) * group_advantage[i]
            assert advantages[i][mask].tolist() == pytest.approx(expected.tolist(), rel=2e-3, abs=1e-5)
            ratio = torch.exp(record["logps"][i] - behaviour)
            clipped += int((ratio > clip + 1e-3).sum())
            unclipped += int((ratio < clip - 1e-3).sum())
    assert clipped and unclipped  # the truncation was exercised on both sides


def test_replay_leaves_seeds_mode_untouched_when_off(make_trainer):
    """replay_per_group must stay below num_generations: at least one on-policy row per group."""
    with pytest.raises(ValueError, match="replay_per_group"):
        make_trainer(seed_method="replay", replay_per_group=4)


# ---------------------------------------------------------------------------------------------------------------------
# seed_selection="passrate"


def _first_char_reward(completions, prompts, **kwargs):
    """Rigged by prompt: even prompts pass when the response starts with a digit (rare), odd ones unless it does."""
    rewards = []
    for prompt, completion in zip(prompts, completions):
        starts_with_digit = bool(completion) and completion[0].isdigit()
        hard = int(prompt.split(":")[1].split("+")[0]) % 2 == 0
        rewards.append(float(starts_with_digit if hard else not starts_with_digit))
    return rewards


def test_passrate_selection_steers_groups_toward_half(tmp_path, tokenizer):
    from datasets import Dataset

    prompts = [f"Q: {i}+{i + 1}=" for i in range(4)]
    args = _config(
        tmp_path / "run",
        seed_selection="passrate",
        seed_fraction=0.5,  # plain groups keep measuring each prompt's pass rate from scratch
        max_steps=10,
        learning_rate=1e-3,
        per_device_train_batch_size=16,  # every prompt in every step: one pass-rate update per prompt per step
    )
    asked = []

    class Spy(SeedGRPOTrainer):
        def _plan_groups(self, inputs):
            asked.append(dict(self._pass_rates))
            return super()._plan_groups(inputs)

    trainer = Spy(
        model=c.build_tiny_model(tokenizer),
        reward_funcs=_first_char_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
    )
    trainer.train()
    rows = _shard_rows(args.output_dir)
    from ts_trl.data import prompt_id_of

    hard = {prompt_id_of(p) for p in prompts[0::2]}
    easy = {prompt_id_of(p) for p in prompts[1::2]}
    # the pass rates the trainer tracked agree with the rig: hard prompts mostly fail, easy ones mostly pass
    final = trainer._pass_rates
    assert all(final[p] < 0.5 for p in hard) and all(final[p] > 0.5 for p in easy)
    seeded = [r for r in rows.values() if r["seed_origin"] is not None]
    assert {r["prompt_id"] for r in seeded} == hard | easy
    for row in seeded:
        origin = rows[row["seed_origin"]]
        rates = asked[row["step"]]  # each step generates once here, so the plan of step t is asked[t]
        rate = rates[row["prompt_id"]]
        assert (origin["reward"] > 0) == (rate < 0.5)  # successful seeds where the policy fails, and vice versa
        assert (origin["reward"] > 0) == (row["prompt_id"] in hard)
    # the independent check: recompute the first measured pass rate of each prompt from its plain rollouts
    first_step = {}
    for row in rows.values():
        if row["seed_origin"] is None:
            first_step.setdefault((row["prompt_id"], row["step"]), []).append(row["reward"] > 0)
    for prompt_id in hard | easy:
        passes = first_step[(prompt_id, 0)]
        assert asked[1][prompt_id] == pytest.approx(np.mean(passes))
