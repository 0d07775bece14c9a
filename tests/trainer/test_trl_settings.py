"""GRPOConfig settings a TRL user flips, each with seeding on, through `trainer.train()`.

Every run must train with finite losses, seed some groups, and bank for each generated token the log-prob of the
policy that sampled it (the weights saved at the step the rollout was generated). Settings that reuse one generation
for several optimizer steps (`num_iterations`, `steps_per_generation`) are where that can go wrong: the training
forward of a later step is no longer the sampling policy. Prefix actions must also get their importance weights
under every loss TRL offers.
"""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.conftest import (
    TARGET_CUTS,
    assert_target_cuts,
    logged,
    recomputed_logprobs,
    seed_rows,
    seeded_action_batch,
    tiny_prompts,
)

# How rollouts are sampled and consumed: the first three reuse one generation for several optimizer steps, where TRL's
# old log-probs and a later training forward part ways; the last reshapes the sampler's distribution around the
# processor that forces seed prefixes.
SAMPLING = {
    "num_iterations=2": dict(num_iterations=2),
    "steps_per_generation=2": dict(steps_per_generation=2),
    # With the switches of research/target-cuts.md on, which change which groups are seeded and where they are cut.
    "gradient_accumulation_steps=2,target_cuts": dict(gradient_accumulation_steps=2, **TARGET_CUTS),
    "top_k=5,top_p=0.9,repetition_penalty=1.3": dict(top_k=5, top_p=0.9, repetition_penalty=1.3),
}

# What the loss does with the advantages TRL (and the prefix-action weighting) hands it.
LOSSES = {
    "loss_type=grpo": dict(loss_type="grpo"),
    "loss_type=bnpo": dict(loss_type="bnpo"),
    "loss_type=dr_grpo": dict(loss_type="dr_grpo"),
    "loss_type=cispo": dict(loss_type="cispo"),
    "loss_type=sapo": dict(loss_type="sapo"),
    "loss_type=vespo": dict(loss_type="vespo"),
    "loss_type=luspo": dict(loss_type="luspo", importance_sampling_level="sequence"),
    "importance_sampling_level=sequence": dict(importance_sampling_level="sequence"),
    "scale_rewards=batch": dict(scale_rewards="batch"),
    "scale_rewards=none": dict(scale_rewards="none"),
    "beta=0.04": dict(beta=0.04),
    "top_entropy_quantile=0.5": dict(top_entropy_quantile=0.5),
    "delta=1.5": dict(delta=1.5, epsilon_high=0.28),
}


def _train(make_trainer, **settings):
    # As many prompts as one generation takes (2 per 8 rows), so that every prompt is back, with seeds, at the next.
    steps_per_generation = settings.get("steps_per_generation") or settings.get("gradient_accumulation_steps", 1)
    prompts = 2 * steps_per_generation
    trainer = make_trainer(dataset=tiny_prompts(prompts), max_steps=4, save_steps=1, **settings)
    trainer.train()
    losses = logged(trainer, "loss")
    assert losses and all(math.isfinite(x) for x in losses), losses
    assert max(logged(trainer, "seeds/seeded_group_share")) > 0, "some groups should be seeded"
    if settings.get("cut_selection") == "target":
        assert_target_cuts(trainer)
    return trainer


def _assert_banks_the_sampling_policy(trainer, tokenizer):
    """Rollouts generated at step s were sampled by checkpoint-s's weights: their generated tokens' log-probs match."""
    output_dir = Path(trainer.args.output_dir)
    rows = seed_rows(output_dir)
    steps = sorted({r["step"] for r in rows if r["step"] > 0})
    assert steps, "rollouts after the first optimizer step should be banked"
    checked = 0
    for step in steps:
        model = AutoModelForCausalLM.from_pretrained(output_dir / f"checkpoint-{step}").eval()
        for row in [r for r in rows if r["step"] == step]:
            k = row["prefix_len"]  # prefix tokens keep the seed's own behaviour log-probs
            expected = recomputed_logprobs(model, tokenizer, row)
            # Training scores the row inside a padded batch, which shifts float rounding: measured up to 7.7e-3 on
            # one token (continuous batching) and 2.0e-3 on a row's mean (top_k, action), while the weights of one
            # step earlier are off by >= 2e-2 on a row's mean and >= 7e-2 at its worst token.
            errors = np.abs(np.array(row["logprobs"][k:]) - np.array(expected[k:]))
            assert errors.mean() < 5e-3 and errors.max() < 1.5e-2, (step, row["rollout_id"], errors.tolist())
            checked += 1
    assert checked >= 8


@pytest.mark.parametrize("prefix_mode", ["state", "action"])
@pytest.mark.parametrize("settings", list(SAMPLING.values()), ids=list(SAMPLING))
def test_seeded_rollouts_bank_the_sampling_policy(make_trainer, tokenizer, settings, prefix_mode):
    trainer = _train(make_trainer, prefix_mode=prefix_mode, **settings)
    _assert_banks_the_sampling_policy(trainer, tokenizer)
    if prefix_mode == "action":
        ratios = logged(trainer, "seeds/prefix_is_ratio_mean")
        assert ratios and all(0 < x <= trainer.args.prefix_is_clip for x in ratios), ratios


@pytest.mark.parametrize("settings", list(LOSSES.values()), ids=list(LOSSES))
def test_prefix_actions_train_under_every_loss(make_trainer, settings):
    """Prefix tokens get a gradient that does not cancel over the group, with the sign of V(state) - b(prompt)."""
    trainer, _ = seeded_action_batch(make_trainer, state_value=0.9, baseline=0.5, **settings)  # V - b > 0
    assert all(math.isfinite(x) for x in logged(trainer, "loss"))
    prefix_lens = [p.rollout.prefix_len for p in trainer.seed_store.pending]
    assert all(k > 0 for k in prefix_lens), "both groups should be seeded"
    grad = trainer.delta.grad
    for group in (range(0, 4), range(4, 8)):
        prefix_grads = torch.cat([grad[i, : prefix_lens[i]] for i in group])
        assert prefix_grads.abs().sum() > 0, "prefix actions got no gradient"
        assert abs(sum(grad[i, 0].item() for i in group)) > 1e-9, "the group's prefix gradient cancels"
        if settings.get("importance_sampling_level") != "sequence" and not settings.get("beta"):
            # d loss / d logp = -weight * advantage (times a positive factor, 0 where a mask drops the token): V - b > 0
            # pushes the prefix tokens up
            assert torch.all(prefix_grads <= 0) and prefix_grads.min() < 0, prefix_grads
    ratios = logged(trainer, "seeds/prefix_is_ratio_mean")
    assert ratios and all(0 < x <= trainer.args.prefix_is_clip for x in ratios), ratios


@pytest.mark.parametrize(
    "switches", [{}, dict(prefix_mode="action", **TARGET_CUTS)], ids=["state", "action,target_cuts"]
)
def test_continuous_batching_continues_seeds_within_their_budget(make_trainer, tokenizer, switches):
    """transformers' continuous batching (no forced prefixes) gets the spliced prompts and the budget they leave; also
    with the cuts and the seeded groups chosen by the switches of research/target-cuts.md, in action mode."""
    # A paged cache the size of the batch: left to itself, transformers sizes it (and its attention mask) by the free
    # memory of the machine, and clearing that took 30 of this test's 40 s on CPU.
    cache = dict(num_blocks=16, max_batch_tokens=256)
    trainer = _train(
        make_trainer,
        use_transformers_continuous_batching=True,
        transformers_continuous_batching_config=cache,
        **switches,
    )
    _assert_banks_the_sampling_policy(trainer, tokenizer)
    continued = [r for r in seed_rows(trainer.args.output_dir) if r["seed_origin"] is not None]
    assert continued
    assert all(len(r["completion_ids"]) <= trainer.args.max_completion_length for r in continued)


def test_a_model_built_in_memory_gets_its_kl_reference(make_trainer):
    """TRL loads the reference model (beta != 0) from the policy's path; the embedded default's model has none."""
    trainer = make_trainer(beta=0.04, dataset=tiny_prompts(4), max_steps=3, learning_rate=1e-2)
    policy, reference = trainer.model.state_dict(), trainer.ref_model.state_dict()
    assert all(torch.equal(policy[name], reference[name]) for name in policy)
    assert trainer.model.config._name_or_path == ""  # no temporary folder left in cards or seed datasets
    trainer.train()
    kl = logged(trainer, "kl")
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and max(kl) > 0  # the policy moves away from its reference
