"""Reward functions for the two domains of the paper, and a registry that maps names to them."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .code import code_reward, get_code_reward
from .math import format_reward, math_reward

REWARDS: dict[str, Callable] = {
    "math": math_reward,
    "format": format_reward,
    "code": code_reward,
    "binary_code": get_code_reward(mode="binary"),
}


def _import_callable(path: str) -> Callable:
    module_name, _, attribute = path.rpartition(":") if ":" in path else path.rpartition(".")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"Cannot import reward function {path!r}: {error}") from error
    if not callable(function):
        raise ValueError(f"Reward {path!r} is not callable")
    return function


def get_reward_funcs(names: list[str]) -> list[Callable]:
    """The reward functions named by registry name (see `REWARDS`) or dotted path (`pkg.mod:func`, `pkg.mod.func`)."""
    functions = []
    for name in names:
        if name in REWARDS:
            functions.append(REWARDS[name])
        elif "." in name or ":" in name:
            functions.append(_import_callable(name))
        else:
            raise ValueError(f"Unknown reward {name!r}; known rewards are {sorted(REWARDS)}, or give `pkg.mod:func`.")
    return functions


__all__ = ["REWARDS", "code_reward", "format_reward", "get_code_reward", "get_reward_funcs", "math_reward"]
