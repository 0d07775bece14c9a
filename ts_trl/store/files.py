"""The store's files: atomic writes, checksums, what a killed writer left, folders for set-aside files, local or Hub.

Every file is written to a temporary `.<name>.tmp-<pid>` beside it, flushed and renamed (`atomic_write`), so a crash
at any moment leaves the previous file or the new one, never a torn one; the next start removes the temporaries of
writers no longer alive (`remove_stale_temporaries`). The lock on the output folder is `lock.py`'s.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..resources import converted_from

TEMPORARY = re.compile(r"^\..+\.tmp-(\d+)$")  # `atomic_write`'s temporary files: `.<name>.tmp-<pid>`


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> str:
    """Has `write(temporary)` write the file, then flushes it, renames it to `path` and returns its SHA-256.

    Readers never see a partial file: a crash leaves the previous `path` (or none) and at most a temporary file,
    which `remove_stale_temporaries` clears at the next start. The checksum is of the bytes on disk, read back from
    the page cache before the rename.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(temporary)
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
        checksum = file_sha256(temporary)
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):  # the cleanup's own failure (a read-only disk) must not hide the cause
            temporary.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise _write_error(path, error) from None
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a power cut once the folder is flushed
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return checksum


def _write_error(path: Path, error: OSError) -> OSError:
    """One line naming the file that could not be written, and why; the file's previous version is untouched."""
    code = error.errno  # pyarrow's writers set it too
    if code in (errno.ENOSPC, errno.EDQUOT):
        why = "the disk is full (or over quota)"
        fix = f"Free space on the disk of {path.parent}, then resume from the last checkpoint"
    else:
        why = " ".join(str(error).split())
        fix = "Fix the folder, then resume from the last checkpoint"
    return OSError(
        code,
        f"Cannot write {path}: {why}. The files written before it are whole and listed in the manifest. {fix}.",
    )


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> str:
    return atomic_write(path, lambda temporary: Path(temporary).write_bytes(data))


def atomic_write_json(path: str | os.PathLike, payload: dict) -> str:
    return atomic_write_bytes(path, (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode())


def file_sha256(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def remove_stale_temporaries(folders: Sequence[str | os.PathLike]) -> list[Path]:
    """Deletes the temporary files that a killed writer left in `folders` (those of processes no longer alive).

    A temporary file of a live process is left alone: it may be a write in progress. This process's own are stale
    when it calls this (it writes nothing meanwhile), so a run that crashed and restarted in one process clears them.
    """
    removed = []
    for folder in map(Path, folders):
        for path in folder.glob(".*.tmp-*") if folder.is_dir() else ():
            match = TEMPORARY.match(path.name)
            if match and path.is_file() and not _is_other_live_process(int(match.group(1))):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def _is_other_live_process(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def hub_cache_blobs(folder: Path) -> Path | None:
    """The `blobs/` folder of the Hugging Face cache repo whose snapshot holds `folder`, if it lies in one: the cache
    stores a snapshot's files as symbolic links into it, so a downloaded seeds folder's files lead there."""
    parts = Path(folder).absolute().parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith(("datasets--", "models--")):
            return (Path(*parts[:i]) / "blobs").resolve()
    return None


def set_aside_folder(root: Path) -> Path:
    """A new folder under `root` named by the time to the second, suffixed `-2`, `-3`... when that name is taken:
    two set-asides in one second must not overwrite each other's files."""
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1, 10_000):
        target = root / (stamp if attempt == 1 else f"{stamp}-{attempt}")
        try:
            target.mkdir()
        except FileExistsError:
            continue
        return target
    raise FileExistsError(f"{root} holds 9999 folders named {stamp}*; move some away.")


def same_file(path: Path, checksum: str) -> bool:
    """Whether `path` is a file whose SHA-256 is `checksum`."""
    return path.is_file() and file_sha256(path) == checksum


def is_hub_id(name: str | None) -> bool:
    """Whether `name` reads as a Hub repo id (`org/name`) rather than a local path: no such path exists, and it is
    two names of letters, digits, `_`, `.` and `-` (neither starting with `.` or `-`), joined by one slash."""
    return (
        bool(name) and re.fullmatch(r"\w[\w.-]*/\w[\w.-]*", name) is not None and not Path(name).expanduser().exists()
    )


def public_model_name(name_or_path: str | None) -> str | None:
    """How a card or an adapter's config names a model: its Hub id where one is known (a Hub id itself, a folder ts_trl
    converted from a Hub model's release, a Hub cache snapshot), else a local folder's name, never a path on this
    machine, which names nothing anywhere else."""
    if not name_or_path or is_hub_id(name_or_path):
        return name_or_path
    path = Path(name_or_path).expanduser()
    converted = converted_from(path)
    if converted and converted.get("hub_id"):
        return converted["hub_id"]
    cached = [part for part in path.parts if part.startswith("models--")]  # <cache>/models--org--name/snapshots/<sha>
    if cached and cached[-1].count("--") == 2:
        return "/".join(cached[-1].split("--")[1:])
    return path.name if path.exists() else name_or_path
