"""The all-equal share of seeded and of plain groups: the pure function, and what `trainer.train()` logs."""

import math

import numpy as np
import pytest

from tests.conftest import count_reward, logged
from ts_trl.method.group_signal import zero_std_shares

NAN = float("nan")


def test_zero_std_shares_of_hand_made_groups():
    rewards = [
        [1, 1, 1, 1],  # seeded, all equal
        [0, 1, 0, 0],  # seeded, spread
        [0.5, 0.5, 0.5, 0.5 + 1e-9],  # plain, equal within TRL's tolerance
        [0, 0, 1, 1],  # plain, spread
        [NAN, 2, NAN, NAN],  # plain, one scored reward: no signal
        [NAN, NAN, NAN, NAN],  # plain, nothing scored: no signal
        [1, 0, 1, 1],  # replayed rows in it, spread
    ]
    seeded = [[True] * 4] * 2 + [[False] * 4] * 5
    replayed = [[False] * 4] * 6 + [[False, False, True, True]]
    shares = zero_std_shares(np.ravel(rewards), 4, np.ravel(seeded), np.ravel(replayed))
    assert shares == {
        "seeds/zero_std_share_seeded": pytest.approx(1 / 2),
        "seeds/zero_std_share_plain": pytest.approx(3 / 4),
        "seeds/zero_std_share_replayed": 0.0,
    }
    # A batch without seeded groups logs no seeded share (not a 0 that would pull the mean down).
    assert zero_std_shares([1, 1, 0, 1, 2, 2], 2, [False] * 6) == {"seeds/zero_std_share_plain": pytest.approx(2 / 3)}


def _half_constant_reward(completions, prompts, **kwargs):
    """Constant on even-numbered prompts (always an all-equal group), digit parity on the others (mostly spread)."""
    spread = count_reward(completions)
    return [1.0 if int(p.split(":")[1].split("+")[0]) % 2 == 0 else r for p, r in zip(prompts, spread)]


@pytest.mark.parametrize("method", ["seeds", "none"])
def test_training_logs_the_all_equal_share_of_seeded_and_plain_groups(make_trainer, method):
    """The two shares, weighted by the groups of each kind, are exactly TRL's frac_reward_zero_std of each step."""
    trainer = make_trainer(
        reward=_half_constant_reward,
        seed_method=method,
        per_device_train_batch_size=16,  # four groups per step: room for seeded and plain groups in one batch
        seed_fraction=0.5,
        seed_snapshot_only=False,  # seeds from the step before, so that seeded groups appear in a 4-step run
        max_steps=4,
    )
    trainer.train()
    history = [h for h in trainer.state.log_history if "frac_reward_zero_std" in h]
    assert len(history) == 4
    both = 0
    for h in history:
        plain = h.get("seeds/zero_std_share_plain")
        seeded = h.get("seeds/zero_std_share_seeded")
        share = h.get("seeds/seeded_group_share", 0.0)
        if seeded is None:
            assert plain is not None and share == 0.0
            assert h["frac_reward_zero_std"] == pytest.approx(plain)
            continue
        both += plain is not None
        expected = share * seeded + (1 - share) * (plain if plain is not None else 0.0)
        assert h["frac_reward_zero_std"] == pytest.approx(expected)
    if method == "none":
        assert not logged(trainer, "seeds/zero_std_share_seeded")
        assert all(not math.isnan(v) for v in logged(trainer, "seeds/zero_std_share_plain"))
    else:
        assert both >= 1, "no step mixed seeded and plain groups"
        assert 0 < np.mean(logged(trainer, "seeds/zero_std_share_plain")) < 1
