"""The report a `ts_trl train` run ends with: held-out pass@1 on the built-in task, seeding statistics, what was written.

It is printed as aligned text and saved as `<output_dir>/report.json`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq

from ..embedded import pass_at_1
from ..embedded.agent import AgentTask, agent_pass_at_1
from ..embedded.curve import held_out_figures
from ..embedded.tasks import task_reward
from ..store.checkpoints import checkpoint_folders
from ..store.format import SEEDS_DIR, SeedManifest

# Seeding metrics that the report averages over the run (TRL logs a window mean at every logging step).
MEAN_METRICS = (
    "seeds/seeded_group_share",
    "seeds/reward_seeded",
    "seeds/reward_unseeded",
    "seeds/prefix_len_mean",
    "seeds/seed_age_mean",
)
REPORT_FILE = "report.json"


def held_out_pass_at_1(trainer, dataset, num_samples: int, task=None) -> float | None:
    """Sampled pass@1 of the built-in task's held-out set at the training temperature (None when there is none);
    an agent `task` is sampled through its tool loop."""
    if dataset is None or len(dataset) == 0 or not trainer.accelerator.is_main_process:
        return None
    if trainer.is_deepspeed_enabled:  # ZeRO-3 shards the weights: generate() outside the engine would see none
        return None

    model = trainer.accelerator.unwrap_model(trainer.model)
    sampling = {"temperature": trainer.args.temperature, "num_samples": num_samples, "seed": trainer.args.seed}
    if isinstance(task, AgentTask):
        return agent_pass_at_1(
            model, trainer.processing_class, dataset, task, trainer.args.max_completion_length, **sampling
        )
    reward = task_reward(task)
    return pass_at_1(model, trainer.processing_class, dataset, reward, trainer.args.max_completion_length, **sampling)


def run_figures(trainer, start: float) -> dict:
    """Steps and minutes, labelled: a fresh run's are the whole run's; a resumed segment's steps are the whole run's
    (with the step it resumed at and its own count), and its minutes are its own (the earlier segments' are not kept)."""
    minutes = (time.time() - start) / 60
    resumed_at = getattr(trainer, "_initial_global_step", 0)  # transformers: the step this train() call started at
    if not resumed_at:
        return {"steps": trainer.state.global_step, "minutes": minutes}
    return {
        "steps": trainer.state.global_step,
        "resumed_at_step": resumed_at,
        "steps_this_segment": trainer.state.global_step - resumed_at,
        "minutes_this_segment": minutes,
    }


def seed_statistics(trainer) -> dict:
    """Run means of the seeding metrics TRL logged, the bank's final size, and counts read from the seed dataset."""
    history = trainer.state.log_history
    stats = {}
    for name in MEAN_METRICS:
        values = [h[name] for h in history if isinstance(h.get(name), (int, float)) and h[name] == h[name]]
        if values:
            stats[name.removeprefix("seeds/")] = sum(values) / len(values)
    stats["bank_size"] = len(trainer.seed_bank)  # the bank itself, not the last logging window's mean
    manifest = SeedManifest.load(Path(trainer.args.output_dir) / SEEDS_DIR)
    if manifest is not None:
        shards = manifest.shards
        # One file at a time, on this thread: pyarrow's dataset scanner (`pq.read_table`) leaves pool threads that can
        # abort the interpreter ("terminate called without an active exception") when the process exits right after.
        rows = [pq.ParquetFile(path).read(columns=["seed_origin"], use_threads=False) for path in manifest.paths()]
        origins = [o for table in rows for o in table.column("seed_origin").to_pylist()]
        stats["rollouts"] = len(origins)
        stats["continuations"] = sum(o is not None for o in origins)
        stats["shards"] = len(shards)
    return stats


def last_checkpoint_of_run(trainer) -> str | None:
    """The newest checkpoint this run saved, at or before its last step (a folder may hold later, stale ones)."""
    output_dir = Path(trainer.args.output_dir)
    saved = [path for step, path in checkpoint_folders(output_dir, complete=True) if step <= trainer.state.global_step]
    return str(saved[-1]) if saved else None


def format_report(report: dict, title: str) -> str:
    """The final report as aligned text lines."""
    lines = ["", "=" * 72, title]

    def show(value):
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    for key, value in report.items():
        if value is None:
            continue  # not measured (an interrupted run's held-out score waits for its resume): not shown as "None"
        if isinstance(value, dict):
            lines.append(f"  {key}")
            lines += [f"    {name:<22} {show(item)}" for name, item in value.items()]
        else:
            lines.append(f"  {key:<24} {show(value)}")
    lines.append("=" * 72)
    return "\n".join(lines)


# The report's title names what was trained, so that an on-policy baseline is not reported as Thinking Seeds.
METHOD_NAMES = {"seeds": "Thinking Seeds", "none": "On-policy GRPO", "replay": "Replay"}


def report_run(trainer, start: float, metrics: dict, interrupted: bool = False) -> dict:
    """Prints the final report and saves it as `report.json` in the output directory (main process).

    The held-out figures keep every score the run measured (`held_out_figures`); the seeding statistics are the whole
    run's (a resumed run's log history and seed shards include its earlier segments); `run_figures` labels the rest.
    """
    output_dir = Path(trainer.args.output_dir)
    seeds = output_dir / "seeds"
    report = {
        **held_out_figures(trainer, metrics),
        # Main process only: the other ranks exit without touching the seed shards (see seed_statistics).
        "seeds": seed_statistics(trainer) if trainer.accelerator.is_main_process else {},
        **run_figures(trainer, start),
        "model": str(output_dir),
        "last_checkpoint": last_checkpoint_of_run(trainer),
        "seed_dataset": str(seeds),
        "model_card": str(output_dir / "README.md"),
        **({"dataset_card": str(seeds / "README.md")} if (seeds / "README.md").is_file() else {}),
        "report": str(output_dir / REPORT_FILE),
    }
    if (output_dir / "learning_curve.png").is_file():
        report["learning_curve"] = str(output_dir / "learning_curve.png")
    if trainer.accelerator.is_main_process:
        method = METHOD_NAMES.get(trainer.args.seed_method, trainer.args.seed_method)
        title = f"{method} run interrupted at step {report['steps']}" if interrupted else f"{method} run finished"
        print(format_report(report, title), flush=True)
        (output_dir / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return report
