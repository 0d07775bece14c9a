"""Running the tiny model on a shared CPU: one torch thread, because intra-op threads only fight over cores."""

from __future__ import annotations

from ..trainer.threads import torch_threads, user_set_threads

__all__ = ["embedded_training_threads", "torch_threads", "user_set_threads"]


def embedded_training_threads() -> int | None:
    """torch's thread count while the embedded default trains: one, unless the user set `OMP_NUM_THREADS`.

    Its intra-op threads meet at a barrier after every small operation, so a core that another process holds makes
    every step wait for the thread that shares it. On 2 cores beside other work (load average 10-17), 10 steps of the
    main job took 45 s and 280 s with one thread, 494 s and 1345 s with torch's default two; at load 6, 5 steps took
    20 s against 84 s (docs/cli.md). On an idle machine two threads are only about a fifth faster. `None`: the user
    set OMP_NUM_THREADS, which torch follows.
    """
    return None if user_set_threads() else 1
