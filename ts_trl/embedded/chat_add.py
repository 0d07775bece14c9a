"""The built-in task for a real instruct model: one-digit sums asked in chat, in four wordings, scored by the reply's
last number.

Sized for SmolLM2-135M-Instruct (`ts_trl.smollm2`), the real model that installs from PyPI and runs on CPU. Sampled
at temperature 1 with 32 new tokens, its replies were right 0.23 of the time (32 problems x 4 samples; by wording:
"What is a + b?" 0.53, "Compute a + b." 0.16, "Add a and b." 0.09, "a + b = ?" 0.12), so GRPO groups of 4 are mixed
(some right, some wrong) about two times in three, and there is room to learn: the same sum asked four ways.
"""

from __future__ import annotations

import itertools
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from datasets import Dataset

WORDINGS = ("What is {a} + {b}?", "Compute {a} + {b}.", "Add {a} and {b}.", "{a} + {b} = ?")
INSTRUCTION = " Reply with just the number."
HELD_OUT_EVERY = 4  # one pair of operands in 4, in all its orders and wordings, is held out
NUMBER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class ChatAddTask:
    """Sums of two numbers from 1-9, each asked in `WORDINGS` as a chat message; `answer` is the sum.

    Which problems are held out depends only on a hash of the unordered pair and `seed`, so the train and held-out
    sets never share a sum's operands, in any order or wording. There are 324 prompts: 81 ordered pairs x 4 wordings.
    """

    seed: int = 0

    def is_held_out(self, a: int, b: int) -> bool:
        return zlib.crc32(f"{self.seed}:{sorted((a, b))}".encode()) % HELD_OUT_EVERY == 0

    def _problems(self, held_out: bool) -> list[tuple[str, int]]:
        pairs = [(a, b) for a, b in itertools.product(range(1, 10), repeat=2) if self.is_held_out(a, b) == held_out]
        problems = [(wording.format(a=a, b=b) + INSTRUCTION, a + b) for (a, b) in pairs for wording in WORDINGS]
        # A fixed shuffle, so that the first n of a pool mix pairs and wordings.
        return sorted(problems, key=lambda p: zlib.crc32(f"{self.seed}/{p[0]}".encode()))

    def make_splits(self, n_train: int, n_eval: int) -> tuple[Dataset, Dataset]:
        """Disjoint train and held-out datasets: `prompt` (one user message), `answer` and `prompt_id`."""
        return self._dataset("train", n_train, held_out=False), self._dataset("eval", n_eval, held_out=True)

    def _dataset(self, split: str, size: int, held_out: bool) -> Dataset:
        return chat_dataset(
            "chat-add", split, size, self._problems(held_out),
            chat=lambda problem: [{"role": "user", "content": problem[0]}], answer=lambda problem: problem[1],
        )  # fmt: skip


def chat_dataset(
    task: str, split: str, size: int, problems: Sequence, chat: Callable[..., list[dict]], answer: Callable[..., int]
) -> Dataset:
    """The first `size` of a chat task's `problems` (its pool, in order) as a dataset: `prompt` (`chat(problem)`),
    `answer` (`answer(problem)`, as text) and `prompt_id`; a `size` the pool cannot give is refused, naming `task`."""
    if size > len(problems):
        raise ValueError(f"asked for {size} {split} problems of the {task} task, whose pool holds {len(problems)}")
    problems = problems[:size]
    return Dataset.from_dict(
        {
            "prompt": [chat(problem) for problem in problems],
            "answer": [str(answer(problem)) for problem in problems],
            "prompt_id": [f"{split}-{index:05d}" for index in range(size)],
        }
    )


def chat_add_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """1.0 where the reply's last number is the sum, else 0.0 (a reply without a number scores 0.0).

    The last number, because a short model's replies often restate the question ("3 + 4 = 7").
    """
    rewards = []
    for completion, expected in zip(completions, answer):
        if not isinstance(completion, str):  # conversational: the last message is the model's
            completion = completion[-1]["content"]
        numbers = NUMBER.findall(completion)
        rewards.append(1.0 if numbers and int(numbers[-1]) == int(expected) else 0.0)
    return rewards
