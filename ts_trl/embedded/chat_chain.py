"""The built-in real-model task with reasoning states: sums of three one-digit numbers asked in chat, one partial sum
per line after a worked example, scored by the number on the reply's final line.

Unlike `chat-add` ("reply with just the number"), a reply here is several lines, and a wrong partial sum is not final:
a later line may recompute it, and only the last line is read. So a prefix of an earlier reply is a state (the sums so
far) that the rest of the reply can still turn into a pass or a fail. Sized for SmolLM2-135M-Instruct
(`ts_trl.smollm2`); its calibration (untrained pass@1 at temperature 1, lines per reply, replies that run past the
budget) is `research/smollm2-chain/calibrate.py` and its output beside it.
"""

from __future__ import annotations

import itertools
import re
import zlib
from dataclasses import dataclass

from datasets import Dataset

from ts_trl.embedded.chat_add import chat_dataset

# Each wording: (the worked example's question, its answer, the question's template). The example is a user turn and
# an assistant turn before the question, so the model sees the format as its own earlier reply.
WORDINGS = (
    (
        "Add 2 + 6 + 1 + 4. Write one partial sum per line, then the total.",
        "2 + 6 = 8\n8 + 1 = 9\n9 + 4 = 13\nTotal: 13",
        "Add {terms}. Write one partial sum per line, then the total.",
    ),
    (
        "What is 5 + 1 + 3? Work it out step by step, one addition per line.",
        "5 + 1 = 6\n6 + 3 = 9\nTotal: 9",
        "What is {terms}? Work it out step by step, one addition per line.",
    ),
    (
        "2 + 6 + 1 + 4",
        "2 + 6 = 8\n8 + 1 = 9\n9 + 4 = 13\nTotal: 13",
        "{terms}",
    ),
    (
        "Add 2 + 6 + 1. Start with the first number and add the others one at a time, one line each, then the total.",
        "2 + 6 = 8\n8 + 1 = 9\nTotal: 9",
        "Add {terms}. Start with the first number and add the others one at a time, one line each, then the total.",
    ),
    (
        "Add 2 + 6 + 1. Start with the first number and add the others one at a time, one step per line, then the "
        "total.",
        "Step 1: 2 + 6 = 8\nStep 2: 8 + 1 = 9\nTotal: 9",
        "Add {terms}. Start with the first number and add the others one at a time, one step per line, then the "
        "total.",
    ),
    (
        "Add 2 + 6 + 1. Start with the first number and add the others one at a time, one line each, then the total "
        "on a third line.",
        "2 + 6 = 8\n8 + 1 = 9\nTotal: 9",
        "Add {terms}. Start with the first number and add the others one at a time, one line each, then the total "
        "on a third line.",
    ),
)
WORDING = 4  # the calibrated one (research/smollm2-chain/calibration.md): "Step 1:" lines
HELD_OUT_EVERY = 4  # one multiset of operands in 4, in all its orders, is held out
NUMBER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class ChatChainTask:
    """Sums of `sizes` numbers (3 by default; 4 made pass@1 0.07) from 1-`max_operand`, asked in chat after one
    worked example; `answer` is the sum.

    Which problems are held out depends only on a hash of the operands' multiset and `seed`, so the train and held-out
    sets never share a sum's operands in any order. `wording` picks one of `WORDINGS` (the calibration compares them).
    The defaults are the calibrated task: 534 training prompts, 195 held out.
    """

    seed: int = 0
    wording: int = WORDING
    sizes: tuple[int, ...] = (3,)
    max_operand: int = 9

    def __post_init__(self):
        if not 0 <= self.wording < len(WORDINGS):
            raise ValueError(f"wording must be one of 0..{len(WORDINGS) - 1}, got {self.wording}")

    def is_held_out(self, operands: tuple[int, ...]) -> bool:
        return zlib.crc32(f"{self.seed}:{sorted(operands)}".encode()) % HELD_OUT_EVERY == 0

    def messages(self, operands: tuple[int, ...]) -> list[dict]:
        """The chat of one problem: the worked example (user, assistant), then the question."""
        example_question, example_answer, template = WORDINGS[self.wording]
        return [
            {"role": "user", "content": example_question},
            {"role": "assistant", "content": example_answer},
            {"role": "user", "content": template.format(terms=" + ".join(map(str, operands)))},
        ]

    def _problems(self, held_out: bool) -> list[tuple[int, ...]]:
        problems = [
            operands
            for size in self.sizes
            for operands in itertools.product(range(1, self.max_operand + 1), repeat=size)
            if self.is_held_out(operands) == held_out
        ]
        # A fixed shuffle, so that the first n of a pool mix sizes and operands.
        return sorted(problems, key=lambda p: zlib.crc32(f"{self.seed}/{p}".encode()))

    def make_splits(self, n_train: int, n_eval: int) -> tuple[Dataset, Dataset]:
        """Disjoint train and held-out datasets: `prompt` (the chat), `answer` and `prompt_id`."""
        return self._dataset("train", n_train, held_out=False), self._dataset("eval", n_eval, held_out=True)

    def _dataset(self, split: str, size: int, held_out: bool) -> Dataset:
        return chat_dataset("chat-chain", split, size, self._problems(held_out), chat=self.messages, answer=sum)


def final_line(completion: str) -> str:
    """The reply's last non-empty line ('' for an empty reply)."""
    lines = [line for line in completion.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def chat_chain_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """1.0 where the last number on the reply's final line is the sum, else 0.0.

    Only the final line counts: a wrong partial sum that a later line repairs still passes, and a reply cut off by the
    token budget mid-chain fails unless its last line happens to hold the total.
    """
    rewards = []
    for completion, expected in zip(completions, answer):
        if not isinstance(completion, str):  # conversational: the last message is the model's
            completion = completion[-1]["content"]
        numbers = NUMBER.findall(final_line(completion))
        rewards.append(1.0 if numbers and int(numbers[-1]) == int(expected) else 0.0)
    return rewards
