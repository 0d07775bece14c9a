"""Ctrl-C or SIGTERM during training: finish the step, save a checkpoint and its seed shard, then stop.

SIGTERM is what Slurm and Kubernetes send before they kill a job, so it is treated as the first Ctrl-C. Under
`accelerate launch` with one process, the terminal's Ctrl-C would also reach the launcher, which then stops its worker
within seconds (`_terminate_process_tree`), before a checkpoint can be written; so while training, the worker takes
the terminal's foreground for itself, and once its checkpoint is safe it hands the terminal back and tells the
launcher to stop (which then exits 130, without a traceback).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from pathlib import Path

from transformers import TrainerCallback

SIGNALS = ("SIGINT", "SIGTERM")


class SaveOnInterrupt(TrainerCallback):
    """On Ctrl-C or SIGTERM, finishes the current step, saves a checkpoint (and its seed shard) and stops; a second
    Ctrl-C aborts (a second SIGTERM, such as a launcher passing the signal on, does not).

    The save goes through `SeedGRPOTrainer._save_checkpoint` like any other, which writes the seed shard first. Set
    `accelerator` to the trainer's once it exists: with several processes the flag then goes through
    `Accelerator.set_trigger`/`check_trigger` at every step end, so that all ranks save the same step.
    """

    def __init__(self):
        self.interrupted = False
        self.accelerator = None
        self.signal = signal.SIGINT  # the signal that stopped the run; another rank's save request counts as Ctrl-C
        self._signalled = False
        self._previous: dict[int, object] = {}
        self.terminal = _Terminal()

    def _handle(self, signum, frame):
        if self._signalled:
            return  # SIGTERM again; a second Ctrl-C has the default handler back and aborts
        self._signalled, self.signal = True, signal.Signals(signum)
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGINT, self._previous.get(signal.SIGINT) or signal.default_int_handler)
        name = "Interrupted" if signum == signal.SIGINT else f"{signal.Signals(signum).name} received"
        print(
            f"\n{name}: saving a checkpoint and its seed snapshot at the end of this step (Ctrl-C again aborts).",
            file=sys.stderr,
            flush=True,
        )

    def on_train_begin(self, args, state, control, **kwargs):
        if os.name != "posix":
            return
        with contextlib.suppress(ValueError):  # not the main thread: leave the signals alone
            for name in SIGNALS:
                number = getattr(signal, name)
                self._previous[number] = signal.signal(number, self._handle)
            self.terminal.take()

    def on_step_end(self, args, state, control, **kwargs):
        interrupted = self._signalled
        if self.accelerator is not None and self.accelerator.num_processes > 1:
            # Ranks may see the signal at different steps: every rank asks at every step, and saves where one did.
            if interrupted:
                self.accelerator.set_trigger()
            interrupted = self.accelerator.check_trigger()
        if interrupted:
            self.interrupted = True
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        with contextlib.suppress(ValueError):
            for number, previous in self._previous.items():
                signal.signal(number, previous)
        self._previous = {}

    @property
    def exit_status(self) -> int:
        """What a shell reports for the signal that stopped the run: 130 for Ctrl-C, 143 for SIGTERM."""
        return 128 + self.signal

    def finish(self) -> None:
        """Once the run is saved and reported: the terminal goes back to the launcher, which is told to stop when
        this run was interrupted (so that `accelerate launch` exits 130 like the worker, without a traceback)."""
        self.terminal.give_back(stop_with=self.signal if self.interrupted else None)


class _Terminal:
    """The terminal's foreground, taken from a single-process `accelerate launch` for the worker while it trains."""

    def __init__(self):
        self.fd: int | None = None
        self.launcher_group: int | None = None

    def take(self) -> None:
        if not _under_single_process_accelerate():
            return
        with contextlib.suppress(OSError):
            fd = os.open("/dev/tty", os.O_RDWR)
            if os.tcgetpgrp(fd) != os.getpgrp():  # a background job: the terminal is not ours to take
                os.close(fd)
                return
            self.fd, self.launcher_group = fd, os.getpgrp()
            os.setpgid(0, 0)
            _set_foreground(fd, os.getpgrp())
            atexit.register(self.give_back)  # a crash, too, hands the terminal back

    def give_back(self, stop_with: signal.Signals | None = None) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            _set_foreground(self.fd, self.launcher_group)
            os.close(self.fd)
        self.fd = None
        if stop_with is not None:  # the launcher then exits 130 (Ctrl-C) or 143 (SIGTERM), as the worker does
            sys.stdout.flush()
            sys.stderr.flush()
            with contextlib.suppress(OSError):
                os.kill(os.getppid(), stop_with)


def _set_foreground(fd: int, group: int) -> None:
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may not otherwise set it
    try:
        os.tcsetpgrp(fd, group)
    finally:
        signal.signal(signal.SIGTTOU, previous)


def _under_single_process_accelerate() -> bool:
    """Whether this process is the one worker of `accelerate launch`'s simple launcher (its parent, on Linux)."""
    if os.environ.get("WORLD_SIZE", "1") != "1" or "ACCELERATE_MIXED_PRECISION" not in os.environ:
        return False
    try:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    command = b" ".join(parent)
    return b"accelerate" in command and b"launch" in command
