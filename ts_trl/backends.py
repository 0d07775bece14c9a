"""Per-request generation budgets for TRL's vLLM backends, which otherwise ask every prompt for `max_completion_length`.

A seeded row only has `max_completion_length - k` tokens left after its prefix of `k` tokens, and its prompt is `k`
tokens longer, so the full budget wastes decoding and can overflow vLLM's `max_model_len`. TRL builds one set of
sampling parameters for the whole batch, deep inside `VLLMGeneration.generate`; rather than copy that method, the
trainer wraps the one engine call it ends in, for the duration of a seeded generation:

- colocate: `LLM.generate` gets one `SamplingParams` per prompt (vLLM pairs a list with the prompts one by one);
- server: `VLLMClient.generate` sends one `/v1/completions` request per distinct budget (the OpenAI API takes a
  single `max_tokens` per request), concurrently so that the server still batches them together, and reassembles
  the answers in prompt order.

The budget of each prompt is `cutting.continuation_budget`; vLLM itself is never imported here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from .cutting import continuation_budget

RESULT_KEYS = ("completion_ids", "logprobs", "logprob_token_ids")  # per completion, prompt-major, in client answers


def budgets_of(
    prompts: Sequence[Sequence[int]], prefix_lens: Sequence[int], max_completion_length: int, max_model_len: int
) -> list[int]:
    """The budget of each prompt (prompt + prefix ids) of a backend call, given the prefix length of each."""
    if len(prompts) != len(prefix_lens):
        raise RuntimeError(
            f"The vLLM backend was called with {len(prompts)} prompts where the seed plan has {len(prefix_lens)}; "
            "TRL's batching of vLLM requests changed. Please report this with your TRL version."
        )
    return [
        continuation_budget(int(k), len(ids), max_completion_length, max_model_len)
        for ids, k in zip(prompts, prefix_lens)
    ]


def per_prompt_sampling_params(generate: Callable, prefix_lens, max_completion_length: int, max_model_len: int):
    """Wraps `LLM.generate(prompts, sampling_params=...)` so that each prompt gets its own `max_tokens`."""

    def generate_with_budgets(prompts, sampling_params=None, **kwargs):
        ids = [prompt["prompt_token_ids"] for prompt in prompts]
        params = []
        for budget in budgets_of(ids, prefix_lens, max_completion_length, max_model_len):
            copy = sampling_params.clone()
            copy.max_tokens = budget
            params.append(copy)
        return generate(prompts, sampling_params=params, **kwargs)

    return generate_with_budgets


def requests_per_budget(generate: Callable, prefix_lens, max_completion_length: int, max_model_len: int):
    """Wraps `VLLMClient.generate(prompts, features, n=..., max_tokens=..., ...)`: one request per distinct budget."""

    def generate_with_budgets(prompts, features=None, **params):
        n = params.get("n", 1)
        groups: dict[int, list[int]] = {}
        for index, budget in enumerate(budgets_of(prompts, prefix_lens, max_completion_length, max_model_len)):
            groups.setdefault(budget, []).append(index)

        def send(item):
            budget, indices = item
            subset = None if features is None else [features[i] for i in indices]
            return generate([prompts[i] for i in indices], features=subset, **{**params, "max_tokens": budget})

        with ThreadPoolExecutor(max_workers=len(groups)) as executor:
            answers = list(executor.map(send, groups.items()))
        merged = {"prompt_ids": [None] * len(prompts)}
        merged.update({key: [None] * (len(prompts) * n) for key in RESULT_KEYS})
        for indices, answer in zip(groups.values(), answers):
            for j, i in enumerate(indices):
                merged["prompt_ids"][i] = answer["prompt_ids"][j]
                for key in RESULT_KEYS:
                    if answer.get(key) is not None:
                        merged[key][i * n : (i + 1) * n] = answer[key][j * n : (j + 1) * n]
        for key in RESULT_KEYS:  # the client answers None when the server returned no log-probs
            if any(answer.get(key) is None for answer in answers):
                merged[key] = None
        return merged

    return generate_with_budgets


@contextlib.contextmanager
def replaced(owner, name: str, replacement):
    """Sets `owner.<name>` to `replacement` for the duration, then puts back exactly what was there."""
    own = vars(owner)
    had, saved = name in own, own.get(name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        if had:
            setattr(owner, name, saved)
        else:
            delattr(owner, name)
