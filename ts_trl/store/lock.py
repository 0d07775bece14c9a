"""One run at a time in an output_dir: an advisory `flock` on `<output_dir>/.ts_trl.lock`, held while a run trains."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from pathlib import Path

logger = logging.getLogger(__name__)
LOCK_FILE = ".ts_trl.lock"
RUNNING_FILE = ".ts_trl.running"  # where `flock` is not available: exists exactly while a run trains


class OutputDirLock:
    """The main process's hold on its output_dir, so that a second run (fresh or resumed) there is refused.

    The kernel lets go of a `flock` when its holder's process ends, however it ends (a crash, `kill -9`, a lost node
    on a local disk), so a dead run never leaves the folder locked; the file itself stays and only names the last
    holder. On NFS, Linux emulates `flock` with byte-range locks that the server arbitrates. On a filesystem without
    locks (`ENOLCK`, some FUSE mounts) the run instead creates `.ts_trl.running` exclusively and deletes it when it
    ends; a run killed there leaves it behind, and the next run refuses the folder naming that file until the user,
    who alone can tell that no run is alive, deletes it.
    """

    def __init__(self, output_dir: str | os.PathLike):
        self.output_dir = Path(output_dir)
        self.fd: int | None = None
        self.marker: Path | None = None  # `.ts_trl.running`, where this run holds the folder by that file

    @property
    def path(self) -> Path:
        return self.output_dir / LOCK_FILE

    def acquire(self) -> None:
        """Takes the folder, or raises a one-line `ValueError`: another live run holds it, or it is not writable."""
        if self.fd is not None:
            return
        try:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise ValueError(
                f"output_dir={str(self.output_dir)!r} is not writable ({error.strerror}): a run writes its seeds and "
                "checkpoints there. Make it writable, or pass another output_dir."
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ValueError(
                f"output_dir={str(self.output_dir)!r} is in use by another run ({holder}): two runs in one folder "
                "would overwrite each other's seeds and checkpoints. Wait for it to end, or pass another output_dir."
            ) from None
        except OSError as error:  # a filesystem without locks (some network and FUSE mounts)
            logger.warning(f"Cannot flock {self.path} ({error.strerror}): holding the folder by {RUNNING_FILE}.")
            try:
                self._create_marker()
            except BaseException:
                os.close(fd)
                raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, _holder().encode(), 0)
        self.fd = fd

    def _create_marker(self) -> None:
        marker = self.output_dir / RUNNING_FILE
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = marker.read_text(errors="replace").strip() or "a run"
            raise ValueError(
                f"output_dir={str(self.output_dir)!r} is held by {marker} ({holder}); its filesystem has no locks, so "
                "a run that died there cannot let go of it. If no run is using this folder, delete that file."
            ) from None
        with os.fdopen(fd, "w") as file:
            file.write(_holder())
        self.marker = marker

    def release(self) -> None:
        if self.marker is not None:
            self.marker.unlink(missing_ok=True)
            self.marker = None
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor lets go of the lock
            self.fd = None


def _holder() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
