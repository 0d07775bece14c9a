"""Seeds in TRL's tool-call loop: the tool-call markup of a chat template, environment replay, and a seeded row's turns.

TRL 1.16 runs tools by parsing each completion, calling the tools, and regenerating from the concatenated ids
(`GRPOTrainer._tool_call_loop`). A seeded row's first generation is the prompt, the prefix's whole turns (model turns
and tool results, as ids) and the cut turn's first part; the loop then continues as for any row. With `tools` the
transcript is the state; with `environment_factory` the environment, already `reset(**row)` by TRL, replays the
prefix's recorded calls, and a row whose observations differ from the recorded ones is not seeded.

`ToolLoopSeeds` is the one object the trainer's hooks call for all of it, in their order: `restore` (prefix turns,
replay, undo), `first_turn_masks` and `loss_masks`, `lead` and `close` around TRL's loop, and `even_turn` where
every rank must take every turn together.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch
from accelerate.utils import gather_object
from trl.chat_template_utils import parse_response

from ..method.planning import GroupPlan, without_groups
from ..method.turns import PrefixTurns, prefix_turns
from .seed_batch import PLACEHOLDER_PROMPT, SeedBatch, reset_prompt

logger = logging.getLogger(__name__)
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


def seed_tool_masks(plan: GroupPlan, masks: list[list[int]]) -> None:
    """Over each multi-turn seeded row's prefix, in place: the seed's own tool mask (1 on model tokens, 0 on tool
    results), where TRL's loop would mark the whole first call as model tokens."""
    for i in plan.multi_turn_rows:
        k = plan.cuts[i].k
        masks[i][:k] = [int(x) for x in plan.seeds[i].tool_mask[:k]]


class ToolLoopSeeds:
    """The multi-turn seeds of one `SeedGRPOTrainer` in TRL's tool loop, in the order the trainer's hooks call them.

    It reads the trainer's per-batch tool state as TRL sets it (`environments`, the rows' tool dicts) and writes the
    batch's prefix turns into `SeedBatch.turns`.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.told_other_prompt = False  # `_reset` said once that a reset made another prompt than the row's

    # `_generate`, before generation ------------------------------------------------------------------------------

    def restore(self, batch: SeedBatch) -> None:
        """Finds each seeded row's prefix turns and, with environments, replays their calls in the row's environment
        (TRL has just reset it with the row); a group any of whose rows sees another result than recorded is planned
        plain on every rank, its environments reset again. Logs the multi-turn seeding metrics."""
        t, plan = self.trainer, batch.plan
        G, first = t.num_generations, t.accelerator.process_index * len(plan.cuts)
        turns = {
            i: prefix_turns(plan.seeds[i].tool_mask, plan.cuts[i].k, json.loads(plan.seeds[i].messages))
            for i in plan.multi_turn_rows
        }
        seeded_groups = int(plan.global_seeded[::G].sum())
        mismatched = set()
        if t.environments:
            mismatched = self._replay(turns, first)
            for i in turns:
                if (first + i) // G in mismatched:  # undo the partial replay: the row runs plain from the prompt
                    self._reset(batch, i)
            batch.plan = without_groups(plan, mismatched, G, first)
            turns = {i: prefix for i, prefix in turns.items() if (first + i) // G not in mismatched}
        batch.turns = turns
        self._log(turns, len(mismatched), seeded_groups)

    def _replay(self, turns: dict[int, PrefixTurns], first: int) -> set[int]:
        """Replays each row's prefix calls in its environment; the global groups where one mismatched, on every rank."""
        t = self.trainer
        loop = getattr(t, "async_loop", None)
        mismatched = {
            (first + i) // t.num_generations
            for i, prefix in turns.items()
            if not replay_calls(t._sync_tool_dicts[i], t._async_tool_dicts[i], loop, prefix)
        }
        if t.accelerator.num_processes > 1:
            mismatched = {g for part in gather_object([sorted(mismatched)]) for g in part}
        return mismatched

    def _reset(self, batch: SeedBatch, row: int) -> None:
        """Resets local `row`'s environment with its dataset row, as TRL did before the replay; says once in the log
        when this reset makes another prompt than the one the row is generated from (a reset drawing at random)."""
        t = self.trainer
        kwargs = batch.inputs[row]
        if t._multi_environment:
            kwargs = {k: v for k, v in kwargs.items() if k != "environment"}
        observation = t.environments[row].reset(**kwargs)
        made = reset_prompt(batch.inputs[row].get("prompt", PLACEHOLDER_PROMPT), observation)
        if batch.prompts is not None and made != batch.prompts[row] and not self.told_other_prompt:
            self.told_other_prompt = True
            logger.warning(
                "reset(**row), called again to undo a replay that answered otherwise than recorded, made another "
                "prompt than the one the row is generated from: its environment may hold another task than its "
                "prompt shows. Make reset(**row) a function of the row (e.g. of a task id column)."
            )

    def _log(self, turns: dict[int, PrefixTurns], mismatched: int, seeded_groups: int) -> None:
        """`seeds/prefix_turns_mean`, and with environments `seeds/replay_mismatch_share` and
        `seeds/replayed_tool_calls_mean`: over the rows still seeded once mismatched groups turned plain."""
        t = self.trainer
        assistant_turns = sum(sum(m["role"] == "assistant" for m in prefix.messages) for prefix in turns.values())
        replayed = sum(len(prefix.tool_calls) for prefix in turns.values()) if t.environments else 0
        local = torch.tensor([len(turns), assistant_turns, replayed], device=t.accelerator.device)
        totals = t.accelerator.gather(local.reshape(1, 3)).sum(0)
        metrics = t._metrics["train"]
        if totals[0] > 0:
            metrics["seeds/prefix_turns_mean"].append(float(totals[1] / totals[0]))
        if t.environments and seeded_groups:
            metrics["seeds/replay_mismatch_share"].append(mismatched / seeded_groups)
            metrics["seeds/replayed_tool_calls_mean"].append(float(totals[2]) / max(float(totals[0]), 1.0))

    # `_generate_single_turn` and `_generate`: the masks --------------------------------------------------------

    def first_turn_masks(self, plan: GroupPlan, masks: list[list[int]]) -> None:
        """In `prefix_mode="action"`, in place: a multi-turn prefix trains its model tokens, never its tool results."""
        if self.trainer.args.prefix_mode == "action":
            seed_tool_masks(plan, masks)

    def loss_masks(self, batch: SeedBatch, completion_ids, loop_masks) -> list[list[int]] | None:
        """Records each whole rollout's tool mask (1 on model tokens, 0 on tool results) in the batch, and returns the
        loss mask for TRL's `tool_mask` slot: the first call's mask times the loop's where a row was seeded."""
        plan = batch.plan
        masks = [
            list(loop_masks[i]) if loop_masks is not None else [1] * len(ids) for i, ids in enumerate(completion_ids)
        ]
        seed_tool_masks(plan, masks)
        batch.generation.tool_masks = masks
        if not plan.any_seeded:
            return loop_masks
        return merged_tool_masks(batch.generation.response_masks, loop_masks, [len(c) for c in completion_ids])

    # `_tool_call_loop` ---------------------------------------------------------------------------------------------

    def lead(self, batch: SeedBatch | None, prompts, prompt_ids, completion_ids, completions) -> None:
        """Before TRL's loop, in place: each seeded row's history is its prefix's turns, and its cut turn is parsed
        whole (prefix part and continuation), so that the loop continues it."""
        t = self.trainer
        for i, prefix in self._turns(batch).items():
            prompts[i] = [*prompts[i], *prefix.messages]
            start = prefix.partial_start
            context = [*prompt_ids[i], *completion_ids[i][:start]]
            completions[i] = [
                parse_response(t._tokenizer, completion_ids[i][start:], prefix=context, tools=self._tools_of(i))
            ]

    def close(self, batch: SeedBatch | None, completions) -> None:
        """After TRL's loop, in place: the prefix's messages lead each seeded row's completion."""
        for i, prefix in self._turns(batch).items():
            completions[i] = [*prefix.messages, *completions[i]]

    @staticmethod
    def _turns(batch: SeedBatch | None) -> dict[int, PrefixTurns]:
        return batch.turns if batch is not None and batch.turns is not None else {}

    def _tools_of(self, row: int) -> list:
        """The tools local row `row`'s prompt was rendered with (its environment's, with environments)."""
        t = self.trainer
        if t.environment_factories is not None:
            return t._env_tools[t._batch_environments[row]]
        return t.tools

    # every rank, every turn ----------------------------------------------------------------------------------------

    def even_turn(self, prompt_ids, images, generate: Callable):
        """One tool-loop turn taken by every rank together (`SeededBackend.collective_calls`): TRL's loop assumes
        every rank takes as many turns with as many rows, but seeded rows cut after their calls, or rows that simply
        stop calling tools, leave a rank with fewer turns than another. Each rank's rows are padded to the most any
        rank has with filler rows that generate one token (an EOS prompt, asked for one token or forced to end at
        once); a rank whose loop is over sends fillers only. `generate(prompt_ids, images)` is TRL's own turn.
        Returns this rank's completions and log-probs, or None once no rank has a row left."""
        t = self.trainer
        counts = gather_object([len(prompt_ids)])
        most = max(counts)
        if most == 0:
            return None
        n, fills, eos = len(prompt_ids), most - len(prompt_ids), t.eos_token_ids[0]
        padded = [*prompt_ids, *[[eos]] * fills]
        if images is not None:
            images = [*images, *[None] * fills]
        # vLLM: a filler's request leaves it one token, as a prefix of max_completion_length - 1 tokens would.
        fillers = np.concatenate([[0] * c + [t.max_completion_length - 1] * (most - c) for c in counts])
        local = fillers[t.accelerator.process_index * most :][:most]
        forced = () if t.use_vllm else [[]] * n + [[eos]] * fills  # HF generate: the filler ends at once
        with t.backend.patched(fillers, local, t.max_completion_length, forced, samples=1):
            ids, logprobs = generate(padded, images)
        return ids[:n], logprobs[:n] if logprobs is not None else None
