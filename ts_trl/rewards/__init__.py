"""Reward functions for the two domains of the paper, and a registry that maps names to them (`registry.py`).

This module itself imports nothing heavy: `ts_trl train` checks `--reward_funcs` names by its rules before TRL is
imported (`reward_problems`), in the words `get_reward_funcs` uses. The functions are exported lazily.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from importlib import import_module

# The built-in task's reward, imported on first use: `ts_trl.embedded` pulls in the tiny model's code.
LAZY_REWARDS = {
    "embedded": "ts_trl.embedded.task:embedded_reward",
    "chat_add": "ts_trl.embedded.chat_add:chat_add_reward",
    "chat_chain": "ts_trl.embedded.chat_chain:chat_chain_reward",
}
# Every registered name: `registry.REWARDS`' and `LAZY_REWARDS`' (tests/test_rewards.py checks them).
REWARD_NAMES = sorted(["math", "format", "code", "binary_code", *LAZY_REWARDS])
_EXPORTS = {
    "REWARDS": "registry",
    "get_reward_funcs": "registry",
    "check_reward_columns": "registry",
    "code_reward": "code",
    "get_code_reward": "code",
    "format_reward": "math",
    "math_reward": "math",
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)  # lazy: they import TRL
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def reward_module(path: str) -> tuple[str, str]:
    """The module and the function a dotted reward path names: `pkg.mod:func`, or `pkg.mod.func`."""
    module, _, function = path.rpartition(":") if ":" in path else path.rpartition(".")
    return module, function


def unknown_reward(name: str, known: list[str]) -> str:
    return f"Unknown reward {name!r}; known rewards are {sorted(known)}, or give `pkg.mod:func`."


def unimportable_reward(path: str, error: Exception) -> str:
    return f"Cannot import reward function {path!r}: {error}"


def reward_problems(names, known: list[str]) -> list[str]:
    """Why `--reward_funcs` entries name no reward, one sentence each, as `rewards.get_reward_funcs` says it: a name
    that is neither registered (`known`) nor a dotted path, or a dotted path whose top package is nowhere (on the
    import path or in the working folder, which `get_reward_funcs` adds). A module that is found is not imported here:
    a user's module may be slow or import torch; what it holds is checked when the run imports it."""
    problems = []
    for name in map(str, names if isinstance(names, list) else [names] if names else []):
        if name in known:
            continue
        if "." not in name and ":" not in name:
            problems.append(unknown_reward(name, known))
            continue
        top = reward_module(name)[0].partition(".")[0]
        if top.isidentifier() and not _findable(top):
            problems.append(unimportable_reward(name, ModuleNotFoundError(f"No module named {top!r}")))
    return problems


def _findable(package: str) -> bool:
    """Whether importing the top-level `package` would find it, from the import path or the working folder."""
    try:
        spec = importlib.util.find_spec(package) or importlib.machinery.PathFinder.find_spec(package, [os.getcwd()])
    except (ImportError, ValueError):  # `__main__`, whose spec may be None: left to the import
        return True
    return spec is not None


__all__ = ["LAZY_REWARDS", "REWARD_NAMES", "reward_problems", *_EXPORTS]
