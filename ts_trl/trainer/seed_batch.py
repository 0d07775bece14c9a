"""One generation batch of a seeded run as one record: the plan, decided before generation, and what came back.

`SeedBatch` is the trainer's only per-batch state. `_generate_and_score_completions` makes it from the plan (with
environments, `_generate` plans it once TRL's `reset(**row)` made the prompts: `ResetPrompts`); the TRL
hooks it runs fill in `generation` in order (`_generate_single_turn` the loss masks, `_generate` the responses,
`_calculate_rewards` the rewards); it is dropped once the batch is scored and banked. The functions below are pure:
which rows reach the backend with which prompt (`generation_request`), how each response is put back together
(`assemble_responses`), and the rollouts the batch banks (`pending_rollouts`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..method.cutting import SeedSplicer, Splice
from ..method.planning import GroupPlan
from ..store.schema import Rollout, prompt_id_of
from ..store.seed_store import PendingRollout
from .prefix_forcing import strip_forced

PROMPT_LENGTHS_KEPT = 1 << 16  # distinct prompts whose token counts a trainer remembers
# The planner's key for a group whose rows `reset(**row)` gave different prompts: no rollout is banked under it.
UNMATCHED_GROUP = "\0group of different prompts"
PLACEHOLDER_PROMPT = [{"role": "user", "content": ""}]  # TRL's prompt for an environment row without one

logger = logging.getLogger(__name__)


@dataclass
class Generation:
    """What generation and scoring returned for this rank's rows; each field is set once, by the hook named."""

    response_masks: list[list[int]] | None = None  # `_generate_single_turn`: prefix mask, then 1 per generated token
    completion_ids: list[list[int]] | None = None  # `_generate`: whole responses (prefix + continuation)
    completions: list | None = None  # `_generate`: their decoded text (or messages)
    sampling_logprobs: list | None = None  # `_generate`: the backend's (None on prefix tokens); None with HF generate
    rewards_per_func: object = None  # `_calculate_rewards`: a tensor gathered over all ranks, one row per rollout
    first_turn_done: bool = False  # `_generate_single_turn`: the seeded call made; tool-loop calls after it are plain
    tool_masks: list[list[int]] | None = None  # `_generate`: TRL's tool mask of each whole rollout (tools only)


@dataclass
class SeedBatch:
    """The plan of one generation batch and what generation made of it."""

    plan: GroupPlan | None  # None in an environment run until `_generate`: its prompts are known after TRL's reset
    mask_truncated: bool  # TRL's `mask_truncated_completions`, applied through the loss mask instead (see trainer)
    generation: Generation = field(default_factory=Generation)
    inputs: list | None = None  # this rank's dataset rows (an environment is reset with its row again)
    prompts: list | None = None  # environment runs: each local row's prompt as `reset(**row)` made it (`ResetPrompts`)
    keys: list[str] | None = None  # ... and its seed key
    turns: dict | None = None  # multi-turn seeds: local row -> `turns.PrefixTurns` of its prefix

    @property
    def global_prefix_lens(self) -> np.ndarray:
        """Per global row, the prefix its prompt ends with (replayed rows are generated, if at all, from the prompt)."""
        return np.where(self.plan.global_seeded, self.plan.global_prefix_len, 0)


@dataclass(frozen=True)
class GenerationRequest:
    """What one seeded backend call is asked, per local row, and which local rows are sent at all."""

    splices: list[Splice | None]  # None: a plain or replayed row
    prompts: list[list[int]]  # the prompt ids, followed by the part of the prefix spliced into them
    forced: list[list[int]]  # prefix tokens `generate` is made to emit first (static HF generate only)
    rows: list[int]  # the local rows sent to the backend, in order
    budget: int  # the most new tokens any row of the global batch needs

    def sent(self, per_row: Sequence) -> list:
        """`per_row` (one item per local row) restricted to the rows sent, in the order they are sent."""
        return [per_row[i] for i in self.rows]

    @property
    def prefix_lens(self) -> list[int]:
        """Per row sent: the length of the prefix its prompt ends with (forced tokens included)."""
        return [len(s.prefix_ids) if s is not None else 0 for s in self.sent(self.splices)]


def generation_request(
    prompt_ids: Sequence[Sequence[int]],
    plan: GroupPlan,
    splicer: SeedSplicer,
    max_completion_length: int,
    forces_prefixes: bool,
    any_rows: bool,
) -> GenerationRequest:
    """Splices each seeded row's prefix after its prompt and decides which rows the backend generates.

    Replayed rows are left out unless the backend takes only whole batches (`any_rows=False`: vLLM server, tensor-
    parallel colocate, per-row multimodal inputs); then they are generated and their output discarded. With
    `forces_prefixes` (static HF `generate`), only the prefix length every generated row of the global batch shares
    is spliced, and each row emits the rest of its prefix as forced first tokens (see `prefix_forcing.py`).
    """
    splices = [
        splicer(ids, seed.completion_ids, cut) if cut is not None and not replayed else None
        for ids, seed, cut, replayed in zip(prompt_ids, plan.seeds, plan.cuts, plan.replayed)
    ]
    prompts = [s.prompt_ids if s is not None else list(ids) for ids, s in zip(prompt_ids, splices)]
    rows = [i for i, replayed in enumerate(plan.replayed) if not replayed]
    if not rows or not any_rows:
        rows = list(range(len(prompts)))
    forced: list[list[int]] = [[] for _ in prompts]
    budget = int(max_completion_length - plan.global_prefix_len.min())
    if forces_prefixes:
        generating = ~plan.global_replayed
        common = int(plan.global_prefix_len[generating].min()) if generating.any() else 0  # the same on every rank
        budget = max_completion_length - common
        for i, splice in enumerate(splices):
            if splice is not None:
                prompts[i] = list(prompt_ids[i]) + list(splice.prefix_ids[:common])
                forced[i] = list(splice.prefix_ids[common:])
    return GenerationRequest(splices=splices, prompts=prompts, forced=forced, rows=rows, budget=budget)


def assemble_responses(
    plan: GroupPlan,
    request: GenerationRequest,
    continuations: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]] | None,
    max_completion_length: int,
) -> tuple[list[list[int]], list[list[int]], list[list[float | None]] | None]:
    """Per local row: the whole response, its loss mask, and its sampling log-probs (None when the backend gave none).

    A seeded row is its prefix and the continuation truncated to the budget the prefix leaves; a replayed row is the
    stored rollout whole (every token trained as an old action, none generated); a plain row is its continuation.
    Prefix tokens have no sampling log-prob: TRL treats None as "no correction" in its vLLM importance ratio.
    """
    own: list[list[int] | None] = [None] * len(request.prompts)
    own_logprobs: list = [None] * len(request.prompts)
    for j, i in enumerate(request.rows):
        own[i] = strip_forced(continuations[j], request.forced[i])
        own_logprobs[i] = logprobs[j] if logprobs is not None else None
    responses, masks, sampling = [], [], []
    for i, (splice, continuation) in enumerate(zip(request.splices, own)):
        if plan.replayed[i]:
            response = [int(t) for t in plan.seeds[i].completion_ids[: plan.cuts[i].k]]
            mask, k = [1] * len(response), len(response)
        elif splice is None:
            response, mask, k = list(continuation), [1] * len(continuation), 0
        else:
            response, mask = SeedSplicer.response(splice, list(continuation), max_completion_length)
            k = len(splice.prefix_ids)
        responses.append(response)
        masks.append(mask)
        if logprobs is not None:
            generated = list(own_logprobs[i][: len(response) - k]) if k < len(response) else []
            sampling.append([None] * k + generated)
    return responses, masks, (sampling if logprobs is not None else None)


def without_truncated(
    completion_ids: Sequence[Sequence[int]], truncated: Sequence[bool], loss_masks: Sequence[Sequence[int]] | None
) -> list[list[int]]:
    """The loss masks (None: all 1s) with every truncated row zeroed: TRL's `mask_truncated_completions`, applied
    through the loss mask rather than `completion_mask`, the attention mask of the forward passes."""
    masks = loss_masks if loss_masks is not None else [None] * len(completion_ids)
    return [
        [0] * len(ids) if cut else (list(mask) if mask is not None else [1] * len(ids))
        for ids, cut, mask in zip(completion_ids, truncated, masks)
    ]


def prompt_key(row: dict) -> str:
    """The prompt id of a dataset row: its `prompt_id` when it has one, else the prompt's stable hash."""
    return str(row["prompt_id"]) if row.get("prompt_id") is not None else prompt_id_of(prompt_of(row))


def prompt_of(row: dict) -> str | list:
    """A row's prompt; for a row without one (its environment's `reset(**row)` makes the prompt), the row's fields as
    JSON: the row's own key (`row_keys`), its seed key where reset returned nothing."""
    if "prompt" in row:
        return row["prompt"]
    return json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)


def reset_prompt(prompt: list, observation) -> list:
    """The prompt TRL renders from a row's prompt and what `reset(**row)` returned: the observation appended to the last
    message's content (`GRPOTrainer._generate_and_score_completions`), the row's prompt itself for None."""
    if observation is None:
        return prompt
    content = prompt[-1]["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return [*prompt[:-1], {**prompt[-1], "content": content + observation}]


def row_keys(rows: Sequence[dict], prompts: Sequence | None = None) -> list[tuple[str, str]]:
    """Per row: its own key (`prompt_key`) and its seed key, the key of the prompt TRL rendered for it after
    `reset(**row)` when `prompts` are given (an environment run; the row's own key where reset returned nothing)."""
    keys = []
    for i, row in enumerate(rows):
        own = prompt_key(row)
        made = prompts is not None and prompts[i] != row.get("prompt", PLACEHOLDER_PROMPT)
        keys.append((own, prompt_id_of(prompts[i]) if made else own))
    return keys


class ResetPrompts:
    """Seed keys in an environment run, where `reset(**row)` may make or extend the prompt (TRL appends what it returns
    to the row's last message, after its own reset and before `_generate`): a row is keyed by the prompt it made.

    A row whose reset returned nothing keeps its own key (`prompt_key`), so that a `seed_dataset` matched to the
    training prompts still finds it. A prompt `reset` never makes again never seeds, and a group whose rows were
    given different prompts (each rollout has its own environment, reset on its own) is planned plain: both are said
    once in the log, the first time a row's reset makes another prompt than before. A `seed_dataset`'s seeds are
    matched to the rows' own prompts, so they never seed a row whose reset added to its prompt: said once too.
    """

    def __init__(self, num_generations: int, main_process: bool, seed_dataset: str | None = None):
        self.num_generations, self.main_process = num_generations, main_process
        self.seed_dataset = seed_dataset  # its seeds are matched to the rows' own prompts, before any reset
        self.made: dict[str, str] = {}  # row key -> key of the prompt its last reset made
        self.told = self.told_extended = False

    def planned(self, keys: Sequence[tuple[str, str]]) -> list[str]:
        """The planner's key of every global row (`row_keys` of every rank's rows, in order): its seed key, or
        `UNMATCHED_GROUP` for each row of a group of different prompts."""
        G, made = self.num_generations, [key for _, key in keys]
        if len(self.made) >= PROMPT_LENGTHS_KEPT:
            self.made.clear()
        changed = False
        for own, key in keys:
            changed |= self.made.setdefault(own, key) != key
            self.made[own] = key
        planned = list(made)
        for g in range(0, len(made), G):
            if len(set(made[g : g + G])) > 1:
                planned[g : g + G] = [UNMATCHED_GROUP] * G
        if self.seed_dataset is not None and not self.told_extended and any(own != key for own, key in keys):
            self.told_extended = True
            if self.main_process:
                logger.warning(
                    f"reset(**row) added to the prompt of a row, and the seeds of seed_dataset={self.seed_dataset!r} "
                    "are matched to the rows' prompts as the dataset gives them: those rows are keyed by the prompt "
                    "reset() made, so that data's seeds never seed them (the run's own rollouts still do). For "
                    "seed_dataset to seed them, have reset() return None and keep the whole task in the prompt."
                )
        if changed and not self.told:
            self.told = True
            if self.main_process:
                logger.warning(
                    "reset(**row) made another prompt for a row it had reset before (as an environment drawing a fresh "
                    "task at each reset does): seeds are keyed by the prompt reset() made, so a prompt it never makes "
                    "again is never seeded, and a group whose rollouts got different prompts trains plain."
                )
        return planned


class PromptLengths:
    """Token counts of prompts by prompt key, each prompt tokenized once by `tokenize` (a batch holds
    `num_generations` copies of each, and prompts come back every epoch); up to `PROMPT_LENGTHS_KEPT` are kept."""

    def __init__(self, tokenize):
        self.tokenize = tokenize  # prompts -> their token ids, as the generation backend will see them
        self.known: dict[str, int] = {}

    def __call__(self, rows: Sequence[dict], keys: Sequence[str]) -> list[int]:
        if len(self.known) >= PROMPT_LENGTHS_KEPT:
            self.known.clear()
        missing: dict[str, int] = {}
        for row, key in enumerate(keys):
            if key not in self.known:
                missing.setdefault(key, row)
        if missing:
            prompt_ids = self.tokenize([rows[row]["prompt"] for row in missing.values()])
            self.known.update((key, len(ids)) for key, ids in zip(missing, prompt_ids))
        return [self.known[key] for key in keys]


def pending_rollouts(
    batch: SeedBatch,
    rows: Sequence[dict],
    first_row: int,
    run_id: str,
    rewards: np.ndarray,
    reward_names: Sequence[str],
    policy_logprobs: np.ndarray | None,
) -> list[PendingRollout | None]:
    """The local rollouts of `batch` to bank, one per row (None for a replayed row: it is in the bank already).

    `rows` are this rank's dataset rows, the global batch's from `first_row` on; `rewards` the total reward of every
    global row. Behaviour log-probs are the backend's when it sampled them (vLLM), else `policy_logprobs` (TRL's
    pre-update forward) when given; otherwise the training forward fills them in (`SeedStore.fill_logprobs`).
    """
    plan, generation = batch.plan, batch.generation
    per_func = generation.rewards_per_func[first_row : first_row + len(rows)].tolist()
    pending: list[PendingRollout | None] = []
    for i, row in enumerate(rows):
        if plan.replayed[i]:
            pending.append(None)
            continue
        seed, cut = plan.seeds[i], plan.cuts[i]
        response, completion = generation.completion_ids[i], generation.completions[i]
        k = cut.k if cut is not None else 0
        prompt = prompt_of(row) if batch.prompts is None else batch.prompts[i]
        rollout = Rollout(
            rollout_id=f"{run_id}-{plan.step:06d}-{plan.count:02d}-{first_row + i:05d}",
            prompt_id=prompt_key(row) if batch.keys is None else batch.keys[i],
            prompt=prompt if isinstance(prompt, str) else json.dumps(prompt),
            completion=completion if isinstance(completion, str) else json.dumps(completion),
            completion_ids=np.asarray(response, np.int32),  # compact from here to the shard
            logprobs=(),
            reward=float(rewards[first_row + i]),
            step=plan.step,
            prefix_len=k,
            seed_origin=seed.rollout_id if seed is not None else None,
            rewards=dict(zip(reward_names, per_func[i])),
            tool_mask=generation.tool_masks[i] if generation.tool_masks is not None else None,
        )
        item = PendingRollout(rollout, prefix_logprobs=np.asarray(seed.logprobs[:k]) if k else np.zeros(0))
        if generation.sampling_logprobs is not None:
            item.logprobs = np.array([np.nan if x is None else x for x in generation.sampling_logprobs[i]], np.float32)
        elif policy_logprobs is not None:
            item.logprobs = policy_logprobs[i, : len(response)]
        pending.append(item)
    return pending
