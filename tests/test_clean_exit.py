"""A finished multi-process run exits 0 on every rank (issue 13, item 13).

The last collectives of training (the final snapshot's object gather, then a barrier) leave gloo's worker thread
freeing the gather's tensors, which needs the GIL. A rank that left `train()` at once could reach interpreter
finalization first; the worker then died taking the GIL inside a C++ destructor ("terminate called without an active
exception", SIGABRT). Without `ts_trl.collectives.pause_backend_threads_at_exit` that was 6 aborted runs out of 62
with 2 CPU processes; with it, 0 of 30. The race cannot be forced, so the test repeats complete 2-rank runs, each a
fresh pair of interpreters. Scripts that end with `trainer.end()` (`ts_trl train` does) destroy the process group
first, but DDP keeps gloo's threads alive: the pause once skipped them and CI caught an abort there (1 in 20 runs
of `two_rank_exit.py --end` before the fix).
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _two_rank_runs(tmp_path, repeats: int, prefix_mode: str = "state", end: bool = False) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.update(TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.pop("ACCELERATE_USE_CPU", None)
    failures = []
    for attempt in range(repeats):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            _free_port(),
        ]
        command += [str(ROOT / "tests" / "two_rank_exit.py"), str(tmp_path / f"run{attempt}"), prefix_mode]
        command += ["--end"] if end else []
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        output = result.stdout + result.stderr
        assert "rank 0 finished training" in output and "rank 1 finished training" in output, output[-3000:]
        if result.returncode != 0 or "terminate called" in output:
            failures.append(f"attempt {attempt}: exit {result.returncode}\n{output[-1500:]}")
    assert not failures, f"{len(failures)} of {repeats} complete runs failed at exit:\n" + "\n".join(failures)


@pytest.mark.parametrize("prefix_mode, end", [("state", False), ("action", False), ("state", True)])
def test_finished_two_rank_runs_exit_zero_on_every_rank(tmp_path, prefix_mode, end):
    _two_rank_runs(tmp_path, repeats=6, prefix_mode=prefix_mode, end=end)  # 18 runs: a 1-in-10 abort fails 5 in 6


def test_the_exit_pause_outlives_a_destroyed_process_group(tmp_path):
    """`trainer.end()` destroys the group, not gloo's threads (DDP holds them): the exit handler must still pause."""
    script = f"""
import time, torch.distributed as dist
from ts_trl import collectives
dist.init_process_group("gloo", init_method="file://{tmp_path / "rendezvous"}", rank=0, world_size=1)
collectives.pause_backend_threads_at_exit()
dist.destroy_process_group()
start = time.perf_counter()
collectives._pause_for_backend_threads()
print("paused", time.perf_counter() - start)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    from ts_trl.collectives import EXIT_PAUSE_S

    assert float(result.stdout.split("paused")[-1]) >= EXIT_PAUSE_S


@pytest.mark.slow
def test_thirty_finished_two_rank_runs_exit_zero(tmp_path):
    """Detects a 1-in-10 abort with probability 0.96."""
    _two_rank_runs(tmp_path, repeats=30)
