"""Pure NumPy planning of Thinking Seeds: which prompt groups of a batch are seeded, from which seed, and cut where.

Nothing here touches torch or trainer state: the trainer gathers the prompt ids of the global batch and the rewards,
and this module turns them into a `GroupPlan` (the same on every rank, since every rank draws from the same
generator) and into per-prompt pass rates. Unit-tested in tests/test_planning.py with a hand-filled `SeedBank`;
the settings it reads are one `PlannerSettings`, built once by the trainer from its config.

Two switches beside the paper's method live here too (research/target-cuts.md): `cut_selection="target"` (`CutOutcomes`:
the ratio bin whose estimated continuation pass rate is nearest a target) and `seed_trigger="zero_std"` (seed only
prompts whose last plain group was all-equal). Their statistics are part of `GroupPlanner.state()`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from .cutting import Cut, admissible_ratios, draw_cut
from .group_signal import all_equal_groups
from .selection import EXTERNAL_STEP, Seed
from .turns import admissible_cuts, draw_turn_cut, step_boundaries, turn_ratio_bounds

PASS_RATE_DECAY = 0.5  # weight of a prompt's previous pass rate (seed_selection="passrate"), mean reward, cut counts
TARGET_RATIO_BINS = 4  # equal-width bins of [cut_ratio_min, cut_ratio_max] that cut_selection="target" picks among
CUT_PRIOR_STRENGTH = 2.0  # pseudo-continuations of the Beta prior of a bin's pass rate (research/target-cuts.md)


@dataclass(frozen=True, eq=False)
class GroupPlan:
    """Which seed and cut each row of the local generation batch continues from (None: a plain GRPO row).

    Decided before generation, identically on every rank, and never changed afterwards: what generation returns is
    kept apart, in `seed_batch.SeedBatch`.
    """

    seeds: list[Seed | None]
    cuts: list[Cut | None]
    step: int  # global step and number of earlier generations at that step: part of every rollout id
    count: int
    global_seeded: np.ndarray  # per global row: in a seeded group
    global_prefix_len: np.ndarray
    replayed: list[bool]  # per local row: an old rollout put back whole, not generated
    global_replayed: np.ndarray
    group_keys: list[str]  # prompt id of every group of the global batch
    global_seed_age: list[float] = field(default_factory=list)  # per seeded group
    group_cut_ratios: list[float | None] = field(default_factory=list)  # per group: the cut's drawn ratio r
    group_seed_passed: list[bool | None] = field(default_factory=list)  # per group: whether its seed succeeded
    num_groups: int = 0
    num_eligible_groups: int = 0
    num_refused_cuts: int = 0  # groups drawn for seeding whose seed admits no cut in the ratio range and the budget
    num_external_groups: int = 0  # seeded groups whose seed came from `seed_dataset` (another run or a trace dataset)

    @property
    def any_seeded(self) -> bool:
        return any(c is not None for c in self.cuts)

    @property
    def multi_turn_rows(self) -> list[int]:
        """The local rows that continue a multi-turn seed: cut (not replayed) from a rollout with tool turns."""
        return [
            i
            for i, (seed, cut) in enumerate(zip(self.seeds, self.cuts))
            if cut is not None and not self.replayed[i] and seed.tool_mask is not None
        ]


class CutOutcomes:
    """Pass rates of continuations by prompt, seed outcome and ratio bin, for `cut_selection="target"`.

    The ratio range `[low, high]` is split into `TARGET_RATIO_BINS` equal bins. For a prompt and a seed that passed
    (or failed), the pass rate of a continuation cut in bin `b` has a Beta prior of strength `CUT_PRIOR_STRENGTH`
    whose mean runs linearly from the prompt's own pass rate (`r = 0`: nothing of the seed kept) to the seed's
    outcome (`r = 1`: the whole seed), evaluated at the bin centre. Every earlier seeded group of that prompt, cut
    from a seed of the same outcome in that bin, adds its passes and trials (older counts decayed by
    `PASS_RATE_DECAY`). The estimate is the posterior mean, made monotone in `r` (non-decreasing for a seed that
    passed, non-increasing for one that failed: more of it kept, more like it) by a weighted pool-adjacent-violators
    fit with weights `trials + CUT_PRIOR_STRENGTH`. `choose` picks the bin whose estimate is closest to
    `target` (ties: the earliest cut), or None where the prompt has neither counts nor a pass rate (the caller then
    draws uniformly, as `cut_selection="ratio"` does). Pure NumPy on data every rank shares.
    """

    def __init__(self, low: float, high: float, target: float, counts: dict | None = None):
        self.edges = np.linspace(low, high, TARGET_RATIO_BINS + 1)
        self.target = target
        # prompt id -> "passed"/"failed" (the seed's outcome) -> per bin [passes, trials]
        self.counts: dict[str, dict[str, list[list[float]]]] = self.copy(counts or {})

    @staticmethod
    def copy(counts: dict) -> dict:
        """A deep copy of `counts` (prompt -> seed outcome -> per bin [passes, trials]), e.g. for a checkpoint."""
        return {key: {o: [list(cell) for cell in cells] for o, cells in by.items()} for key, by in counts.items()}

    def estimates(self, key: str, seed_passed: bool, prompt_rate: float | None) -> np.ndarray | None:
        """Posterior mean pass rate per bin, or None when nothing is known of the prompt."""
        cells = self.counts.get(key, {}).get(_outcome(seed_passed))
        if cells is None and prompt_rate is None:
            return None
        passes, trials = np.array(cells if cells is not None else [[0.0, 0.0]] * TARGET_RATIO_BINS).T
        centres = (self.edges[:-1] + self.edges[1:]) / 2
        rate = 0.5 if prompt_rate is None else prompt_rate
        prior = (1 - centres) * rate + centres * float(seed_passed)
        weights = trials + CUT_PRIOR_STRENGTH
        return monotone_fit((passes + CUT_PRIOR_STRENGTH * prior) / weights, weights, increasing=seed_passed)

    def choose(self, key: str, seed_passed: bool, prompt_rate: float | None, bounds) -> tuple[float, float] | None:
        """The ratio range (a bin, within the admissible `bounds`) to draw the cut from; None: draw uniformly."""
        estimates = self.estimates(key, seed_passed, prompt_rate)
        if estimates is None or bounds is None:
            return None
        low, high = bounds
        fits = (self.edges[:-1] < high) & (self.edges[1:] > low)
        if not fits.any():
            return None
        b = int(np.argmin(np.where(fits, np.abs(estimates - self.target), np.inf)))
        return max(float(self.edges[b]), low), min(float(self.edges[b + 1]), high)

    def observe(self, key: str, seed_passed: bool, ratio: float, passes: float, trials: float) -> None:
        b = int(np.clip(np.searchsorted(self.edges, ratio, side="right") - 1, 0, TARGET_RATIO_BINS - 1))
        cells = self.counts.setdefault(key, {}).setdefault(
            _outcome(seed_passed), [[0.0, 0.0] for _ in range(TARGET_RATIO_BINS)]
        )
        cells[b] = [PASS_RATE_DECAY * cells[b][0] + passes, PASS_RATE_DECAY * cells[b][1] + trials]


def monotone_fit(values: np.ndarray, weights: np.ndarray, increasing: bool = True) -> np.ndarray:
    """The weighted least-squares non-decreasing (else non-increasing) fit to `values`: pool adjacent violators."""
    sign = 1.0 if increasing else -1.0
    blocks: list[list[float]] = []  # [mean, weight, bins] per pooled block
    for value, weight in zip(sign * np.asarray(values, dtype=np.float64), weights):
        blocks.append([float(value), float(weight), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, weight, size = blocks.pop()
            last = blocks[-1]
            blocks[-1] = [(last[0] * last[1] + mean * weight) / (last[1] + weight), last[1] + weight, last[2] + size]
    return sign * np.repeat([b[0] for b in blocks], [int(b[2]) for b in blocks])


def _outcome(passed: bool) -> str:
    return "passed" if passed else "failed"


@dataclass(frozen=True)
class PlannerSettings:
    """The seeding settings a `GroupPlanner` reads, validated once by `SeedGRPOConfig` (its fields of the same names)."""

    seed: int = 0
    seed_method: str = "seeds"  # "seeds" or "replay"
    seed_fraction: float = 0.5
    seed_trigger: str = "fraction"  # "fraction" or "zero_std"
    seed_selection: str = "uniform"
    seed_min_age: int = 1
    seed_snapshot_only: bool = True
    cut_ratio_min: float = 0.1
    cut_ratio_max: float = 0.9
    cut_selection: str = "ratio"  # "ratio" or "target"
    target_pass_rate: float = 0.5
    success_threshold: float = 0.0
    replay_per_group: int = 1

    @classmethod
    def of(cls, config) -> PlannerSettings:
        """The planner's fields of `config` (a `SeedGRPOConfig`, or anything with those attributes)."""
        return cls(**{f: getattr(config, f) for f in cls.__dataclass_fields__})


class GroupPlanner:
    """Plans the seeded groups of every generation batch and keeps the pass rates that `passrate` selection reads.

    `settings` is a `PlannerSettings`; `budget` is `max_completion_length`;
    `max_positions` is the model's position limit (None: unbounded), which bounds the cuts of long prompts.
    """

    def __init__(
        self,
        settings: PlannerSettings,
        num_generations: int,
        budget: int,
        eos_token_ids: Collection[int],
        boundary_token_ids: Collection[int] | None = None,
        max_positions: int | None = None,
        text_cuts: Mapping[str, np.ndarray] | None = None,
        agent_cuts: tuple[Sequence[int] | None, str] | None = None,
    ):
        self.settings = settings
        # Multi-turn runs (tools, environments): (the ids a tool-call markup starts with, `agent_cut_points`). Seeds
        # are then cut only at admissible points of their turns (`turns.py`); a seed without turns is not cut.
        self.agent_cuts = agent_cuts
        # rollout id -> the only positions a re-tokenised text seed may be cut at (its text boundaries)
        self.text_cuts = text_cuts or {}
        self.max_positions = max_positions
        self.num_generations = num_generations
        self.budget = budget
        self.eos_token_ids = frozenset(eos_token_ids)
        self.boundary_token_ids = boundary_token_ids
        self.pass_rates: dict[str, float] = {}  # prompt id -> moving pass rate of its plain (unseeded) rollouts
        self.reward_means: dict[str, float] = {}  # prompt id -> moving mean reward of its plain rollouts
        # prompt id -> its last whole plain group: 1 all-equal and passed, -1 all-equal and failed, 0 mixed
        self.last_plain: dict[str, int] = {}
        self.cut_outcomes = self._cut_outcomes()
        self._generation_key = (-1, 0)  # (global step, generations at that step)

    def _cut_outcomes(self, counts: dict | None = None) -> CutOutcomes:
        settings = self.settings
        return CutOutcomes(settings.cut_ratio_min, settings.cut_ratio_max, settings.target_pass_rate, counts)

    def reset(self, state: dict | None = None) -> None:
        """Starts a run: empty statistics, or those a checkpoint kept (`state()`)."""
        state = state or {}
        self.pass_rates = dict(state.get("pass_rates", {}))
        self.reward_means = dict(state.get("reward_means", {}))
        self.last_plain = dict(state.get("last_plain", {}))
        self.cut_outcomes = self._cut_outcomes(state.get("cut_outcomes"))
        self._generation_key = (-1, 0)

    def plan(
        self,
        bank,
        keys: Sequence[str],
        step: int,
        first_row: int,
        local_size: int,
        prompt_lengths: Sequence[int] | None = None,
    ) -> GroupPlan:
        """Decides which prompt groups of the global batch (`keys`: one prompt id per row) are seeded and where cut.

        `first_row` and `local_size` select this rank's rows of the global batch. `prompt_lengths` (tokens, one per
        row) are needed when `max_positions` is set.
        """
        settings, G = self.settings, self.num_generations
        group_keys = list(keys[::G])
        count = self._generation_key[1] + 1 if self._generation_key[0] == step else 0
        self._generation_key = (step, count)
        # A fresh generator per generation, keyed by (seed, step, count): every rank draws the same cuts, and the
        # torch RNG that TRL's sampling uses is never touched (seed_fraction=0 reproduces GRPOTrainer exactly).
        rng = np.random.default_rng([settings.seed, step, count])
        wanted = rng.random(len(group_keys)) < settings.seed_fraction
        if settings.seed_trigger == "zero_std":  # rescue seeding: only prompts whose last plain group taught nothing
            wanted &= np.array([self.last_plain.get(key, 0) != 0 for key in group_keys], dtype=bool)
        candidates = self._sample(bank, group_keys, step, rng)
        if settings.seed_method == "replay":
            rows = self._plan_replay(bank, group_keys, wanted, candidates, rng, step, first_row, local_size)
        else:
            group_lengths = list(prompt_lengths[::G]) if prompt_lengths is not None else None
            rows = self._plan_cuts(group_keys, wanted, candidates, rng, step, first_row, local_size, group_lengths)
        return GroupPlan(step=step, count=count, group_keys=list(group_keys), num_groups=len(group_keys), **rows)

    def _sample(self, bank, group_keys: Sequence[str], step: int, rng: np.random.Generator):
        """One seed per group as `seed_selection` says. With `seed_trigger="zero_std"`, a successful seed for a prompt
        whose last plain group all failed and a failed one for an all-passed prompt come first, where the bank has
        one; else the `seed_selection` one; else any eligible seed."""
        settings = self.settings
        sample = partial(bank.sample, group_keys, step, rng, min_age=settings.seed_min_age)
        chosen = sample(settings.seed_selection, snapshot_only=settings.seed_snapshot_only, pass_rates=self.pass_rates)
        if settings.seed_trigger != "zero_std":
            return chosen
        rates = {key: 0.0 if equal < 0 else 1.0 for key, equal in self.last_plain.items() if equal}
        preferred = sample("passrate", snapshot_only=settings.seed_snapshot_only, pass_rates=rates)
        if settings.seed_selection != "uniform":
            anything = sample("uniform", snapshot_only=settings.seed_snapshot_only)
            chosen = [c if c is not None else a for c, a in zip(chosen, anything)]
        return [p if p is not None else c for p, c in zip(preferred, chosen)]

    def _plan_cuts(self, group_keys, wanted, candidates, rng, step, first_row, local_size, lengths) -> dict:
        """`seed_method="seeds"`: every row of a chosen group continues from the same cut of the same seed.

        The ratio is drawn over the part of `[cut_ratio_min, cut_ratio_max]` that the budget admits (with
        `cut_selection="target"`, of the bin `CutOutcomes.choose` picks); a seed that no ratio in that range can cut
        (e.g. much longer than the budget) leaves its group plain, and is counted.
        """
        G = self.num_generations
        group_seeds, group_cuts, refused = [], [], 0
        for g, (want, seed) in enumerate(zip(wanted, candidates)):
            cut = None
            if seed is not None:
                budget = self._cut_budget(lengths[g] if lengths is not None else None)
                cut = self._cut(seed, group_keys[g], rng, budget)
                refused += bool(want and cut is None)
            if not want or cut is None:
                seed, cut = None, None
            group_seeds.append(seed)
            group_cuts.append(cut)
        rows = range(first_row, first_row + local_size)
        return dict(
            seeds=[group_seeds[r // G] for r in rows],
            cuts=[group_cuts[r // G] for r in rows],
            global_seeded=np.repeat([c is not None for c in group_cuts], G),
            global_prefix_len=np.repeat([c.k if c is not None else 0 for c in group_cuts], G),
            global_seed_age=[step - s.step for s in group_seeds if s is not None and s.step >= 0],
            group_cut_ratios=[c.ratio if c is not None else None for c in group_cuts],
            group_seed_passed=[self._passed(s) if s is not None else None for s in group_seeds],
            num_eligible_groups=sum(s is not None for s in candidates),
            num_refused_cuts=refused,
            num_external_groups=sum(s is not None and s.step == EXTERNAL_STEP for s in group_seeds),
            replayed=[False] * local_size,
            global_replayed=np.zeros(len(group_keys) * G, dtype=bool),
        )

    def _cut(self, seed: Seed, key: str, rng: np.random.Generator, budget: int) -> Cut | None:
        settings, ids = self.settings, seed.completion_ids
        low, high = settings.cut_ratio_min, settings.cut_ratio_max
        if self.agent_cuts is not None:
            if seed.tool_mask is None:
                return None  # a seed with no recorded turns cannot be restored in a multi-turn run
            admissible = self.turn_cuts(seed.rollout_id, ids, seed.tool_mask, budget)
            if settings.cut_selection == "target":
                bounds = turn_ratio_bounds(seed.tool_mask, admissible, budget, low, high)
                chosen = self.cut_outcomes.choose(key, self._passed(seed), self.pass_rates.get(key), bounds)
                low, high = chosen or (low, high)
            return draw_turn_cut(seed.tool_mask, rng, low, high, admissible, budget)
        if settings.cut_selection == "target":
            bounds = admissible_ratios(ids, self.eos_token_ids, budget, low, high)
            chosen = self.cut_outcomes.choose(key, self._passed(seed), self.pass_rates.get(key), bounds)
            low, high = chosen or (low, high)
        allowed = self.text_cuts.get(seed.rollout_id)
        return draw_cut(ids, rng, low, high, self.eos_token_ids, budget, self.boundary_token_ids, allowed)

    def turn_cuts(self, rollout_id: str, ids, tool_mask, budget: int) -> np.ndarray:
        """Where a multi-turn seed may be cut (`turns.admissible_cuts`): for a text seed only where its text may be
        (`text_cuts`), and with `cut_at_newline` at turn boundaries and after newlines (`turns.step_boundaries`)."""
        markup, points = self.agent_cuts
        admissible = admissible_cuts(ids, tool_mask, self.eos_token_ids, markup, points)
        allowed = self.text_cuts.get(rollout_id)
        if allowed is not None:
            admissible = np.intersect1d(admissible, allowed)
        if self.boundary_token_ids:
            admissible = step_boundaries(ids, tool_mask, admissible, self.boundary_token_ids, budget)
        return admissible

    def _passed(self, seed: Seed) -> bool:
        return bool(seed.reward > self.settings.success_threshold)

    def _cut_budget(self, prompt_length: int | None) -> int:
        """The budget a cut must leave: generation runs up to `budget` tokens past `prompt + k` whatever the row's
        own share (the batch's `max_new_tokens`), so `prompt + k + budget` must stay within the model's positions."""
        if self.max_positions is None or prompt_length is None:
            return self.budget
        return min(self.budget, self.max_positions - self.budget - prompt_length + 1)

    def _plan_replay(self, bank, group_keys, wanted, first_candidates, rng, step, first_row, local_size) -> dict:
        """`seed_method="replay"`: the last `replay_per_group` rows of a chosen group are whole old rollouts.

        A replayed row is planned as a "cut" at the rollout's full length (`k = len`, capped by the budget): the same
        fields then carry it through splicing, the importance weights, the metrics and the token counts, with nothing
        left to generate. The slots are drawn with replacement, like the seeds.
        """
        settings, G = self.settings, self.num_generations
        draws = [first_candidates] + [
            self._sample(bank, group_keys, step, rng) for _ in range(settings.replay_per_group - 1)
        ]
        seeds: list[Seed | None] = [None] * (len(group_keys) * G)
        for g, want in enumerate(wanted):
            group_draws = [d[g] for d in draws]
            if not want or any(d is None for d in group_draws):
                continue
            for slot, seed in enumerate(group_draws):
                seeds[g * G + G - settings.replay_per_group + slot] = seed
        cuts = [Cut(k=min(len(s.completion_ids), self.budget), ratio=1.0) if s else None for s in seeds]
        rows = slice(first_row, first_row + local_size)
        replayed = np.array([s is not None for s in seeds])
        return dict(
            seeds=seeds[rows],
            cuts=cuts[rows],
            global_seeded=np.zeros(len(seeds), dtype=bool),
            global_prefix_len=np.array([c.k if c else 0 for c in cuts]),
            global_seed_age=[step - s.step for s in seeds if s is not None and s.step >= 0],
            num_eligible_groups=sum(s is not None for s in first_candidates),
            replayed=list(replayed[rows]),
            global_replayed=replayed,
        )

    def observe(self, plan: GroupPlan, rewards: np.ndarray, passed: np.ndarray) -> None:
        """Moves each prompt's pass rate and mean reward toward those of its plain rows in this batch.

        `rewards` and `passed` hold one value per global row. Only plain rows count: a seeded or replayed row says
        how well the policy does from a given state, not from the prompt. Every rank sees the same gathered rewards,
        so every rank keeps the same statistics and plans the same seeds.
        """
        plain = ~(plan.global_seeded | plan.global_replayed)
        G = self.num_generations
        for g, key in enumerate(plan.group_keys):
            rows = slice(g * G, (g + 1) * G)
            if plain[rows].any():
                _decay_into(self.pass_rates, key, float(passed[rows][plain[rows]].mean()))
                scored = rewards[rows][plain[rows]]
                if np.isfinite(scored).any():
                    _decay_into(self.reward_means, key, float(np.nanmean(scored)))
        if self.settings.seed_trigger == "zero_std":
            self._observe_plain_groups(plan, rewards, passed, plain)
        if self.settings.cut_selection == "target":
            for g, (ratio, seed_passed) in enumerate(zip(plan.group_cut_ratios, plan.group_seed_passed)):
                if ratio is not None:
                    passes = float(passed[g * G : (g + 1) * G].sum())
                    self.cut_outcomes.observe(plan.group_keys[g], seed_passed, ratio, passes, G)

    def _observe_plain_groups(self, plan: GroupPlan, rewards: np.ndarray, passed: np.ndarray, plain) -> None:
        """Keeps, per prompt, whether its last whole plain group was all-equal (`seed_trigger="zero_std"`)."""
        G = self.num_generations
        equal = all_equal_groups(rewards, G)
        for g, key in enumerate(plan.group_keys):
            if plain[g * G : (g + 1) * G].all():
                self.last_plain[key] = (1 if passed[g * G : (g + 1) * G].mean() >= 0.5 else -1) if equal[g] else 0

    def state(self) -> dict:
        """What a checkpoint must keep for a resumed run to plan the same seeds (JSON-serialisable)."""
        return {
            "planner": {
                "pass_rates": dict(self.pass_rates),
                "reward_means": dict(self.reward_means),
                "last_plain": dict(self.last_plain),
                "cut_outcomes": CutOutcomes.copy(self.cut_outcomes.counts),
            }
        }


def without_groups(plan: GroupPlan, groups: Collection[int], num_generations: int, first_row: int) -> GroupPlan:
    """`plan` with the seeded global `groups` turned plain (e.g. an environment that could not replay their prefix)."""
    if not groups:
        return plan
    G, dropped = num_generations, set(groups)
    seeded_groups = [g for g in range(plan.num_groups) if plan.global_seeded[g * G]]
    global_seeded, global_prefix_len = plan.global_seeded.copy(), plan.global_prefix_len.copy()
    for g in dropped:
        global_seeded[g * G : (g + 1) * G] = False
        global_prefix_len[g * G : (g + 1) * G] = 0
    local = [(first_row + i) // G in dropped for i in range(len(plan.cuts))]
    kept_ages = [age for g, age in zip(seeded_groups, plan.global_seed_age) if g not in dropped]
    return replace(
        plan,
        seeds=[None if d else s for s, d in zip(plan.seeds, local)],
        cuts=[None if d else c for c, d in zip(plan.cuts, local)],
        global_seeded=global_seeded,
        global_prefix_len=global_prefix_len,
        global_seed_age=kept_ages if len(plan.global_seed_age) == len(seeded_groups) else plan.global_seed_age,
        group_cut_ratios=[None if g in dropped else r for g, r in enumerate(plan.group_cut_ratios)],
        group_seed_passed=[None if g in dropped else p for g, p in enumerate(plan.group_seed_passed)],
    )


def _decay_into(stats: dict[str, float], key: str, value: float) -> None:
    old = stats.get(key)
    stats[key] = value if old is None else PASS_RATE_DECAY * old + (1 - PASS_RATE_DECAY) * value


def state_advantages(rewards: np.ndarray, plan: GroupPlan, num_generations: int, planner: GroupPlanner) -> np.ndarray:
    """Per global row, the advantage of the state a seeded group starts from: `V(state) - b(prompt)` (else 0).

    `V(state)` is the mean reward of the group's continuations from `prompt + seed[:k]`, an unbiased estimate of the
    state's value under the current policy. `b(prompt)` is the prompt's value without a prefix: the mean reward of
    its plain rows in this batch when it has any, else the moving mean of its earlier plain rows
    (`planner.reward_means`). A prompt with neither gets 0: its prefix actions are not trained this batch.
    """
    G = num_generations
    plain = ~(plan.global_seeded | plan.global_replayed)
    in_batch: dict[str, list[float]] = {}
    for g, key in enumerate(plan.group_keys):
        rows = slice(g * G, (g + 1) * G)
        in_batch.setdefault(key, []).extend(rewards[rows][plain[rows]].tolist())
    advantages = np.zeros(len(rewards), dtype=np.float64)
    for g, key in enumerate(plan.group_keys):
        rows = slice(g * G, (g + 1) * G)
        if not plan.global_seeded[rows].any():
            continue
        scored = [r for r in in_batch[key] if np.isfinite(r)]
        baseline = float(np.mean(scored)) if scored else planner.reward_means.get(key)
        group = rewards[rows]
        if baseline is not None and np.isfinite(group).any():
            advantages[rows] = float(np.nanmean(group)) - baseline
    return advantages
