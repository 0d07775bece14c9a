"""Unit tests of group planning and pass rates, on a hand-filled bank (no trainer, no torch)."""

from types import SimpleNamespace

import numpy as np

from ts_trl.bank import SeedBank
from ts_trl.planning import PASS_RATE_DECAY, GroupPlanner
from ts_trl.seed_data import Rollout

EOS = 1
G = 4


def _args(**overrides):
    settings = dict(
        seed=0,
        seed_method="seeds",
        seed_fraction=1.0,
        cut_ratio_min=0.5,
        cut_ratio_max=0.5,
        seed_selection="uniform",
        seed_min_age=1,
        seed_snapshot_only=True,
        replay_per_group=1,
    )
    settings.update(overrides)
    return SimpleNamespace(**settings)


def _bank():
    bank = SeedBank()
    bank.add_rollouts(
        [
            Rollout("r-a", "a", "", "", np.arange(10, 20, dtype=np.int32), np.full(10, -1.0, np.float32), 1.0, 0),
            Rollout("r-b", "b", "", "", np.arange(20, 26, dtype=np.int32), np.full(6, -2.0, np.float32), 0.0, 0),
        ]
    )
    bank.mark_snapshotted()
    return bank


def test_one_cut_per_group_the_same_on_every_rank():
    keys = ["a"] * G + ["b"] * G + ["c"] * G  # "c" has no seed
    plans = [GroupPlanner(_args(), G, budget=64, eos_token_ids={EOS}).plan(_bank(), keys, 3, r * 6, 6) for r in (0, 1)]
    first, second = plans
    assert first.group_keys == ["a", "b", "c"] and first.num_eligible_groups == 2
    np.testing.assert_array_equal(first.global_prefix_len, [5] * G + [3] * G + [0] * G)  # floor(0.5 * len)
    np.testing.assert_array_equal(first.global_seeded, second.global_seeded)
    rows = first.cuts + second.cuts
    assert [c.k if c else 0 for c in rows] == first.global_prefix_len.tolist()
    assert [s.rollout_id if s else None for s in first.seeds + second.seeds] == ["r-a"] * G + ["r-b"] * G + [None] * G
    assert first.global_seed_age == [3, 3] and (first.step, first.count) == (3, 0)


def test_seed_fraction_zero_and_young_seeds_leave_groups_plain():
    keys = ["a"] * G
    assert not GroupPlanner(_args(seed_fraction=0.0), G, 64, {EOS}).plan(_bank(), keys, 3, 0, G).any_seeded
    young = GroupPlanner(_args(seed_min_age=4), G, 64, {EOS}).plan(_bank(), keys, 3, 0, G)  # seed of step 0, t=3
    assert not young.any_seeded and young.num_eligible_groups == 0


def test_generations_of_one_step_are_counted_and_draw_anew():
    planner = GroupPlanner(_args(cut_ratio_min=0.1, cut_ratio_max=0.9), G, 64, {EOS})
    counts = [planner.plan(_bank(), ["a"] * G, 5, 0, G).count for _ in range(3)]
    assert counts == [0, 1, 2]
    assert planner.plan(_bank(), ["a"] * G, 6, 0, G).count == 0


def test_replay_fills_the_last_slots_of_a_group_with_whole_rollouts():
    planner = GroupPlanner(_args(seed_method="replay", replay_per_group=2), G, budget=8, eos_token_ids={EOS})
    plan = planner.plan(_bank(), ["a"] * G + ["b"] * G, 3, 0, 2 * G)
    assert plan.replayed == [False, False, True, True] * 2
    assert [c.k if c else 0 for c in plan.cuts] == [0, 0, 8, 8, 0, 0, 6, 6]  # capped by the budget of 8
    assert not plan.global_seeded.any() and plan.global_replayed.sum() == 4


def test_pass_rates_count_plain_rows_only_and_decay():
    planner = GroupPlanner(_args(seed_method="replay", replay_per_group=1), G, 64, {EOS})
    plan = planner.plan(_bank(), ["a"] * G + ["c"] * G, 3, 0, 2 * G)  # "a" gets one replayed row, "c" none
    passed = np.array([1, 0, 0, 1, 1, 1, 0, 0], dtype=bool)  # the replayed row 3 of "a" passes, but does not count
    planner.observe(plan, passed.astype(float), passed)
    assert planner.pass_rates == {"a": 1 / 3, "c": 0.5} and planner.reward_means == planner.pass_rates
    planner.observe(plan, np.ones(2 * G), np.ones(2 * G, dtype=bool))
    assert planner.pass_rates["c"] == PASS_RATE_DECAY * 0.5 + (1 - PASS_RATE_DECAY) * 1.0


def test_cuts_keep_prompt_plus_prefix_plus_budget_within_the_positions():
    # Seed "a" has 10 tokens; r = 0.5 asks for k = 5. Generation may run `budget` = 8 tokens past prompt + k.
    keys = ["a"] * G
    roomy = GroupPlanner(_args(), G, budget=8, eos_token_ids={EOS}, max_positions=30)
    assert roomy.plan(_bank(), keys, 3, 0, G, prompt_lengths=[10] * G).global_prefix_len[0] == 5  # 10 + 5 + 8 <= 30
    tight = GroupPlanner(_args(), G, budget=8, eos_token_ids={EOS}, max_positions=22)
    plan = tight.plan(_bank(), keys, 3, 0, G, prompt_lengths=[10] * G)  # k <= 22 - 8 - 10 = 4: r = 0.5 does not fit
    assert not plan.any_seeded and plan.num_refused_cuts == 1
    wide = GroupPlanner(_args(cut_ratio_min=0.1, cut_ratio_max=0.9), G, 8, {EOS}, max_positions=22)
    ks = {int(wide.plan(_bank(), keys, s, 0, G, prompt_lengths=[10] * G).global_prefix_len[0]) for s in range(1, 41)}
    assert ks == {1, 2, 3, 4}  # r drawn over the ratios whose cut fits
