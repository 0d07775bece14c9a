"""Ctrl-C during training: finish the step, save a checkpoint and its seed shard, then stop."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from transformers import TrainerCallback


class SaveOnInterrupt(TrainerCallback):
    """On Ctrl-C, finishes the current step, saves a checkpoint (and its seed shard) and stops; a second Ctrl-C aborts.

    The save goes through `SeedGRPOTrainer._save_checkpoint` like any other, which writes the seed shard first. Set
    `accelerator` to the trainer's once it exists: with several processes the flag then goes through
    `Accelerator.set_trigger`/`check_trigger` at every step end, so that all ranks save the same step.
    """

    def __init__(self):
        self.interrupted = False
        self.accelerator = None
        self._signalled = False
        self._previous = None

    def _handle(self, signum, frame):
        self._signalled = True
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)
        print(
            "\nInterrupted: saving a checkpoint and its seed snapshot at the end of this step (Ctrl-C again aborts).",
            file=sys.stderr,
            flush=True,
        )

    def on_train_begin(self, args, state, control, **kwargs):
        if os.name == "posix" and hasattr(signal, "SIGINT"):
            with contextlib.suppress(ValueError):  # not the main thread: leave Ctrl-C alone
                self._previous = signal.signal(signal.SIGINT, self._handle)

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
        if self._previous is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGINT, self._previous)
            self._previous = None
