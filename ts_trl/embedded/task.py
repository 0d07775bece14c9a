"""The built-in task: add a few small numbers, writing one partial sum per line in any order, then "#### total"."""

from __future__ import annotations

import itertools
import math
import random
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from datasets import Dataset

ANSWER_PATTERN = re.compile(r"####\s*(-?\d+)")
PROMPT_PATTERN = re.compile(r"Q: ([\d+]+)\nA:$")
HELD_OUT_EVERY = 8  # one problem in 8 belongs to the held-out pool


@dataclass(frozen=True)
class Problem:
    """One question: the numbers to add, in the order the prompt shows them."""

    operands: tuple[int, ...]

    @property
    def prompt(self) -> str:
        # Ends with "A:" like the tiny tokenizer's chat template, so solutions start with a space.
        return f"Q: {'+'.join(map(str, self.operands))}\nA:"

    @property
    def answer(self) -> str:
        return str(sum(self.operands))

    @classmethod
    def from_prompt(cls, prompt: str) -> Problem:
        match = PROMPT_PATTERN.search(prompt)
        if match is None:
            raise ValueError(f"not an embedded-task prompt: {prompt!r}")
        return cls(tuple(int(operand) for operand in match.group(1).split("+")))


def worked_solution(operands: Sequence[int]) -> str:
    """The solution that adds `operands` left to right, one partial sum per line."""
    lines, total = [], operands[0]
    for operand in operands[1:]:
        lines.append(f"{total}+{operand}={total + operand}")
        total += operand
    return " " + "\n".join(lines) + f"\n#### {total}"


@dataclass
class EmbeddedTask:
    """Multi-operand addition with verifiable integer answers and several valid solution paths per problem.

    A problem adds `d + 1` distinct numbers from `[min_operand, max_operand]`, `d` drawn uniformly from
    `[min_difficulty, difficulty]` per problem, e.g. "Q: 7+15+9\nA:" (d = 2) with
    solutions such as " 7+15=22\n22+9=31\n#### 31" and " 9+15=24\n24+7=31\n#### 31". A solution adds them in any
    order, one partial sum per line, so different paths visit different early reasoning states, which is what a
    restart from a cut earlier solution needs. Which problems are held out depends only on a hash of the problem and
    `seed`, so train and held-out sets never overlap whatever their sizes, not even by a reordering of the operands.

    Args:
        difficulty (`int`, *optional*, defaults to `2`):
            Number of additions per problem (the largest, with `min_difficulty`): 3 operands and solutions of 19-26
            characters at 2; each extra addition adds about 9 characters and makes the tiny model's job markedly
            harder.
        min_difficulty (`int`, *optional*):
            Fewest additions per problem; `None` (the default) means `difficulty`, one level. Below `difficulty` it
            gives a difficulty mix, each level equally likely.
        seed (`int`, *optional*, defaults to `0`):
            Seeds the problem stream and the train / held-out assignment.
        min_operand (`int`, *optional*, defaults to `1`):
            Smallest operand.
        max_operand (`int`, *optional*, defaults to `19`):
            Largest operand. Two-digit operands up to 99 are much harder for the tiny model to learn in a short
            warm-up.
    """

    difficulty: int = 2
    seed: int = 0
    min_operand: int = 1
    max_operand: int = 19
    min_difficulty: int | None = None

    def __post_init__(self):
        if self.difficulty < 1:
            raise ValueError(f"difficulty must be at least 1, got {self.difficulty}")
        if self.min_difficulty is not None and not 1 <= self.min_difficulty <= self.difficulty:
            raise ValueError(
                f"min_difficulty must lie in [1, difficulty={self.difficulty}], got {self.min_difficulty}"
            )
        if self.max_operand - self.min_operand + 1 < self.num_operands:
            raise ValueError("the operand range is too narrow for distinct operands")

    @property
    def levels(self) -> range:
        """The numbers of additions a problem may have."""
        return range(self.difficulty if self.min_difficulty is None else self.min_difficulty, self.difficulty + 1)

    @property
    def num_operands(self) -> int:
        """Operands of the hardest problems."""
        return self.difficulty + 1

    @property
    def num_problems(self) -> int:
        """How many distinct problems exist (ordered, distinct operands), over all levels."""
        return sum(math.perm(self.max_operand - self.min_operand + 1, level + 1) for level in self.levels)

    def is_held_out(self, problem: Problem) -> bool:
        # By the set of operands, not the prompt: reorderings of one problem share every solution, so they must not
        # straddle the split.
        return zlib.crc32(f"{self.seed}:{sorted(problem.operands)}".encode()) % HELD_OUT_EVERY == 0

    def sample_problem(self, rng: random.Random, held_out: bool = False) -> Problem:
        """Draws one problem from the train (or held-out) pool."""
        while True:
            operands = 1 + (self.difficulty if len(self.levels) == 1 else rng.choice(self.levels))
            problem = Problem(tuple(rng.sample(range(self.min_operand, self.max_operand + 1), operands)))
            if self.is_held_out(problem) == held_out:
                return problem

    def problems(self, held_out: bool, seed: int | None = None) -> Iterator[Problem]:
        """Yields distinct problems of one pool, in a fixed order for a given seed."""
        rng, seen = random.Random(self.seed if seed is None else seed), set()
        pool_size = self.num_problems // HELD_OUT_EVERY if held_out else self.num_problems
        while len(seen) < pool_size * 0.9:  # the pool's last problems would take too many draws to find
            problem = self.sample_problem(rng, held_out)
            if problem not in seen:
                seen.add(problem)
                yield problem

    def make_splits(self, n_train: int, n_eval: int) -> tuple[Dataset, Dataset]:
        """Returns disjoint train and held-out datasets with columns `prompt`, `answer` and `prompt_id`.

        Each is the first problems of its pool, so a larger `n_eval` extends the held-out set and leaves the train
        set unchanged.
        """
        return self._dataset("train", n_train, held_out=False), self._dataset("eval", n_eval, held_out=True)

    def _dataset(self, split: str, size: int, held_out: bool) -> Dataset:
        problems = list(itertools.islice(self.problems(held_out), size))
        if len(problems) < size:
            raise ValueError(f"asked for {size} {split} problems, the pool holds only {len(problems)}")
        return Dataset.from_dict(
            {
                "prompt": [problem.prompt for problem in problems],
                "answer": [problem.answer for problem in problems],
                "prompt_id": [f"{split}-{index:05d}" for index in range(size)],
            }
        )

    def solutions(self, problem: Problem | str) -> list[str]:
        """All valid worked solutions of `problem` (a `Problem` or its prompt): one per order of the operands."""
        if isinstance(problem, str):
            problem = Problem.from_prompt(problem)
        return [worked_solution(order) for order in itertools.permutations(problem.operands)]

    def sample_solution(self, problem: Problem, rng: random.Random) -> str:
        """One valid solution with a uniformly random order of the operands (cheaper than `solutions` for many)."""
        return worked_solution(rng.sample(problem.operands, len(problem.operands)))

    def warm_up_example(self, tokenizer, problem: Problem, rng: random.Random):
        """The warm-up's prompt ids, target ids and labels of one problem: the whole solution and EOS are trained."""
        solution = tokenizer(self.sample_solution(problem, rng), add_special_tokens=False)["input_ids"]
        solution.append(tokenizer.eos_token_id)
        return tokenizer(problem.prompt, add_special_tokens=False)["input_ids"], solution, solution


def parse_answer(completion: str) -> str | None:
    """The integer after the first "####", or None where there is none."""
    match = ANSWER_PATTERN.search(completion)
    return match.group(1) if match else None


def embedded_reward(completions: list, answer: list[str], **kwargs) -> list[float | None]:
    """1.0 where the first "#### n" in the completion gives the right total, else 0.0.

    The first, not the last, answer counts, so a model can't earn reward by listing several totals.
    """
    rewards = []
    for completion, expected in zip(completions, answer):
        if not isinstance(completion, str):  # conversational: the last message is the model's
            completion = completion[-1]["content"]
        parsed = parse_answer(completion)
        rewards.append(1.0 if parsed is not None and int(parsed) == int(expected) else 0.0)
    return rewards
