"""GPU smoke run: the tiny model through `accelerate launch train.py` in bf16, with LoRA on one GPU and with ZeRO-3.

Not part of the test suite (CI has no GPU). On a machine with one CUDA GPU and the package installed:

    python benchmarks/gpu_smoke.py --out /tmp/gpu-smoke

Each case trains a few steps with seeding on, then checks what a user would look at: exit status, seed shards with one
log-prob per token, groups actually seeded, the trainer's logged loss, and (for ZeRO-3) a resumed run continuing the
same seed dataset. It writes `summary.json` and one log per case into `--out`, and exits non-zero if a case failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
REWARD = "tests.conftest.count_reward"  # spread on random text, importable from the repository root
COMMON = [
    "--per_device_train_batch_size", "16",
    "--num_generations", "4",
    "--max_completion_length", "24",
    "--save_steps", "2",
    "--seed_fraction", "1.0",
    "--learning_rate", "1e-3",
    "--logging_steps", "1",
    "--report_to", "none",
    "--disable_tqdm", "true",
    "--bf16", "true",
    "--use_vllm", "false",
]  # fmt: skip


def prepare(folder: Path) -> tuple[Path, Path]:
    """Saves the tiny model like a Hub checkpoint, and four prompts with GSM8K's schema."""
    from ts_trl.tiny import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    rows = [{"question": f"{a}+{a + 1}=", "answer": f"#### {2 * a + 1}"} for a in range(4)]
    data = folder / "math.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "model", data


def launch(name: str, accelerate_args: list[str], train_args: list[str], out: Path) -> dict:
    command = [sys.executable, "-m", "accelerate.commands.launch", *accelerate_args, "train.py", *train_args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    seconds = time.perf_counter() - start
    (out / f"{name}.log").write_text(f"$ {' '.join(command)}\n{result.stdout}\n--- stderr ---\n{result.stderr}")
    return {"name": name, "exit": result.returncode, "seconds": round(seconds, 1)}


def inspect_run(output_dir: Path) -> dict:
    """What a user checks after a run: shards, seeded groups, losses, the saved weights' dtype."""
    seeds = output_dir / "seeds"
    manifest = json.loads((seeds / "manifest.json").read_text())
    rows = [row for s in manifest["shards"] for row in pq.read_table(seeds / s["file"]).to_pylist()]
    states = sorted(output_dir.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    history = json.loads(states[-1].read_text())["log_history"] if states else []
    seeded = [h["seeds/seeded_group_share"] for h in history if "seeds/seeded_group_share" in h]
    losses = [h["loss"] for h in history if "loss" in h]
    return {
        "shards": [s["step"] for s in manifest["shards"]],
        "rollouts": len(rows),
        "logprobs_aligned": all(len(r["logprobs"]) == len(r["completion_ids"]) for r in rows),
        "continuations": sum(r["prefix_len"] > 0 for r in rows),
        "seeded_group_share": seeded,
        "losses_finite": bool(losses) and all(loss == loss for loss in losses),
        "last_step": json.loads(states[-1].read_text())["global_step"] if states else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    model, data = prepare(work)
    base = ["--model_name_or_path", str(model), "--dataset_path", str(data), "--reward_funcs", REWARD, *COMMON]
    single = ["--config_file", str(ROOT / "accelerate_configs" / "single_gpu.yaml")]
    zero3 = ["--config_file", str(ROOT / "accelerate_configs" / "zero3.yaml"), "--num_processes", "1"]
    steps = ["--max_steps", str(args.steps)]
    cases = [
        ("lora_bf16", single, ["--use_peft", "--lora_r", "8", "--lora_alpha", "16", *steps]),
        ("zero3_bf16_state", zero3, steps),
        ("zero3_bf16_action", zero3, [*steps, "--prefix_mode", "action"]),
        ("zero3_bf16_replay", zero3, [*steps, "--seed_method", "replay"]),
    ]
    summary = []
    for name, accelerate_args, extra in cases:
        output_dir = work / name
        record = launch(name, accelerate_args, [*base, *extra, "--output_dir", str(output_dir)], args.out)
        if record["exit"] == 0:
            record.update(inspect_run(output_dir))
        summary.append(record)
        print(json.dumps(record), flush=True)
    # ZeRO-3 resume: continue the state-mode run from its first checkpoint to two steps past its end.
    first = work / "zero3_bf16_state"
    if summary[1]["exit"] == 0:
        resumed = [*base, "--max_steps", str(args.steps + 2), "--output_dir", str(first)]
        record = launch(
            "zero3_resume", zero3, [*resumed, "--resume_from_checkpoint", str(first / "checkpoint-2")], args.out
        )
        if record["exit"] == 0:
            record.update(inspect_run(first))
        summary.append(record)
        print(json.dumps(record), flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return int(any(r["exit"] != 0 for r in summary))


if __name__ == "__main__":
    sys.exit(main())
