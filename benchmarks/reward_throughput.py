"""Reward throughput: samples per second of the math reward (math-verify) and of the sandboxed code reward.

Math: GSM8K test solutions scored against their own answer (half of them) or a shuffled one, so math-verify parses
and compares a realistic mix. Code: short programs, correct, half-right and crashing, run in the sandbox against
assert tests, with the default number of workers (the CPU count), through every layer this machine allows (its own
root filesystem, the judge that runs the tests outside the program's interpreter). Either is "not available" when
`ts_trl.rewards` cannot be imported.
"""

from __future__ import annotations

import json
import random
import resource
import time
from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k_test.jsonl"

ADD_TESTS = "assert add(1, 2) == 3\nassert add(2, 2) == 4\nassert add(0, 5) == 5\nassert add(-1, 1) == 0"
PROGRAMS = (
    "Here is the function.\n```python\ndef add(a, b):\n    return a + b\n```",
    "```python\ndef add(a, b):\n    return a + b if a <= 0 else a - b\n```",  # passes 2 of the 4 tests
    "```python\ndef add(a, b):\n    return a + c\n```",  # NameError
    "```python\nimport math\n\ndef add(a, b):\n    total = 0\n    for x in (a, b):\n        total += x\n    return total\n```",
)


def _math_samples(count: int) -> tuple[list[str], list[str], str]:
    rows = [json.loads(line) for line in SHARED_DATA.read_text().splitlines()] if SHARED_DATA.exists() else []
    source = "GSM8K test solutions"
    if not rows:  # outside the project layout: synthetic worked solutions in the same format
        rows = [{"answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(500)]
        source = "synthetic GSM8K-style solutions"
    rng = random.Random(0)
    completions, gold = [], []
    for i in range(count):
        row = rows[i % len(rows)]
        completions.append(row["answer"])
        gold.append(row["answer"] if i % 2 == 0 else rng.choice(rows)["answer"])
    return completions, gold, source


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (every sandbox process of a finished run)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _throughput(function, batches) -> dict:
    samples = 0
    wall, cpu = time.perf_counter(), _cpu_seconds()
    for batch in batches:
        scores = function(*batch)
        samples += len(scores)
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    return {"samples": samples, "seconds": wall, "samples_per_s": samples / wall, "samples_per_cpu_s": samples / cpu}


def run(quick: bool) -> dict:
    try:
        from ts_trl.rewards import get_code_reward, math_reward
        from ts_trl.rewards.sandbox import detect_isolation
    except ImportError as error:
        return {"available": False, "reason": f"ts_trl.rewards is not importable: {error}"}
    out = {"available": True}

    completions, gold, source = _math_samples(256 if quick else 1024)
    try:
        math_reward(completions[:8], gold[:8])  # warm-up: math-verify's parsers import lazily
    except ImportError as error:  # trl's accuracy_reward needs the [math] extra (math-verify)
        out["math"] = {"available": False, "reason": str(error)}
    else:
        batches = [(completions[i : i + 256], gold[i : i + 256]) for i in range(0, len(completions), 256)]
        out["math"] = _throughput(math_reward, batches) | {"batch": 256, "data": source}

    isolation = detect_isolation()  # probed once, outside the timing
    code_reward = get_code_reward()
    count, batch = (16, 16) if quick else (64, 32)
    programs = [PROGRAMS[i % len(PROGRAMS)] for i in range(count)]
    batches = [(programs[i : i + batch], [ADD_TESTS] * batch) for i in range(0, count, batch)]
    out["code"] = _throughput(code_reward, batches) | {
        "batch": batch,
        "isolation": isolation.layers,
        "target": ">= 15 samples/s on 2 cores",
        "note": "one sandbox per sample (the harness's interpreter, whose fork is the judge, and the worker's fresh "
        "interpreter); CPU time counts every sandbox process, not the kernel's namespace clean-up",
    }
    return out
