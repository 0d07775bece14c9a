"""Settings off the default path, each checked through `trainer.train()`: truncation masking, the model's position
limit, TRL's length metrics, seeds longer than the budget, and TRL's own validation errors."""

from pathlib import Path

import pytest
from datasets import Dataset

from tests.conftest import TINY_SETTINGS, count_reward, logged, recomputed_logprobs, seed_rows, tiny_prompts
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
from ts_trl.store.format import write_shard
from ts_trl.store.schema import Rollout, prompt_id_of, rollouts_to_table, tokenizer_fingerprint
from ts_trl.tiny import build_tiny_model


def test_truncated_rows_bank_the_sampling_policys_logprobs(make_trainer, tokenizer):
    """TRL's `mask_truncated_completions` must not change the log-probs the bank keeps for truncated rows."""
    from transformers import AutoModelForCausalLM

    trainer = make_trainer(mask_truncated_completions=True, max_steps=3, save_steps=1)
    trainer.train()
    output_dir = Path(trainer.args.output_dir)
    model = AutoModelForCausalLM.from_pretrained(output_dir / "checkpoint-2").eval()
    rows = [r for r in seed_rows(output_dir) if r["step"] == 2]  # sampled by checkpoint-2's weights
    eos = tokenizer.eos_token_id
    truncated = [r for r in rows if r["completion_ids"][-1] != eos]
    assert truncated, "the 12-token budget should truncate some of the tiny model's rows"
    for row in rows:
        k = row["prefix_len"]  # prefix tokens keep the seed's own log-probs
        expected = recomputed_logprobs(model, tokenizer, row)
        # abs=5e-3: training scores the row inside a padded batch, which shifts float rounding slightly
        assert row["logprobs"][k:] == pytest.approx(expected[k:], abs=5e-3), row["completion_ids"][-1] == eos


def test_generation_never_runs_past_the_models_positions(tmp_path, tokenizer):
    """A seeded row continues from prompt + k; with a mixed batch, generation must still stay within the model."""
    model = build_tiny_model(tokenizer)
    # 7-token prompts + the 12-token budget fit in 22 positions; prompt + k + 12 would not for k > 3.
    model.config.max_position_embeddings = 22
    reaches = []
    original = model.generate

    def spy(*args, **kwargs):
        reached = kwargs["attention_mask"].sum(dim=1) + kwargs["generation_config"].max_new_tokens
        reaches.append(int(reached.max()))
        return original(*args, **kwargs)

    model.generate = spy
    settings = {
        **TINY_SETTINGS,
        "output_dir": str(tmp_path / "run"),
        "save_steps": 1,
        "seed_fraction": 0.5,  # mixed batches: generation keeps the full budget past every prefix
    }
    trainer = SeedGRPOTrainer(
        model=model,
        reward_funcs=count_reward,
        args=SeedGRPOConfig(**settings),
        train_dataset=tiny_prompts(4),
        processing_class=tokenizer,
    )
    trainer.train()
    continuations = [r for r in seed_rows(trainer.args.output_dir) if r["seed_origin"] is not None]
    assert continuations, "some groups should be seeded"
    assert max(reaches) <= 22, reaches


def test_trl_length_metrics_count_generated_tokens(make_trainer):
    """`completions/mean_length` etc. are TRL's metrics of generated tokens: the seed prefix is not generated."""
    trainer = make_trainer(max_steps=4, save_steps=1, dataset=tiny_prompts(2))  # both prompts in every batch
    trainer.train()
    history = [h for h in trainer.state.log_history if h.get("seeds/prefix_tokens", 0) > 0]
    assert history, "some steps should be seeded"
    rows = TINY_SETTINGS["per_device_train_batch_size"]
    for h in history:
        assert h["completions/mean_length"] * rows == pytest.approx(h["seeds/generated_tokens"])
        assert h["completions/max_length"] <= TINY_SETTINGS["max_completion_length"]


def test_seeds_longer_than_the_budget_are_cut_over_the_admissible_range(make_trainer, tokenizer, tmp_path):
    """Seeds of a run with a larger budget: cuts spread over the ratios that fit, and uncuttable seeds are counted."""
    digits = tokenizer("1234567890")["input_ids"]
    external = []
    for i in range(4):
        prompt = f"Q: {i}+{i + 1}="
        ids = digits * (4 if i < 2 else 20)  # 40 tokens: only r < 0.3 fits 12; 200 tokens: even r = 0.1 does not
        external.append(Rollout(f"ext-{i}", prompt_id_of(prompt), prompt, "x", ids, [-0.5] * len(ids), 1.0, 40))
    table = rollouts_to_table(external, "checkpoint-40", "other", tokenizer_fingerprint(tokenizer), [])
    (tmp_path / "ext").mkdir()
    write_shard(table, tmp_path / "ext" / "step-000040.parquet")

    # save_steps=10: no snapshot of this run during training, so only the external seeds are eligible
    trainer = make_trainer(
        seed_dataset=str(tmp_path / "ext"), max_steps=6, save_steps=10, per_device_train_batch_size=16
    )
    trainer.train()
    rows = seed_rows(trainer.args.output_dir)
    cuts = [r["prefix_len"] for r in rows if r["seed_origin"] in ("ext-0", "ext-1")][::4]  # one per group
    assert len(cuts) >= 4
    assert all(4 <= k <= 11 for k in cuts)  # floor(0.1 * 40) .. budget - 1
    assert sum(k == 11 for k in cuts) < len(cuts) / 2, cuts  # clipping r in [0.3, 0.9] to k = 11 piled 3/4 here
    assert not [r for r in rows if r["seed_origin"] in ("ext-2", "ext-3")]  # no cut of them fits: not seeded
    refused = logged(trainer, "seeds/refused_cut_share")
    assert refused and max(refused) > 0 and all(0 <= x <= 1 for x in refused)


def test_trl_validation_errors_are_not_hidden_by_seeding_refusals(tmp_path, tokenizer):
    """A missing train_dataset is reported as TRL reports it, even with an option seeding refuses."""

    def rollout_func(prompts, trainer):
        return {}

    args = SeedGRPOConfig(**{**TINY_SETTINGS, "output_dir": str(tmp_path / "run")})
    with pytest.raises(ValueError, match="train_dataset"):
        SeedGRPOTrainer(
            model=build_tiny_model(tokenizer),
            reward_funcs=count_reward,
            args=args,
            processing_class=tokenizer,
            rollout_func=rollout_func,
        )
    with pytest.raises(ValueError, match="cannot be combined with `rollout_func`"):
        SeedGRPOTrainer(
            model=build_tiny_model(tokenizer),
            reward_funcs=count_reward,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["a", "b", "c", "d"]}),
            processing_class=tokenizer,
            rollout_func=rollout_func,
        )


@pytest.mark.parametrize("omp", [None, "2"])
def test_the_trainer_trains_on_one_torch_thread_on_cpu_unless_omp_num_threads_says(omp, make_trainer, monkeypatch):
    """Through the Python API as through `ts_trl train`: torch's default two threads on two busy cores spin-wait for
    each other (the real model's tests timed out, issue 58); a user's OMP_NUM_THREADS is followed as torch follows it."""
    import torch

    seen = []
    training_step = SeedGRPOTrainer.training_step

    def counting_step(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return training_step(self, *args, **kwargs)

    monkeypatch.setattr(SeedGRPOTrainer, "training_step", counting_step)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if omp:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    trainer = make_trainer(max_steps=2)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)  # what torch picks on two cores when OMP_NUM_THREADS is unset
    try:
        trainer.train()
        assert torch.get_num_threads() == 2  # restored after training
    finally:
        torch.set_num_threads(previous)
    assert seen == [1, 1] if omp is None else seen == [2, 2]
