"""Multi-turn seeds: where a tool-using trajectory may be cut, and which of its recorded tool calls a prefix holds.

A multi-turn rollout is the token ids after the prompt: model turns (`tool_mask` 1) and tool results with the next
assistant header (`tool_mask` 0), as TRL's tool loop concatenates them. A cut must leave a prefix the tool loop can
continue from: at a turn boundary (right after a tool result, before the model's next turn) or inside a model text span,
never inside a tool result and never inside or after a tool-call markup (the call would be half written, or written
and never run). Pure NumPy, unit-tested in tests/test_agentic_turns.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from .cutting import Cut
from .settings import AGENT_CUT_POINTS


def runs(tool_mask: Sequence[int]) -> list[tuple[int, int, bool]]:
    """The maximal runs of `tool_mask` as `(start, end, is_model)`, in order."""
    mask = np.asarray(tool_mask, dtype=np.int8)
    if not mask.size:
        return []
    edges = np.flatnonzero(np.diff(mask)) + 1
    starts, ends = np.r_[0, edges], np.r_[edges, mask.size]
    return [(int(s), int(e), bool(mask[s])) for s, e in zip(starts, ends)]


def find(ids: Sequence[int], pattern: Sequence[int], start: int, end: int) -> int | None:
    """The first position in `ids[start:end]` where `pattern` begins, or None."""
    n = len(pattern)
    if not n:
        return None
    first = pattern[0]
    for i in range(start, end - n + 1):
        if ids[i] == first and list(ids[i : i + n]) == list(pattern):
            return i
    return None


def admissible_cuts(
    seed_ids: Sequence[int],
    tool_mask: Sequence[int],
    eos_token_ids: Collection[int],
    markup_ids: Sequence[int] | None,
    points: str = "any",
) -> np.ndarray:
    """Every `k` (1 <= k < len) at which the trajectory may be cut, sorted.

    Turn boundaries: the end of each tool-result run that a model turn follows. With `points="any"`, also every
    position inside a model run up to the start of its tool-call markup (`markup_ids`, e.g. the ids of `<tool_call>`)
    and, in a run that calls no tool, up to its first EOS. A model run that a tool result follows but whose markup is
    not found (a template whose calls do not start with `markup_ids`) admits no inner cut: safe, if fewer cuts.
    """
    if points not in AGENT_CUT_POINTS:
        raise ValueError(f"agent_cut_points must be one of {AGENT_CUT_POINTS}, got {points!r}.")
    if len(seed_ids) != len(tool_mask):
        raise ValueError(f"A multi-turn seed has {len(seed_ids)} token ids but a tool mask of {len(tool_mask)}.")
    spans = runs(tool_mask)
    cuts: list[int] = []
    for index, (start, end, is_model) in enumerate(spans):
        if not is_model:
            if end < len(seed_ids):
                cuts.append(end)  # after a tool result, before the next assistant turn
            continue
        if points == "turns":
            continue
        calls_tool = index + 1 < len(spans)
        markup = find(seed_ids, markup_ids, start, end) if markup_ids else None
        if calls_tool and markup is None:
            continue
        last = end - 1 if markup is None else markup
        eos = next((i for i in range(start, end) if seed_ids[i] in eos_token_ids), None)
        if eos is not None:
            last = min(last, eos)
        cuts.extend(range(start + 1, last + 1))
    return np.unique(np.asarray([k for k in cuts if 1 <= k < len(seed_ids)], dtype=np.int64))


def step_boundaries(
    seed_ids: Sequence[int],
    tool_mask: Sequence[int],
    admissible: np.ndarray,
    boundary_token_ids: Collection[int],
    budget: int,
) -> np.ndarray:
    """`cut_at_newline` for a multi-turn seed: the admissible cuts that are a turn boundary or follow a token holding a
    newline inside a model turn. All of `admissible` when none of those leaves a token of `budget`, as a single-turn
    cut keeps its ratio when no newline lies in range (a seed without tool calls and without newlines still seeds)."""
    fits = admissible[admissible <= budget - 1]
    stepped = [int(k) for k in fits if not tool_mask[k - 1] or int(seed_ids[k - 1]) in boundary_token_ids]
    return np.asarray(stepped, dtype=np.int64) if stepped else admissible


def turn_ratio_bounds(
    tool_mask: Sequence[int], admissible: np.ndarray, budget: int, low: float, high: float
) -> tuple[float, float] | None:
    """The part of `[low, high]` that the admissible cuts within `budget` span, as ratios over the model tokens (for
    `cut_selection="target"`, which picks a bin of it); `[low, high]` when they span less; None when none fits."""
    fits = admissible[admissible <= budget - 1]
    if not fits.size:
        return None
    model_before = np.r_[0, np.cumsum(np.asarray(tool_mask, dtype=np.int64))]
    ratios = model_before[fits] / max(int(model_before[-1]), 1)
    lo, hi = max(low, float(ratios.min())), min(high, float(ratios.max()))
    return (lo, hi) if lo < hi else (low, high)


def choose_turn_cut(tool_mask: Sequence[int], ratio: float, admissible: np.ndarray, budget: int) -> Cut | None:
    """Cuts at `floor(ratio * model tokens)` model tokens, snapped to the nearest admissible `k` that leaves at least
    one token of `budget` (ties: the earlier cut); None when no admissible cut fits."""
    fits = admissible[admissible <= budget - 1]
    if not fits.size:
        return None
    model_before = np.r_[0, np.cumsum(np.asarray(tool_mask, dtype=np.int64))]  # model tokens before each position
    target = max(math.floor(ratio * model_before[-1]), 1)
    distance = np.abs(model_before[fits] - target) * 2 + (model_before[fits] > target)
    return Cut(k=int(fits[np.argmin(distance)]), ratio=ratio)


def draw_turn_cut(
    tool_mask: Sequence[int], rng: np.random.Generator, low: float, high: float, admissible: np.ndarray, budget: int
) -> Cut | None:
    """Draws `r` uniformly in `[low, high]` and cuts there (`choose_turn_cut`); draws nothing when no cut fits."""
    if not admissible[admissible <= budget - 1].size:
        return None
    ratio = float(rng.uniform(low, high)) if high > low else float(low)
    return choose_turn_cut(tool_mask, ratio, admissible, budget)


@dataclass(frozen=True)
class PrefixTurns:
    """What the first `k` tokens of a multi-turn seed hold, in its recorded messages."""

    messages: list[dict]  # the whole messages before the cut: assistant turns with their calls, tool results
    tool_calls: list[dict]  # the calls those assistant turns made, in order (each `{"name", "arguments"}`)
    observations: list[str]  # the recorded result of each call, as TRL put it in the tool message
    partial_start: int  # where the cut turn starts in the ids (== k at a turn boundary)


def prefix_turns(tool_mask: Sequence[int], k: int, messages: Sequence[dict]) -> PrefixTurns:
    """Splits a seed's recorded messages at a cut `k`: the turns wholly before it, and the calls they replay.

    Each tool-result run before `k` closes one assistant turn that called tools; its results are the tool messages
    that follow that turn. `messages` is the rollout's completion as TRL returned it (assistant and tool messages).
    """
    tool_ends = [end for _, end, is_model in runs(tool_mask) if not is_model and end <= k]
    closed, partial_start = len(tool_ends), max(tool_ends, default=0)
    kept: list[dict] = []
    calls: list[dict] = []
    observations: list[str] = []
    turns = 0
    for message in messages:
        if message.get("role") == "assistant":
            if turns == closed:
                break
            if not message.get("tool_calls"):
                raise ValueError(
                    "A seed's turn that a tool result follows has no tool calls in its recorded messages."
                )
            turns += 1
            kept.append(message)
            for call in message.get("tool_calls") or []:
                function = call.get("function", call)
                calls.append({"name": function["name"], "arguments": function.get("arguments", {})})
        elif message.get("role") == "tool" and kept:
            kept.append(message)
            observations.append(
                message["content"] if isinstance(message["content"], str) else json.dumps(message["content"])
            )
    if turns < closed:
        raise ValueError(f"The seed's messages hold {turns} tool-calling turns, its tool mask {closed}.")
    return PrefixTurns(messages=kept, tool_calls=calls, observations=observations, partial_start=partial_start)
