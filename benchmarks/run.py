"""Benchmarks of ts_trl: step time against TRL's GRPOTrainer, the seed bank at scale, reward throughput, text seeds of
trace datasets.

    python benchmarks/run.py            # full run (135 s on 2 quiet cores); writes benchmarks/results/latest.*
    python benchmarks/run.py --quick    # CI-sized (under 3 minutes); writes to a temporary folder unless --out

Every comparison is a ratio measured in the same run (step times: per-round ratios of interleaved steps). Absolute
times are labelled with the machine they came from, and the load other processes put on it is recorded per section.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import bank_scale  # noqa: E402
import psutil  # noqa: E402
import reward_throughput  # noqa: E402
import step_time  # noqa: E402
import trace_scale  # noqa: E402

CI_MARGIN = 1.2  # CI fails only when a target is missed by more than 20% (noise on a shared machine)
# Step-time targets vs GRPOTrainer: a mixed batch no slower, a fully seeded one 10% faster. The value is the
# median of per-round wall-time ratios of interleaved steps, so slow load drift cancels. CI judges the lower of that and
# the same median of CPU-time ratios: bursts of load from other processes (seen: 1.15x wall, 0.92x CPU at load 2.7 in
# the quick run) inflate wall time only, while more work per step raises both.
STEP_TIME_TARGETS = {"seeds_f0.5": 1.0, "seeds_f1": 0.9}
RESUME_TARGET_S = 5.0  # resuming 10^6 rollouts
METADATA_TARGET_BYTES = 40  # per rollout, in every rank
TRACES_CPU_TARGET_S = 60.0  # constructing the text seeds of 10^5 short traces (issue 48, item 8)


def machine() -> dict:
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import numpy
    import torch
    import transformers
    import trl

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return {
        "cpu": cpu or platform.processor(),
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "numpy": numpy.__version__,
        "commit": commit.stdout.strip() or None,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


class LoadMonitor:
    """Samples, once a second, the 1-minute load average and how many cores processes other than this run keep busy."""

    def __init__(self, interval: float = 1.0):
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _own_cpu(self) -> float:
        me = psutil.Process()
        total = sum(me.cpu_times()[:2])
        for child in me.children(recursive=True):
            try:
                total += sum(child.cpu_times()[:2])
            except psutil.Error:
                pass
        return total

    def _loop(self) -> None:
        cores = os.cpu_count() or 1
        psutil.cpu_percent(None)
        last_own, last_t = self._own_cpu(), time.monotonic()
        while not self._stop.wait(self.interval):
            busy = psutil.cpu_percent(None) / 100 * cores
            own, now = self._own_cpu(), time.monotonic()
            own_busy = max(own - last_own, 0.0) / max(now - last_t, 1e-6)
            last_own, last_t = own, now
            self.samples.append((os.getloadavg()[0], max(busy - own_busy, 0.0)))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        if not self.samples:
            return {"load1_mean": os.getloadavg()[0], "load1_max": os.getloadavg()[0], "other_busy_cores_mean": None}
        loads, others = zip(*self.samples)
        return {
            "load1_mean": round(sum(loads) / len(loads), 2),
            "load1_max": round(max(loads), 2),
            "other_busy_cores_mean": round(sum(others) / len(others), 2),
        }


def _target(name, value, limit, unit="", note="", ci_limit=None, ci_value=None) -> dict:
    """A target `value <= limit`; CI fails when `ci_value` (default: the value) exceeds `ci_limit` (default: the limit
    plus the 20% noise margin)."""
    ci_limit = round(limit * CI_MARGIN, 3) if ci_limit is None else ci_limit
    ci_value = value if ci_value is None else ci_value
    return {
        "name": name,
        "value": value,
        "target": f"<= {limit:g}{unit}",
        "met": value is not None and value <= limit,
        "ci_limit": ci_limit,
        "ci_ok": ci_value is not None and ci_value <= ci_limit,
        "note": note,
    }


def targets(results: dict) -> list[dict]:
    out = []
    steps = results.get("step_time")
    if steps:
        v = steps["variants"]

        def judged(name):  # what CI judges: other processes' load inflates wall time, not the work a step does
            return min(v[name]["wall_ratio"]["median"], v[name]["cpu_ratio"]["median"])

        out.append(
            _target(
                "step time ratio, seed_fraction=0 vs GRPO",
                round(v["seeds_f0"]["wall_ratio"]["median"], 3),
                1.03,
                "x",
                f"median of per-round ratios; CPU ratio {v['seeds_f0']['cpu_ratio']['median']:.3f}",
                ci_value=judged("seeds_f0"),
            )
        )
        for name, label, why in (
            ("seeds_f0.5", "0.5", "plain rows need the full budget; seeded rows force their prefix, unpadded"),
            ("seeds_f1", "1.0", "decoding stops at the largest budget a prefix leaves"),
        ):
            bound = v[name]["token_bound_ratio"]["median"]
            static = v[name]["decode_bound_ratio"]["median"]
            out.append(
                _target(
                    f"step time ratio, seed_fraction={label} vs GRPO",
                    round(v[name]["wall_ratio"]["median"], 3),
                    STEP_TIME_TARGETS[name],
                    "x",
                    f"{why}; static-batching bound (generate time in proportion to decode steps): {static:.2f}x; "
                    f"physical bound (time in proportion to generated tokens): {bound:.2f}x; "
                    f"CPU ratio {v[name]['cpu_ratio']['median']:.3f}",
                    ci_value=judged(name),
                )
            )
    bank = results.get("bank")
    if bank:
        sizes = bank["sizes"]
        for row in sizes:
            out.append(
                _target(
                    f"SeedBank.sample, 256 prompts, bank 10^{len(str(row['size'])) - 1} (CPU ms)",
                    round(row["sample_cpu_ms"], 2),
                    5.0,
                    " ms",
                    f"median wall {row['sample_ms']:.2f} ms, fastest {row['sample_ms_min']:.2f} ms",
                )
            )
        out.append(
            _target(
                "SeedBank.sample flat in bank size (fastest of 50 draws, largest / smallest bank)",
                round(sizes[-1]["sample_ms_min"] / sizes[0]["sample_ms_min"], 2),
                1.25,
                "x",
            )
        )
        for row in sizes:
            out.append(
                _target(
                    f"resident memory / raw ids+log-probs, bank 10^{len(str(row['size'])) - 1}",
                    round(row["rss_over_raw"], 3),
                    1.5,
                    "x",
                    f"untrimmed RSS: {row['rss_untrimmed_over_raw']:.3f}x",
                )
            )
        for row in sizes:
            out.append(
                _target(
                    f"metadata per rollout, bank 10^{len(str(row['size'])) - 1} (bytes)",
                    round(row["metadata_bytes_per_rollout"], 1),
                    METADATA_TARGET_BYTES,
                    " B",
                    "token ids, log-probs and rollout-id text are payload, shareable through a memory map",
                )
            )
        largest = sizes[-1]
        out.append(
            _target(
                f"2 ranks resuming one bank, summed extra memory (PSS) / raw, bank 10^{len(str(largest['size'])) - 1}",
                round(largest["node_pss_over_raw"], 3),
                1.3,
                "x",
                f"every token read by both ranks; summed RSS {largest['node_rss_over_raw']:.2f}x counts the shared "
                f"page cache twice; private (USS) {largest['node_uss_over_raw']:.3f}x",
            )
        )
        out.append(
            _target(
                f"resume time per 10^6 rollouts, bank 10^{len(str(largest['size'])) - 1} (s)",
                round(largest["resume_s"] * 1e6 / largest["size"], 2),
                RESUME_TARGET_S,
                " s",
                f"measured {largest['resume_s']:.2f} s for {largest['size']:,} rollouts: checksums "
                f"{largest.get('resume_verify_s', 0.0):.2f} s + map {largest['resume_read_s']:.2f} s + fill {largest['resume_fill_s']:.2f} s; CPU "
                f"{largest['resume_cpu_s']:.2f} s, which CI judges: load inflates wall time",
                ci_value=round(largest["resume_cpu_s"] * 1e6 / largest["size"], 2),
            )
        )
        out.append(
            _target(
                "snapshot write time of one checkpoint, largest / smallest bank",
                round(sizes[-1]["snapshot_write_s"] / sizes[0]["snapshot_write_s"], 2),
                1.25,
                "x",
                f"{sizes[0]['checkpoint_rollouts']} new rollouts per checkpoint",
            )
        )
    traces = results.get("traces")
    if traces:
        for row in traces["sizes"]:
            out.append(
                _target(
                    f"text seeds of 10^{len(str(row['traces'])) - 1} short traces, CPU s per 10^5",
                    round(row["cpu_s"] * 1e5 / row["traces"], 1),
                    TRACES_CPU_TARGET_S,
                    " s",
                    f"measured {row['cpu_s']:.1f} s CPU ({row['wall_s']:.1f} s wall) for {row['traces']:,}; "
                    f"peak RSS {row['peak_rss_mb']:.0f} MB, {row['peak_rss_mb_before']:.0f} MB before the call",
                )
            )
    return out


def _fmt(value, digits=3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"# ts_trl benchmarks ({'quick' if report['quick'] else 'full'})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; Python {m['python']}, torch {m['torch']} "
        f"({m['torch_threads']} threads), transformers {m['transformers']}, TRL {m['trl']}; commit {m['commit']}, "
        f"{m['date']}. Total {report['seconds']:.0f} s.",
        "",
        "Load from other processes while each section ran (1-min load average; cores busy outside this run):",
        "",
        "| section | load avg (mean / max) | other busy cores (mean) |",
        "|---|---|---|",
    ]
    for section, load in report["load"].items():
        lines.append(
            f"| {section} | {load['load1_mean']} / {load['load1_max']} | {_fmt(load['other_busy_cores_mean'])} |"
        )
    lines += ["", "## Targets", "", "| target | value | goal | met | CI fails above |", "|---|---|---|---|---|"]
    for t in report["targets"]:
        met = "yes" if t["met"] else ("**no**" + ("" if t["ci_ok"] else " (beyond CI limit)"))
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| {t['name']}{note} | {_fmt(t['value'])} | {t['target']} | {met} | {_fmt(t['ci_limit'])} |")

    steps = report["results"].get("step_time")
    if steps:
        s = steps["settings"]
        lines += [
            "",
            "## Step time: SeedGRPOTrainer vs GRPOTrainer",
            "",
            f"Tiny Qwen2 (`build_tiny_model`), batch {s['batch_size']} ({s['batch_size'] // s['num_generations']} "
            f"groups of {s['num_generations']}), max_completion_length {s['max_completion_length']}, HF generate, "
            f"{s['warmup_steps']} warm-up + {s['measured_steps']} measured steps per trainer, steps interleaved "
            f"in shuffled rounds (ratios: median over rounds of t(variant)/t(GRPO) in the same round, "
            f"[25%, 75%] quantiles). Generated tokens: per step, kept in the responses; physical bound: the step "
            f"time ratio if a step cost exactly in proportion to its generated tokens (median per-round token ratio); "
            f"static-batching bound: GRPO's step of the same round with its `generate` time scaled by the variant's "
            f"decode steps and the rest unchanged, the least one static `generate` call per step can cost; "
            f"decoded tokens: rows x decode steps that `generate` computed, forced prefix tokens included. "
            f"`seed_fraction=0` reproduces GRPO exactly: "
            f"{'yes' if steps['seed_fraction_0_matches_grpo'] else '**no**'}.",
            "",
            "| trainer | wall ratio | CPU ratio | step wall s | TRL step_time s | generate s | seeded groups "
            "| generated tokens | physical bound | static-batching bound | prefix tokens | decoded tokens | decode steps "
            "| generate prompt width |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, r in steps["variants"].items():
            ratio = r["wall_ratio"]
            lines.append(
                f"| {name} | {ratio['median']:.3f} [{ratio['q25']:.2f}, {ratio['q75']:.2f}] "
                f"| {r['cpu_ratio']['median']:.3f} | {r['wall_s']['median']:.3f} | {r['trl_step_time_s']['median']:.3f} "
                f"| {r['generate_s']['median']:.3f} | {r['seeded_group_share']['median']:.2f} "
                f"| {r['generated_tokens']['median']:.0f} | {r['token_bound_ratio']['median']:.3f} "
                f"| {r['decode_bound_ratio']['median']:.3f} "
                f"| {r['prefix_tokens']['median']:.0f} | {r['decoded_tokens']['median']:.0f} "
                f"| {r['decode_steps']['median']:.0f} | {r['prompt_width']['median']:.0f} |"
            )

    bank = report["results"].get("bank")
    if bank:
        lines += [
            "",
            "## Seed bank at scale",
            "",
            f"Synthetic rollouts of {bank['sizes'][0]['tokens']} tokens, {bank['rollouts_per_prompt']} per prompt; "
            f"`sample` draws one seed for each of {bank['sample_batch']} prompts; one fresh process per size. "
            "Memory: RSS delta after `malloc_trim(0)`, over the raw bytes of int32 ids + float32 log-probs.",
            "",
            "| rollouts | insert rollouts/s | sample ms (CPU ms) | RSS / raw | metadata B/rollout | bank arrays GB "
            "| snapshot write s (per checkpoint) | resume s (checksums + map + fill) | resume from Parquet only s "
            "| 2 ranks: PSS / RSS over raw |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in bank["sizes"]:
            lines.append(
                f"| {r['size']:,} | {r['insert_rollouts_per_s']:,.0f} | {r['sample_ms']:.2f} ({r['sample_cpu_ms']:.2f}) "
                f"| {r['rss_over_raw']:.3f} | {r['metadata_bytes_per_rollout']:.0f} | {r['bank_nbytes'] / 1e9:.2f} "
                f"| {r['snapshot_write_s']:.3f} ({r['checkpoint_rollouts']:,} rollouts) "
                f"| {r['resume_s']:.2f} ({r.get('resume_verify_s', 0.0):.2f} + {r['resume_read_s']:.2f} + "
                f"{r['resume_fill_s']:.2f}) "
                f"| {r['resume_parquet_s']:.1f} | {r['node_pss_over_raw']:.2f} / {r['node_rss_over_raw']:.2f} |"
            )

    rewards = report["results"].get("rewards")
    if rewards is not None:
        lines += ["", "## Reward throughput", ""]
        if not rewards["available"]:
            lines.append(f"Not available: {rewards['reason']}")
        else:
            lines += ["| reward | samples | samples/s | batch | details |", "|---|---|---|---|---|"]
            m_, c_ = rewards["math"], rewards["code"]
            if m_.get("available", True):
                lines.append(
                    f"| math (math-verify) | {m_['samples']} | {m_['samples_per_s']:.0f} | {m_['batch']} "
                    f"| {m_['data']} |"
                )
            else:
                lines.append(f"| math (math-verify) | - | not available | - | {m_['reason']} |")
            lines.append(
                f"| code (sandboxed) | {c_['samples']} | {c_['samples_per_s']:.1f} | {c_['batch']} "
                f"| layers: {', '.join(c_['isolation'])} |"
            )
    traces = report["results"].get("traces")
    if traces:
        lines += [
            "",
            "## Text seeds of trace datasets",
            "",
            "`read_external_seeds` (what `SeedGRPOTrainer(seed_dataset=<file>)` calls at construction) on a Parquet file "
            "of N synthetic short traces, character tokenizer; one fresh process per size. CPU: `time.process_time`; "
            "peak RSS: the process's `ru_maxrss`.",
            "",
            "| traces | file MB | CPU s | wall s | peak RSS MB (before the call) | seeds | cuts per seed |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in traces["sizes"]:
            lines.append(
                f"| {r['traces']:,} | {r['file_mb']} | {r['cpu_s']:.1f} | {r['wall_s']:.1f} "
                f"| {r['peak_rss_mb']:.0f} ({r['peak_rss_mb_before']:.0f}) | {r['kept']:,} | {r['cuts_per_seed']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI size: banks of 10^4 and 10^5, fewer steps")
    parser.add_argument(
        "--out", type=Path, help="report folder (default: benchmarks/results, or a temp dir in --quick)"
    )
    parser.add_argument(
        "--only", nargs="+", choices=("step_time", "bank", "rewards", "traces"), help="run only these sections"
    )
    args = parser.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp(prefix="ts_trl-bench-")) if args.quick else REPO / "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    sections = args.only or ["step_time", "bank", "rewards", "traces"]
    started = time.perf_counter()
    report = {"quick": args.quick, "machine": machine(), "load": {}, "results": {}}
    with tempfile.TemporaryDirectory(prefix="ts_trl-bench-") as scratch:
        for section in sections:
            print(f"[bench] {section} ...", flush=True)
            with LoadMonitor() as monitor:
                if section == "step_time":
                    result = step_time.run(args.quick, scratch)
                    for variant in result["variants"].values():
                        variant.pop("loss")
                elif section == "bank":
                    sizes = [10**4, 10**5] if args.quick else [10**4, 10**5, 10**6]
                    result = bank_scale.run(sizes, 256, 5000, Path(scratch))
                elif section == "traces":
                    sizes = [10**4] if args.quick else [10**4, 10**5, 10**6]
                    result = {"sizes": trace_scale.run(sizes, Path(scratch))}
                else:
                    result = reward_throughput.run(args.quick)
            report["results"][section] = result
            report["load"][section] = monitor.summary()
    report["seconds"] = time.perf_counter() - started
    report["targets"] = targets(report["results"])
    (out / "latest.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out / "latest.md").write_text(text)
    print(text)
    print(f"[bench] report written to {out}/latest.json and latest.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
