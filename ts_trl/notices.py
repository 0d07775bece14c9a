"""The notices of dependencies that `import ts_trl` hides: repeated on every command or step, and not the user's to act on.

Cheap to import (no torch, no TRL): it must run before those libraries are imported.
"""

from __future__ import annotations

import logging
import sys
import warnings

# transformers 5 renamed gradient checkpointing to activation checkpointing, and TRL 1.16 still calls the old names
# around every generation (and GRPOConfig sets the old field), so each step would print the same notices: they speak
# to TRL, not to whoever runs it.
_TRL_DEPRECATIONS = r"`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated and will be removed in v6"
# DeepSpeed, imported by accelerate whenever it is installed, announces on stdout that it fell back to its CPU
# accelerator, on every command and on machines that have no accelerator to find.
_DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"


class _DropDeepSpeedCpuNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _DEEPSPEED_CPU_NOTICE not in record.getMessage()


def quiet_dependencies() -> None:
    """Hides the two notices above; other warnings stay. `python -W ...` (or PYTHONWARNINGS) keeps Python's own rules."""
    logger = logging.getLogger("DeepSpeed")  # the name DeepSpeed's logger takes; filters survive its setup
    if not any(isinstance(f, _DropDeepSpeedCpuNotice) for f in logger.filters):
        logger.addFilter(_DropDeepSpeedCpuNotice())
    if not sys.warnoptions:
        warnings.filterwarnings("ignore", message=_TRL_DEPRECATIONS, category=FutureWarning)
