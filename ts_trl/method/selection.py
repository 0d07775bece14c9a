"""Which earlier rollout of a prompt seeds its group: eligibility (age, length, snapshot) and the selection rules.

The policy reads a bank through six narrow methods (`prompt_ranges`, `by_prompt`, `steps`, `rewards`, `lengths`,
`num_snapshotted`, plus `success_threshold`), so it never touches how `ts_trl.store.bank.SeedBank` stores rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EXTERNAL_STEP = np.iinfo(np.int32).min  # rollouts from another run (seed_dataset) are older than any step
REJECTION_ROUNDS = 4  # draws per prompt before `draw_seeds` looks at all of a prompt's candidates
# What one prompt's draw asks for: `passrate` turns into one of these per prompt.
_UNIFORM, _OLDEST, _SUCCESS, _FAILURE = range(4)
_WANTS = {"uniform": _UNIFORM, "oldest": _OLDEST, "success": _SUCCESS, "failure": _FAILURE}


@dataclass(frozen=True)
class Seed:
    """A stored rollout handed out for seeding."""

    index: int
    rollout_id: str
    prompt_id: str
    completion_ids: np.ndarray
    logprobs: np.ndarray
    reward: float
    step: int
    tool_mask: np.ndarray | None = None  # multi-turn rollouts: 1 on model tokens, 0 on tool results
    messages: str | None = None  # multi-turn rollouts: JSON of the completion's messages (calls and tool results)


def draw_seeds(
    bank,
    prompt_ids: Sequence[str],
    step: int,
    rng: np.random.Generator,
    selection: str = "uniform",
    min_age: int = 1,
    snapshot_only: bool = True,
    pass_rates: dict[str, float] | None = None,
) -> np.ndarray:
    """The bank index of one eligible rollout per prompt (-1 where there is none), drawn according to `selection`.

    A rollout is eligible at step `t` when it was generated at a step `<= t - min_age`, has at least two tokens (one to
    keep as prefix, one to cut away), and, with `snapshot_only`, is part of a written snapshot. `passrate` steers each
    group toward a 50% pass rate: prompts the policy mostly fails (`pass_rates` < 0.5) get successful seeds (reward >
    the bank's success threshold), prompts it mostly solves get failing ones; unknown prompts are uniform.
    """
    if selection not in _WANTS and selection != "passrate":  # `SeedBank.sample` is public: refuse, as the config does
        raise ValueError(f"seed_selection must be one of {(*_WANTS, 'passrate')}, got {selection!r}.")
    if selection == "passrate":
        rates = pass_rates or {}
        want = np.array(
            [_UNIFORM if rates.get(p) is None else (_SUCCESS if rates[p] < 0.5 else _FAILURE) for p in prompt_ids],
            dtype=np.int8,
        )
    else:
        want = np.full(len(prompt_ids), _WANTS[selection], dtype=np.int8)
    eligible = _Eligibility(bank, step, min_age, snapshot_only)
    chosen = np.full(len(prompt_ids), -1, dtype=np.int64)
    # First by rejection: draw one of each prompt's rollouts uniformly and keep it if it is eligible. Accepted draws
    # are uniform among the eligible rollouts, and the cost is a few reads per prompt wherever the bank's rollouts
    # are, not one per candidate: flat in the bank's size. `oldest` needs every candidate.
    starts, counts = bank.prompt_ranges(prompt_ids)
    pending = np.flatnonzero((counts > 0) & (want != _OLDEST))
    for _ in range(REJECTION_ROUNDS):
        if not pending.size:
            break
        drawn = bank.by_prompt(starts[pending] + rng.integers(counts[pending]))
        accept = eligible(drawn, want[pending])
        chosen[pending[accept]] = drawn[accept]
        pending = pending[~accept]
    # Then exactly, over every candidate: prompts with few eligible rollouts, none, or `oldest`.
    rest = np.flatnonzero((chosen < 0) & (counts > 0))
    if rest.size:
        chosen[rest] = _draw_exhaustive(bank, eligible, starts[rest], counts[rest], want[rest], rng)
    return chosen


class _Eligibility:
    """Whether rollouts may seed at this step, and have the outcome their prompt's draw asks for."""

    def __init__(self, bank, step: int, min_age: int, snapshot_only: bool):
        self.bank, self.step, self.min_age, self.snapshot_only = bank, step, min_age, snapshot_only

    def __call__(self, indices: np.ndarray, want: np.ndarray) -> np.ndarray:
        bank = self.bank
        keep = (bank.steps(indices) <= self.step - self.min_age) & (bank.lengths(indices) >= 2)
        if self.snapshot_only:
            keep &= indices < bank.num_snapshotted
        if ((want == _SUCCESS) | (want == _FAILURE)).any():
            success = bank.rewards(indices) > bank.success_threshold
            keep &= np.where(want == _SUCCESS, success, np.where(want == _FAILURE, ~success, True))
        return keep


def _draw_exhaustive(
    bank, eligible: _Eligibility, starts: np.ndarray, counts: np.ndarray, want: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """One eligible rollout per prompt range (-1 where none), looking at every candidate. Linear in their number."""
    group = np.repeat(np.arange(len(counts)), counts)
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    indices = bank.by_prompt(starts[group] + within)
    kept = np.flatnonzero(eligible(indices, want[group]))  # positions in `indices`, still grouped by prompt
    kept_counts = np.bincount(group[kept], minlength=len(counts))
    has_seed = kept_counts > 0
    first, sizes = (np.cumsum(kept_counts) - kept_counts)[has_seed], kept_counts[has_seed]
    picks = first + rng.integers(sizes)  # uniform among each prompt's kept candidates
    oldest = (want == _OLDEST)[has_seed]
    if oldest.any():
        kept_steps = bank.steps(indices[kept])
        for j in np.flatnonzero(oldest):  # argmin: the first of the oldest
            picks[j] = first[j] + np.argmin(kept_steps[first[j] : first[j] + sizes[j]])
    chosen = np.full(len(counts), -1, dtype=np.int64)
    chosen[has_seed] = indices[kept[picks]]
    return chosen
