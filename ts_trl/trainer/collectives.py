"""Process groups: whether DeepSpeed runs, its view of accelerate's group, and a clean exit on every rank.

`is_deepspeed` is the one test of whether this process runs under DeepSpeed. `share_process_group_with_deepspeed`
hands accelerate's process group to `deepspeed.comm` before TRL builds a ZeRO-3 reference model.

PyTorch's gloo backend frees finished collectives in its worker threads. Freeing a gather's tensors needs the GIL, and
a barrier keeps the collectives that were still in flight when it was issued until the barrier itself is freed. The
trainer's last collectives are exactly that pair: the final seed snapshot gathers every rank's rollouts, then waits
at a barrier. A rank with nothing left to write returns from `train()` at once; if the script then ends and Python
is finalizing before the worker thread gets the GIL, CPython ends that thread inside a C++ destructor, which aborts
the process ("terminate called without an active exception", SIGABRT), and the launcher reports a failed run after a
complete one (with 2 CPU processes, about one finished run in ten without this).

`pause_backend_threads_at_exit` registers an exit handler that releases the GIL for a moment before finalization,
so any such worker frees its collectives while the interpreter can still run them. It pauses even when the process
group is already destroyed (`trainer.end()`, as `ts_trl train` and the transformers docs end a script): DDP keeps
the backend and its threads alive past `destroy_process_group`, so the race is the same. It costs 0.5 s once per
process, more than twice the margin that removed the aborts, so a busy machine that is slow to schedule the worker
still exits cleanly.
"""

from __future__ import annotations

import atexit
import os
import time

import torch

EXIT_PAUSE_S = 0.5
_registered = False


def _pause_for_backend_threads() -> None:
    # Not conditional on `dist.is_initialized()`: after `destroy_process_group` the worker threads are still there.
    time.sleep(EXIT_PAUSE_S)  # sleeping releases the GIL: a backend thread waiting for it runs now


def pause_backend_threads_at_exit() -> None:
    """Once per process: at interpreter exit, give the process group's threads the GIL before Python finalizes."""
    global _registered
    if not _registered:
        atexit.register(_pause_for_backend_threads)
        _registered = True


def is_deepspeed(args=None) -> bool:
    """Whether this process trains under DeepSpeed: `args.deepspeed` is set, or `accelerate launch` chose it."""
    if args is not None and getattr(args, "deepspeed", None):
        return True
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true")


def share_process_group_with_deepspeed() -> None:
    """Lets DeepSpeed see the process group accelerate started, before TRL builds a ZeRO-3 KL reference model.

    On GPUs accelerate starts the group through `deepspeed.comm`. With `use_cpu` it starts a plain gloo group, which
    DeepSpeed's own communication layer does not know of until the policy is prepared. TRL loads the reference model
    before that, under `deepspeed.zero.Init`, whose config then counts a world of 1 process and refuses the batch size
    ("train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size"). Wrapping the running
    group (DeepSpeed's `init_distributed` reuses it) makes ZeRO-3 on several CPU processes behave as on GPUs.
    """

    if not is_deepspeed() or not torch.distributed.is_initialized():
        return
    from deepspeed import comm  # lazy: an optional extra, only under DeepSpeed

    if not comm.is_initialized():
        comm.init_distributed(dist_backend=torch.distributed.get_backend(), auto_mpi_discovery=False)
