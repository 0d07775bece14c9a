"""Files shipped with the package: card templates, recipes and accelerate configs.

In a wheel they are the package data `ts_trl.model_cards`, `ts_trl.recipes` and `ts_trl.accelerate_configs`
(pyproject.toml maps the top-level folders there); in a source checkout they are the top-level folders themselves.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

KINDS = ("model_cards", "recipes", "accelerate_configs")


def packaged_folder(kind: str) -> Path | None:
    """The folder of `kind` (one of `KINDS`): installed package data, else the checkout's top-level folder."""
    if kind not in KINDS:
        raise ValueError(f"Unknown kind of packaged file {kind!r}; one of {KINDS}.")
    package = Path(__file__).resolve().parent
    # Installed: site-packages/ts_trl/<kind>/ (a data folder, not an importable package); else the checkout's.
    for candidate in (package / kind, package.parent / kind):
        if candidate.is_dir():
            return candidate
    return None


def packaged_file(kind: str, name: str) -> Path | None:
    """The shipped file `name` of `kind`, or None when there is none."""
    folder = packaged_folder(kind)
    if folder is None or not (folder / name).is_file():
        return None
    return folder / name


def cache_root() -> Path:
    """Where ts_trl caches what it can rebuild: `$TS_TRL_CACHE`, else `~/.cache/ts_trl`."""
    return Path(os.environ.get("TS_TRL_CACHE", Path.home() / ".cache" / "ts_trl"))


# Written last into a model folder that ts_trl converted from a release elsewhere (smollm2.py): what the weights are,
# the Hub id of the model they are a release of, and how to get them, for the cards of what is trained on them.
CONVERTED_MARKER = "ts_trl_converted.json"


def converted_from(folder: str | os.PathLike) -> dict | None:
    """The conversion marker of a model folder ts_trl converted (`CONVERTED_MARKER`), or None for any other path."""
    try:
        return json.loads((Path(folder).expanduser() / CONVERTED_MARKER).read_text())
    except (OSError, ValueError):
        return None
