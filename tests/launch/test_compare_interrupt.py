"""Ctrl-C of `ts_trl compare` while its worker processes train: the command and every worker stop."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _group(pgid: int) -> dict[int, str]:
    """The live processes of a process group, with their command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...
            if int(fields[2]) == pgid and fields[0] != "Z":
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue  # gone meanwhile
    return found


def test_ctrl_c_of_compare_stops_its_workers(tmp_path, quick_warm_cache):
    # The session's warm-up: the workers start at once, rather than after a warm-up of their own.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TS_TRL_CACHE": str(quick_warm_cache), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "ts_trl", "compare", "--quick", "--jobs", "2", "--steps", "40", "--n_train", "16"]
    command += ["--prompts_per_step", "8", "--n_eval", "16", "--output_dir", str(tmp_path / "quick")]
    process = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # a job of its own, as in a terminal
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and process.poll() is None:
            workers = [pid for pid, line in _group(process.pid).items() if "spawn_main" in line]
            if len(workers) == 2:
                break
            time.sleep(1)
        assert len(workers) == 2, process.communicate(timeout=60)
        time.sleep(5)  # the workers are on their jobs
        os.killpg(process.pid, signal.SIGINT)  # the terminal's Ctrl-C: every process of the job gets it
        _, err = process.communicate(timeout=120)  # before: the command waited for every queued run
        assert process.returncode == 130 and "Traceback" not in err, err[-3000:]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(pid in _group(process.pid) for pid in workers):
            time.sleep(1)
        assert not [pid for pid in workers if pid in _group(process.pid)], _group(process.pid)
    finally:
        if process.poll() is None or _group(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
