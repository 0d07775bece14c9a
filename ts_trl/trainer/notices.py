"""Notices of TRL and DeepSpeed about calls the trainer makes: repeated on every run or step, and not the user's to act
on. The trainer hides them while it makes those calls, and only then; the commands hide them for the whole process.

Stdlib only: the commands call `quiet_dependencies` before torch, TRL or DeepSpeed is imported.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings

# transformers 5 renamed gradient checkpointing to activation checkpointing, and TRL 1.16 still calls the old names
# around every generation (and GRPOConfig sets the old field), so each step would print the same notices: they speak
# to TRL, not to whoever runs it.
_TRL_DEPRECATIONS = r"`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated and will be removed in v6"
# DeepSpeed, imported by accelerate whenever it is installed, announces that it fell back to its CPU accelerator, on
# every command and on machines that have no accelerator to find.
_DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"
_DEEPSPEED_LOGGER = "DeepSpeed"  # the name DeepSpeed's logger takes; filters survive its setup


class _DropDeepSpeedCpuNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _DEEPSPEED_CPU_NOTICE not in record.getMessage()


@contextlib.contextmanager
def trl_notices_hidden():
    """Hides the two notices above inside the block, then puts the warning filters and DeepSpeed's logger back as
    they were. `python -W ...` (or PYTHONWARNINGS) keeps Python's own rules."""
    logger, drop = logging.getLogger(_DEEPSPEED_LOGGER), _DropDeepSpeedCpuNotice()
    logger.addFilter(drop)
    try:
        with warnings.catch_warnings():
            if not sys.warnoptions:
                warnings.filterwarnings("ignore", message=_TRL_DEPRECATIONS, category=FutureWarning)
            yield
    finally:
        logger.removeFilter(drop)


def quiet_dependencies() -> None:
    """Hides the two notices for the rest of the process: what a command may do, and a library may not."""
    logger = logging.getLogger(_DEEPSPEED_LOGGER)
    if not any(isinstance(f, _DropDeepSpeedCpuNotice) for f in logger.filters):
        logger.addFilter(_DropDeepSpeedCpuNotice())
    if not sys.warnoptions:
        warnings.filterwarnings("ignore", message=_TRL_DEPRECATIONS, category=FutureWarning)
