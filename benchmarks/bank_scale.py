"""Seed bank at scale: insert throughput, `sample` latency, resident memory, snapshot writes and resume loads.

Each bank size runs in a fresh process (`python benchmarks/bank_scale.py SIZE ...`), so the resident-memory delta
is the bank's own and not what an earlier, larger bank left in the allocator. Rollouts are synthetic: `tokens` ids
and log-probs each, `ROLLOUTS_PER_PROMPT` per prompt (a prompt seen in 4 epochs with 16 generations), written as one
Parquet shard per `checkpoint_rollouts` new rollouts, exactly as `SeedStore.write_snapshot` writes them.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

ROLLOUTS_PER_PROMPT = 64
SAMPLE_BATCH = 256  # prompts per `SeedBank.sample` call: a large GRPO generation batch
SAMPLE_REPEATS = 50
VOCAB = 100


def _rss() -> tuple[int, int]:
    """Resident bytes as they are, then after `malloc_trim(0)` (glibc) returned the free heap pages it caches."""
    gc.collect()
    untrimmed = psutil.Process().memory_info().rss
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
    return untrimmed, psutil.Process().memory_info().rss


def _timed(function, *args):
    """(result, wall seconds, CPU seconds) of one call: CPU time is the part a loaded machine does not inflate much."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function(*args)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def _checkpoint(index: int, size: int, tokens: int, num_prompts: int):
    """The `size` synthetic rollouts of checkpoint `index` (deterministic, so they can be made again for the shard)."""
    from ts_trl.store.schema import Rollout

    rng = np.random.default_rng(index)
    ids = rng.integers(4, VOCAB, size=(size, tokens), dtype=np.int32)
    logps = -rng.exponential(size=(size, tokens)).astype(np.float32)
    rewards = (rng.random(size) < 0.5).astype(np.float32)
    first = index * size
    return [
        Rollout(
            rollout_id=f"bench-{index:06d}-00-{i:06d}",
            prompt_id=f"prompt-{(first + i) % num_prompts:07d}",
            prompt=f"Q: synthetic prompt {(first + i) % num_prompts}",
            completion="",  # filled only for shards: the bank keeps ids, not text
            completion_ids=ids[i],
            logprobs=logps[i],
            reward=float(rewards[i]),
            step=index,
            rewards={"synthetic": float(rewards[i])},
        )
        for i in range(size)
    ]


def build(size: int, tokens: int, checkpoint_rollouts: int, shard_dir: Path) -> dict:
    """Fills a bank of `size` rollouts, then samples from it and writes its snapshots; one process per size."""
    from ts_trl.store.bank import SeedBank
    from ts_trl.store.format import SeedManifest, bank_file_name, shard_name, write_bank_file, write_shard
    from ts_trl.store.schema import rollouts_to_table

    num_prompts = max(size // ROLLOUTS_PER_PROMPT, 1)
    checkpoint_rollouts = min(checkpoint_rollouts, size)
    num_checkpoints = size // checkpoint_rollouts
    _checkpoint(0, 8, tokens, num_prompts)  # first-use allocations of the generator stay out of the delta
    rss_before = _rss()
    bank = SeedBank()
    insert_wall = insert_cpu = 0.0
    for index in range(num_checkpoints):
        rollouts = _checkpoint(index, checkpoint_rollouts, tokens, num_prompts)
        _, wall, cpu = _timed(bank.add_rollouts, rollouts)
        insert_wall, insert_cpu = insert_wall + wall, insert_cpu + cpu
        del rollouts
    rss_after = _rss()
    bank.mark_snapshotted()

    rng = np.random.default_rng(0)
    sample_wall, sample_cpu = [], []
    for _ in range(SAMPLE_REPEATS):
        prompts = [f"prompt-{p:07d}" for p in rng.integers(0, num_prompts, SAMPLE_BATCH)]
        seeds, wall, cpu = _timed(bank.sample, prompts, num_checkpoints + 1, rng)
        assert all(s is not None for s in seeds)
        sample_wall.append(wall)
        sample_cpu.append(cpu)

    # One checkpoint's snapshot while the whole bank is resident: its cost must be that of the new rollouts alone.
    warm_up = rollouts_to_table(
        _checkpoint(0, 8, tokens, num_prompts), "warm-up", "tiny", "fingerprint", ["synthetic"]
    )
    write_shard(warm_up, shard_dir / "warm-up.parquet")  # first-call costs of pyarrow's writer stay out of the timing
    (shard_dir / "warm-up.parquet").unlink()
    write_wall, write_cpu, shard_bytes = [], [], 0
    manifest = SeedManifest(shard_dir, "bench", "tiny", "fingerprint")
    for index in range(num_checkpoints):
        rollouts = _checkpoint(index, checkpoint_rollouts, tokens, num_prompts)
        path = shard_dir / shard_name(index)
        wall, cpu = time.perf_counter(), time.process_time()
        table = rollouts_to_table(rollouts, f"checkpoint-{index}", "tiny", "fingerprint", ["synthetic"])
        checksum = write_shard(table, path)  # as `SeedStore.write_snapshot` does
        manifest.record(index, table.num_rows, checksum, write_bank_file(table, shard_dir / bank_file_name(index)))
        manifest.save()
        write_wall.append(time.perf_counter() - wall)
        write_cpu.append(time.process_time() - cpu)
        shard_bytes += path.stat().st_size
        del rollouts, table
    raw = size * tokens * 8  # int32 ids + float32 log-probs
    stats = {
        "size": size,
        "tokens": tokens,
        "prompts": num_prompts,
        "insert_rollouts_per_s": size / insert_wall,
        "insert_rollouts_per_cpu_s": size / insert_cpu,
        "sample_ms": 1e3 * float(np.median(sample_wall)),
        "sample_cpu_ms": 1e3 * float(np.median(sample_cpu)),
        "sample_ms_min": 1e3 * float(np.min(sample_wall)),  # the least disturbed by other processes' load
        "raw_bytes": raw,
        "bank_nbytes": bank.nbytes,
        "metadata_bytes_per_rollout": bank.metadata_bytes_per_rollout,
        "rss_delta_bytes": rss_after[1] - rss_before[1],
        "rss_over_raw": (rss_after[1] - rss_before[1]) / raw,
        "rss_untrimmed_over_raw": (rss_after[0] - rss_before[0]) / raw,
        "checkpoint_rollouts": checkpoint_rollouts,
        "snapshot_write_s": float(np.median(write_wall)),
        "snapshot_write_cpu_s": float(np.median(write_cpu)),
        "snapshot_write_first_s": write_wall[0],
        "snapshot_write_last_s": write_wall[-1],
        "shards": num_checkpoints,
        "shard_bytes": shard_bytes,
    }
    del bank
    gc.collect()
    return stats | resume(shard_dir) | node(shard_dir, raw)


def _manifest(shard_dir: Path):
    from ts_trl.store.format import SeedManifest

    return SeedManifest.load(shard_dir)


def resume(shard_dir: Path) -> dict:
    """Times what a resumed run does (`SeedStore.start`): verify every file's checksum, map the shards' bank files,
    fill a new bank from them.

    Also times the fallback for shards without a bank file: the bank columns read from the Parquet shards.
    """
    from ts_trl.store.bank import SeedBank
    from ts_trl.store.format import read_bank_table, read_table, verify_shards
    from ts_trl.store.schema import BANK_COLUMNS
    from ts_trl.store.seed_store import fill_bank

    manifest = _manifest(shard_dir)
    problems, verify_wall, verify_cpu = _timed(verify_shards, manifest, manifest.shards)
    assert not problems, problems
    table, read_wall, read_cpu = _timed(read_bank_table, manifest, manifest.shards, VOCAB, problems)
    bank = SeedBank()
    _, fill_wall, fill_cpu = _timed(fill_bank, bank, table)
    rollouts = len(bank)
    del bank, table
    parquet, parquet_read, _ = _timed(read_table, manifest.paths(), BANK_COLUMNS)
    _, parquet_fill, _ = _timed(fill_bank, SeedBank(), parquet)
    return {
        "resume_verify_s": verify_wall,
        "resume_read_s": read_wall,
        "resume_fill_s": fill_wall,
        "resume_s": verify_wall + read_wall + fill_wall,
        "resume_cpu_s": verify_cpu + read_cpu + fill_cpu,
        "resume_rollouts": rollouts,
        "resume_parquet_s": parquet_read + parquet_fill,
    }


def _memory() -> dict:
    _rss()  # collect and trim first, as for the single-process figures
    info = psutil.Process().memory_full_info()
    return {"rss": info.rss, "pss": getattr(info, "pss", info.rss), "uss": info.uss}


def rank(shard_dir: Path, rank_id: int, ranks: int) -> dict:
    """One rank of a node resuming the bank: memory before and after, every token read once, all ranks alive."""
    from ts_trl.store.bank import SeedBank
    from ts_trl.store.format import read_bank_table
    from ts_trl.store.seed_store import fill_bank

    manifest = _manifest(shard_dir)
    first = read_bank_table(manifest, manifest.shards[:1], problems={})
    fill_bank(SeedBank(), first.slice(0, 8))  # first-use costs of the libraries
    before = _memory()
    bank = SeedBank()
    fill_bank(bank, read_bank_table(manifest, manifest.shards, problems={}))  # memory alone: checksums timed above
    bank.mark_snapshotted()
    touched = 0.0
    for ids, logps in bank._tokens.chunks:  # every page of the payload read once: the worst case for memory
        touched += float(ids.sum()) + float(logps.sum())
    (shard_dir / f"ready-{rank_id}").touch()
    while len(list(shard_dir.glob("ready-*"))) < ranks:  # measured while every rank maps the files
        time.sleep(0.05)
    after = _memory()
    (shard_dir / f"measured-{rank_id}").touch()
    while len(list(shard_dir.glob("measured-*"))) < ranks:
        time.sleep(0.05)
    return {key: after[key] - before[key] for key in after} | {"rollouts": len(bank), "checksum": touched}


def node(shard_dir: Path, raw: int, ranks: int = 2) -> dict:
    """`ranks` processes resume the same bank at once, as the ranks of one node do: their summed extra memory.

    RSS counts a shared page in every process that maps it, so the summed RSS double-counts the page cache; PSS
    charges each process its share, so the summed PSS is what the node spends.
    """
    command = [sys.executable, __file__, "--rank", str(shard_dir), str(ranks)]
    processes = [
        subprocess.Popen([*command, str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(ranks)
    ]
    rows = []
    for process in processes:
        out, err = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"A bank rank failed:\n{err[-4000:]}")
        rows.append(json.loads(out.strip().splitlines()[-1]))
    for marker in list(shard_dir.glob("ready-*")) + list(shard_dir.glob("measured-*")):
        marker.unlink()
    return {
        "node_ranks": ranks,
        "node_pss_over_raw": sum(r["pss"] for r in rows) / raw,
        "node_rss_over_raw": sum(r["rss"] for r in rows) / raw,
        "node_uss_over_raw": sum(r["uss"] for r in rows) / raw,
    }


def _subprocess(*args) -> dict:
    command = [sys.executable, __file__, *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run(sizes, tokens: int, checkpoint_rollouts: int, scratch: Path) -> dict:
    """One fresh process per bank size: build, sample, write the snapshots, then resume from them."""
    results = []
    for size in sizes:
        shard_dir = scratch / f"bank-{size}"
        shard_dir.mkdir(parents=True, exist_ok=True)
        try:
            row = _subprocess(size, tokens, checkpoint_rollouts, shard_dir)
        finally:
            shutil.rmtree(shard_dir)
        results.append(row)
    return {"rollouts_per_prompt": ROLLOUTS_PER_PROMPT, "sample_batch": SAMPLE_BATCH, "sizes": results}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if sys.argv[1:2] == ["--rank"]:  # one rank of `node`
        print(json.dumps(rank(Path(sys.argv[2]), int(sys.argv[4]), int(sys.argv[3]))))
        return
    parser = argparse.ArgumentParser(description="Builds one bank of synthetic rollouts and prints its measurements.")
    parser.add_argument("size", type=int)
    parser.add_argument("tokens", type=int)
    parser.add_argument("checkpoint_rollouts", type=int)
    parser.add_argument("shard_dir", type=Path)
    args = parser.parse_args()
    out = build(args.size, args.tokens, args.checkpoint_rollouts, args.shard_dir)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
