"""A refusal under `accelerate launch` stays one line and exit status 2.

accelerate's launcher (1.x) turns any non-zero exit of its worker into a `CalledProcessError` (torch's
`ChildFailedError` with several processes): the worker's one-line refusal came back under twenty lines of the
launcher's traceback, exit status 1. The package installs `ts_trl_accelerate.pth`, whose one line calls `install()` in
an interpreter whose command line names accelerate; `install()` acts in accelerate's launcher only (`accelerate launch
...`, `python -m accelerate.commands.launch ...`). There, when the launch ends in a refusal, the launcher exits 2 and
prints nothing more, the worker having said why. A refusal is a worker's exit status 2 after a `prog: error: ...` line
(the package's form, and argparse's); with several processes, the first to stop exited 2 and the others did too or
were stopped by the launcher because of it (torch's notices of those stops are then dropped). Every other failure
keeps accelerate's traceback, and those notices.
`TS_TRL_ACCELERATE_EXIT=0` turns this off.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys

OFF_SWITCH = "TS_TRL_ACCELERATE_EXIT"
REFUSAL_STATUS = 2
# A refusal's line: `train.py: error: ...`, `ts_trl train: error: ...`, or any argparse program's.
_REFUSAL_LINE = re.compile(r"^[^\s:][^:]*: error: \S")
_ELASTIC_LOGGER = "torch.distributed.elastic.multiprocessing.api"
_COMMANDS = ("accelerate", "accelerate-launch")
_MODULES = ("accelerate.commands.launch", "accelerate.commands.accelerate_cli")


def is_launcher(argv: list[str], orig_argv: list[str]) -> bool:
    """Whether this interpreter is accelerate's launcher: its command, or `python -m` one of its modules."""
    if argv and os.path.basename(argv[0]) in _COMMANDS:
        return True
    return any(flag == "-m" and module in _MODULES for flag, module in zip(orig_argv, orig_argv[1:]))


def install() -> None:
    """Wraps `sys.excepthook` so that a launch that ended in its workers' refusals exits 2 without a traceback."""
    if os.environ.get(OFF_SWITCH, "1") == "0" or not is_launcher(sys.argv, sys.orig_argv):
        return
    previous = sys.excepthook
    held = _HeldNotices()

    def excepthook(kind, error, traceback):
        if refused(error):
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(REFUSAL_STATUS)  # the interpreter's own exit would be status 1; nothing is left to clean up
        held.release()
        previous(kind, error, traceback)

    sys.excepthook = excepthook
    logging.getLogger(_ELASTIC_LOGGER).addFilter(held)


class _HeldNotices(logging.Filter):
    """With several processes torch's elastic agent logs the end of a failed launch before the launcher raises: the
    first failure (`failed (exitcode: 2) local_rank: 0 ...`) and the other ranks it stops (`Sending process ...
    closing signal SIGTERM`). Held until the launch's end is known: dropped after a refusal (they say nothing its
    line did not), logged before the traceback otherwise."""

    _NOTICES = ("failed (exitcode: %s)", "Sending process %s closing signal %s")

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.releasing = False

    def filter(self, record: logging.LogRecord) -> bool:
        if self.releasing or not str(record.msg).startswith(self._NOTICES):
            return True
        self.records.append(record)
        return False

    def release(self) -> None:
        self.releasing = True
        for record in self.records:
            logging.getLogger(record.name).handle(record)
        self.records.clear()


def refused(error: BaseException) -> bool:
    """Whether `error` is the launcher's report of a launch that ended in a refusal (see the module's docstring)."""
    if isinstance(error, subprocess.CalledProcessError):  # one process: the worker's stderr tail comes with it
        return error.returncode == REFUSAL_STATUS and _ends_with_refusal(error.stderr)
    # Several processes: torch.distributed.elastic's ChildFailedError, known by name (torch is not imported here).
    failures = getattr(error, "failures", None)
    if type(error).__name__ == "ChildFailedError" and isinstance(failures, dict) and failures:
        # The first rank to stop refused; the others refused too, or were stopped by the agent because it did.
        first = min(failures.values(), key=lambda failure: getattr(failure, "timestamp", 0))
        stopped = {REFUSAL_STATUS, -signal.SIGTERM, -signal.SIGKILL}
        return first.exitcode == REFUSAL_STATUS and all(f.exitcode in stopped for f in failures.values())
    return False


def _ends_with_refusal(stderr) -> bool:
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    lines = [line for line in (stderr or "").splitlines() if line.strip()]
    return bool(lines) and _REFUSAL_LINE.match(lines[-1]) is not None
