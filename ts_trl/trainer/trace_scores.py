"""`seed_filter="success"` on the traces of a `seed_dataset`: each scored with the run's success reward, called as
TRL calls a reward function. The trainer hands `success_scorer`'s function to the store, which never calls a reward
function itself (`store/text_seeds.py`)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable

import numpy as np
from accelerate import PartialState
from tqdm.auto import tqdm

SCORE_BATCH = 64  # traces per reward call of `seed_filter="success"`


def success_scorer(reward_funcs, reward_names, success_reward: str | None, train_dataset) -> Callable:
    """The scoring function a run hands to `read_external_seeds_on_every_rank`: (traces, their training rows, the
    source's name) -> each trace's success reward (`success_scores`), with a progress bar on the main process."""
    success = (reward_funcs, list(reward_names), success_reward)

    def score(traces, rows, source: str) -> np.ndarray:
        return success_scores(traces, rows, train_dataset, success, source, PartialState().is_main_process)

    return score


def success_scores(traces, rows, train_dataset, success, source, main=True) -> np.ndarray:
    """The success reward of each trace, scored as this run scores its own rollouts, with a progress bar.

    `success`: (the run's reward functions, their names, the success reward's name); `rows`: each trace's training row,
    whose columns (e.g. `answer`) the reward function gets as TRL passes them.
    """

    reward_funcs, reward_names, success_reward = success
    func = reward_funcs[list(reward_names).index(success_reward)]
    if not callable(func) or hasattr(func, "forward"):
        raise ValueError(
            f"{source}: seed_filter='success' scores traces with the reward function {success_reward!r}, which is a "
            "reward model; only reward functions (callables) can score them here. Set success_reward to one."
        )
    columns = [c for c in train_dataset.column_names if c not in ("prompt", "completion", "completion_ids")]
    scores = np.full(len(traces), np.nan, np.float32)
    batches = range(0, len(traces), SCORE_BATCH)
    for start in tqdm(batches, desc=f"Scoring the traces of {source}", disable=not main):
        batch = range(start, min(start + SCORE_BATCH, len(traces)))
        examples = [train_dataset[rows[i]] for i in batch]
        prompts = [example["prompt"] for example in examples]
        completions = [
            traces[i].turns
            if traces[i].turns is not None
            else [{"role": "assistant", "content": traces[i].text}]
            if isinstance(p, list)
            else traces[i].text
            for i, p in zip(batch, prompts)
        ]
        kwargs = {c: [example[c] for example in examples] for c in columns}
        kwargs.update(trainer_state=None, log_extra=_ignore, log_metric=_ignore)
        values = func(prompts=prompts, completions=completions, completion_ids=[None] * len(batch), **kwargs)
        if inspect.isawaitable(values):
            values = asyncio.run(values)
        scores[start : start + len(batch)] = [np.nan if v is None else float(v) for v in values]
    return scores


def _ignore(*args, **kwargs) -> None:
    """What a reward function's `log_extra` and `log_metric` do while traces are scored: nothing is logged."""
