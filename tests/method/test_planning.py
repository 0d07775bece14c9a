"""Unit tests of group planning and pass rates, on a hand-filled bank (no trainer, no torch)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from ts_trl.method.planning import PASS_RATE_DECAY, CutOutcomes, GroupPlanner, monotone_fit
from ts_trl.store.bank import SeedBank
from ts_trl.store.schema import Rollout

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
        cut_selection="ratio",
        seed_trigger="fraction",
        target_pass_rate=0.5,
        success_threshold=0.0,
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


def _rollouts(bank, prompt: str, lengths_and_rewards, step: int = 0):
    bank.add_rollouts(
        [
            Rollout(
                f"r-{prompt}{j}", prompt, "", "", np.arange(5, 5 + n, dtype=np.int32), np.zeros(n, np.float32), r, step
            )
            for j, (n, r) in enumerate(lengths_and_rewards)
        ]
    )


def _mixed_bank():
    """Four prompts, three seeds each of random length, alternately failed (reward 0) and passed (reward 1)."""
    bank, rng = SeedBank(), np.random.default_rng(7)
    rollouts = []
    for prompt in "abcd":
        for j in range(3):
            n = int(rng.integers(4, 20))
            ids = rng.integers(5, 50, n).astype(np.int32)
            rollouts.append(Rollout(f"r-{prompt}{j}", prompt, "", "", ids, np.full(n, -1.0, np.float32), j % 2, 0))
    bank.add_rollouts(rollouts)
    bank.mark_snapshotted()
    return bank


# (seed, k, drawn ratio) of each group's cut over five steps, as planned before cut_selection and seed_trigger existed
# (commit 7288a3c), with seed_selection="passrate" so that the observed pass rates feed back into the draws.
TODAYS_PLANS = [
    [("r-a2", 3, 0.37039), ("r-b1", 4, 0.529186), ("r-c1", 9, 0.698244), ("r-d2", 4, 0.61276)],
    [("r-a1", 7, 0.466666), (None, 0, None), (None, 0, None), ("r-d0", 3, 0.246605)],
    [("r-a0", 4, 0.2218), ("r-b1", 3, 0.403914), (None, 0, None), ("r-d1", 4, 0.227783)],
    [(None, 0, None), ("r-b1", 5, 0.736612), ("r-c0", 9, 0.790569), ("r-d2", 4, 0.602691)],
    [("r-a0", 3, 0.209883), (None, 0, None), (None, 0, None), (None, 0, None)],
]


def test_the_default_plans_todays_cuts_draw_for_draw():
    """cut_selection="ratio" and seed_trigger="fraction" draw the same numbers in the same order as before."""
    planner = GroupPlanner(
        _args(seed=3, seed_fraction=0.5, cut_ratio_min=0.1, cut_ratio_max=0.9, seed_selection="passrate"), 2, 64, {EOS}
    )
    bank, keys = _mixed_bank(), [k for k in "abcd" for _ in range(2)]
    for step, expected in enumerate(TODAYS_PLANS, start=1):
        plan = planner.plan(bank, keys, step, 0, 8)
        got = [
            (s.rollout_id if s else None, c.k if c else 0, c.ratio if c else None)
            for s, c in zip(plan.seeds[::2], plan.cuts[::2])
        ]
        assert [g[:2] for g in got] == [e[:2] for e in expected], step
        assert [g[2] for g in got] == [pytest.approx(e[2], abs=1e-6) if e[2] else None for e in expected], step
        passed = np.array([1, 0, 0, 0, 1, 1, 0, 1], dtype=bool)
        planner.observe(plan, passed.astype(float), passed)
    assert planner.cut_outcomes.counts == {} and planner.last_plain == {}  # nothing kept that nothing reads


def test_estimator_prior_and_fallback():
    outcomes = CutOutcomes(0.1, 0.9, target=0.45)  # bins [0.1, 0.3, 0.5, 0.7, 0.9], centres 0.2 ... 0.8
    assert outcomes.estimates("a", True, None) is None  # nothing known of the prompt
    assert outcomes.choose("a", True, None, (0.1, 0.9)) is None  # -> the caller draws uniformly
    # Prior only: the mean runs from the prompt's pass rate (r = 0) to the seed's outcome (r = 1).
    np.testing.assert_allclose(outcomes.estimates("a", True, 0.0), [0.2, 0.4, 0.6, 0.8])
    np.testing.assert_allclose(outcomes.estimates("a", False, 1.0), [0.8, 0.6, 0.4, 0.2])
    assert outcomes.choose("a", True, 0.0, (0.1, 0.9)) == pytest.approx((0.3, 0.5))  # 0.4 is nearest 0.45
    assert outcomes.choose("a", False, 1.0, (0.1, 0.9)) == pytest.approx((0.5, 0.7))
    # Only bins the admissible ratios reach: a seed whose cuts must stay below r = 0.35
    assert outcomes.choose("a", False, 1.0, (0.1, 0.35)) == pytest.approx((0.3, 0.35))


def test_estimator_known_outcomes_give_the_expected_bin():
    outcomes = CutOutcomes(0.1, 0.9, target=0.45)
    for ratio, passes in ((0.15, 0), (0.35, 2), (0.55, 4), (0.85, 8)):  # 8 continuations in each bin
        outcomes.observe("a", True, ratio, passes, 8)
    # (passes + 2 * prior) / (8 + 2) with the prior of a prompt at 0: 0.04, 0.28, 0.52, 0.96
    np.testing.assert_allclose(outcomes.estimates("a", True, 0.0), [0.04, 0.28, 0.52, 0.96])
    assert outcomes.choose("a", True, 0.0, (0.1, 0.9)) == pytest.approx((0.5, 0.7))
    assert outcomes.estimates("a", False, None) is None  # a failed seed of "a" has no counts of its own
    outcomes.observe("a", True, 0.55, 0, 8)  # the bin failed this time: its old counts weigh PASS_RATE_DECAY
    passes, trials = 4 * PASS_RATE_DECAY, 8 * PASS_RATE_DECAY + 8
    assert outcomes.counts["a"]["passed"][2] == [passes, trials]
    # Bin 2 is now (2 + 2 * 0.6) / 14 = 0.23, below bin 1's 0.28: for a seed that passed, the two are pooled at
    # (2.8 + 3.2) / 24 = 0.25, 0.2 from the target (bin 0: 0.04, bin 3: 0.96), and the earlier of them is cut.
    np.testing.assert_allclose(outcomes.estimates("a", True, 0.0), [0.04, 0.25, 0.25, 0.96])
    assert outcomes.choose("a", True, 0.0, (0.1, 0.9)) == pytest.approx((0.3, 0.5))  # the first of the pooled bins


def test_monotone_fit_pools_adjacent_violators():
    np.testing.assert_allclose(monotone_fit(np.array([0.1, 0.5, 0.3, 0.9]), np.ones(4)), [0.1, 0.4, 0.4, 0.9])
    np.testing.assert_allclose(monotone_fit(np.array([0.2, 0.6]), np.array([3.0, 1.0]), increasing=False), [0.3, 0.3])
    np.testing.assert_allclose(monotone_fit(np.array([0.8, 0.6]), np.ones(2), increasing=False), [0.8, 0.6])


def test_target_cuts_through_the_planner_from_a_hand_filled_history():
    bank = SeedBank()
    _rollouts(bank, "a", [(10, 1.0)])  # a seed that passed
    _rollouts(bank, "b", [(10, 0.0)])  # one that failed
    bank.mark_snapshotted()
    args = _args(cut_ratio_min=0.1, cut_ratio_max=0.9, cut_selection="target", target_pass_rate=0.45)
    planner = GroupPlanner(args, G, 64, {EOS})
    keys = ["a"] * G + ["b"] * G + ["c"] * G
    # Nothing known: uniform draws, as cut_selection="ratio" makes (same generator, same numbers).
    plain = GroupPlanner(_args(cut_ratio_min=0.1, cut_ratio_max=0.9), G, 64, {EOS}).plan(bank, keys, 3, 0, 3 * G)
    first = planner.plan(bank, keys, 3, 0, 3 * G)
    assert first.group_cut_ratios == plain.group_cut_ratios and first.group_seed_passed == [True, False, None]
    # Known outcomes: "a" continues from its passed seed at 0.55 half the time; "b" is a prompt the policy solves.
    for ratio, passes in ((0.15, 0), (0.35, 2), (0.55, 4), (0.85, 8)):
        planner.cut_outcomes.observe("a", True, ratio, passes, 8)
    planner.pass_rates.update({"a": 0.0, "b": 1.0})  # "b": prior only, 1 - r: 0.4 at the centre 0.6
    for step in range(4, 12):
        ratios = planner.plan(bank, keys, step, 0, 3 * G).group_cut_ratios
        assert 0.5 <= ratios[0] < 0.7 and 0.5 <= ratios[1] < 0.7 and ratios[2] is None, ratios


def test_planner_counts_continuations_by_prompt_outcome_and_bin():
    bank = SeedBank()
    _rollouts(bank, "a", [(10, 1.0)])
    bank.mark_snapshotted()
    planner = GroupPlanner(_args(cut_ratio_min=0.1, cut_ratio_max=0.9, cut_selection="target"), G, 64, {EOS})
    plan = planner.plan(bank, ["a"] * G + ["c"] * G, 3, 0, 2 * G)
    ratio, no_cut = plan.group_cut_ratios
    b = int((ratio - 0.1) // 0.2)  # the bin of [0.1, 0.3, 0.5, 0.7, 0.9] the cut was drawn in
    assert no_cut is None
    passed = np.array([1, 1, 0, 1, 0, 0, 0, 0], dtype=bool)
    planner.observe(plan, passed.astype(float), passed)
    cells = planner.cut_outcomes.counts["a"]["passed"]
    assert cells[b] == [3.0, 4.0] and sum(c[1] for i, c in enumerate(cells) if i != b) == 0
    assert list(planner.cut_outcomes.counts) == ["a"]  # the plain group of "c" counts only in pass_rates


@pytest.mark.parametrize("selection", ["uniform", "passrate"])  # passrate would ask "c" for a failed seed too
def test_rescue_seeding_seeds_only_all_equal_prompts_against_their_outcome(selection):
    bank = SeedBank()
    _rollouts(bank, "a", [(8, 0.0), (8, 1.0), (8, 0.0), (8, 0.0)])  # one passed seed among failed ones
    _rollouts(bank, "b", [(8, 0.0), (8, 1.0)])
    _rollouts(bank, "c", [(8, 1.0), (8, 1.0)])  # no failed seed: any seed will do
    bank.mark_snapshotted()
    planner = GroupPlanner(_args(seed_trigger="zero_std", seed_selection=selection), G, 64, {EOS})
    keys = ["a"] * G + ["b"] * G + ["c"] * G + ["d"] * G
    assert not planner.plan(bank, keys, 3, 0, 4 * G).any_seeded  # no plain group seen yet
    rewards = np.array([0, 0, 0, 0] + [0, 1, 0, 1] + [1, 1, 1, 1] + [1, 1, 1, 1], dtype=float)
    plan = planner.plan(bank, keys, 3, 0, 4 * G)
    planner.observe(plan, rewards, rewards > 0)
    assert planner.last_plain == {"a": -1, "b": 0, "c": 1, "d": 1}
    for step in range(4, 10):
        plan = planner.plan(bank, keys, step, 0, 4 * G)
        seeds = [s.rollout_id if s else None for s in plan.seeds[::G]]
        assert seeds[0] == "r-a1" and seeds[1] is None and seeds[2] in ("r-c0", "r-c1") and seeds[3] is None


def test_planner_state_survives_a_checkpoint():
    bank = _mixed_bank()
    args = _args(
        seed_fraction=0.5, cut_ratio_min=0.1, cut_ratio_max=0.9, cut_selection="target", seed_trigger="zero_std"
    )
    keys = [k for k in "abcd" for _ in range(2)]
    rng = np.random.default_rng(1)

    def run(planner, steps):
        cuts = []
        for step in steps:
            plan = planner.plan(bank, keys, step, 0, 8)
            cuts.append(plan.group_cut_ratios)
            passed = rng.random(8) < 0.5 if step % 3 else np.array([1, 1, 0, 0, 0, 0, 1, 1], dtype=bool)
            planner.observe(plan, passed.astype(float), passed)
        return cuts

    planner = GroupPlanner(args, 2, 64, {EOS})
    run(planner, range(1, 7))
    state, rng_state = json.loads(json.dumps(planner.state())), rng.bit_generator.state
    assert state["planner"]["cut_outcomes"] and state["planner"]["last_plain"]
    uninterrupted = run(planner, range(7, 13))
    resumed = GroupPlanner(args, 2, 64, {EOS})
    resumed.reset(state["planner"])
    rng.bit_generator.state = rng_state
    assert run(resumed, range(7, 13)) == uninterrupted
    assert any(r is not None for cuts in uninterrupted for r in cuts)


def test_rescue_seeding_chooses_the_replayed_rollouts_too():
    bank = SeedBank()
    _rollouts(bank, "a", [(8, 0.0), (8, 1.0), (8, 0.0)])
    _rollouts(bank, "b", [(8, 0.0), (8, 1.0)])
    bank.mark_snapshotted()
    planner = GroupPlanner(_args(seed_method="replay", replay_per_group=2, seed_trigger="zero_std"), G, 64, {EOS})
    keys = ["a"] * G + ["b"] * G
    plan = planner.plan(bank, keys, 3, 0, 2 * G)
    assert not any(plan.replayed)  # no plain group seen yet: nothing replayed
    rewards = np.array([0, 0, 0, 0] + [0, 1, 0, 1], dtype=float)  # "a" all failed, "b" spread
    planner.observe(plan, rewards, rewards > 0)
    plan = planner.plan(bank, keys, 4, 0, 2 * G)
    assert plan.replayed == [False, False, True, True] + [False] * G
    assert [s.rollout_id for s in plan.seeds[2:4]] == ["r-a1", "r-a1"]  # the one rollout of "a" that passed
