"""What `SeedGRPOTrainer` refuses at construction, before any generation: one clear line naming the problem and the fix."""

from __future__ import annotations

PROMPTS_CHECKED = 2000  # prompts of a dataset measured against the budget at construction


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
