"""How long a process takes to end when its last seed upload is stalled: `ShardPusher`'s daemon thread against
huggingface_hub's `HfApi.run_as_future`, and what `CommitScheduler` does with no network (see docs/cards.md).

    PYTHONPATH=. python benchmarks/hub_exit_time.py

The local Hub stand-in of the tests (`tests/support/hub_server.py`) holds every request for 20 s; each variant runs in a fresh
process that submits one shard and stops waiting for it after 1 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STALL_SECONDS = 20.0
CHILD = r"""
import concurrent.futures, sys, time
from pathlib import Path
from huggingface_hub import CommitOperationAdd, CommitScheduler, HfApi

mode, endpoint, shard = sys.argv[1], sys.argv[2], Path(sys.argv[3])
start = time.monotonic()
if mode == "ShardPusher":
    from ts_trl.store.hub import ShardPusher

    pusher = ShardPusher("org/seeds", token="hf_fake", endpoint=endpoint, max_retries=0)
    pusher.submit(shard)
    print("shards not pushed:", len(pusher.close(timeout=1.0)))
elif mode == "run_as_future":
    api = HfApi(endpoint=endpoint, token="hf_fake")

    def push():
        api.create_repo("org/seeds", repo_type="dataset", exist_ok=True)
        add = CommitOperationAdd(path_in_repo=f"data/{shard.name}", path_or_fileobj=str(shard))
        api.create_commit("org/seeds", [add], commit_message="Add a shard", repo_type="dataset")

    done, _ = concurrent.futures.wait([api.run_as_future(push)], timeout=1.0)
    print("pushed within 1 s:", bool(done))
else:
    try:
        CommitScheduler(repo_id="org/seeds", repo_type="dataset", folder_path=shard.parent, every=1, token="hf_fake")
    except Exception as error:
        print(f"CommitScheduler() raised {type(error).__name__} after {time.monotonic() - start:.2f} s")
print(f"main code done after {time.monotonic() - start:.2f} s", flush=True)
"""


def _run(mode: str, endpoint: str, shard: Path, env: dict) -> str:
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", CHILD, mode, endpoint, str(shard)], env=env, capture_output=True, text=True
    )
    lines = "; ".join(result.stdout.split("\n")).strip("; ")
    return f"{mode}: the process ended {time.monotonic() - start:.1f} s after it started ({lines})"


def main() -> None:
    sys.path.insert(0, os.getcwd())
    from tests.store.test_hub import write_run
    from tests.support.hub_server import LocalHub

    shard = write_run(Path(tempfile.mkdtemp()) / "run", [1])[0]
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1", "PYTHONPATH": os.getcwd()}
    for mode in ("ShardPusher", "run_as_future"):
        hub = LocalHub().start()
        hub.stall(STALL_SECONDS)
        print(_run(mode, hub.endpoint, shard, {**env, "HF_ENDPOINT": hub.endpoint}))
        hub.stop()
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens there, as with no network
    print(_run("CommitScheduler", closed, shard, {**env, "HF_ENDPOINT": closed}))
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
