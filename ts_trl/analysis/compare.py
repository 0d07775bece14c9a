"""The methods on the embedded task with the same budget over several RNG seeds: paired differences, curves, coverage.

Methods: `none` (on-policy GRPO), `replay` (whole old rollouts in the group, truncated IS), `seeds-action` (Thinking
Seeds with prefix actions trained), `seeds-state` (Thinking Seeds, the method, uniform seed selection) and, on
request, `seeds-state-success` / `-failure` / `-passrate` (the other seed selections) and the extensions
`seeds-state-target` (`cut_selection="target"`) and `seeds-state-rescue` (`seed_trigger="zero_std"`). Every run starts from the same
warmed-up tiny model (the warm-up is cached), trains the same number of optimizer steps on the same prompts, and is
scored on the held-out split with the same sampling seed per RNG seed (common random numbers), so that methods are
compared *paired*: per RNG seed and per held-out prompt. Generated tokens are counted apart from seed-prefix and
replayed tokens, which cost no generation.

What it reports, per method against `none` (and seeds-state against seeds-action and replay, the paper's other
claims): the primary endpoint, fixed in advance, is the held-out pass@1 difference at equal optimizer steps, paired per
RNG seed, with a paired t interval over the seeds' means (`stats.paired_t`, df = seeds - 1), its p-value, the
two-way bootstrap over RNG seeds and prompts as a sensitivity check, and the smallest effect the run could detect.
Secondary endpoints, Holm-corrected as one family per comparison: pass@8 at equal steps, pass@1 and pass@8 at equal
generated tokens (each run's per-prompt curve interpolated linearly at the budget where the cheapest run stops),
state coverage (`ts_trl.analysis.common.prefix_overlap`, E_q[min(1, p/q)], over prefixes of the warm model's
rollouts on training prompts), the task's own endpoints, and, within each seeded run, the all-equal share of its
seeded groups minus that of its plain groups. `docs/compare.md` states the protocol. Runs go in parallel worker
processes of one torch thread each (`--jobs`). Run `ts_trl compare --help`.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tqdm.auto import tqdm

from ..embedded.tasks import build_task_model
from ..flags import accept_both_spellings
from .common import (
    InputError,
    output_dir,
    quiet_libraries,
    run_command,
)
from .compare_protocol import (
    BASELINE,
    BUDGETS,
    DEFAULT_METHODS,
    DIFFICULTY,
    METHODS,
    MIN_DIFFICULTY,
    PASS_K,
    PRECISION,
    TASK_DEFAULTS,
    Budget,
    task_of,
)
from .compare_report import write_report
from .compare_runs import map_jobs, run_job, saved_output, write_probe


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ts_trl compare", description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="add", choices=list(BUDGETS), help="The built-in task (default: add).")
    parser.add_argument(
        "--methods", nargs="+", default=DEFAULT_METHODS, choices=list(METHODS), help="'none' is always run."
    )
    parser.add_argument("--num-seeds", type=int, help="RNG seeds per method (0, 1, ...); 5 in the full run.")
    parser.add_argument("--quick", action="store_true", help="A small budget that finishes in minutes on 2 CPU cores.")
    parser.add_argument("--steps", type=int, help="Optimizer steps per run (overrides the budget's).")
    parser.add_argument("--n-train", type=int, help="Training prompts.")
    parser.add_argument("--prompts-per-step", type=int, help="Prompt groups per optimizer step.")
    parser.add_argument("--n-eval", type=int, help="Held-out prompts.")
    parser.add_argument(
        "--eval-samples", type=int, help=f"Samples per held-out prompt (>= {PASS_K} for pass@{PASS_K})."
    )
    parser.add_argument("--eval-every", type=int, help="Also score the held-out set every N steps (0: start and end).")
    parser.add_argument("--warmup-steps", type=int, help="Supervised warm-up steps (cached across runs).")
    parser.add_argument("--n-probe", type=int, help="Training prompts whose warm-model states coverage follows.")
    parser.add_argument("--difficulty", type=int, default=DIFFICULTY, help="Most additions per problem.")
    parser.add_argument("--min-difficulty", type=int, default=MIN_DIFFICULTY, help="Fewest additions per problem.")
    parser.add_argument("--seed-fraction", type=float, default=0.5, help="Share of groups seeded / replayed.")
    parser.add_argument("--cut-ratio-min", type=float, default=0.1, help="Seeds are cut at r ~ U[min, max].")
    parser.add_argument(
        "--cut-ratio-max",
        type=float,
        help="Default: the task's (add 0.9, chain 0.3); pick it with `ts_trl probe-cuts`.",
    )
    parser.add_argument("--learning-rate", type=float, help="Default: the task's (add: the embedded default's).")
    parser.add_argument("--jobs", type=int, default=2, help="Runs at a time, one process and one torch thread each.")
    parser.add_argument("--output-dir", default="compare", help="Where compare.md, the CSVs and compare.png go.")
    parser.add_argument(
        "--config",
        help="A recipe (file or shipped name): run the methods on its model, data and rewards instead of the built-in "
        "task. `ts_trl compare --config <recipe> --help` lists what it takes.",
    )
    return accept_both_spellings(parser)


def budget_from(args) -> Budget:
    full, quick = BUDGETS[args.task]
    budget = copy.copy(quick if args.quick else full)
    for name, value in TASK_DEFAULTS[args.task].items():
        if getattr(args, name) is None:
            if value is None:
                raise InputError(
                    f"--task {args.task} has no default --{name.replace('_', '-')} (none passed calibration: "
                    "research/results-chain.md); give one."
                )
            setattr(args, name, value)
    names = ("steps", "n_train", "prompts_per_step", "n_eval", "eval_samples", "eval_every", "warmup_steps")
    for name in (*names, "num_seeds", "n_probe"):
        if getattr(args, name) is not None:
            setattr(budget, name, getattr(args, name))
    for name in (
        "steps",
        "n_train",
        "prompts_per_step",
        "n_eval",
        "eval_samples",
        "warmup_steps",
        "num_seeds",
        "n_probe",
    ):
        if getattr(budget, name) < 1:
            raise InputError(f"--{name} must be positive, got {getattr(budget, name)}.")
    if budget.n_train < budget.prompts_per_step:
        raise InputError(
            f"--n_train must be at least the {budget.prompts_per_step} prompts one step draws, got {budget.n_train}."
        )
    if budget.steps * budget.prompts_per_step <= budget.n_train and set(args.methods) - {BASELINE}:
        raise InputError(
            f"--steps {budget.steps} x {budget.prompts_per_step} prompts never brings a training prompt back out of "
            f"{budget.n_train}, so no run would find a seed; raise --steps or lower --n_train."
        )
    if not 0.0 < args.seed_fraction <= 1.0:
        raise InputError(f"--seed_fraction must lie in (0, 1], got {args.seed_fraction}.")
    if args.jobs < 1:
        raise InputError(f"--jobs must be positive, got {args.jobs}.")
    return budget


# ---------------------------------------------------------------------------------------------------------------------
# Running


def wants_recipe(argv: list[str]) -> bool:
    """Whether a compare command line names a recipe (`--config`): the arms then run on its model, data and rewards."""
    return any(a == "--config" or a.startswith("--config=") for a in argv)


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    if wants_recipe(argv):  # `ts_trl compare` hands these to recipe_compare.py, which builds on this module
        raise InputError("compare --config runs as `ts_trl compare --config <recipe> ...`.")
    args = build_parser().parse_args(argv)
    args.methods = [BASELINE] + [m for m in dict.fromkeys(args.methods) if m != BASELINE]
    budget = budget_from(args)
    quiet_libraries()

    out = output_dir(args.output_dir)
    started = time.time()
    task = task_of(args)
    train_set, _ = task.make_splits(budget.n_train, budget.n_eval)
    warm_model, tokenizer = build_task_model(args.task, task, warmup_steps=budget.warmup_steps, progress=True)
    warm_model.save_pretrained(out / "warm")
    tokenizer.save_pretrained(out / "warm")
    write_probe(warm_model, tokenizer, train_set, budget, out / "probe.json")

    settings = {
        "budget": asdict(budget),
        "precision": PRECISION,
        # The warm start, by content: the cached warm-up is not bit-identical across machines (other CPUs, other
        # kernels), and a run trained from another warm model pairs with nothing here.
        "warm_model": _fingerprint(out / "warm"),
        **{k: v for k, v in vars(args).items() if k != "methods"},
    }
    # Seed-major order, so that the runs finished at any moment are complete pairs; each job's output is saved as it
    # ends, and a rerun with the same settings reuses it (an interrupted comparison resumes where it stopped).
    jobs = []
    for seed in range(budget.num_seeds):
        jobs.append({"kind": "start", "seed": seed, "method": None})
        jobs += [{"kind": "train", "seed": seed, "method": m} for m in args.methods]
    jobs = [{**job, "settings": settings, "out": str(out)} for job in jobs]
    outputs = [saved for job in jobs if (saved := saved_output(job)) is not None]
    pending = [job for job in jobs if saved_output(job) is None]
    with tqdm(total=len(jobs), initial=len(outputs), desc=f"runs ({args.jobs} at a time)", unit="run") as progress:
        for done in map_jobs(run_job, pending, args.jobs):
            outputs.append(done)
            progress.update(1)
            if done["kind"] == "train" and len(outputs) < len(jobs):  # partial tables while the rest runs
                write_report(outputs, budget, args, out, time.time() - started, partial=True)
    table, results, paths = write_report(outputs, budget, args, out, time.time() - started, partial=False)
    print(table)
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return results


def _fingerprint(folder: Path) -> str:
    """SHA-256 of a saved model's weights file (safetensors writes the same bytes for the same tensors)."""
    digest = hashlib.sha256()
    with open(folder / "model.safetensors", "rb") as weights:
        for block in iter(lambda: weights.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


if __name__ == "__main__":
    raise SystemExit(run_command(main, prog="ts_trl compare"))
