"""What `ts_trl train` (and `train.py`) answers before torch, transformers and TRL are imported, which takes from
seconds on an idle machine to a minute on a busy one: the help when it is cached (and a line saying what the wait is
for when it is not), and the settings a dataset run lacks, all named at once.

Only the command line is read here; a `--config` recipe is read with the full parser, which checks the same settings
again (`missing_settings`) once every value is known.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .flags import cached_help, snake_case, wants_help

# The fields whose values a dataset run needs, and the flags that name its data.
_DATASET_FLAGS = ("--dataset_name", "--dataset_path")


def missing_settings(*, with_dataset: bool, model: str | None, reward_funcs, dataset_path: str | None) -> str | None:
    """Every setting a run lacks, in one sentence (None: nothing is missing)."""
    problems = []
    if with_dataset and not model:
        problems.append(
            "--model_name_or_path is required with a dataset (the tiny built-in model only knows the built-in task)"
        )
    if with_dataset and not reward_funcs:
        problems.append("--reward_funcs is required with a dataset, e.g. --reward_funcs math format")
    if dataset_path and not Path(dataset_path).expanduser().exists():
        problems.append(f"--dataset_path {dataset_path}: no such file or folder")
    return "; ".join(problems) + "." if problems else None


def _given(argv: list[str]) -> dict[str, list[str]]:
    """The long flags of `argv` in their snake_case spelling, each with the values that follow it."""
    given: dict[str, list[str]] = {}
    current = None
    for arg in argv:
        if arg.startswith("--"):
            name, _, value = arg.partition("=")
            current = given.setdefault(snake_case(name), [])
            if value:
                current.append(value)
                current = None
        elif current is not None:
            current.append(arg)
    return given


def answer_early(prog: str, argv: list[str] | None = None) -> None:
    """Prints the cached help and exits 0, or prints one `prog: error: ...` line and exits 2 for the settings a dataset
    run lacks; otherwise returns (saying on stderr that the help is being built, when it is)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--config" in argv:
        return  # the recipe may hold any setting: the full parser reads it
    if wants_help(argv):
        text = cached_help(prog)
        if text is not None:
            print(text, end="")  # what `--help` printed last time, without importing TRL
            raise SystemExit(0)
        print(
            f"{prog}: building the help: importing TRL, transformers and torch (seconds, or a minute on a busy "
            "machine); it is cached, so the next --help prints at once.",
            file=sys.stderr,
            flush=True,
        )
        return
    given = _given(argv)
    dataset_path = (given.get("--dataset_path") or [None])[0]
    problem = missing_settings(
        with_dataset=any(flag in given for flag in _DATASET_FLAGS),
        model=(given.get("--model_name_or_path") or [None])[0],
        reward_funcs=given.get("--reward_funcs"),
        dataset_path=dataset_path,
    )
    if problem is not None:
        print(f"{prog}: error: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(2)
