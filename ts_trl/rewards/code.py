"""Code rewards: the program in the whole response, run in the sandbox against assert tests or stdin/stdout cases."""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .math import completion_text
from .sandbox import Limits, detect_isolation, run_in_sandbox

_FENCE = re.compile(r"```([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_program(text: str) -> str:
    """The last ```python fenced block, else the last fenced block of any language, else the whole text."""
    blocks = _FENCE.findall(text)
    python = [body for language, body in blocks if language.lower() in ("python", "py", "python3")]
    if python or blocks:
        return (python or [body for _, body in blocks])[-1]
    return text


def split_test_units(tests: str, entry_point: str | None = None) -> list[tuple[str, bool]]:
    """`(source, is_test)` units: each top-level `assert` is one test, other statements are setup run in order.

    HumanEval's `def check(candidate)` becomes one test, `check(<entry_point>)` (none without one); code with no top-level assert (or
    that does not parse) is one test as a whole.
    """
    if re.search(r"^def check\(", tests, re.MULTILINE):
        # Without its entry point, a check() that nothing calls would pass any program: no test, hence None.
        return [(tests, False)] + ([(f"check({entry_point})", True)] if entry_point else [])
    try:
        statements = ast.parse(tests).body
    except SyntaxError:
        return [(tests, True)]
    if not any(isinstance(statement, ast.Assert) for statement in statements):
        return [(tests, True)]
    return [(ast.unparse(statement), isinstance(statement, ast.Assert)) for statement in statements]


def parse_tests(tests) -> dict | str:
    """A stdin/stdout case dict `{"inputs": [...], "outputs": [...]}` (given as a dict or JSON), else assert code."""
    if isinstance(tests, str) and tests.lstrip().startswith("{"):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError:
            return tests
    return tests


def normalize_output(text: str) -> list[str]:
    """Lines with their whitespace collapsed, blank lines dropped: the comparison ignores spacing only."""
    return [" ".join(line.split()) for line in text.strip().splitlines() if line.strip()]


def _score_stdio(program: str, cases: dict, binary: bool, limits: Limits, isolation) -> float | None:
    inputs, outputs = cases.get("inputs") or [], cases.get("outputs") or []
    if not inputs or len(inputs) != len(outputs):
        return None
    passed = 0
    for stdin, expected in zip(inputs, outputs):
        result = run_in_sandbox(isolation, program, None, str(stdin), limits)
        ok = result.ok and normalize_output(result.stdout) == normalize_output(str(expected))
        passed += ok
        if binary and not ok:
            return 0.0
    return passed / len(inputs)


def _score_asserts(program: str, tests: str, entry_point, binary: bool, limits: Limits, isolation) -> float | None:
    units = split_test_units(tests, entry_point)
    test_indices = {index for index, (_, is_test) in enumerate(units) if is_test}
    if not test_indices:
        return None
    result = run_in_sandbox(isolation, program, units, "", limits)
    if not result.ok or result.passed_units is None:
        return 0.0  # a timeout, a crash, an early exit, or no verdict from the harness
    fraction = len(test_indices.intersection(result.passed_units)) / len(test_indices)
    return float(fraction == 1.0) if binary else fraction


def get_code_reward(
    mode: str = "fraction",
    timeout: float = 10.0,
    memory_mb: int = 1024,
    max_workers: int | None = None,
    max_processes: int = 32,
) -> Callable[..., list[float | None]]:
    """Builds a code reward: the pass fraction of each response's program (`mode="fraction"`) or 1/0 when every
    test passes (`mode="binary"`). Runs at most `max_workers` sandboxes at once (default: the CPU count)."""
    if mode not in ("fraction", "binary"):
        raise ValueError(f"mode must be 'fraction' or 'binary', got {mode!r}")
    limits = Limits(timeout=timeout, memory_mb=memory_mb, max_processes=max_processes)
    workers = max_workers or os.cpu_count() or 1

    def score(completion, tests, entry_point, isolation) -> float | None:
        program = extract_program(completion_text(completion))
        cases = parse_tests(tests)
        if isinstance(cases, dict):
            return _score_stdio(program, cases, mode == "binary", limits, isolation)
        if not isinstance(cases, str) or not cases.strip():
            return None  # no tests: cannot score
        return _score_asserts(program, cases, entry_point, mode == "binary", limits, isolation)

    def code_reward(completions, tests, entry_point=None, **kwargs) -> list[float | None]:
        isolation = detect_isolation()
        entry_points = entry_point if entry_point is not None else [None] * len(completions)
        with ThreadPoolExecutor(max_workers=min(workers, max(1, len(completions)))) as pool:
            return list(pool.map(score, completions, tests, entry_points, [isolation] * len(completions)))

    code_reward.__name__ = code_reward.__qualname__ = "code_reward" if mode == "fraction" else "binary_code_reward"
    return code_reward


code_reward = get_code_reward()
