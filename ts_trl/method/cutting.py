"""Pure functions of Thinking Seeds: where to cut a seed, how to splice it after a prompt, how to weight its tokens.

Nothing here touches trainer state, so every rule of the cut, the budget and the prefix masks (docs/design.md) is
unit-tested with hand-written token lists. The trainer calls these and nothing else to cut, splice and mask.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Cut:
    """Where a seed is cut: its first `k` tokens become the prefix the current policy continues from."""

    k: int
    ratio: float  # the drawn length ratio r, before clipping and snapping


@dataclass(frozen=True)
class Splice:
    """A prompt with a seed prefix spliced after it, and the loss mask of the prefix tokens."""

    prompt_ids: list[int]  # prompt + prefix: what the generation backend continues from
    prefix_ids: list[int]
    prefix_mask: list[int]  # 0 per prefix token in "state" mode (context only), 1 in "action" mode (trained)


def max_cut(seed_ids: Sequence[int], eos_token_ids: Collection[int], budget: int) -> int:
    """The largest admissible `k`: below the seed's length, before its first EOS, leaving >= 1 token of budget."""
    limit = min(len(seed_ids) - 1, budget - 1)
    for position, token in enumerate(seed_ids[: limit + 1]):
        if token in eos_token_ids:
            return min(limit, position)
    return limit


def choose_cut(
    seed_ids: Sequence[int],
    ratio: float,
    eos_token_ids: Collection[int],
    budget: int,
    boundary_token_ids: Collection[int] | None = None,
    allowed: np.ndarray | None = None,
) -> Cut | None:
    """Cuts `seed_ids` at `k = floor(ratio * len(seed))`, clipped to `1 <= k <= max_cut`; None if no cut exists.

    With `boundary_token_ids` (e.g. the ids of tokens that contain a newline), `k` snaps to the nearest step
    boundary, i.e. a position right after such a token, when one lies within the admissible range. With `allowed`
    (the only positions a seed may be cut at: a re-tokenised text seed's text boundaries), `k` snaps to the nearest
    of them in the admissible range, and there is no cut when none lies in it.
    """
    upper = max_cut(seed_ids, eos_token_ids, budget)
    if upper < 1:
        return None
    k = min(max(math.floor(ratio * len(seed_ids)), 1), upper)
    if allowed is not None:
        admissible = allowed[(allowed >= 1) & (allowed <= upper)]
        if not admissible.size:
            return None
        return Cut(k=int(admissible[np.argmin(np.abs(admissible - k) * 2 + (admissible > k))]), ratio=ratio)
    if boundary_token_ids:
        boundaries = [i + 1 for i, token in enumerate(seed_ids[:upper]) if token in boundary_token_ids]
        if boundaries:
            k = min(boundaries, key=lambda b: (abs(b - k), b))
    return Cut(k=k, ratio=ratio)


class SeedSplicer:
    """The one place that splices a cut seed after a prompt and builds the prefix loss mask."""

    def __init__(self, prefix_mode: str = "state"):
        if prefix_mode not in ("state", "action"):  # a public class: direct users get the config's refusal too
            raise ValueError(f"prefix_mode must be one of ('state', 'action'), got {prefix_mode!r}.")
        self.prefix_mode = prefix_mode

    def __call__(self, prompt_ids: Sequence[int], seed_ids: Sequence[int], cut: Cut) -> Splice:
        if not 1 <= cut.k < len(seed_ids):
            raise ValueError(f"A cut must satisfy 1 <= k < len(seed) = {len(seed_ids)}, got k = {cut.k}.")
        # Plain ints: the bank stores int32 arrays, and the spliced ids go on to JSON (vLLM server) and foreign APIs.
        prefix_ids = [int(t) for t in seed_ids[: cut.k]]
        trained = 1 if self.prefix_mode == "action" else 0
        return Splice(
            prompt_ids=[int(t) for t in prompt_ids] + prefix_ids, prefix_ids=prefix_ids, prefix_mask=[trained] * cut.k
        )

    @staticmethod
    def response(splice: Splice, continuation_ids: Sequence[int], budget: int) -> tuple[list[int], list[int]]:
        """Joins prefix and continuation into the response, truncating the continuation to the budget left.

        Returns the response ids and their loss mask (the prefix mask, then 1 for every generated token).
        """
        continuation = list(continuation_ids[: max(budget - len(splice.prefix_ids), 0)])
        return splice.prefix_ids + continuation, splice.prefix_mask + [1] * len(continuation)


def continuation_budget(
    prefix_len: int, context_len: int, max_completion_length: int, max_model_len: int | None = None
) -> int:
    """How many tokens a row may generate: what its prefix leaves of `max_completion_length`, and no
    more than fits after its `context_len` prompt + prefix tokens in an engine of `max_model_len` positions.
    """
    budget = max_completion_length - prefix_len
    if max_model_len is not None:
        budget = min(budget, max_model_len - context_len)
    if budget < 1:
        raise ValueError(
            f"A prompt of {context_len - prefix_len} tokens with a seed prefix of {prefix_len} tokens leaves nothing to "
            f"generate within max_completion_length={max_completion_length} and the engine's max_model_len="
            f"{max_model_len}. Raise vllm_max_model_length (or the server's --max-model-len), or shorten the prompts."
        )
    return budget


def prefix_importance_weights(
    current_logps: torch.Tensor, behaviour_logps: torch.Tensor, prefix_mask: torch.Tensor, clip: float
) -> torch.Tensor:
    """Per-token weights `min(exp(logp_current - logp_behaviour), clip)` on prefix tokens and 1 elsewhere.

    Used in `prefix_mode="action"`: prefix tokens were sampled by an earlier policy, so their policy-gradient term is
    reweighted by a truncated token-level importance ratio (as TRL does for vLLM sampling mismatch).
    """
    ratio = torch.exp((current_logps - behaviour_logps).clamp(max=math.log(clip))).clamp(max=clip)
    return torch.where(prefix_mask.bool(), ratio, torch.ones_like(ratio))


def boundary_token_ids(tokenizer, marker: str = "\n") -> frozenset[int]:
    """The ids of vocabulary tokens whose text contains `marker` (step boundaries for `cut_at_newline`)."""
    ids = range(len(tokenizer))
    texts = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)
    return frozenset(i for i, text in zip(ids, texts) if marker in text)


def draw_ratio(rng: np.random.Generator, low: float, high: float) -> float:
    return float(rng.uniform(low, high)) if high > low else float(low)


def admissible_ratios(
    seed_ids: Sequence[int], eos_token_ids: Collection[int], budget: int, low: float, high: float
) -> tuple[float, float] | None:
    """The part of `[low, high]` whose cuts `floor(r * len(seed))` are admissible (`1 <= k <= max_cut`), or None.

    A seed longer than the budget (e.g. from a `seed_dataset` of a run with a larger `max_completion_length`) admits
    only small ratios; drawing `r` from all of `[low, high]` and clipping `k` would pile most cuts at the budget.
    """
    upper = max_cut(seed_ids, eos_token_ids, budget)
    if upper < 1:
        return None
    length = len(seed_ids)
    if low == high:  # a single ratio asked for: it fits or it does not
        return (low, high) if 1 <= math.floor(low * length) <= upper else None
    # k = floor(r * length) lies in [1, upper] exactly when r lies in [1 / length, (upper + 1) / length).
    lo, hi = max(low, 1 / length), min(high, (upper + 1) / length)
    return (lo, hi) if lo < hi else None


def draw_cut(
    seed_ids: Sequence[int],
    rng: np.random.Generator,
    low: float,
    high: float,
    eos_token_ids: Collection[int],
    budget: int,
    boundary_token_ids: Collection[int] | None = None,
    allowed: np.ndarray | None = None,
) -> Cut | None:
    """Draws `r` uniformly over the admissible part of `[low, high]` and cuts there; None if no ratio in it fits.

    Draws nothing from `rng` when the seed cannot be cut as asked, so the caller can count and skip it. `allowed`:
    see `choose_cut`.
    """
    bounds = admissible_ratios(seed_ids, eos_token_ids, budget, low, high)
    if bounds is None:
        return None
    return choose_cut(seed_ids, draw_ratio(rng, *bounds), eos_token_ids, budget, boundary_token_ids, allowed)
