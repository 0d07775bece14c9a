"""Seeds in TRL's tool-call loop: the tool-call markup of a chat template, environment replay, and a seeded row's turns.

TRL 1.16 runs tools by parsing each completion, calling the tools, and regenerating from the concatenated ids
(`GRPOTrainer._tool_call_loop`). A seeded row's first generation is the prompt, the prefix's whole turns (model turns
and tool results, as ids) and the cut turn's first part; the loop then continues as for any row. With `tools` the
transcript is the state; with `environment_factory` the environment, already `reset(**row)` by TRL, replays the
prefix's recorded calls, and a row whose observations differ from the recorded ones is not seeded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from ..method.turns import PrefixTurns

MARKUP_SENTINEL = "ts_trl_markup_probe"  # a tool name no template spells by itself


def tool_call_markup_ids(tokenizer) -> list[int] | None:
    """The ids that open a tool call in the chat template's assistant turn (e.g. `<tool_call>`), or None.

    Found by rendering an assistant turn with and without a call: the first line of what the call adds, up to the
    tool's name (`<tool_call>` for Qwen2.5, `[` for the embedded agent tasks' `A: text [add a=1 b=2]`). A cut inside a
    model turn stays before it (`turns.admissible_cuts`).
    """
    user = {"role": "user", "content": "x"}
    call = {"type": "function", "function": {"name": MARKUP_SENTINEL, "arguments": {}}}
    try:
        plain = tokenizer.apply_chat_template([user, {"role": "assistant", "content": ""}], tokenize=False)
        called = tokenizer.apply_chat_template(
            [user, {"role": "assistant", "content": "", "tool_calls": [call]}], tokenize=False
        )
    except Exception:  # noqa: BLE001 - any template failure means: no inner cuts in calling turns
        return None
    common = 0
    while common < min(len(plain), len(called)) and plain[common] == called[common]:
        common += 1
    if 0 < common < len(called) and not (called[common].isspace() or called[common - 1].isspace()):
        # The renderings part inside a word (both go on with the same "<" before "|im_end|>" and "tool_call>"): the
        # markup starts where that word does. Not at the line's start, which may hold the turn's header ("A:").
        common = max(called.rfind(space, 0, common) for space in (" ", "\n", "\t")) + 1
    added = called[common : called.find(MARKUP_SENTINEL)].strip()
    marker = added.split("\n")[0].strip() if added else ""
    if not marker:
        return None
    return tokenizer.encode(marker, add_special_tokens=False) or None


def check_replayable(environment_pool: dict | None) -> None:
    """An environment that declares `replayable = False` cannot be restored to a seed's state: seeding refuses it."""
    for name, instances in (environment_pool or {}).items():
        environment = instances[0]
        if getattr(environment, "replayable", True) is False:
            label = type(environment).__name__ + (f" ({name!r})" if name is not None else "")
            raise ValueError(
                f"The environment {label} declares replayable=False, so a seed's state cannot be restored in it; "
                "use seed_method='none' with it, or make its tool calls replayable from reset(**row)."
            )


def tool_result_text(result) -> str:
    """A tool's result as TRL writes it into the tool message (`str(result)`; errors as `{'error': ...}`)."""
    return result if isinstance(result, str) else str(result)


def replay_calls(sync_tools: dict, async_tools: dict, loop, turns: PrefixTurns) -> bool:
    """Replays `turns.tool_calls` in order with the row's environment tools; True when every result is as recorded."""
    if len(turns.tool_calls) != len(turns.observations):
        return False
    for call, recorded in zip(turns.tool_calls, turns.observations):
        name, arguments = call["name"], call["arguments"]
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        try:
            if name in sync_tools:
                result = sync_tools[name](**arguments)
            elif name in async_tools and loop is not None:
                result = asyncio.run_coroutine_threadsafe(async_tools[name](**arguments), loop).result()
            else:
                raise ValueError(f"Tool {name} not found.")
        except Exception as error:  # noqa: BLE001 - TRL records a failing call as its error; so does the replay
            result = {"error": str(error)}
        if tool_result_text(result) != recorded:
            return False
    return True


def merged_tool_masks(
    response_masks: Sequence[Sequence[int]], loop_masks: Sequence[Sequence[int]] | None, lengths: Sequence[int]
) -> list[list[int]]:
    """Per row: the first call's mask (prefix mask, then 1s) times the tool loop's, then the loop's for later turns."""
    merged = []
    for i, first in enumerate(response_masks):
        loop = list(loop_masks[i]) if loop_masks is not None else [1] * lengths[i]
        head = [a * b for a, b in zip(first, loop[: len(first)])]
        merged.append(head + loop[len(first) :])
    return merged
