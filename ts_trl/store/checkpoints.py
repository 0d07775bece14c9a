"""Checkpoint folders as transformers writes them, read without transformers: which there are, the step a folder was
saved at, and why a folder cannot be resumed from. The store's resume checks (`resume.py`) and `ts_trl train`'s, before TRL is
imported (`cli.refusals`), say the same."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

# The file transformers writes last into a checkpoint (`TRAINER_STATE_NAME`), and its checkpoint folders' names
# (`PREFIX_CHECKPOINT_DIR`): tests/test_early.py checks both against transformers.
TRAINER_STATE = "trainer_state.json"
_FOLDER = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_folders(folder: str | os.PathLike, complete: bool = False) -> list[tuple[int, Path]]:
    """The `checkpoint-<step>` folders of `folder` by the step in their names, oldest first; with `complete`, only
    those whose save finished (their trainer state, which transformers writes last)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = ((_FOLDER.match(path.name), path) for path in folder.iterdir())
    folders = sorted((int(match.group(1)), path) for match, path in found if match and path.is_dir())
    return [(step, path) for step, path in folders if not complete or (path / TRAINER_STATE).is_file()]


def last_checkpoint(folder: str | os.PathLike) -> Path | None:
    """The `checkpoint-N` folder of `folder` with the largest N, as transformers' `get_last_checkpoint` finds it."""
    folders = checkpoint_folders(folder)
    return folders[-1][1] if folders else None


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    """The step a checkpoint folder was saved at: its trainer state's, else its name's."""
    state = Path(checkpoint) / TRAINER_STATE
    if state.exists():
        return int(json.loads(state.read_text())["global_step"])
    name = Path(checkpoint).name
    if name.startswith("checkpoint-"):
        return int(name.rsplit("-", 1)[1])
    raise ValueError(f"{checkpoint} is not a checkpoint folder (no {TRAINER_STATE}, not named checkpoint-<step>).")


def resume_problem(checkpoint: str | os.PathLike, output_dir: str | os.PathLike) -> str | None:
    """Why `checkpoint` cannot be resumed from: it does not exist, or is not a checkpoint folder (no trainer state,
    which transformers writes last); the sentence names the checkpoints that do exist (None: it is one)."""
    path = Path(checkpoint).expanduser()
    if path.is_dir() and (path / TRAINER_STATE).is_file():
        return None
    problem = "does not exist" if not path.exists() else f"is not a checkpoint folder (it has no {TRAINER_STATE})"
    # The checkpoints beside the one asked for, else those of this run's output_dir.
    folder = path.parent if path.parent.is_dir() and path.parent != Path(".") else Path(output_dir)
    found = [path for _, path in checkpoint_folders(folder, complete=True)]
    if not found:
        return (
            f"resume_from_checkpoint={str(checkpoint)!r} {problem}, and {folder} holds no checkpoint. Name a "
            "checkpoint-<step> folder of the run to continue, or leave resume_from_checkpoint unset to start a new run."
        )
    return (
        f"resume_from_checkpoint={str(checkpoint)!r} {problem}: the checkpoints in {folder} are "
        f"{', '.join(p.name for p in found)}. Pass one of those, or leave resume_from_checkpoint unset to start a new run."
    )
