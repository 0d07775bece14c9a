"""What `SeedGRPOTrainer` refuses at construction, before any generation: one clear line naming the problem and the fix."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import numpy as np

from ..method.cutting import max_cut

PROMPTS_CHECKED = 2000  # prompts of a dataset measured against the budget at construction


def check_processes_joined(args) -> None:
    """The launcher started several processes, but the training arguments see a world of one: on a machine without
    a GPU, accelerate joins processes (over gloo) only when `use_cpu` is set; otherwise it looks for a GPU backend,
    finds none and starts no process group, and each rank would train alone (DeepSpeed then refuses the batch size,
    and the ranks contend for one output_dir)."""
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if launched > 1 and args.world_size == 1:
        raise ValueError(
            f"{launched} processes were launched (WORLD_SIZE={launched}), but this one trains alone (world size 1): "
            f"accelerate found no GPU to join them over. On CPU, set use_cpu=True in the config (--use_cpu), which "
            "joins them over gloo; under DeepSpeed, with DS_ACCELERATOR=cpu."
        )


def check_seedable_rollouts(seed_method: str, trainer_kwargs: dict) -> None:
    """Seeds are spliced into TRL's own generation and tool loop: a custom `rollout_func` is refused, and so is
    `seed_method="replay"` with tools or environments (a replayed rollout would run its tool calls again)."""
    if seed_method == "none":
        return
    if trainer_kwargs.get("rollout_func"):
        raise ValueError(
            f"seed_method={seed_method!r} cannot be combined with `rollout_func`: a seed cannot be spliced into user "
            "rollout code. Use tools= or environment_factory= for multi-turn rollouts, or seed_method='none'."
        )
    if seed_method == "replay" and (trainer_kwargs.get("tools") or trainer_kwargs.get("environment_factory")):
        raise ValueError(
            "seed_method='replay' cannot be combined with `tools` or `environment_factory`: a replayed rollout would "
            "run its tool calls again. Use seed_method='seeds' for multi-turn rollouts."
        )


def check_tools_restorable(vision_language: bool, tools) -> None:
    """A tool result may hold images on a vision-language model, and a seed keeps token ids, not images."""
    if vision_language and tools:
        raise ValueError(
            "seed_method='seeds' cannot restore tool results on a vision-language model: a seed keeps token ids, not "
            "the images a tool returned. Use seed_method='none' for tools with a multimodal processing_class."
        )


def check_environment_rows(dataset, environments: bool, seed_dataset: str | None = None) -> bool:
    """True when an environment run's rows carry no prompt (or there are no rows: TRL's placeholder stands in), so
    that `reset(**row)` makes it; seeds are then keyed by the prompt it made (`seed_batch.ResetPrompts`). Refuses a
    `seed_dataset` there: it is matched to the training prompts at construction, before any reset made one."""
    if not environments:
        return False
    columns = getattr(dataset, "column_names", None) if dataset is not None else []
    if columns is None or "prompt" in columns:
        return False
    if seed_dataset is not None:
        raise ValueError(
            f"seed_dataset={seed_dataset!r} is matched to the training prompts, and these rows have none (reset() "
            "makes them). Leave seed_dataset unset, or give the training dataset a 'prompt' column."
        )
    return True


def check_one_generation_fits(dataset, generation_batch_size: int, num_generations: int) -> None:
    """TRL's sampler drops an incomplete generation batch, so a dataset smaller than one would train 0 steps."""
    if not hasattr(dataset, "__len__"):
        return
    prompts_per_generation = generation_batch_size // num_generations
    if len(dataset) < prompts_per_generation:
        raise ValueError(
            f"The training dataset has {len(dataset)} prompts, fewer than one generation takes "
            f"({prompts_per_generation} = generation_batch_size {generation_batch_size} / num_generations "
            f"{num_generations}), so training would stop after 0 steps. Add prompts, or lower "
            "per_device_train_batch_size, steps_per_generation or generation_batch_size."
        )


def check_prompt_ids(prompt_ids, prompts) -> None:
    """Seeds are banked and drawn by `prompt_id`: two prompts under one id would continue each other's rollouts."""
    first: dict[str, tuple[int, str]] = {}
    for index, (prompt_id, prompt) in enumerate(zip(prompt_ids, prompts)):
        if prompt_id is None:  # such a row's id is its prompt's hash
            continue
        text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False)
        seen, seen_text = first.setdefault(str(prompt_id), (index, text))
        if seen_text != text:
            raise ValueError(
                f"Rows {seen} and {index} of the training dataset share prompt_id {str(prompt_id)!r} but hold different "
                "prompts; seeds are banked by prompt_id, so one prompt would be continued from the other's rollouts. "
                "Give each prompt its own id, or drop the prompt_id column (each prompt's hash is then its id)."
            )


def check_seedable_dataset(
    dataset, tokenizer, max_completion_length: int, max_positions: int | None, engine_len: int | None
) -> None:
    """Fails on data that seeding cannot handle: no `prompt` column, empty prompts, prompts too long for the budget.

    `max_positions` is the model's position limit, `engine_len` a colocated vLLM engine's `max_model_len` (None:
    none; a vLLM server's limit is checked at each request).
    """
    columns = getattr(dataset, "column_names", None)
    if columns is not None and "prompt" not in columns:
        raise ValueError(
            f"The training dataset has no 'prompt' column (found {columns}). Rename the prompt column to "
            "'prompt', e.g. dataset.rename_column('question', 'prompt')."
        )
    if not hasattr(dataset, "__len__"):
        return  # an IterableDataset is checked batch by batch
    if columns is not None and "prompt_id" in columns:
        check_prompt_ids(dataset["prompt_id"], dataset["prompt"])
    prompts = (
        list(dataset.select(range(min(len(dataset), PROMPTS_CHECKED)))["prompt"]) if hasattr(dataset, "select") else []
    )
    for index, prompt in enumerate(prompts):
        if not prompt or (isinstance(prompt, str) and not prompt.strip()):
            raise ValueError(f"Row {index} of the training dataset has an empty prompt; drop or fill it.")
    longest = max(prompt_lengths(prompts, tokenizer), default=0)
    limit, fix = max_positions, "Shorten or filter the prompts, or lower max_completion_length."
    if engine_len is not None and (limit is None or engine_len < limit):
        limit, fix = engine_len, f"{fix[:-1]}, or raise vllm_max_model_length."
    if limit is not None and longest + max_completion_length > limit:
        where = f"model's {limit} positions" if limit == max_positions else f"vLLM engine's max_model_len={limit}"
        raise ValueError(
            f"A prompt of {longest} tokens plus max_completion_length={max_completion_length} exceeds the {where}. {fix}"
        )


def prompt_lengths(prompts, tokenizer) -> list[int]:
    """Token counts of text prompts, and of chat prompts as the chat template renders them (when there is one)."""
    texts = [p for p in prompts if isinstance(p, str)]
    lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]] if texts else []
    chats = [p for p in prompts if not isinstance(p, str)]
    if chats and getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=True)
        lengths += [len(ids) for ids in (rendered if isinstance(rendered, list) else rendered["input_ids"])]
    return lengths


def check_success_reward(success_reward: str | None, reward_names: list[str]) -> int:
    """The index of the reward function whose score decides success (`success_reward`, or the first)."""
    if success_reward is not None and success_reward not in reward_names:
        raise ValueError(
            f"success_reward={success_reward!r} is not one of the reward functions {reward_names}; "
            "set it to one of those names, or leave it unset to use the first."
        )
    return reward_names.index(success_reward or reward_names[0])


def check_seeds_cuttable(table, text_cuts: Mapping, eos_token_ids, budget: int, source: str, turn_cuts=None) -> None:
    """Refuses a `seed_dataset` none of whose seeds can ever be cut (empty, one token, an EOS first, or a text seed
    without a boundary within the budget): it would seed nothing, and the run would be plain GRPO without a word.

    `turn_cuts` (a multi-turn run's `GroupPlanner.turn_cuts`): seeds are cut at admissible points of their turns, and
    one without recorded turns (a single-turn run's seed dataset) not at all.
    """
    if table is None or table.num_rows == 0:
        return
    rows = _seed_rows(table, with_masks=turn_cuts is not None)  # a batch in Python at a time: 10^6 seeds' ids took GBs
    if turn_cuts is not None:
        for rollout_id, ids, mask in rows:
            if mask is not None and np.any(turn_cuts(rollout_id, ids, mask, budget) <= budget - 1):
                return
        raise ValueError(
            f"{source}: none of its {table.num_rows} seeds can be cut in this run with tools (none has recorded "
            f"turns, i.e. a `tool_mask`, with an admissible point within max_completion_length={budget}), so it "
            "would seed nothing. Seed from a run with tools, or from traces in chat `messages` form."
        )
    for rollout_id, ids, _ in rows:
        upper = max_cut(ids, eos_token_ids, budget)
        allowed = text_cuts.get(rollout_id)
        if upper >= 1 and (allowed is None or np.any((allowed >= 1) & (allowed <= upper))):
            return
    raise ValueError(
        f"{source}: none of its {table.num_rows} seeds can be cut (each is empty, one token long, starts with an EOS "
        f"token, or has no text boundary within max_completion_length={budget}), so it would seed nothing. Seed from "
        "a dataset of longer responses, or leave seed_dataset unset."
    )


def _seed_rows(table, with_masks: bool):
    """(rollout id, token ids, tool mask or None) of each row of a seed table, as Python values a batch at a time."""
    with_masks = with_masks and "tool_mask" in table.column_names
    for batch in table.to_batches(max_chunksize=1024):
        masks = batch.column("tool_mask").to_pylist() if with_masks else [None] * batch.num_rows
        yield from zip(batch.column("rollout_id").to_pylist(), batch.column("completion_ids").to_pylist(), masks)


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


def check_trainer_inputs(trainer, train_dataset, trainer_kwargs: dict) -> None:
    """Refuses, right after TRL's constructor and before any generation, what `trainer` cannot seed: the rollouts, the
    tools and environments, the dataset's rows and its prompts' lengths (each by one of the checks above)."""
    args = trainer.args
    check_seedable_rollouts(args.seed_method, trainer_kwargs)
    environment_prompts = False
    if args.seed_method != "none":
        check_replayable(getattr(trainer, "_environment_pool", None))
        check_tools_restorable(trainer._is_vlm, trainer.tools)
        environments = trainer.environment_factories is not None
        environment_prompts = check_environment_rows(train_dataset, environments, args.seed_dataset)
    if train_dataset is None:
        return
    check_one_generation_fits(train_dataset, args.generation_batch_size, trainer.num_generations)
    if args.seed_method != "none" and not environment_prompts:
        max_positions = getattr(trainer.model.config, "max_position_embeddings", None)
        engine_len = trainer.backend.colocated_max_model_len
        check_seedable_dataset(
            train_dataset, trainer._tokenizer, trainer.max_completion_length, max_positions, engine_len
        )
