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


class OutputDirLock:
    """The main process's hold on its output_dir, so that a second run (fresh or resumed) there is refused.

    The kernel lets go of a `flock` when its holder's process ends, however it ends (a crash, `kill -9`, a lost node
    on a local disk), so a dead run never leaves the folder locked; the file itself stays and only names the last
    holder. On NFS, Linux emulates `flock` with byte-range locks that the server arbitrates; a filesystem without
    locks at all is warned about and the run goes on unguarded (see docs/seed-dataset.md).
    """

    def __init__(self, output_dir: str | os.PathLike):
        self.output_dir = Path(output_dir)
        self.fd: int | None = None

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
            logger.warning(
                f"Cannot lock {self.path} ({error.strerror}): nothing stops a second run from writing into "
                f"{self.output_dir} while this one trains. Start one run per output_dir."
            )
        os.ftruncate(fd, 0)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {started}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor lets go of the lock
            self.fd = None
