"""The invariants of docs/design.md, each checked through `trainer.train()` on the tiny model."""

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from tests.conftest import seed_by_id, seed_rows, tiny_prompts
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
from ts_trl.store.format import write_shard
from ts_trl.store.schema import Rollout, rollouts_to_table, tokenizer_fingerprint
from ts_trl.store.seed_store import PendingRollout


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.fixture(scope="module")
def seeded_run(tmp_path_factory):
    """One seeded run shared by the read-only invariant checks below (it is the slowest part of this file)."""
    import tests.conftest as c

    output_dir = tmp_path_factory.mktemp("seeded") / "run"
    tokenizer = c.build_tokenizer()
    seen = []

    def spy_reward(completions, **kwargs):
        seen.extend(completions)
        return c.count_reward(completions)

    generate_inputs = []
    model = c.build_tiny_model(tokenizer)
    original_generate = model.generate

    def spy_generate(*args, **kwargs):
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        output = original_generate(*args, **kwargs)
        # What each row was conditioned on when it sampled its own tokens: its prompt and the tokens before them.
        generate_inputs.extend(
            row[m.bool()].tolist() + new.tolist() for row, m, new in zip(ids, mask, output[:, ids.size(1) :])
        )
        return output

    model.generate = spy_generate
    args = SeedGRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=12,
        max_steps=8,
        save_steps=2,
        logging_steps=1,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        seed=0,
        seed_fraction=0.5,  # mixes seeded and plain groups in the same batch
        disable_tqdm=True,
    )
    trainer = SeedGRPOTrainer(
        model=model, reward_funcs=spy_reward, args=args, train_dataset=c.tiny_prompts(4), processing_class=tokenizer
    )
    trainer.train()
    return {"trainer": trainer, "rows": seed_rows(output_dir), "seen": seen, "generate_inputs": generate_inputs}


def test_seeded_run_seeds_some_groups(seeded_run):
    continuations = [r for r in seeded_run["rows"] if r["seed_origin"] is not None]
    fresh = [r for r in seeded_run["rows"] if r["seed_origin"] is None]
    assert continuations and fresh
    history = seeded_run["trainer"].state.log_history
    for metric in (
        "seeds/seeded_group_share",
        "seeds/prefix_len_mean",
        "seeds/seed_age_mean",
        "seeds/reward_seeded",
        "seeds/reward_unseeded",
        "seeds/generated_tokens",
        "seeds/prefix_tokens",
    ):
        assert any(metric in h for h in history), metric


def test_seeds_come_from_earlier_checkpoints(seeded_run):
    rows = {r["rollout_id"]: r for r in seeded_run["rows"]}
    for row in rows.values():
        if row["seed_origin"] is None:
            continue
        origin = rows[row["seed_origin"]]
        assert origin["step"] <= row["step"] - 1  # seed_min_age = 1
        assert origin["shard_step"] <= row["step"]  # already in a snapshot written before this generation


def test_one_cut_per_group(seeded_run):
    groups = {}
    for row in seeded_run["rows"]:
        run, step, generation, index = row["rollout_id"].rsplit("-", 3)
        groups.setdefault((step, generation, int(index) // 4), []).append(row)
    assert all(len(g) == 4 for g in groups.values())
    for group in groups.values():
        assert len({(r["seed_origin"], r["prefix_len"], r["prompt_id"]) for r in group}) == 1


def test_cut_is_a_length_ratio_without_eos(seeded_run):
    rows = {r["rollout_id"]: r for r in seeded_run["rows"]}
    eos = seeded_run["trainer"].processing_class.eos_token_id
    for row in rows.values():
        if row["seed_origin"] is None:
            continue
        origin_ids = rows[row["seed_origin"]]["completion_ids"]
        k = row["prefix_len"]
        assert 1 <= k < len(origin_ids)
        assert eos not in origin_ids[:k]
        assert row["completion_ids"][:k] == origin_ids[:k]  # the continuation starts with the seed's prefix
        assert k <= int(0.9 * len(origin_ids)) or k == 1  # r <= cut_ratio_max (k = 1 is the lower clip)


def test_budget_and_separate_token_counts(seeded_run):
    assert all(len(r["completion_ids"]) <= 12 for r in seeded_run["rows"])
    history = [h for h in seeded_run["trainer"].state.log_history if "seeds/prefix_tokens" in h]
    assert any(h["seeds/prefix_tokens"] > 0 for h in history)
    assert all(h["seeds/generated_tokens"] > 0 for h in history)


def test_rewards_see_the_whole_response(seeded_run):
    tokenizer = seeded_run["trainer"].processing_class
    seen = set(seeded_run["seen"])
    for row in seeded_run["rows"]:
        whole = tokenizer.decode(row["completion_ids"], skip_special_tokens=True)
        assert row["completion"] == whole
        assert whole in seen  # the reward function was called with prefix + continuation


def test_generation_receives_the_spliced_ids(seeded_run):
    tokenizer = seeded_run["trainer"].processing_class
    inputs = [tuple(ids) for ids in seeded_run["generate_inputs"]]
    for row in seeded_run["rows"]:
        if row["seed_origin"] is None:
            continue
        spliced = tuple(tokenizer(row["prompt"])["input_ids"] + row["completion_ids"][: row["prefix_len"]])
        assert any(sequence[: len(spliced)] == spliced for sequence in inputs)  # generation continued from the seed


def test_behaviour_logprobs_are_those_of_the_sampling_policy(seeded_run, tokenizer):
    """Rollouts of step 2 were sampled by checkpoint-2's weights: recompute their generated tokens' log-probs."""
    from transformers import AutoModelForCausalLM

    output_dir = Path(seeded_run["trainer"].args.output_dir)
    model = AutoModelForCausalLM.from_pretrained(output_dir / "checkpoint-2").eval()
    rows = [r for r in seeded_run["rows"] if r["step"] == 2]
    assert rows
    for row in rows[:4]:
        prompt_ids = tokenizer(row["prompt"])["input_ids"]
        ids = torch.tensor([prompt_ids + row["completion_ids"]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(row["completion_ids"])[:, None])
        k = row["prefix_len"]  # prefix tokens keep the seed's own behaviour log-probs (next test)
        # abs=5e-3: training scores the row inside a left-padded batch, which shifts float rounding slightly
        assert row["logprobs"][k:] == pytest.approx(expected[k:, 0].tolist(), abs=5e-3)
    assert all(len(r["logprobs"]) == len(r["completion_ids"]) for r in seeded_run["rows"])


def test_continuation_keeps_the_seed_logprobs_on_its_prefix(seeded_run):
    rows = {r["rollout_id"]: r for r in seeded_run["rows"]}
    for row in rows.values():
        if row["seed_origin"] is not None:
            k = row["prefix_len"]
            assert row["logprobs"][:k] == pytest.approx(rows[row["seed_origin"]]["logprobs"][:k])


def test_seed_fraction_zero_reproduces_grpo_trainer(make_trainer, tmp_path):
    # fp32 (no CPU bf16 autocast), so that the shared-prefix forward's rounding stays at fp32's
    seeds = make_trainer(seed_fraction=0.0, max_steps=4, output_dir=str(tmp_path / "seeds"), bf16=False)
    seeds.train()
    grpo = make_trainer(
        trainer_cls=GRPOTrainer, config_cls=GRPOConfig, max_steps=4, output_dir=str(tmp_path / "grpo"), bf16=False
    )
    grpo.train()
    # The same losses up to float rounding: the shared-prefix forward sums over other numbers of masked zeros
    assert _losses(seeds) == pytest.approx(_losses(grpo), rel=1e-5, abs=1e-7)
    assert len(seeds.seed_bank) == 4 * 8  # the rollouts were banked all the same


def test_seed_method_none_is_plain_grpo(make_trainer, tmp_path):
    plain = make_trainer(seed_method="none", max_steps=3, output_dir=str(tmp_path / "none"))
    plain.train()
    grpo = make_trainer(trainer_cls=GRPOTrainer, config_cls=GRPOConfig, max_steps=3, output_dir=str(tmp_path / "grpo"))
    grpo.train()
    assert _losses(plain) == _losses(grpo)
    assert len(plain.seed_bank) == 0
    assert not (Path(plain.args.output_dir) / "seeds").exists()


class _PerturbedLogps(SeedGRPOTrainer):
    """Adds a zero-valued leaf to the training log-probs, so the test can read d(loss)/d(logp) per position."""

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if torch.is_grad_enabled():
            self.delta = torch.zeros_like(logps, requires_grad=True)
            logps = logps + self.delta
        return logps, entropies, aux


@pytest.mark.parametrize("mode", ["state", "action"])
def test_prefix_gradient(make_trainer, mode):
    """In "state" mode no gradient reaches prefix positions; in "action" mode it does (the state advantage)."""
    trainer = make_trainer(trainer_cls=_PerturbedLogps, prefix_mode=mode, max_steps=4, save_steps=1)
    trainer.train()  # fills the bank and snapshots, so the next batch is seeded
    trainer.model.train()
    batch = [trainer.train_dataset[i // 4] for i in range(8)]  # two groups of prompts seen in training
    inputs = trainer._generate_and_score_completions(batch)
    pending = trainer.seed_store.pending[-8:]
    cuts = [
        (i, seed_by_id(trainer.seed_bank, p.rollout.seed_origin), p.rollout.prefix_len)
        for i, p in enumerate(pending)
        if p.rollout.seed_origin is not None
    ]
    assert cuts, "the batch should be seeded"
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grad = trainer.delta.grad
    mask = inputs["completion_mask"]
    advantages = inputs["advantages"]
    checked = 0
    for i, _, k in cuts:
        if mode == "state":
            assert torch.all(grad[i, :k] == 0)
        elif advantages[i, 0] != 0:  # the state advantage (tests/launch/test_old_tokens.py checks its value)
            assert torch.all(grad[i, :k] != 0)
        row_advantage = advantages[i] if advantages.dim() == 1 else advantages[i, k]
        if row_advantage == 0:
            continue
        checked += 1
        assert torch.all(grad[i, k:][mask[i, k:].bool()] != 0)  # continuation tokens are always trained
    assert checked, "no seeded row had a non-zero advantage"
    assert torch.all(grad[mask == 0] == 0)


@pytest.mark.parametrize("bank_files", [True, False], ids=["mapped", "parquet-only"])
def test_resume_restores_the_bank(make_trainer, tmp_path, bank_files):
    banks = {}

    def record_banks(trainer):
        store = trainer.seed_store
        write_pointer = store.write_checkpoint_pointer

        def write_and_record(step):
            write_pointer(step)
            banks[step] = list(store.bank.rollout_ids)

        store.write_checkpoint_pointer = write_and_record
        return trainer

    first = record_banks(make_trainer(max_steps=6, save_steps=2))
    first.train()
    output_dir = Path(first.args.output_dir)
    shard_ids_before = {r["rollout_id"] for r in seed_rows(output_dir) if r["shard_step"] <= 4}

    assert sorted(p.name for p in (output_dir / "seeds" / "bank").iterdir()) == [
        f"step-{s:06d}.arrow" for s in (2, 4, 6)
    ]
    if not bank_files:  # the memory-mappable copies are a cache: the Parquet shards alone restore the same bank
        shutil.rmtree(output_dir / "seeds" / "bank")
    resumed = record_banks(make_trainer(max_steps=6, save_steps=2))
    seen_at_start = []
    original = resumed.seed_store.start

    def start(checkpoint):
        original(checkpoint)
        seen_at_start.extend(resumed.seed_bank.rollout_ids)

    resumed.seed_store.start = start
    resumed.train(resume_from_checkpoint=str(output_dir / "checkpoint-4"))
    assert seen_at_start == banks[4]  # exactly the bank checkpoint-4 saw, in the same order
    rows = seed_rows(output_dir)
    assert {r["rollout_id"] for r in rows if r["shard_step"] <= 4} == shard_ids_before
    assert len({r["rollout_id"] for r in rows}) == len(rows)  # nothing duplicated
    assert list((output_dir / "seeds" / "superseded").glob("*/step-000006.parquet"))  # the old branch is kept


def test_crash_mid_write_leaves_previous_snapshot(make_trainer, monkeypatch):
    trainer = make_trainer(max_steps=4, save_steps=2)
    trainer.train()
    seeds = Path(trainer.args.output_dir) / "seeds"
    manifest_before = (seeds / "manifest.json").read_text()

    def crash(table, where, **kwargs):
        Path(where).write_bytes(b"PAR1 torn")
        raise KeyboardInterrupt("simulated crash while writing a shard")

    monkeypatch.setattr("ts_trl.store.format.pq.write_table", crash)
    trainer.seed_store.pending = [
        PendingRollout(Rollout("x", "p", "prompt", "c", [5, 6], (), 0.0, step=6), np.zeros(0))
    ]
    trainer.seed_store.pending[0].logprobs = np.array([-1.0, -1.0])
    with pytest.raises(KeyboardInterrupt):
        trainer.seed_store.write_snapshot(6)
    assert (seeds / "manifest.json").read_text() == manifest_before
    assert not (seeds / "step-000006.parquet").exists()
    for shard in json.loads(manifest_before)["shards"]:
        pq.read_table(seeds / shard["file"])  # every listed shard still reads


def test_seeding_from_another_runs_seed_dataset(make_trainer, tokenizer, tmp_path):
    eos = tokenizer.eos_token_id
    prompt_ids = {}
    external = []
    for i in range(4):
        prompt = f"Q: {i}+{i + 1}="
        from ts_trl.store.schema import prompt_id_of

        prompt_ids[prompt] = prompt_id_of(prompt)
        ids = tokenizer(f"{2 * i + 1}")["input_ids"] + [eos, 30, 31]  # an EOS mid-way bounds the cut
        external.append(Rollout(f"ext-{i}", prompt_id_of(prompt), prompt, "x", ids, [-0.5] * len(ids), 1.0, 40))
    table = rollouts_to_table(external, "checkpoint-40", "other", tokenizer_fingerprint(tokenizer), [])
    (tmp_path / "ext").mkdir()
    write_shard(table, tmp_path / "ext" / "step-000040.parquet")

    trainer = make_trainer(seed_dataset=str(tmp_path / "ext"), max_steps=2, save_steps=10, dataset=tiny_prompts(4))
    trainer.train()
    rows = seed_rows(trainer.args.output_dir)
    from_external = [r for r in rows if (r["seed_origin"] or "").startswith("ext-")]
    assert from_external and any(r["step"] == 0 for r in from_external)  # eligible from the very first step
    for row in from_external:
        origin = external[int(row["seed_origin"].split("-")[1])]
        assert row["completion_ids"][: row["prefix_len"]] == list(origin.completion_ids[: row["prefix_len"]])
        assert eos not in origin.completion_ids[: row["prefix_len"]]


def test_bad_input_fails_at_construction(make_trainer, tokenizer, tmp_path):
    from datasets import Dataset

    with pytest.raises(ValueError, match="cut_ratio_min"):
        SeedGRPOConfig(output_dir=str(tmp_path), use_cpu=True, cut_ratio_min=0.0)
    with pytest.raises(ValueError, match="must not exceed"):
        SeedGRPOConfig(output_dir=str(tmp_path), use_cpu=True, cut_ratio_min=0.8, cut_ratio_max=0.2)
    with pytest.raises(ValueError, match="seed_fraction"):
        SeedGRPOConfig(output_dir=str(tmp_path), use_cpu=True, seed_fraction=1.5)
    for field, value in (("prefix_mode", "both"), ("seed_selection", "best"), ("seed_method", "magic")):
        with pytest.raises(ValueError, match=field):
            SeedGRPOConfig(output_dir=str(tmp_path), use_cpu=True, **{field: value})
    with pytest.raises(ValueError, match="no 'prompt' column"):
        make_trainer(dataset=Dataset.from_dict({"question": ["a", "b", "c", "d"]}))
    with pytest.raises(ValueError, match="empty prompt"):
        make_trainer(dataset=Dataset.from_dict({"prompt": ["a", " ", "c", "d"]}))
    with pytest.raises(ValueError, match="exceeds the model's"):
        make_trainer(dataset=Dataset.from_dict({"prompt": ["x" * 600, "b", "c", "d"]}))

    other_vocab = Rollout("o", "p", "p", "c", [5, 6, 7], [-1.0] * 3, 0.0, 1)
    (tmp_path / "other").mkdir()
    write_shard(rollouts_to_table([other_vocab], "c", "m", "0123456789abcdef", []), tmp_path / "other" / "s.parquet")
    with pytest.raises(ValueError, match="none of its 1 traces' prompts matches a training prompt"):
        make_trainer(seed_dataset=str(tmp_path / "other"))  # another tokenizer's: text seeds, matched by prompt
    bare = rollouts_to_table([other_vocab], "c", "m", tokenizer_fingerprint(tokenizer), []).drop_columns(["logprobs"])
    (tmp_path / "bare").mkdir()
    write_shard(bare, tmp_path / "bare" / "s.parquet")
    with pytest.raises(ValueError, match="logprobs"):
        make_trainer(seed_dataset=str(tmp_path / "bare"))


@pytest.mark.parametrize("method", ["seeds", "none"])
def test_a_dataset_smaller_than_one_generation_is_refused_instead_of_training_zero_steps(make_trainer, method):
    # steps_per_generation=2 makes one generation take 2 steps x 2 groups = 4 prompts; TRL's sampler drops a shorter
    # batch, and GRPOTrainer's train() would return after 0 steps with only a logged warning.
    with pytest.raises(ValueError, match="has 3 prompts, fewer than one generation takes \\(4 ="):
        make_trainer(seed_method=method, steps_per_generation=2, dataset=tiny_prompts(3))
    trainer = make_trainer(seed_method=method, steps_per_generation=2, max_steps=2, dataset=tiny_prompts(4))
    trainer.train()
    assert trainer.state.global_step == 2


def test_fully_seeded_batches_generate_only_the_budget_left(make_trainer):
    trainer = make_trainer(seed_fraction=1.0, max_steps=6, save_steps=1, dataset=tiny_prompts(2))
    budgets = []
    original = trainer.model.generate

    def spy(*args, **kwargs):
        budgets.append(kwargs["generation_config"].max_new_tokens)
        return original(*args, **kwargs)

    trainer.model.generate = spy
    trainer.train()
    assert budgets[0] == 12  # nothing to seed from at the first step
    assert min(budgets) < 12  # later, every group is seeded: the longest remaining budget bounds generation
    assert trainer.generation_config.max_new_tokens == 12  # restored after each call


def test_mixed_batches_decode_like_grpo_and_rows_stop_at_their_budget(make_trainer):
    """Static HF generate: no row is padded for another's prefix, and no step decodes more than any row needs."""
    trainer = make_trainer(seed_fraction=0.5, max_steps=8, save_steps=1, dataset=tiny_prompts(2))
    calls = []
    original = trainer.model.generate

    def spy(*args, **kwargs):
        output = original(*args, **kwargs)
        calls.append((kwargs["attention_mask"], kwargs["generation_config"].max_new_tokens, output.size(1)))
        return output

    trainer.model.generate = spy
    trainer.train()
    rows = seed_rows(trainer.args.output_dir)
    mixed = {r["step"] for r in rows if r["prefix_len"]} & {r["step"] for r in rows if not r["prefix_len"]}
    assert mixed, "no batch mixed seeded and plain groups"
    for mask, _, _ in calls:
        assert bool(mask.all())  # equal-length prompts stay unpadded: the prefixes are not in the prompts
    for r in rows:  # every row is its prefix plus a continuation within the budget left
        assert len(r["completion_ids"]) <= trainer.max_completion_length
    assert "generate" not in vars(trainer.model) or trainer.model.generate is spy  # the forcing wrapper is removed


def test_conversational_prompts_are_measured_against_the_budget(make_trainer):
    from datasets import Dataset

    long_chat = [[{"role": "user", "content": "x" * 600}]] + [[{"role": "user", "content": "hi"}]] * 3
    with pytest.raises(ValueError, match="exceeds the model's"):
        make_trainer(dataset=Dataset.from_dict({"prompt": long_chat}))
