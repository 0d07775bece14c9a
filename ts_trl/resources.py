"""Files shipped with the package: card templates, recipes and accelerate configs.

In a wheel they are the package data `ts_trl.model_cards`, `ts_trl.recipes` and `ts_trl.accelerate_configs`
(pyproject.toml maps the top-level folders there); in a source checkout they are the top-level folders themselves.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

KINDS = ("model_cards", "recipes", "accelerate_configs")


def packaged_folder(kind: str) -> Path | None:
    """The folder of `kind` (one of `KINDS`): installed package data, else the checkout's top-level folder."""
    if kind not in KINDS:
        raise ValueError(f"Unknown kind of packaged file {kind!r}; one of {KINDS}.")
    try:
        candidate = Path(str(importlib.resources.files(f"ts_trl.{kind}")))
        if candidate.is_dir():
            return candidate
    except (ModuleNotFoundError, TypeError):
        pass  # not installed with the package-data mapping: running from a source checkout
    candidate = Path(__file__).resolve().parents[1] / kind
    return candidate if candidate.is_dir() else None


def packaged_file(kind: str, name: str) -> Path | None:
    """The shipped file `name` of `kind`, or None when there is none."""
    folder = packaged_folder(kind)
    if folder is None or not (folder / name).is_file():
        return None
    return folder / name
