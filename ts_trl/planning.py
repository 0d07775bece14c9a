"""Pure NumPy planning of Thinking Seeds: which prompt groups of a batch are seeded, from which seed, and cut where.

Nothing here touches torch or trainer state: the trainer gathers the prompt ids of the global batch and the rewards,
and this module turns them into a `GroupPlan` (the same on every rank, since every rank draws from the same
generator) and into per-prompt pass rates. Unit-tested in tests/test_planning.py with a hand-filled `SeedBank`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .bank import EXTERNAL_STEP, Seed, SeedBank
from .cutting import Cut, draw_cut

PASS_RATE_DECAY = 0.5  # weight of a prompt's previous pass rate (seed_selection="passrate") and mean reward


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
    num_groups: int = 0
    num_eligible_groups: int = 0
    num_refused_cuts: int = 0  # groups drawn for seeding whose seed admits no cut in the ratio range and the budget
    num_external_groups: int = 0  # seeded groups whose seed came from `seed_dataset` (another run or a trace dataset)

    @property
    def any_seeded(self) -> bool:
        return any(c is not None for c in self.cuts)


class GroupPlanner:
    """Plans the seeded groups of every generation batch and keeps the pass rates that `passrate` selection reads.

    `args` is a `SeedGRPOConfig` (only its seeding fields and `seed` are read); `budget` is `max_completion_length`;
    `max_positions` is the model's position limit (None: unbounded), which bounds the cuts of long prompts.
    """

    def __init__(
        self,
        args,
        num_generations: int,
        budget: int,
        eos_token_ids: Collection[int],
        boundary_token_ids: Collection[int] | None = None,
        max_positions: int | None = None,
        text_cuts: Mapping[str, np.ndarray] | None = None,
    ):
        self.args = args
        # rollout id -> the only positions a re-tokenised text seed may be cut at (its text boundaries)
        self.text_cuts = text_cuts or {}
        self.max_positions = max_positions
        self.num_generations = num_generations
        self.budget = budget
        self.eos_token_ids = frozenset(eos_token_ids)
        self.boundary_token_ids = boundary_token_ids
        self.pass_rates: dict[str, float] = {}  # prompt id -> moving pass rate of its plain (unseeded) rollouts
        self.reward_means: dict[str, float] = {}  # prompt id -> moving mean reward of its plain rollouts
        self._generation_key = (-1, 0)  # (global step, generations at that step)

    def reset(self, state: dict | None = None) -> None:
        """Starts a run: empty statistics, or those a checkpoint kept (`state()`)."""
        state = state or {}
        self.pass_rates = dict(state.get("pass_rates", {}))
        self.reward_means = dict(state.get("reward_means", {}))
        self._generation_key = (-1, 0)

    def plan(
        self,
        bank: SeedBank,
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
        args, G = self.args, self.num_generations
        group_keys = list(keys[::G])
        count = self._generation_key[1] + 1 if self._generation_key[0] == step else 0
        self._generation_key = (step, count)
        # A fresh generator per generation, keyed by (seed, step, count): every rank draws the same cuts, and the
        # torch RNG that TRL's sampling uses is never touched (seed_fraction=0 reproduces GRPOTrainer exactly).
        rng = np.random.default_rng([args.seed, step, count])
        wanted = rng.random(len(group_keys)) < args.seed_fraction
        candidates = self._sample(bank, group_keys, step, rng)
        if args.seed_method == "replay":
            rows = self._plan_replay(bank, group_keys, wanted, candidates, rng, step, first_row, local_size)
        else:
            group_lengths = list(prompt_lengths[::G]) if prompt_lengths is not None else None
            rows = self._plan_cuts(group_keys, wanted, candidates, rng, step, first_row, local_size, group_lengths)
        return GroupPlan(step=step, count=count, group_keys=list(group_keys), num_groups=len(group_keys), **rows)

    def _sample(self, bank: SeedBank, group_keys: Sequence[str], step: int, rng: np.random.Generator):
        args = self.args
        return bank.sample(
            group_keys, step, rng, args.seed_selection, args.seed_min_age, args.seed_snapshot_only, self.pass_rates
        )

    def _plan_cuts(self, group_keys, wanted, candidates, rng, step, first_row, local_size, lengths) -> dict:
        """`seed_method="seeds"`: every row of a chosen group continues from the same cut of the same seed.

        The ratio is drawn over the part of `[cut_ratio_min, cut_ratio_max]` that the budget admits; a seed that no
        ratio in that range can cut (e.g. much longer than the budget) leaves its group plain, and is counted.
        """
        args, G = self.args, self.num_generations
        group_seeds, group_cuts, refused = [], [], 0
        for g, (want, seed) in enumerate(zip(wanted, candidates)):
            cut = None
            if seed is not None:
                cut = draw_cut(
                    seed.completion_ids,
                    rng,
                    args.cut_ratio_min,
                    args.cut_ratio_max,
                    self.eos_token_ids,
                    self._cut_budget(lengths[g] if lengths is not None else None),
                    self.boundary_token_ids,
                    self.text_cuts.get(seed.rollout_id),
                )
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
            num_eligible_groups=sum(s is not None for s in candidates),
            num_refused_cuts=refused,
            num_external_groups=sum(s is not None and s.step == EXTERNAL_STEP for s in group_seeds),
            replayed=[False] * local_size,
            global_replayed=np.zeros(len(group_keys) * G, dtype=bool),
        )

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
        args, G = self.args, self.num_generations
        draws = [first_candidates] + [
            self._sample(bank, group_keys, step, rng) for _ in range(args.replay_per_group - 1)
        ]
        seeds: list[Seed | None] = [None] * (len(group_keys) * G)
        for g, want in enumerate(wanted):
            group_draws = [d[g] for d in draws]
            if not want or any(d is None for d in group_draws):
                continue
            for slot, seed in enumerate(group_draws):
                seeds[g * G + G - args.replay_per_group + slot] = seed
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

    def state(self) -> dict:
        """What a checkpoint must keep for a resumed run to plan the same seeds (JSON-serialisable)."""
        return {"planner": {"pass_rates": dict(self.pass_rates), "reward_means": dict(self.reward_means)}}


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
