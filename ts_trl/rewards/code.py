"""Code rewards: the program in the whole response, run in the sandbox against assert tests or stdin/stdout cases."""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .math import completion_text

# `.sandbox` is imported where it runs, so that `python -m ts_trl.rewards.sandbox` does not find it imported already.

_LANGUAGE = re.compile(r"[\w+-]*")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """`(language, body)` of each ```-fenced block, left to right: a fence, a language tag and the rest of its line,
    then the body up to the next ```. One pass with `str.find` (a regex with a lazy body goes quadratic on a long run
    of backticks, which a policy can emit)."""
    blocks, position = [], 0
    while (start := text.find("```", position)) != -1:
        line_end = text.find("\n", start + 3)
        if line_end == -1:
            break
        end = text.find("```", line_end + 1)
        if end == -1:
            break
        blocks.append((_LANGUAGE.match(text, start + 3, line_end).group(), text[line_end + 1 : end]))
        position = end + 3
    return blocks


def extract_program(text: str) -> str:
    """The last ```python fenced block, else the last fenced block of any language, else the whole text."""
    blocks = fenced_blocks(text)
    python = [body for language, body in blocks if language.lower() in ("python", "py", "python3")]
    if python or blocks:
        return (python or [body for _, body in blocks])[-1]
    return text


def split_test_units(tests: str, entry_point: str | None = None) -> list[tuple[str, bool]]:
    """`(source, is_test)` units: each top-level `assert` is one test, other statements are setup run in order.

    Tests with no top-level assert are one test that passes if the script runs to the end (`def check(candidate)`
    followed by `check(fn)`, as many code datasets ship them); HumanEval's `def check(candidate)` that nothing calls
    becomes the test `check(<entry_point>)`. Raises ValueError for tests that cannot score any program: code that
    does not parse, or a `check` that is never called and has no entry point.
    """
    try:
        statements = ast.parse(tests).body
    except SyntaxError as error:
        raise ValueError(
            f"Code tests do not parse ({error.msg}, line {error.lineno}); fix the dataset's tests column."
        ) from None
    if any(isinstance(statement, ast.Assert) for statement in statements):
        return [(ast.unparse(statement), isinstance(statement, ast.Assert)) for statement in statements]
    defines_check = any(isinstance(node, ast.FunctionDef) and node.name == "check" for node in statements)
    calls_check = any(
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", "") == "check"
        for node in statements
    )
    if defines_check and not calls_check:
        if not entry_point:
            raise ValueError(
                "Code tests define check(candidate) but never call it, and the row has no entry_point: pass the "
                "dataset's entry_point column (HumanEval schema) or end the tests with `check(<function name>)`."
            )
        return [(tests, False), (f"check({entry_point})", True)]
    return [(tests, True)]


def _prompt_text(prompt) -> str:
    """The text of a prompt as TRL passes it: a string, or chat messages (their user turns, joined)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(
            str(message.get("content") or "")
            for message in prompt
            if isinstance(message, dict) and message.get("role") == "user"
        )
    return ""


def _prompt_code(text: str) -> list[ast.stmt]:
    """The Python the prompt shows: the whole text, else its fenced blocks, else the text from the first line that
    starts a definition or an import to the end (a HumanEval prompt behind a system prompt); [] if none parses."""
    first = re.search(r"^(?:def |class |import |from |@)", text, re.MULTILINE)
    for candidates in ([text], [body for _, body in fenced_blocks(text)], [text[first.start() :]] if first else []):
        statements = []
        for candidate in candidates:
            try:
                statements += ast.parse(candidate).body
            except (SyntaxError, ValueError):
                continue
        if statements:
            return statements
    return []


def _is_stub(node: ast.stmt) -> bool:
    """A definition the model is asked to write: its body is only a docstring, `pass` or `...`."""
    return all(
        isinstance(statement, ast.Pass)
        or (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant))
        for statement in node.body
    )


def _is_literal(node: ast.expr | None) -> bool:
    """A constant, or a container of constants: it runs nothing when the judge defines it."""
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return node is not None


def _called_by_check(tests: str) -> set[str]:
    """Names the tests pass to `check(...)`: the entry points of a HumanEval-style script without the column."""
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return set()
    return {
        argument.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "check"
        for argument in node.args
        if isinstance(argument, ast.Name)
    }


@functools.lru_cache(maxsize=4096)
def trusted_helpers(prompt_text: str, tests: str, entry_point: str | None = None) -> str:
    """The helpers that come with the prompt, as source for the judge: its imports, its constants and every function or
    class it defines in full (HumanEval/32's `poly`, /38's `encode_cyclic`), leaving out the entry point (the `entry_point` column
    or what the tests pass to `check`; none is trusted without one) and the stubs the model must fill. The prompt is the dataset's, trusted like the tests: the tests call these definitions, never the
    program's (a program redefining `poly` to return 0 would otherwise pass)."""
    excluded = _called_by_check(tests) | ({entry_point} if entry_point else set())
    if not excluded:
        return ""  # without a known entry point, a full definition in the prompt may be the one to fix: trust none
    kept = [
        node
        for node in _prompt_code(prompt_text)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        or (isinstance(node, (ast.Assign, ast.AnnAssign)) and _is_literal(node.value))  # a constant a helper reads
        or (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.name not in excluded
            and not _is_stub(node)
        )
    ]
    if not any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in kept):
        return ""  # imports alone change nothing the tests see
    return "\n".join(ast.unparse(node) for node in kept)


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


def _score_stdio(program: str, cases: dict, binary: bool, limits, isolation) -> float | None:
    """Runs the program once per case, all cases within one `limits.timeout` budget: cases left when it is spent fail
    (so a program that sleeps just under the timeout in every case costs one timeout, not one per case)."""
    from .sandbox import run_in_sandbox  # lazy: start-up time of reward workers that score math only

    inputs, outputs = cases.get("inputs") or [], cases.get("outputs") or []
    if not inputs or len(inputs) != len(outputs):
        return None
    deadline = time.monotonic() + limits.timeout
    passed = 0
    for stdin, expected in zip(inputs, outputs):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        result = run_in_sandbox(isolation, program, None, str(stdin), dataclasses.replace(limits, timeout=remaining))
        ok = result.ok and normalize_output(result.stdout) == normalize_output(str(expected))
        passed += ok
        if binary and not ok:
            return 0.0
        if result.timed_out:
            break
    return passed / len(inputs)


def _score_asserts(program: str, tests: str, entry_point, helpers: str, binary: bool, limits, isolation) -> float:
    from .sandbox import run_in_sandbox  # lazy: start-up time of reward workers that score math only

    units = split_test_units(tests, entry_point)
    if helpers:  # set up before the tests, over the program's names: the tests call the prompt's own helpers
        units.insert(0, (helpers, False))
    test_indices = {index for index, (_, is_test) in enumerate(units) if is_test}
    result = run_in_sandbox(isolation, program, units, "", limits)
    if not result.ok or result.passed_units is None:
        return 0.0  # a timeout, a crash, an early exit, or no verdict from the judge
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
    workers = max_workers or os.cpu_count() or 1

    def score(completion, tests, entry_point, prompt, limits, isolation) -> float | None:
        program = extract_program(completion_text(completion))
        try:
            program.encode("utf-8")
        except UnicodeEncodeError:
            return 0.0  # a lone surrogate (a broken generation): no program to run; the rest of the batch is scored
        cases = parse_tests(tests)
        if isinstance(cases, dict):
            return _score_stdio(program, cases, mode == "binary", limits, isolation)
        if not isinstance(cases, str) or not cases.strip():
            return None  # no tests: cannot score
        helpers = trusted_helpers(_prompt_text(prompt), cases, entry_point)
        return _score_asserts(program, cases, entry_point, helpers, mode == "binary", limits, isolation)

    def code_reward(completions, tests, entry_point=None, prompts=None, **kwargs) -> list[float | None]:
        from .sandbox import Limits, detect_isolation  # lazy: as above

        limits = Limits(timeout=timeout, memory_mb=memory_mb, max_processes=max_processes)
        isolation = detect_isolation()
        n = len(completions)
        entry_points = entry_point if entry_point is not None else [None] * n
        # TRL passes the prompts; the helpers they define are trusted, and the tests call those (`trusted_helpers`).
        prompts = prompts if prompts is not None else [None] * n
        with ThreadPoolExecutor(max_workers=min(workers, max(1, n))) as pool:
            return list(pool.map(score, completions, tests, entry_points, prompts, [limits] * n, [isolation] * n))

    code_reward.__name__ = code_reward.__qualname__ = "code_reward" if mode == "fraction" else "binary_code_reward"
    return code_reward


code_reward = get_code_reward()
