"""The reward functions by name: the paper's two domains (`math`, `format`, `code`, `binary_code`), the built-in
tasks' (imported on first use) and any `pkg.mod:func` (imported when the run starts)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable

from . import LAZY_REWARDS, REWARD_NAMES, reward_module, unimportable_reward, unknown_reward
from .code import code_reward, get_code_reward
from .math import format_reward, math_reward

REWARDS: dict[str, Callable] = {
    "math": math_reward,
    "format": format_reward,
    "code": code_reward,
    "binary_code": get_code_reward(mode="binary"),
}


def _import_callable(path: str) -> Callable:
    module_name, attribute = reward_module(path)
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(unimportable_reward(path, error)) from error
    if not callable(function):
        raise ValueError(f"Reward {path!r} is not callable")
    return function


def get_reward_funcs(names: list[str]) -> list[Callable]:
    """The reward functions named by registry name (`REWARDS`, `embedded`) or dotted path (`pkg.mod:func`, `pkg.mod.func`).

    Like TRL's scripts, a dotted path may name a module of the working directory.
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    functions = []
    for name in names:
        if name in REWARDS:
            functions.append(REWARDS[name])
        elif name in LAZY_REWARDS:
            functions.append(_import_callable(LAZY_REWARDS[name]))
        elif "." in name or ":" in name:
            functions.append(_import_callable(name))
        else:
            raise ValueError(unknown_reward(name, REWARD_NAMES))
    return functions


def check_reward_columns(dataset, reward_funcs: list[Callable]) -> None:
    """Fails early when a reward needs a column the data lacks (TRL passes every column to rewards as a keyword)."""
    columns = set(getattr(dataset, "column_names", None) or [])
    for function in reward_funcs:
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):
            continue
        for parameter in parameters:
            required = parameter.default is inspect.Parameter.empty and parameter.kind in (
                parameter.POSITIONAL_OR_KEYWORD,
                parameter.KEYWORD_ONLY,
            )
            if required and parameter.name not in {"completions", "prompts", "completion_ids"} | columns:
                name = getattr(function, "__name__", repr(function))
                raise ValueError(
                    f"Reward {name} needs a column {parameter.name!r}, the data has {sorted(columns)}. Name the right "
                    "one with --answer_column (or --domain code for tests)."
                )
