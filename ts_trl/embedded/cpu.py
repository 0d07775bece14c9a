"""Running the tiny model on a shared CPU: one torch thread, because intra-op threads only fight over cores."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
