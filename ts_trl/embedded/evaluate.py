"""Held-out pass@1 and pass@k with Hugging Face `generate`, sampled at GRPO's temperature or greedy."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from datasets import Dataset
from tqdm.auto import tqdm

from ts_trl.embedded.cpu import torch_threads


@torch.no_grad()
def sample_rewards(
    model,
    tokenizer,
    dataset: Dataset,
    reward_fn: Callable[..., list[float | None]],
    max_new_tokens: int,
    batch_size: int = 64,
    temperature: float = 1.0,
    num_samples: int = 1,
    seed: int = 0,
    progress: bool = False,
    num_threads: int | None = 1,
) -> list[list[float]]:
    """Generates `num_samples` completions per prompt and returns their rewards, one list per prompt.

    A prompt is text, or chat messages that the tokenizer's chat template renders with the assistant's turn opened
    (then the reward gets each completion as TRL gives a conversational one: a list of one assistant message).
    `temperature=0` decodes greedily (then extra samples are copies). Sampling matches GRPO's (no top-k, no top-p)
    and is deterministic given `seed` and `batch_size`. `reward_fn` gets the completions and, like in TRL, every
    dataset column as a keyword; a `None` reward (cannot score) counts as a failure. `num_threads` is torch's thread
    count while generating (`None`: leave it).

    Long: one batched generation loop with its threads, seeds and progress, read best whole.
    """
    rows = [row for row in dataset for _ in range(num_samples)]
    was_training, padding_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"  # generation appends on the right, so prompts must end at the same column
    # Greedy must not inherit a sampling generation_config; sampling must not inherit HF's default top_k=50.
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {}
    sampling = sampling or {"do_sample": False}
    rewards: list[float] = []
    try:
        with torch.random.fork_rng(), torch_threads(num_threads):
            torch.manual_seed(seed)
            batches = range(0, len(rows), batch_size)
            for start in tqdm(batches, desc="held-out samples", unit="batch", disable=not progress, leave=False):
                batch = rows[start : start + batch_size]
                inputs = _tokenize_prompts(tokenizer, [row["prompt"] for row in batch])
                output = model.generate(
                    **inputs,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                    **sampling,
                )
                completions = tokenizer.batch_decode(
                    output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True
                )
                if not isinstance(batch[0]["prompt"], str):
                    completions = [[{"role": "assistant", "content": text}] for text in completions]
                columns = {key: [row[key] for row in batch] for key in batch[0] if key != "prompt"}
                scores = reward_fn(prompts=[row["prompt"] for row in batch], completions=completions, **columns)
                rewards.extend(0.0 if score is None else float(score) for score in scores)
    finally:
        model.train(was_training)
        tokenizer.padding_side = padding_side
    return [rewards[index : index + num_samples] for index in range(0, len(rewards), num_samples)]


def _tokenize_prompts(tokenizer, prompts: list):
    """A left-padded batch of text prompts, or of chat prompts rendered as TRL renders them."""
    if isinstance(prompts[0], str):
        return tokenizer(prompts, return_tensors="pt", padding=True)
    texts = [
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) for messages in prompts
    ]
    # The template writes the special tokens itself.
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def pass_at_k(rewards: list[list[float]], k: int) -> float:
    """The unbiased pass@k estimate (Chen et al., 2021) from `n >= k` scored samples per prompt; 1.0 counts as pass."""
    estimates = []
    for samples in rewards:
        n, correct = len(samples), sum(score >= 1.0 for score in samples)
        if n < k:
            raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
        estimates.append(1.0 - math.comb(n - correct, k) / math.comb(n, k))
    return sum(estimates) / len(estimates)


def pass_at_1(model, tokenizer, dataset: Dataset, reward_fn, max_new_tokens: int, **sampling) -> float:
    """The mean reward over `num_samples` completions per prompt; at temperature 1.0 this is GRPO's pass rate.

    `sampling` takes the keyword arguments of `sample_rewards` (batch_size, temperature, num_samples, seed, ...).
    """
    return pass_at_k(sample_rewards(model, tokenizer, dataset, reward_fn, max_new_tokens, **sampling), 1)
