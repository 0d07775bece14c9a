"""Which prompt groups carry a learning signal: the share of all-equal groups, seeded and plain apart.

A group whose rewards are all equal gets advantage 0 on every row (GRPO centres rewards on the group mean), so it
trains nothing; TRL logs the share of such groups as `frac_reward_zero_std`, over all groups together. A seeded group
starts from a prefix that may already decide the outcome, so its share can differ a lot from that of plain groups:
they are logged apart. Every arm of a comparison treats all-equal groups the same way, TRL's: they stay in the batch
with advantage 0 (no group is dropped or resampled). In "action" mode a seeded group's shared prefix tokens have their
own advantage (the state's value against the prompt's baseline), which an all-equal group can still carry.
"""

from __future__ import annotations

import numpy as np

ZERO_STD_SHARE_KEYS = {
    "seeded": "seeds/zero_std_share_seeded",
    "plain": "seeds/zero_std_share_plain",
    "replayed": "seeds/zero_std_share_replayed",
}


def zero_std_shares(rewards, num_generations: int, seeded, replayed=None) -> dict[str, float]:
    """The share of all-equal groups among seeded groups, plain groups and groups holding replayed rollouts.

    `rewards`: one total reward per row of the global batch, groups of `num_generations` consecutive rows (NaN: a row
    no reward function could score); `seeded`, `replayed`: one bool per row. A group is seeded when its rows are,
    replayed when any of its rows is an old rollout, else plain. It is all-equal when its scored rewards agree within
    the tolerance TRL applies to the group std (`isclose`, rtol 1e-5, atol 1e-8), or when fewer than two were scored.
    Returns `ZERO_STD_SHARE_KEYS` metric names for the kinds of group present in the batch (none for an absent kind).
    """
    seeded = np.asarray(seeded, dtype=bool).reshape(-1, num_generations).any(axis=1)
    if replayed is None:
        replayed = np.zeros_like(seeded)
    else:
        replayed = np.asarray(replayed, dtype=bool).reshape(-1, num_generations).any(axis=1) & ~seeded
    all_equal = all_equal_groups(rewards, num_generations)
    shares = {}
    for kind, groups in (("seeded", seeded), ("plain", ~(seeded | replayed)), ("replayed", replayed)):
        if groups.any():
            shares[ZERO_STD_SHARE_KEYS[kind]] = float(all_equal[groups].mean())
    return shares


def all_equal_groups(rewards, num_generations: int) -> np.ndarray:
    """Per group of `num_generations` consecutive rows: its scored rewards agree within the tolerance TRL applies to
    the group std (`isclose`, rtol 1e-5, atol 1e-8), or fewer than two were scored (NaN: unscored)."""
    rewards = np.asarray(rewards, dtype=np.float64).reshape(-1, num_generations)
    scored = ~np.isnan(rewards)
    high = np.where(scored, rewards, -np.inf).max(axis=1)
    low = np.where(scored, rewards, np.inf).min(axis=1)
    return (scored.sum(axis=1) < 2) | np.isclose(high, low)


def log_zero_std_shares(metrics, rewards_per_func, reward_weights, num_generations: int, seeded=None, replayed=None):
    """Appends this batch's `zero_std_shares` to a trainer's `metrics`, from TRL's gathered per-function rewards.

    The total reward of a row is TRL's: the weighted sum of its scored rewards, NaN where none scored it. Without
    `seeded` every group is plain (the on-policy arm).
    """
    per_func = rewards_per_func.float().cpu().numpy()
    weights = reward_weights.float().cpu().numpy()
    unscored = np.isnan(per_func).all(axis=1)
    total = np.where(unscored, np.nan, np.nansum(per_func * weights, axis=1))
    seeded = np.zeros(len(total), dtype=bool) if seeded is None else seeded
    for key, share in zero_std_shares(total, num_generations, seeded, replayed).items():
        metrics[key].append(share)
