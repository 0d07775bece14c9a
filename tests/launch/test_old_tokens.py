"""Tokens an earlier policy sampled (seed prefixes in "action" mode, replayed rollouts), trained through the loss."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import RANKS, GradientProbe, seed_by_id, seeded_action_batch, tiny_prompts
from tests.support.ranks import run_on_two_ranks
from tests.support.two_rank_losses import run as run_two_prompt_modes
from ts_trl.store.format import write_shard
from ts_trl.store.schema import Rollout, prompt_id_of, rollouts_to_table, tokenizer_fingerprint


@pytest.mark.parametrize("state_value", [0.9, 0.1])
def test_prefix_actions_get_the_state_advantage(make_trainer, state_value):
    """The gradient on prefix log-probs is non-zero, shared by the group, and has the sign of V(state) - b(prompt)."""
    baseline = 0.5
    trainer, inputs = seeded_action_batch(make_trainer, state_value, baseline, loss_type="dapo")
    cuts = [(i, p.rollout.prefix_len, p.rollout.seed_origin) for i, p in enumerate(trainer.seed_store.pending)]
    seeded = [(i, k, seed_by_id(trainer.seed_bank, origin)) for i, k, origin in cuts if origin is not None]
    assert len(seeded) == 8, "both groups should be seeded"
    rewards = np.array([state_value + (0.1 if i % 2 else -0.1) for i in range(8)])
    expected = (state_value - baseline) / (rewards.std() + 1e-4)  # V - b, in batch reward standard deviations
    grad, advantages, mask = trainer.delta.grad, inputs["advantages"], inputs["completion_mask"]
    clip = trainer.args.prefix_is_clip
    for i, k, seed in seeded:
        assert advantages[i, :k].tolist() == pytest.approx([expected] * k, rel=1e-4)
        assert torch.all(torch.sign(-grad[i, :k]) == math.copysign(1.0, state_value - baseline))
        weights = torch.exp(trainer.logps[i, :k] - torch.tensor(seed.logprobs[:k])).clamp(max=clip)
        continuation = [t for t in range(k, mask.size(1)) if mask[i, t] and advantages[i, t] != 0]
        if continuation:  # d loss / d logp = -advantage * weight / normaliser on every token
            t = continuation[0]
            scale = -grad[i, t] / advantages[i, t]
            assert (-grad[i, :k]).tolist() == pytest.approx((scale * expected * weights).tolist(), rel=1e-3)
    for group in (range(0, 4), range(4, 8)):  # the prefix gradient of a group no longer sums to zero
        assert abs(sum(grad[i, 0].item() for i in group)) > 0


def _nan_seed_dataset(folder: Path, tokenizer) -> str:
    rollouts = []
    for i, prompt in enumerate(tiny_prompts(2)["prompt"]):
        ids = [20 + i, 21, 22, 23, 24, 25]
        logps = [-1.0, float("nan"), -2.0, float("nan"), -1.5, -1.0]  # vLLM's None, or a row that missed the loss
        rollouts.append(Rollout(f"ext-{i}", prompt_id_of(prompt), prompt, "x", ids, logps, 1.0, 0))
    folder.mkdir()
    table = rollouts_to_table(rollouts, "checkpoint-0", "other", tokenizer_fingerprint(tokenizer), [])
    write_shard(table, folder / "step-000000.parquet")
    return str(folder)


@pytest.mark.parametrize("mode", [dict(prefix_mode="action"), dict(seed_method="replay")])
def test_nan_behaviour_logprobs_never_reach_the_loss(make_trainer, tokenizer, tmp_path, mode):
    seeds = _nan_seed_dataset(tmp_path / "ext", tokenizer)
    trainer = make_trainer(seed_dataset=seeds, dataset=tiny_prompts(2), max_steps=3, save_steps=10, **mode)
    trainer.train()
    history = trainer.state.log_history
    losses = [h["loss"] for h in history if "loss" in h]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    nan_tokens = [h["seeds/nan_behaviour_tokens"] for h in history if "seeds/nan_behaviour_tokens" in h]
    assert nan_tokens and max(nan_tokens) > 0  # the excluded tokens are counted, not hidden
    ratios = [h["seeds/prefix_is_ratio_mean"] for h in history if "seeds/prefix_is_ratio_mean" in h]
    assert ratios and all(math.isfinite(x) for x in ratios)


def test_action_mode_runs_no_extra_forward_pass(make_trainer, tmp_path):
    """The importance weights come from the training forward's own log-probs: as many passes as plain GRPO."""
    counts = {}
    for name, mode in {"plain": dict(seed_method="none"), "action": dict(prefix_mode="action")}.items():
        trainer = make_trainer(
            trainer_cls=GradientProbe,
            output_dir=str(tmp_path / name),
            dataset=tiny_prompts(2),
            max_steps=3,
            save_steps=1,
            **mode,
        )
        trainer.train()
        counts[name] = trainer.forwards
    shares = [h["seeds/seeded_group_share"] for h in trainer.state.log_history if "seeds/seeded_group_share" in h]
    assert max(shares) > 0  # the action run did seed
    assert counts["action"] == counts["plain"]


@RANKS
def test_two_ranks_with_one_seeded_match_one_rank(tmp_path):
    """Action and replay modes, and target cuts with rescue seeding (research/target-cuts.md) in action and state mode,
    one prompt group per rank and seeds for one prompt only: every step runs the same collectives on both ranks (else
    gloo reports a collective mismatch), the losses equal one rank's, and so do the cuts and the planner's state."""
    run_on_two_ranks("two_rank_losses.py", str(tmp_path / "two"), timeout=400)
    two = json.loads((tmp_path / "two" / "losses.json").read_text())
    for mode in ("action", "replay", "target", "target-state"):
        one = run_two_prompt_modes(mode, tmp_path / "one", num_processes=1)
        assert len(one["loss"]) == 3 and (one["seeds/prefix_is_ratio_mean"] or mode == "target-state")
        assert two[mode]["loss"] == pytest.approx(one["loss"], rel=1e-2, abs=2e-3)
        assert two[mode]["seeds/prefix_is_ratio_mean"] == pytest.approx(one["seeds/prefix_is_ratio_mean"], rel=1e-2)
        assert two[mode]["seeds/seeded_group_share"] == one["seeds/seeded_group_share"]
        assert two[mode]["seeds/replayed_rows"] == one["seeds/replayed_rows"]
        assert two[mode]["seeds/mean_cut_ratio"] == one["seeds/mean_cut_ratio"]  # the same cuts on one and two ranks
        assert two[mode]["planner"] == one["planner"]  # and the same statistics to plan the next ones
    # Rescue seeding: nothing seeded before the first prompt's all-failed plain group, then only that prompt
    assert one["seeds/seeded_group_share"] == [0.0, 0.5, 0.5] and one["planner"]["last_plain"]
    assert one["planner"]["cut_outcomes"] and set(one["planner"]["cut_outcomes"].popitem()[1]) == {"passed"}
