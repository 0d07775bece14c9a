"""Agent traces as multi-turn seeds: chat messages with tool calls, checked and rendered as TRL's tool loop writes them.

A trace's turns (assistant messages with `tool_calls`, `role: "tool"` results) become what a banked multi-turn rollout
holds: the token ids after the prompt, TRL's tool mask (1 on model tokens, 0 on tool results) and TRL's messages. The
ids are built as `GRPOTrainer._tool_call_loop` builds a rollout's: each assistant turn as the chat template renders it
(up to its end-of-turn token, where generation stops), each run of tool results as TRL's own tool-result suffix
(`_get_tool_suffix_ids`, passed in by the trainer), concatenated, never re-tokenised as a whole.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

TRAJECTORY_ROLES = ("assistant", "tool")
PROBE_USER = {"role": "user", "content": "dummy"}  # the minimal conversation a turn is rendered after (as TRL does)


@dataclass(frozen=True)
class TurnTemplate:
    """How this run renders turns: its tokenizer and chat template, and TRL's tool-result suffix (the trainer's
    `_get_tool_suffix_ids`). Only multi-turn runs (`tools` or `environment_factory`) have one."""

    tokenizer: object
    tool_suffix_ids: Callable[[list[dict]], list[int]]
    chat_template: str | None = None
    chat_template_kwargs: dict = field(default_factory=dict)

    def key(self) -> str:
        """What the rendering depends on beyond the tokenizer (part of the text seeds' cache key)."""
        template = self.chat_template or getattr(self.tokenizer, "chat_template", None) or ""
        text = json.dumps([template, self.chat_template_kwargs], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _ids(self, conversation: list[dict], add_generation_prompt: bool) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            conversation,
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            chat_template=self.chat_template,
            return_dict=False,
            **self.chat_template_kwargs,
        )
        return list(ids[0] if ids and isinstance(ids[0], list) else ids)

    def assistant_ids(self, message: dict, where: str) -> list[int]:
        """The ids a policy writes for `message`: its rendering after a minimal conversation's generation prompt, up
        to and including its last end-of-turn token (the template's newline after it belongs to the next header)."""
        head = self._ids([PROBE_USER], add_generation_prompt=True)
        full = self._ids([PROBE_USER, message], add_generation_prompt=False)
        if full[: len(head)] != head:
            raise ValueError(
                f"{where}: the chat template renders an assistant turn that does not continue its own generation "
                "prompt, so the trace's turns cannot be written as the policy would write them. Seed this run from "
                "its own seed dataset instead."
            )
        turn = full[len(head) :]
        eos = getattr(self.tokenizer, "eos_token_id", None)
        ends = [i for i, token in enumerate(turn) if token == eos]
        return turn[: ends[-1] + 1] if ends else turn

    def trajectory_ids(self, turns: list[dict], where: str) -> tuple[list[int], list[int]]:
        """The ids of a checked trajectory (`agent_trajectory`) and its tool mask, as TRL's loop concatenates them."""
        ids: list[int] = []
        mask: list[int] = []
        results: list[dict] = []
        for message in [*turns, None]:
            if message is not None and message["role"] == "tool":
                results.append(message)
                continue
            if results:  # a run of tool results closes: TRL's suffix (results, then the next assistant header)
                suffix = list(self.tool_suffix_ids(results))
                ids += suffix
                mask += [0] * len(suffix)
                results = []
            if message is not None:
                turn = self.assistant_ids(message, where)
                ids += turn
                mask += [1] * len(turn)
        return ids, mask


def agent_trajectory(messages, where: str) -> tuple[list[dict], list[dict]]:
    """(the messages before the trajectory, the trajectory) of a chat trace, the trajectory in TRL's form.

    The trajectory is the trailing run of assistant and tool messages; what comes before it (system, user turns) is
    the prompt. Refused in one line naming the row's message and the fix: a tool call without a function name or
    whose arguments are not a JSON object, a tool result that answers no call, a turn whose calls are answered only
    in part before the next turn, and a turn without calls that more messages follow (in TRL's loop it ends the
    rollout). The last turn's calls may go unanswered (TRL drops results that would overflow the budget).

    Long: one message after another, each refusal next to the condition it names.
    """
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError(f"{where} holds {type(messages).__name__}, not chat messages (a list of role/content dicts).")
    start = len(messages)
    while start > 0 and messages[start - 1].get("role") in TRAJECTORY_ROLES:
        start -= 1
    while start < len(messages) and messages[start].get("role") != "assistant":
        if messages[start].get("role") == "tool":
            raise ValueError(
                f'{where}: message {start} is a tool result with no tool call before it; a `role: "tool"` message '
                "answers a call of the assistant turn before it. Add that call to the turn's tool_calls, or drop the "
                "tool message."
            )
        start += 1
    if start == len(messages):
        raise ValueError(
            f"{where} holds chat messages without an assistant turn: there is no trajectory to seed from."
        )
    turns: list[dict] = []
    calls: list[str] = []  # names of the open turn's calls
    answered = 0
    ended = False  # the last assistant turn made no call: its rollout ended there
    for j, message in enumerate(messages[start:], start=start):
        if message["role"] == "assistant":
            if ended or answered < len(calls):
                problem = (
                    "an assistant turn without tool calls ends a rollout in TRL's tool loop"
                    if ended
                    else f"the assistant turn before it made {len(calls)} tool call(s) but {answered} result(s) follow"
                )
                raise ValueError(
                    f'{where}: message {j} continues after {problem}. Give each call its `role: "tool"` result, in '
                    "order, before the next assistant turn, or end the trace there."
                )
            made = _calls(message, f"{where}: message {j}")
            calls = [call["function"]["name"] for call in made]
            turns.append(_assistant(message, made))
            answered, ended = 0, not calls
        else:
            if answered >= len(calls):
                raise ValueError(
                    f"{where}: message {j} is a tool result with no tool call left to answer (the assistant turn "
                    f"before it made {len(calls)}). Add the call to that turn's tool_calls, or drop the tool message."
                )
            name = message.get("name") or calls[answered]
            turns.append({"role": "tool", "name": name, "content": _text(message.get("content"))})
            answered += 1
    if 0 < answered < len(calls):
        raise ValueError(
            f"{where}: the last assistant turn made {len(calls)} tool call(s) but only {answered} result(s) follow. "
            "Give every call its result, or none (a trace may end on a turn whose calls were not run)."
        )
    return messages[:start], turns


def _calls(message: dict, where: str) -> list[dict]:
    """A message's tool calls in TRL's form (`{"type": "function", "function": {"name", "arguments": dict}}`)."""
    raw = message.get("tool_calls") or []
    if not isinstance(raw, list):
        raise ValueError(f"{where}: tool_calls holds {type(raw).__name__}, not a list of calls. {_CALL_FORM}")
    calls = []
    for c, call in enumerate(raw):
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise ValueError(f"{where}: tool_calls[{c}] has no function name. {_CALL_FORM}")
        if isinstance(call, dict) and call.get("type", "function") != "function":
            raise ValueError(
                f"{where}: tool_calls[{c}] is of type {call['type']!r}; only functions are run. {_CALL_FORM}"
            )
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                arguments = None
        if not isinstance(arguments, dict):
            raise ValueError(
                f"{where}: the arguments of tool_calls[{c}] ({function['name']!r}) are not a JSON object: "
                f"{str(function.get('arguments'))[:60]!r}. {_CALL_FORM}"
            )
        calls.append({"type": "function", "function": {"name": function["name"], "arguments": arguments}})
    return calls


_CALL_FORM = (
    'Write each call as {"type": "function", "function": {"name": "<tool>", "arguments": "<JSON object>"}}, or drop '
    "the row."
)


def _assistant(message: dict, calls) -> dict:
    turn = {"role": "assistant", "content": _text(message.get("content"))}
    if calls:
        turn["tool_calls"] = calls
    return turn


def _text(content) -> str:
    """A message's content as text: parts of type `text` joined; anything else as JSON (as banked rollouts do)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    return json.dumps(content)


def trajectory_text(turns: list[dict]) -> str:
    """The text of a trajectory's messages, for the length check before any is rendered."""
    parts = [m["content"] for m in turns]
    parts += [json.dumps(c["function"]) for m in turns for c in m.get("tool_calls") or []]
    return "\n".join(parts)


def turn_text_cuts(tokenizer, ids: list[int], tool_mask: list[int], retokenise) -> np.ndarray:
    """Where a rendered trajectory may be cut as a text seed: every turn boundary (after a tool result), and inside
    each model turn where `retokenise` (the text seeds' own check) finds a text boundary this tokenizer would cut the
    turn's text at. A turn whose text this tokenizer does not tokenise back to its ids keeps its boundary only."""
    mask = np.asarray(tool_mask, dtype=np.int8)
    edges = np.flatnonzero(np.diff(mask)) + 1
    starts, ends = np.r_[0, edges], np.r_[edges, mask.size]
    cuts: list[int] = []
    for start, end in zip(starts.tolist(), ends.tolist()):
        if not mask[start]:
            if end < len(ids):
                cuts.append(end)
            continue
        text = tokenizer.decode(ids[start:end], skip_special_tokens=False)
        turn_ids, inner = retokenise(text)
        if list(turn_ids) == list(ids[start:end]):
            cuts += [start + int(k) for k in inner]
    return np.unique(np.asarray([k for k in cuts if 1 <= k < len(ids)], dtype=np.int32))
