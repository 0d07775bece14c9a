"""What a training run checks and fixes in its surroundings before it starts: the output folder, the model source,
the CPU/DeepSpeed environment, one-line errors, and the command that resumes a run."""

from __future__ import annotations

import contextlib
import importlib
import os
import shlex
import sys
from pathlib import Path

import torch

from ..trainer.collectives import is_deepspeed, pause_backend_threads_at_exit
from .refusals import ConfigError, model_source_problem, output_dir_problem, say_refusal


def cpu_only() -> bool:
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return True
    return not (torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()))


def skip_deepspeed_shm_build() -> None:
    """Under DeepSpeed on CPU, skips the JIT build of DeepSpeed's shared-memory all-reduce kernel.

    DeepSpeed compiles that C++ op when its communication backend starts, for any number of processes; with
    `DS_BUILD_OPS=0` that is minutes of compiling, and needs a compiler. Training never uses it: only
    `inference_all_reduce` (DeepSpeed's tensor-parallel layers) does, and without the op that call falls back to
    torch.distributed's all-reduce. ZeRO's own collectives are torch.distributed's either way.
    """
    if not is_deepspeed():
        return
    if torch.cuda.is_available():
        return
    with contextlib.suppress(ImportError):
        # import_module, not `import deepspeed.comm.torch as`: that attribute of deepspeed.comm is torch itself
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def check_output_dir(training_args) -> None:
    """One rule for a folder that holds another run: continue it with resume_from_checkpoint, or use a new folder; and
    a resume_from_checkpoint that is not a checkpoint is refused with the checkpoints there are.

    Checkpoints and seeds are one run (`refusals.earlier_run_problem`), so a used folder is refused before anything is
    loaded or written.
    Every rank checks its own output_dir (another machine's may be a local disk), and all stop with the first line.
    """
    problem = None
    try:
        problem = output_dir_problem(Path(training_args.output_dir), training_args.resume_from_checkpoint)
    except ValueError as error:  # a checkpoint's trainer state that does not read
        problem = str(error)
    problem = first_problem_of_every_rank(problem)
    if problem is not None:
        raise ConfigError(problem)


def first_problem_of_every_rank(problem: str | None) -> str | None:
    """The first rank's problem (None: none has one), on every rank of a started process group; `problem` alone
    without one. A rank that stopped alone would leave the others waiting in their first collective."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return problem
    found = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(found, problem)
    pause_backend_threads_at_exit()  # a rank that refuses exits right after this gather: as cleanly as a finished run
    rank, first = next(((r, p) for r, p in enumerate(found) if p is not None), (0, None))
    return first if rank == 0 or first is None else f"Rank {rank} (its own --output_dir): {first}"


def check_model_source(name: str) -> None:
    """Fails early and clearly on a local model path that does not exist, or a Hub id not cached when offline."""
    problem = model_source_problem(name)
    if problem is not None:
        raise ConfigError(problem)


@contextlib.contextmanager
def fail_clearly(prog: str | None = None):
    """Turns bad input found before training into one line on stderr and exit status 2 (no traceback)."""
    try:
        yield
    except (ValueError, FileNotFoundError, ImportError, OSError) as error:
        say_refusal(prog or program_name(), str(error))
        raise SystemExit(2) from None


def program_name() -> str:
    """The command as the user typed it, for error lines: `train.py`, or `ts_trl train` (also `python -m ts_trl train`
    and `accelerate launch -m ts_trl train`, whose argv[0] is the package's `__main__.py`)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if name in ("", "ts_trl", "__main__.py"):
        command = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "train"
        return f"ts_trl {command}"
    return name


def resume_command(checkpoint: str | None) -> str:
    """The command line that continues this run from `checkpoint`: the one that started it, plus the checkpoint.

    Under `accelerate launch` the worker's own argv lacks the launcher's options, so the launcher's command line is
    read from the parent process where the system shows it (Linux); elsewhere it is this process's, as typed: the
    console script `ts_trl train ...` (its argv[0] is the script's full path in the venv, run by Python), or
    `python -m ts_trl ...`, or `python train.py ...`.
    """
    console_script = Path(sys.argv[0]).name == "ts_trl" if sys.argv else False
    argv = ["ts_trl", *sys.argv[1:]] if console_script else [Path(sys.executable).name, *sys.argv]
    with contextlib.suppress(OSError, UnicodeDecodeError):
        parent = [part.decode() for part in Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0") if part]
        # `accelerate launch ...` or `python -m accelerate.commands.launch ...` (torchrun's agent runs in the launcher)
        launch = [
            i for i, part in enumerate(parent) if part == "launch" or part.endswith("accelerate.commands.launch")
        ]
        if launch and any("accelerate" in part for part in parent[: launch[0] + 1]):
            argv = ["accelerate", "launch", *parent[launch[0] + 1 :]]
    if argv[0].startswith("python") and len(argv) > 1 and Path(argv[1]).name == "__main__.py":
        argv = [argv[0], "-m", "ts_trl", *argv[2:]]  # `ts_trl train` runs through ts_trl/__main__.py
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume_from_checkpoint":
            skip = True
        elif not arg.startswith("--resume_from_checkpoint="):
            kept.append(arg)
    return shlex.join([*kept, "--resume_from_checkpoint", checkpoint or "<checkpoint>"])
