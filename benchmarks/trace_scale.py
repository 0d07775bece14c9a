"""Text seeds at dataset scale: constructing the seeds of a `seed_dataset` of N short reasoning traces.

Each size runs in a fresh process (`python benchmarks/trace_scale.py SIZE ...`), which reads a Parquet file of N
synthetic traces (a prompt and a few-line trace each, `TRACES_PER_PROMPT` per training prompt) through
`read_external_seeds`, the function a `SeedGRPOTrainer` with `seed_dataset=<file>` calls at construction, with the
tiny character-level tokenizer. Reported: CPU seconds (`time.process_time`, what a loaded machine inflates least),
wall seconds and the process's peak resident memory (`ru_maxrss`), before and after the call. A Parquet file is read
a batch of rows at a time (`STREAM_ROWS`), so the peak does not grow with every text held at once.

    python benchmarks/trace_scale.py 10000 100000 1000000 --out benchmarks/results/trace_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
TRACES_PER_PROMPT = 4
WRITE_BATCH = 50_000  # rows per row group of the synthetic file


def _prompt(p: int, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> str:
    return f"Q: What is {a[p]}+{b[p]}+{c[p]}?\nA:"


def _operands(num_prompts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return tuple(rng.integers(1, 1000, num_prompts) for _ in range(3))


def write_traces(size: int, path: Path) -> int:
    """N synthetic traces of `size // TRACES_PER_PROMPT` prompts, written as Parquet; returns the number of prompts."""
    num_prompts = max(size // TRACES_PER_PROMPT, 1)
    a, b, c = _operands(num_prompts)
    writer = None
    for start in range(0, size, WRITE_BATCH):
        rows = range(start, min(start + WRITE_BATCH, size))
        prompts, completions = [], []
        for i in rows:
            p = i % num_prompts
            ab = a[p] + b[p]
            prompts.append(_prompt(p, a, b, c))
            completions.append(
                f" First, {a[p]} + {b[p]} = {ab}.\nThen {ab} + {c[p]} = {ab + c[p]}.\n"
                f"Check: {c[p]} + {b[p]} + {a[p]} = {ab + c[p]} (try {i % 7}).\n#### {ab + c[p]}"
            )
        table = pa.table({"prompt": prompts, "completion": completions})
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    writer.close()
    return num_prompts


def measure(path: Path, num_prompts: int, output_dir: Path) -> dict:
    """Constructs the seeds of `path` as a trainer does, in this process; returns what it cost."""
    sys.path.insert(0, str(REPO))
    from datasets import Dataset

    from ts_trl.store.external_seeds import ExternalSeedSettings, read_external_seeds
    from ts_trl.store.schema import tokenizer_fingerprint
    from ts_trl.tiny import build_tokenizer

    a, b, c = _operands(num_prompts)
    train = Dataset.from_dict({"prompt": [_prompt(p, a, b, c) for p in range(num_prompts)]})
    tokenizer = build_tokenizer()
    settings = ExternalSeedSettings(seed_dataset=str(path), max_completion_length=256, output_dir=str(output_dir))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    wall, cpu = time.perf_counter(), time.process_time()
    seeds = read_external_seeds(settings, tokenizer, tokenizer_fingerprint(tokenizer), train)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        "peak_rss_mb_before": round(rss_before / 1024, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "kept": seeds.provenance["kept"],
        "cuts_per_seed": round(float(np.mean([len(v) for v in seeds.text_cuts.values()])), 1),
    }


def run(sizes, scratch: Path, report=None) -> list[dict]:
    """One fresh process per size (the file is written by another), so each peak is that size's own; `report` is
    called with each size's row as soon as it is measured (a long run's first rows are not lost with its last)."""
    results = []
    for size in sizes:
        path = scratch / f"traces-{size}.parquet"
        num_prompts = write_traces(size, path)
        command = [sys.executable, __file__, str(size), "--measure", str(path), "--prompts", str(num_prompts)]
        command += ["--output-dir", str(scratch / f"run-{size}")]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results.append({"traces": size, "file_mb": round(path.stat().st_size / 2**20, 1), **json.loads(out)})
        path.unlink()
        if report is not None:
            report(results[-1])
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sizes", nargs="+", type=int)
    parser.add_argument("--out", type=Path, help="also write the rows, the commit and the load to this JSON file")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--prompts", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--output-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.prompts, args.output_dir)))
        return 0
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        rows = run(args.sizes, Path(scratch), lambda row: print(json.dumps(row), flush=True))
    if args.out is not None:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        report = {
            "commit": commit.stdout.strip() or None,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "cores": os.cpu_count(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "sizes": rows,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
