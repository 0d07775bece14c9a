"""Running the tiny model on a shared CPU: one torch thread, because intra-op threads only fight over cores."""

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


def embedded_training_threads() -> int | None:
    """torch's thread count while the embedded default trains: one, unless the user set `OMP_NUM_THREADS`.

    Its intra-op threads meet at a barrier after every small operation, so a core that another process holds makes
    every step wait for the thread that shares it. On 2 cores beside other work (load average 10-17), 10 steps of the
    main job took 45 s and 280 s with one thread, 494 s and 1345 s with torch's default two; at load 6, 5 steps took
    20 s against 84 s (docs/cli.md). On an idle machine two threads are only about a fifth faster. `None`: the user
    set OMP_NUM_THREADS, which torch follows.
    """
    return None if user_set_threads() else 1


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
