"""The seed bank: every rollout the run has produced, kept in compact arrays and sampled per prompt.

Token ids (int32) and behaviour log-probs (float32) live in a few large chunks rather than in Python lists, so a
bank of 10^5 rollouts x 512 tokens costs about 0.4 GB. Per-rollout metadata are parallel NumPy arrays; each prompt
keeps the positions of its rollouts so `sample` costs time in the rollouts of that prompt, not in the bank's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

SEED_SELECTIONS = ("uniform", "oldest", "success", "failure", "passrate")
EXTERNAL_STEP = np.iinfo(np.int32).min  # rollouts from another run (seed_dataset) are older than any step
_PROMPT_ROW = np.dtype([("index", np.int64), ("step", np.int32), ("length", np.int32), ("reward", np.float32)])
_NO_ROWS = np.empty(0, dtype=_PROMPT_ROW)


@dataclass(frozen=True)
class Rollout:
    """One generated response, as written to the seed dataset (one Parquet row)."""

    rollout_id: str
    prompt_id: str
    prompt: str
    completion: str
    completion_ids: Sequence[int]
    logprobs: Sequence[float]
    reward: float
    step: int
    prefix_len: int = 0
    seed_origin: str | None = None
    rewards: dict[str, float] = field(default_factory=dict)  # per reward function


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


class _ChunkedArray:
    """An append-only store of variable-length rows in a few contiguous chunks (no per-row Python objects).

    Chunks double up to `max_chunk` elements. NumPy asks for huge pages on large arrays, so a fresh chunk is soon
    resident in full: the cap bounds that slack to one chunk (4 MB of int32), not half the bank.
    """

    def __init__(self, dtype, first_chunk: int = 1 << 16, max_chunk: int = 1 << 20):
        self.dtype = np.dtype(dtype)
        self.chunks: list[np.ndarray] = []
        self.used = 0  # tokens used in the last chunk
        self.next_size = first_chunk
        self.max_chunk = max_chunk

    def append(self, values: np.ndarray) -> tuple[int, int]:
        n = len(values)
        if not self.chunks or self.used + n > len(self.chunks[-1]):
            size = max(self.next_size, n)
            self.chunks.append(np.empty(size, dtype=self.dtype))
            self.next_size = min(self.next_size * 2, self.max_chunk)
            self.used = 0
        start = self.used
        self.chunks[-1][start : start + n] = values
        self.used += n
        return len(self.chunks) - 1, start

    def get(self, chunk: int, start: int, length: int) -> np.ndarray:
        return self.chunks[chunk][start : start + length]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)


class _GrowableColumn:
    """A NumPy column with amortised appends."""

    __slots__ = ("data", "size")

    def __init__(self, dtype, capacity: int = 1024):
        self.data = np.empty(capacity, dtype=dtype)
        self.size = 0

    def append(self, value) -> None:
        if self.size == len(self.data):
            self.data = np.resize(self.data, 2 * len(self.data))
        self.data[self.size] = value
        self.size += 1

    @property
    def values(self) -> np.ndarray:
        return self.data[: self.size]


class SeedBank:
    """Stores rollouts and hands out seeds: earlier rollouts of a prompt that the current policy may restart from.

    A rollout is eligible as a seed at step `t` when it was generated at a step `<= t - min_age`, has at least two
    tokens (one to keep as prefix, one to cut away), and, with `snapshot_only`, is already part of a written snapshot.
    Rollouts loaded from another run's seed dataset are always old enough.
    """

    def __init__(self, success_reward: str | None = None, success_threshold: float = 0.0):
        # A rollout succeeded when its `success_reward` (a reward function's name; None: the weighted total) is
        # above `success_threshold`; the bank keeps that reward as each rollout's `reward`.
        self.success_reward, self.success_threshold = success_reward, success_threshold
        self._ids = _ChunkedArray(np.int32)
        self._logps = _ChunkedArray(np.float32)
        self._chunk = _GrowableColumn(np.int32)
        self._start = _GrowableColumn(np.int64)
        self._length = _GrowableColumn(np.int32)
        self._step = _GrowableColumn(np.int32)  # EXTERNAL_STEP for rollouts of another run
        self._reward = _GrowableColumn(np.float32)
        self.rollout_ids: list[str] = []
        self.prompt_ids: list[str] = []
        # Per prompt, what eligibility reads, side by side: `sample` touches only the asked prompts' rows, so its
        # cost does not grow with the bank (a per-prompt list of indices into bank-wide columns cache-missed per row).
        self._by_prompt: dict[str, _GrowableColumn] = {}
        self._by_rollout_id: dict[str, int] = {}
        self.num_snapshotted = 0  # rollouts [0, num_snapshotted) are in a written snapshot (or external)

    def __len__(self) -> int:
        return len(self.rollout_ids)

    def __contains__(self, rollout_id: str) -> bool:
        return rollout_id in self._by_rollout_id

    def add(
        self,
        rollout_id: str,
        prompt_id: str,
        completion_ids: Sequence[int],
        logprobs: Sequence[float],
        reward: float,
        step: int,
        external: bool = False,
    ) -> int:
        """Stores one rollout and returns its index; log-probs must align with the token ids."""
        ids = np.asarray(completion_ids, dtype=np.int32)
        logps = np.asarray(logprobs, dtype=np.float32)
        if ids.shape != logps.shape:
            raise ValueError(
                f"Rollout {rollout_id!r} has {len(ids)} token ids but {len(logps)} log-probs; they must align."
            )
        if rollout_id in self._by_rollout_id:
            raise ValueError(f"Rollout {rollout_id!r} is already in the seed bank.")
        index = len(self.rollout_ids)
        chunk, start = self._ids.append(ids)
        self._logps.append(logps)  # same chunk sizes, hence the same (chunk, start)
        self._chunk.append(chunk)
        self._start.append(start)
        self._length.append(len(ids))
        self._step.append(EXTERNAL_STEP if external else step)
        self._reward.append(np.nan if reward is None else reward)
        self.rollout_ids.append(rollout_id)
        self.prompt_ids.append(prompt_id)
        rows = self._by_prompt.get(prompt_id)
        if rows is None:
            rows = self._by_prompt[prompt_id] = _GrowableColumn(_PROMPT_ROW, capacity=4)
        rows.append((index, EXTERNAL_STEP if external else step, len(ids), np.nan if reward is None else reward))
        self._by_rollout_id[rollout_id] = index
        if external:
            if index != self.num_snapshotted:
                raise ValueError("Rollouts of another run must be loaded before this run's own rollouts.")
            self.num_snapshotted += 1
        return index

    def add_rollouts(self, rollouts: Sequence[Rollout]) -> None:
        for r in rollouts:
            reward = r.rewards.get(self.success_reward, r.reward) if self.success_reward else r.reward
            self.add(r.rollout_id, r.prompt_id, r.completion_ids, r.logprobs, reward, r.step)

    def mark_snapshotted(self) -> None:
        """Records that every rollout stored so far is part of a written snapshot."""
        self.num_snapshotted = len(self)

    def get(self, index: int) -> Seed:
        return self._get_many(np.array([index]))[0]

    def lookup(self, rollout_id: str) -> Seed:
        return self.get(self._by_rollout_id[rollout_id])

    def eligible(self, prompt_id: str, step: int, min_age: int, snapshot_only: bool = True) -> np.ndarray:
        """Indices of the rollouts of `prompt_id` that may seed a group at `step`."""
        rows = self._prompt_rows(prompt_id)
        return rows["index"][self._eligible(rows, step, min_age, snapshot_only)]

    def _prompt_rows(self, prompt_id: str) -> np.ndarray:
        rows = self._by_prompt.get(prompt_id)
        return _NO_ROWS if rows is None else rows.values

    def _eligible(self, rows: np.ndarray, step: int, min_age: int, snapshot_only: bool) -> np.ndarray:
        keep = (rows["step"] <= step - min_age) & (rows["length"] >= 2)
        if snapshot_only:
            keep &= rows["index"] < self.num_snapshotted
        return keep

    def sample(
        self,
        prompt_ids: Sequence[str],
        step: int,
        rng: np.random.Generator,
        selection: str = "uniform",
        min_age: int = 1,
        snapshot_only: bool = True,
        pass_rates: dict[str, float] | None = None,
    ) -> list[Seed | None]:
        """Draws one seed per prompt (None where the prompt has no eligible seed) according to `selection`.

        `passrate` steers each group toward a 50% pass rate: prompts the policy mostly fails (`pass_rates` < 0.5)
        get successful seeds (reward > success_threshold), prompts it mostly solves get failing ones; unknown prompts
        are uniform.
        """
        if selection not in SEED_SELECTIONS:
            raise ValueError(f"seed_selection must be one of {SEED_SELECTIONS}, got {selection!r}.")
        # Vectorised over the candidates of all prompts at once: one NumPy pass instead of a few calls per prompt,
        # which kept a 256-prompt draw above 5 ms. Cost: linear in the rollouts of the asked prompts.
        per_prompt = [self._prompt_rows(prompt_id) for prompt_id in prompt_ids]
        counts = np.fromiter(map(len, per_prompt), dtype=np.int64, count=len(per_prompt))
        # Concatenated as raw bytes: NumPy would otherwise promote the structured dtype pair by pair, in Python.
        rows = np.concatenate([r.view(np.uint8) for r in per_prompt]).view(_PROMPT_ROW) if per_prompt else _NO_ROWS
        group = np.repeat(np.arange(len(per_prompt)), counts)
        keep = self._eligible(rows, step, min_age, snapshot_only)
        wants = [selection] * len(per_prompt)
        if selection == "passrate":
            rates = pass_rates or {}
            wants = [
                "uniform" if rates.get(p) is None else ("success" if rates[p] < 0.5 else "failure") for p in prompt_ids
            ]
        if "success" in wants or "failure" in wants:
            want = np.array([SEED_SELECTIONS.index(w) for w in wants], dtype=np.int8)[group]
            success = rows["reward"] > self.success_threshold
            keep &= np.where(want == SEED_SELECTIONS.index("success"), success, True)
            keep &= np.where(want == SEED_SELECTIONS.index("failure"), ~success, True)
        kept = np.flatnonzero(keep)  # positions in `rows`, still grouped by prompt
        kept_counts = np.bincount(group[kept], minlength=len(per_prompt))
        has_seed = kept_counts > 0
        starts, sizes = (np.cumsum(kept_counts) - kept_counts)[has_seed], kept_counts[has_seed]
        picks = starts + rng.integers(sizes)  # uniform among each prompt's kept candidates
        oldest = np.array([w == "oldest" for w in wants])[has_seed]
        if oldest.any():
            kept_steps = rows["step"][kept]
            for j in np.flatnonzero(oldest):  # argmin: the first of the oldest
                picks[j] = starts[j] + np.argmin(kept_steps[starts[j] : starts[j] + sizes[j]])
        chosen = rows["index"][kept[picks]]
        seeds: list[Seed | None] = [None] * len(per_prompt)
        for position, seed in zip(np.flatnonzero(has_seed).tolist(), self._get_many(chosen)):
            seeds[position] = seed
        return seeds

    def _get_many(self, indices: np.ndarray) -> list[Seed]:
        """The seeds at `indices`, with the per-rollout columns read in one go (the token arrays are views)."""
        columns = (self._chunk, self._start, self._length, self._reward, self._step)
        chunks, starts, lengths, rewards, steps = (c.data[indices].tolist() for c in columns)
        return [
            Seed(
                index=index,
                rollout_id=self.rollout_ids[index],
                prompt_id=self.prompt_ids[index],
                completion_ids=self._ids.chunks[chunk][start : start + length],
                logprobs=self._logps.chunks[chunk][start : start + length],
                reward=reward,
                step=step,
            )
            for index, chunk, start, length, reward, step in zip(
                indices.tolist(), chunks, starts, lengths, rewards, steps
            )
        ]

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (token ids, log-probs and per-rollout columns), excluding Python strings."""
        columns = (self._chunk, self._start, self._length, self._step, self._reward)
        return self._ids.nbytes + self._logps.nbytes + sum(c.data.nbytes for c in columns)
