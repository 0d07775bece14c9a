"""torch's thread count on a shared CPU: one intra-op thread while training, unless the user set `OMP_NUM_THREADS`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch


@contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Sets torch's intra-op thread count inside the block (`None` leaves it alone), then restores it.

    The tiny model's matrices are too small to split across cores, and when other processes hold the cores a second
    thread waits on the first: on 2 busy cores, one warm-up step took 1.9 s with 2 threads and 0.16 s with 1.
    """
    previous = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def cpu_training_threads(device: torch.device) -> int | None:
    """torch's thread count while a trainer trains on `device`: one on CPU unless the user set `OMP_NUM_THREADS`
    (`None`: left as torch has it).

    Intra-op threads meet at a barrier after every operation, so a core that another process holds makes every step
    wait for the thread that shares it: `generate` on SmolLM2-135M ran 3.3 tokens/s with torch's default two threads
    at load 6 on 2 cores, 24.9 with one. On 2 idle cores a step of the SmolLM2 recipe took 15 s with two threads and
    22 s with one (README).
    """
    return 1 if device.type == "cpu" and not user_set_threads() else None


def user_set_threads() -> bool:
    """Whether `OMP_NUM_THREADS` is the user's: set, and not by `accelerate launch` on its own.

    `accelerate launch` on CPU sets it for its workers to the cores per process when its own environment has none
    (`num_cpu_threads_per_process`, which no accelerate config file can set), so the variable alone does not say that
    anyone chose it. The launcher's environment does: read from the parent process where the system shows it (Linux).
    """
    if not os.environ.get("OMP_NUM_THREADS"):
        return False
    if "ACCELERATE_USE_CPU" not in os.environ and "LOCAL_RANK" not in os.environ:
        return True  # not under a launcher
    try:
        launcher = Path(f"/proc/{os.getppid()}/environ").read_bytes().split(b"\0")
    except OSError:
        return True
    return any(entry.startswith(b"OMP_NUM_THREADS=") for entry in launcher)
