"""The second built-in task: a chain of partial sums in which a wrong line can be repaired by a recomputation line.

The addition task cannot test whether restarts bring back states that matter: a wrong partial sum there is final,
and the states that vanish under RL are operand orders, all equally good. Here a solution may contain a wrong line
and then repair it, so error states and their repair are states a policy can lose and that change the outcome.

    Q: 3+8+1+6
    A: 3+8=11
    11+1=13        <- wrong (12)
    ? 11+1=12      <- recomputation: the chain goes on from its value
    12+6=18
    #### 18

A solution adds the operands in any order, one partial sum per line ("running total + next operand = new total").
A line that starts with "? " recomputes the previous line's sum; the chain continues from the recomputed value. The
reward is the addition task's (`embedded_reward`): the first "#### n" must be the right total, so an unrepaired
error fails (its wrong total carries to the answer) and a repaired one passes.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from ts_trl.embedded.task import EmbeddedTask, Problem, parse_answer

LINE_PATTERN = re.compile(r"^(\? ?)?(-?\d+)\+(-?\d+)=(-?\d+)$")
REPAIR_MARK = "? "
ERROR_OFFSETS = (-10, -2, -1, 1, 2, 10)  # slips of one or two, and dropped or doubled carries


@dataclass
class ChainTask(EmbeddedTask):
    """Add 4-6 distinct digits 1-9 with one partial sum per line in any order; warm-up traces make and repair errors.

    The problems, the prompt format, the held-out split and the reward are the addition task's (an `EmbeddedTask`
    with other defaults); only the warm-up traces differ (`sample_solution`): each sum line is wrong with probability
    `error_rate`; a recomputation line "? a+b=c" with the right sum follows a wrong line with probability
    `repair_rate` and a right line with probability `recheck_rate`, so that a "?" line is a habit the model may keep
    or lose, and not a mark that the line before it was wrong. An unrepaired error carries on to the final answer.

    Args:
        error_rate (`float`, *optional*, defaults to `0.15`):
            Probability that a sum line of a warm-up trace is wrong (off by 1, 2 or 10).
        repair_rate (`float`, *optional*, defaults to `0.6`):
            Probability that a recomputation line follows a wrong line.
        recheck_rate (`float`, *optional*, defaults to `0.1`):
            Probability that a recomputation line follows a right line.
    """

    difficulty: int = 5
    min_difficulty: int | None = 3
    min_operand: int = 1
    max_operand: int = 9
    error_rate: float = 0.15
    repair_rate: float = 0.6
    recheck_rate: float = 0.1
    # `compare`'s per-run secondary endpoint of this task (a column of its results, from `trace_rates`).
    endpoints = ("recovery_rate",)

    def __post_init__(self):
        super().__post_init__()
        for name in ("error_rate", "repair_rate", "recheck_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")

    @property
    def max_completion_tokens(self) -> int:
        """A budget that holds nearly every warm-up trace (a repair on each line is rare): 72 characters and EOS."""
        return 72

    def sample_solution(self, problem: Problem, rng: random.Random) -> str:
        """One warm-up trace: a random order of the operands, with errors and recomputation lines drawn as above."""
        order = rng.sample(problem.operands, len(problem.operands))
        lines, total = [], order[0]
        for operand in order[1:]:
            right = total + operand
            written = right
            if rng.random() < self.error_rate:
                written = right + rng.choice([d for d in ERROR_OFFSETS if right + d > 0])
            lines.append(f"{total}+{operand}={written}")
            if rng.random() < (self.repair_rate if written != right else self.recheck_rate):
                lines.append(f"{REPAIR_MARK}{total}+{operand}={right}")
                written = right
            total = written
        return " " + "\n".join(lines) + f"\n#### {total}"


@dataclass(frozen=True)
class Trace:
    """What a completion did: whether a sum line was wrong, whether it recomputed a line, and whether it passed."""

    has_error: bool  # a sum line (not a recomputation) whose sum is wrong
    has_repair: bool  # a "?" recomputation line
    passed: bool


def read_trace(completion: str, answer: str, reward: float | None = None) -> Trace:
    """Reads a completion of either task line by line; lines that are not sums (the answer, noise) are skipped.

    It passed when `reward` (the task's score, if given) is 1, else when its first answer is right.
    """
    has_error = has_repair = False
    for line in completion.strip().splitlines():
        match = LINE_PATTERN.match(line.strip())
        if match is None:
            continue
        repair, a, b, c = match.group(1), int(match.group(2)), int(match.group(3)), int(match.group(4))
        if repair:
            has_repair = True
        elif a + b != c:
            has_error = True
    if reward is not None:
        return Trace(has_error, has_repair, reward >= 1.0)
    parsed = parse_answer(completion)
    return Trace(has_error, has_repair, parsed is not None and int(parsed) == int(answer))


def trace_rates(traces: list[Trace]) -> dict[str, float]:
    """Shares of traces with an error, with a repair line, with either, and the recovery rate P(pass | error).

    The recovery rate is NaN when no trace holds an error.
    """
    n = max(1, len(traces))
    errors = [t for t in traces if t.has_error]
    return {
        "error_share": len(errors) / n,
        "repair_share": sum(t.has_repair for t in traces) / n,
        "error_or_repair_share": sum(t.has_error or t.has_repair for t in traces) / n,
        "recovery_rate": sum(t.passed for t in errors) / len(errors) if errors else float("nan"),
    }


def chain_holds(completion: str, operands: tuple[int, ...], answer: str) -> bool:
    """Whether `completion` is a valid chain for `operands` that ends in the right total.

    Valid: the first line adds two of the operands; every later sum line adds an unused operand to the running total;
    a "?" line recomputes the line just before it (same terms, right sum) and resets the running total to its value;
    a wrong sum line must be followed by such a line; then "#### n" with every operand used and n equal to both the
    running total and `answer`. So an unrepaired wrong line fails even when a later slip brings the final number
    back, and a repaired one passes.
    """
    remaining, total, last, unrepaired = list(operands), None, None, False
    for line in completion.strip().splitlines():
        line = line.strip()
        if line.startswith("####"):
            parsed = parse_answer(line)
            ok = parsed is not None and not remaining and not unrepaired
            return ok and int(parsed) == total == int(answer)
        match = LINE_PATTERN.match(line)
        if match is None:
            return False
        repair, a, b, c = match.group(1), int(match.group(2)), int(match.group(3)), int(match.group(4))
        if repair:
            if last != (a, b) or a + b != c:
                return False
            total, unrepaired = c, False
            continue
        if unrepaired:
            return False
        terms = [a, b] if total is None else [b]
        if total is not None and a != total:
            return False
        for term in terms:
            if term not in remaining:
                return False
            remaining.remove(term)
        last, total, unrepaired = (a, b), c, a + b != c
    return False


def chain_reward(completions: list, answer: list[str], prompts: list, **kwargs) -> list[float]:
    """1.0 where the completion is a valid chain ending in the right total (`chain_holds`), else 0.0.

    Unlike the answer-only `embedded_reward`, the lines count: a policy cannot drop the chain and guess the total.
    """
    rewards = []
    for prompt, completion, expected in zip(prompts, completions, answer):
        if not isinstance(completion, str):  # conversational: the last message is the model's
            completion = completion[-1]["content"]
        if not isinstance(prompt, str):
            prompt = prompt[-1]["content"]
        operands = Problem.from_prompt(prompt).operands
        rewards.append(1.0 if chain_holds(completion, operands, expected) else 0.0)
    return rewards
