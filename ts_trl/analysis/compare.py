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
import contextlib
import copy
import csv
import hashlib
import json
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, TrainerCallback
from transformers.trainer_callback import PrinterCallback

from ..cli.flags import accept_both_spellings
from ..embedded.agent import AGENT_TASKS, AgentTask, sample_agent_rewards
from ..embedded.chain import read_trace, trace_rates
from ..embedded.cpu import torch_threads
from ..embedded.evaluate import pass_at_k, sample_rewards
from ..embedded.tasks import CHAIN_TASKS, build_task_model, make_task, task_spec
from ..tiny import load_tokenizer
from ..trainer.seed_grpo_config import SeedGRPOConfig
from ..trainer.seed_grpo_trainer import SeedGRPOTrainer
from .common import (
    InputError,
    output_dir,
    prefix_overlap,
    quiet_libraries,
    run_command,
    sample_continuations,
    save_figure,
    token_logprobs,
    write_csv,
)
from .stats import ALPHA, POWER, holm, paired_t

METHODS = {
    "none": {"seed_method": "none"},
    "replay": {"seed_method": "replay"},
    "seeds-action": {"seed_method": "seeds", "prefix_mode": "action"},
    "seeds-state": {"seed_method": "seeds", "prefix_mode": "state", "seed_selection": "uniform"},
    "seeds-state-success": {"seed_method": "seeds", "prefix_mode": "state", "seed_selection": "success"},
    "seeds-state-failure": {"seed_method": "seeds", "prefix_mode": "state", "seed_selection": "failure"},
    "seeds-state-passrate": {"seed_method": "seeds", "prefix_mode": "state", "seed_selection": "passrate"},
    # Extensions beside the paper's method (research/target-cuts.md): cuts aimed at a pass rate, seeding all-equal groups.
    "seeds-state-target": {"seed_method": "seeds", "prefix_mode": "state", "cut_selection": "target"},
    "seeds-state-rescue": {"seed_method": "seeds", "prefix_mode": "state", "seed_trigger": "zero_std"},
}
DEFAULT_METHODS = ["none", "replay", "seeds-action", "seeds-state"]
BASELINE = "none"
PASS_K = 8
COVERAGE_CUT = 0.5  # states are the first half (in tokens) of the warm model's rollouts
BOOTSTRAP_SAMPLES = 2000
# The paper's claims that do not involve on-policy GRPO, compared directly: (method, against).
PAPER_CLAIMS = [("seeds-state", "seeds-action"), ("seeds-state", "replay")]
PRIMARY = "pass@1 at equal steps"
# Per-run endpoints from compare.csv, secondary to PRIMARY; a task adds its own through an `endpoints` attribute.
SCALAR_ENDPOINTS = ("coverage",)
ZERO_STD_GAP = "all-equal share, seeded - plain groups"
ZERO_STD_SEEDED, ZERO_STD_PLAIN = "seeds/zero_std_share_seeded", "seeds/zero_std_share_plain"  # the trainer's logs
PRECISION = "float32"  # saved runs without this key trained under bf16 autocast: not reused


@dataclass
class Budget:
    """Sizes of one comparison; `--quick` picks the small one."""

    steps: int
    n_train: int
    n_eval: int
    prompts_per_step: int
    num_generations: int
    max_completion_length: int
    eval_samples: int
    eval_every: int
    warmup_steps: int
    num_seeds: int
    n_probe: int


# The embedded default's task and training settings (ts_trl/cli/arguments.py EMBEDDED_DEFAULTS): same warm-up (hence the same
# cache), 32 groups of 8 per step, the same training prompts and learning rate. Held-out: 8 samples for pass@8.
FULL = Budget(300, 1024, 128, 32, 8, 32, 8, 50, 600, 5, 64)
QUICK = Budget(40, 1024, 64, 32, 8, 32, 8, 20, 600, 2, 32)
DIFFICULTY, MIN_DIFFICULTY, LEARNING_RATE = 2, 1, 1e-4
# The chain task (ts_trl.embedded.chain), sized so that 4 methods x 5 RNG seeds fit in 45 minutes on 2 shared cores;
# research/prereg-chain.md fixes these values, the learning rate by on-policy calibration and the cut range by
# `ts_trl probe-cuts` on the warm model.
CHAIN_FULL = Budget(60, 192, 256, 16, 8, 72, 8, 30, 700, 5, 64)
CHAIN_QUICK = Budget(10, 64, 32, 8, 8, 72, 8, 5, 700, 2, 16)
# The agent tasks (ts_trl.embedded.agent): a rollout of 3-5 turns costs several generate calls, so fewer, smaller
# steps. Not calibrated: the learning rate and cut range are the addition task's.
AGENT_FULL = Budget(60, 256, 64, 8, 8, 96, 8, 20, 400, 3, 32)
AGENT_QUICK = Budget(10, 64, 32, 4, 8, 96, 8, 5, 400, 2, 16)
BUDGETS = {
    "add": (FULL, QUICK),
    "chain": (CHAIN_FULL, CHAIN_QUICK),
    "chain-strict": (CHAIN_FULL, CHAIN_QUICK),
    **{name: (AGENT_FULL, AGENT_QUICK) for name in AGENT_TASKS},
}
# Per task: the learning rate and the top of the cut range when not given.
TASK_DEFAULTS = {
    "add": {"learning_rate": LEARNING_RATE, "cut_ratio_max": 0.9},
    "chain": {"learning_rate": None, "cut_ratio_max": 0.3},
    "chain-strict": {"learning_rate": None, "cut_ratio_max": None},
    **{name: {"learning_rate": LEARNING_RATE, "cut_ratio_max": 0.9} for name in AGENT_TASKS},
}
# Read from the samples on the chain task only (ts_trl.embedded.chain.trace_rates).
TRACE_KEYS = ("error_share", "repair_share", "error_or_repair_share", "recovery_rate")


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
    task = _task(args)
    train_set, _ = task.make_splits(budget.n_train, budget.n_eval)
    warm_model, tokenizer = build_task_model(args.task, task, warmup_steps=budget.warmup_steps, progress=True)
    warm_model.save_pretrained(out / "warm")
    tokenizer.save_pretrained(out / "warm")
    _write_probe(warm_model, tokenizer, train_set, budget, out / "probe.json")

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
    outputs = [saved for job in jobs if (saved := _saved_output(job)) is not None]
    pending = [job for job in jobs if _saved_output(job) is None]
    with tqdm(total=len(jobs), initial=len(outputs), desc=f"runs ({args.jobs} at a time)", unit="run") as progress:
        for done in _map(_run_job, pending, args.jobs):
            outputs.append(done)
            progress.update(1)
            if done["kind"] == "train" and len(outputs) < len(jobs):  # partial tables while the rest runs
                _report(outputs, budget, args, out, time.time() - started, partial=True)
    table, results, paths = _report(outputs, budget, args, out, time.time() - started, partial=False)
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


def _output_path(job: dict) -> Path:
    name = f"start-seed{job['seed']}" if job["kind"] == "start" else f"{job['method']}-seed{job['seed']}"
    return Path(job["out"]) / "runs" / name / "output.json"


# Settings that play no part in a job of this kind (the warm start, or a method): on-policy GRPO never plans a seed,
# replay puts whole rollouts back. A saved run that differs from the job only in them is the same run.
INERT_SETTINGS = {
    "start": ("seed_fraction", "cut_ratio_min", "cut_ratio_max"),
    "none": ("seed_fraction", "cut_ratio_min", "cut_ratio_max"),
    "replay": ("cut_ratio_min", "cut_ratio_max"),
}


def _comparable(settings: dict, job: dict) -> dict:
    """The settings a saved run must share to be reused: all but where and how many at a time, the seed count and
    those that play no part in the job (`INERT_SETTINGS`)."""
    ignored = {"jobs", "output_dir", "num_seeds", *INERT_SETTINGS.get(job["method"] or job["kind"], ())}
    budget = {k: v for k, v in settings["budget"].items() if k != "num_seeds"}
    return {**{k: v for k, v in settings.items() if k not in ignored}, "budget": budget}


def _saved_output(job: dict) -> dict | None:
    path = _output_path(job)
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    return saved["output"] if _comparable(saved["settings"], job) == _comparable(job["settings"], job) else None


def _report(outputs: list[dict], budget: Budget, args, out: Path, elapsed: float, partial: bool):
    """Writes the CSVs, the table and the plot from the finished runs (while others run: `partial`)."""
    starts = {o["seed"]: o for o in outputs if o["kind"] == "start"}
    results, curves, prompts = [], [], []
    for o in (o for o in outputs if o["kind"] == "train" and o["seed"] in starts):
        results.append({**o["result"], "pass_at_1_start": starts[o["seed"]]["pass_at_1"]})
        start = starts[o["seed"]]
        curves += [
            {"method": o["method"], "seed": o["seed"], "step": 0, "kind": kind, "value": start[kind]}
            for kind in start
            if kind.startswith("pass_at_") or kind in ("coverage", *TRACE_KEYS)
        ] + o["curves"]
        start_rows = [{**row, "method": o["method"], "generated_tokens": 0.0} for row in starts[o["seed"]]["prompts"]]
        prompts += start_rows + o["prompts"]
    order = {m: i for i, m in enumerate(args.methods)}
    results.sort(key=lambda r: (order[r["method"]], r["seed"]))
    names = ("compare.csv", "curves.csv", "prompts.csv", "differences.csv", "compare.md", "compare.png")
    paths = {name: out / name for name in names}
    if not results:
        return "", results, paths
    write_csv(paths["compare.csv"], results)
    write_csv(paths["curves.csv"], curves)
    write_csv(paths["prompts.csv"], prompts)
    differences = all_differences(read_csv(paths["prompts.csv"]), read_csv(paths["compare.csv"]), _endpoints(args))
    write_csv(paths["differences.csv"], differences)
    table = format_table(summarize(results), differences, budget, args, elapsed)
    if partial:
        table = f"PARTIAL: {len(results)} of {len(args.methods) * budget.num_seeds} runs finished.\n\n{table}"
    paths["compare.md"].write_text(table + "\n")
    plot(read_csv(paths["curves.csv"]), paths["compare.png"], budget, args)
    return table, results, paths


def _task(args):

    return make_task(args.task, seed=0, difficulty=args.difficulty, min_difficulty=args.min_difficulty)


def _endpoints(args) -> tuple[str, ...]:
    """The per-run secondary endpoints: coverage, then the task's own (result columns its evaluation writes)."""
    if hasattr(args, "endpoints"):  # a recipe comparison names its own
        return tuple(args.endpoints)
    return (*SCALAR_ENDPOINTS, *getattr(_task(args), "endpoints", ()))


def _title(args) -> str:
    if getattr(args, "title", None):
        return args.title
    if getattr(args, "task", "add") == "chain":
        return "Chain task (4-6 digits, repairable errors)"
    if getattr(args, "task", "add") == "chain-strict":
        return "Chain task, scored by the whole chain (4-6 digits, repairable errors)"
    if getattr(args, "task", "add") in AGENT_TASKS:
        return f"Agent task {args.task} (difficulty {args.min_difficulty}-{args.difficulty}, tool calls)"
    return f"Embedded task (difficulty {args.min_difficulty}-{args.difficulty})"


def _map(function, items, jobs):
    """`map` over worker processes (spawned: no forked torch state), or in this process when `jobs` is 1.

    The workers end with the command, however it ends (Ctrl-C, a failed job, the caller stopping early).
    """
    if jobs == 1:
        yield from map(function, items)
        return

    others = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
    try:
        with _ctrl_c_left_to_this_process():
            futures = [pool.submit(function, item) for item in items]  # the workers start here
        for future in as_completed(futures):
            yield future.result()
    except BaseException:
        # Leaving the pool normally would wait for every queued run: the workers went on for many minutes after the
        # command seemed to have stopped.
        pool.shutdown(wait=False, cancel_futures=True)
        for worker in set(multiprocessing.active_children()) - others:
            worker.terminate()
        raise
    pool.shutdown()


@contextlib.contextmanager
def _ctrl_c_left_to_this_process():
    """Processes started inside ignore Ctrl-C (an ignored signal stays ignored through exec, and Python then installs
    no KeyboardInterrupt): the terminal's Ctrl-C reaches every process of the job, and a worker still importing
    torch would print a traceback of its own; this process stops its workers itself."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: Ctrl-C is not this thread's to handle
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _write_probe(model, tokenizer, train_set, budget: Budget, path: Path) -> None:
    """Samples the warm model's rollouts on the first training prompts and keeps their first half as coverage states.

    Stores each prefix with its log-probability under the warm model (q), so that a run scores only log p.
    """

    # An agent task's chat prompts as the template renders them; its coverage states are then in the first model turn.
    texts = [p if isinstance(p, str) else tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
             for p in train_set["prompt"][: budget.n_probe]]  # fmt: skip
    contexts = [tokenizer(text)["input_ids"] for text in texts] * 2
    with torch_threads(1):
        rollouts = sample_continuations(
            model, tokenizer, contexts, [budget.max_completion_length] * len(contexts), rng_seed=12345, desc="probe"
        )
        prefixes = [ids[: max(1, int(COVERAGE_CUT * len(ids)))] for ids in rollouts]
        logq = [sum(lp) for lp in token_logprobs(model, contexts, prefixes)]
    path.write_text(json.dumps({"contexts": contexts, "prefixes": prefixes, "logq": logq}))


def _run_job(job: dict) -> dict:
    """One worker job: the warm model's held-out scores at one RNG seed (`start`), or one training run (`train`)."""

    torch.set_num_threads(1)  # the tiny model gains nothing from a second thread, and loses much on a busy machine
    quiet_libraries()
    out, settings = Path(job["out"]), job["settings"]
    budget = Budget(**settings["budget"])
    args = argparse.Namespace(**settings)
    _, eval_set = _task(args).make_splits(budget.n_train, budget.n_eval)
    model = AutoModelForCausalLM.from_pretrained(out / "warm")
    tokenizer = load_tokenizer(out / "warm")
    probe = json.loads((out / "probe.json").read_text())
    seed = job["seed"]

    agent = _task(args) if args.task in AGENT_TASKS else None

    def evaluate(model, step: int) -> dict:
        return _evaluate(model, tokenizer, eval_set, probe, budget, seed, step, task=args.task, agent=agent)

    if job["kind"] == "start":
        output = {"kind": "start", "seed": seed, **evaluate(model, 0)}
    else:
        result, curves, prompts = _train(job["method"], seed, model, tokenizer, budget, args, out, evaluate)
        output = {"kind": "train", "seed": seed, "method": job["method"], "result": result}
        output.update(curves=curves, prompts=prompts)
    path = _output_path(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"settings": settings, "output": output}))
    temporary.replace(path)  # atomic: a crash leaves the previous state, never half a file
    return output


def _evaluate(
    model, tokenizer, eval_set, probe, budget: Budget, seed: int, step: int, task: str = "add", agent=None
) -> dict:
    """Held-out pass@1 and pass@k per prompt (sampled at temperature 1), and state coverage of the probe prefixes.

    An `agent` task (`AgentTask`) is sampled through its tool loop (`sample_agent_rewards`).

    On the chain tasks, also the shares of samples with a wrong sum line or a recomputation line, and the recovery rate
    P(pass | a wrong line) (`ts_trl.embedded.chain.trace_rates`).

    Long: one checkpoint's evaluation, every figure from the same samples; split, the samples would be passed between
    helpers.
    """

    read, traces, task_reward = [], task in CHAIN_TASKS, task_spec(task).reward

    def reward(completions, answer, **kwargs):
        scores = task_reward(completions=completions, answer=answer, **kwargs)
        if traces:
            read.extend(read_trace(c, a, s) for c, a, s in zip(completions, answer, scores))
        return scores

    # The same sampling noise for every method at a given RNG seed.
    if isinstance(agent, AgentTask):
        rewards = sample_agent_rewards(
            model, tokenizer, eval_set, agent, budget.max_completion_length, num_samples=budget.eval_samples,
            seed=1000 + seed,
        )  # fmt: skip
    else:
        rewards = sample_rewards(
            model,
            tokenizer,
            eval_set,
            reward,
            budget.max_completion_length,
            batch_size=256,
            num_samples=budget.eval_samples,
            seed=1000 + seed,
        )
    k = min(PASS_K, budget.eval_samples)
    was_training = model.training
    model.eval()
    logp = [sum(lp) for lp in token_logprobs(model, probe["contexts"], probe["prefixes"], batch_size=128)]
    model.train(was_training)
    prompts = [
        {
            "seed": seed,
            "step": step,
            "prompt": index,
            "passes": sum(r >= 1.0 for r in samples),
            "samples": len(samples),
        }
        for index, samples in enumerate(rewards)
    ]
    return {
        "pass_at_1": pass_at_k(rewards, 1),
        f"pass_at_{k}": pass_at_k(rewards, k),
        "coverage": prefix_overlap(logp, probe["logq"]),
        **(trace_rates(read) if traces else {}),
        "prompts": prompts,
    }


def _train(method, seed, model, tokenizer, budget: Budget, args, out: Path, evaluate):
    """Trains one method at one RNG seed; returns its result row, its curve points and its per-prompt scores.

    Long: one run's setup, read top to bottom: task, model, config, trainer, curve, result row.
    """

    run_dir = out / "runs" / f"{method}-seed{seed}"
    task = _task(args)
    train_set, _ = task.make_splits(budget.n_train, budget.n_eval)
    evals = []

    class Evaluate(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            if budget.eval_every and state.global_step % budget.eval_every == 0 and state.global_step < budget.steps:
                evals.append(evaluate(kwargs["model"], state.global_step))

    config = SeedGRPOConfig(
        output_dir=str(run_dir),
        per_device_train_batch_size=budget.prompts_per_step * budget.num_generations,
        num_generations=budget.num_generations,
        max_completion_length=budget.max_completion_length,
        max_steps=budget.steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        temperature=1.0,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        # float32, as the embedded default trains: GRPOConfig's bf16 default means autocast on CPU, which this
        # machine's cores emulate (2.5x slower per step), and the tiny model needs no activation checkpointing
        # (it recomputes the forward pass for nothing; the result is bit-identical without it).
        bf16=False,
        activation_checkpointing=False,
        seed=seed,
        disable_tqdm=True,
        seed_fraction=args.seed_fraction,
        cut_ratio_min=args.cut_ratio_min,
        cut_ratio_max=args.cut_ratio_max,
        # Seeds from one step back, without waiting for a checkpoint: the runs compare methods, not snapshot cadence.
        seed_snapshot_only=False,
        seed_min_age=1,
        replay_per_group=max(1, budget.num_generations // 4),
        **METHODS[method],
    )
    trainer = SeedGRPOTrainer(
        model=model,
        reward_funcs=task_spec(args.task).reward,
        args=config,
        train_dataset=train_set,
        processing_class=tokenizer,
        callbacks=[Evaluate()],
        tools=getattr(task, "tools", None) or None,  # an agent task's tools or environment
        environment_factory=getattr(task, "environment_factory", None),
    )
    trainer.remove_callback(PrinterCallback)  # the numbers go to the CSVs
    started = time.time()
    trainer.train()
    wall = time.time() - started
    evals.append(evaluate(trainer.model, budget.steps))
    trainer.model.save_pretrained(run_dir / "final")
    tokenizer.save_pretrained(run_dir / "final")

    training = training_log(trainer.state.log_history, method, seed, config.per_device_train_batch_size)
    k = min(PASS_K, budget.eval_samples)
    prompts, curves = [], training["curves"]
    for scores in evals:
        step = scores["prompts"][0]["step"]
        at = training["tokens"][min(step, len(training["tokens"]) - 1)]
        prompts += [{**row, "method": method, "generated_tokens": at} for row in scores["prompts"]]
        traced = [kind for kind in TRACE_KEYS if kind in scores]
        for kind in ("pass_at_1", f"pass_at_{k}", "coverage", *traced):
            curves.append({"method": method, "seed": seed, "step": step, "kind": kind, "value": scores[kind]})
    final = evals[-1]
    result = {
        "method": method,
        "seed": seed,
        "pass_at_1": final["pass_at_1"],
        f"pass_at_{k}": final[f"pass_at_{k}"],
        "coverage": final["coverage"],
        **{kind: final[kind] for kind in TRACE_KEYS if kind in final},
        **training["result"],
        "wall_s": round(wall, 1),
    }
    return result, curves, prompts


def training_log(log_history: list[dict], method: str, seed: int, rows_per_step: int) -> dict:
    """What a run's `log_history` (logged every step) gives the comparison.

    `tokens`: generated tokens after each step (index = step, 0 first); `curves`: per-step training reward of plain
    groups and shares of all-equal groups; `result`: the run's token counts, steps, and its all-equal shares of
    seeded and of plain groups (means over the steps that had such groups; NaN when none did).
    """
    logs = [h for h in log_history if "reward" in h]
    tokens, generated, prefix = [0.0], 0.0, 0.0
    curves = []
    for step, h in enumerate(logs, start=1):
        if "seeds/generated_tokens" in h:
            generated += h["seeds/generated_tokens"]
            prefix += h["seeds/prefix_tokens"]
        else:
            generated += h["completions/mean_length"] * rows_per_step
        tokens.append(generated)
        plain = h["reward"] if method == BASELINE else h.get("seeds/reward_unseeded", math.nan)
        for kind, key in (
            ("zero_std_groups", "frac_reward_zero_std"),
            ("zero_std_seeded", ZERO_STD_SEEDED),
            ("zero_std_plain", ZERO_STD_PLAIN),
        ):
            curves.append({"method": method, "seed": seed, "step": step, "kind": kind, "value": h.get(key, math.nan)})
        curves.append({"method": method, "seed": seed, "step": step, "kind": "train_reward", "value": plain})

    def mean_of(key: str) -> float:
        values = [h[key] for h in logs if key in h and not math.isnan(h[key])]
        return float(np.mean(values)) if values else math.nan

    result = {
        "generated_tokens": int(round(generated)),
        "reused_tokens": int(round(prefix)),
        "steps": len(logs),
        "zero_std_share_seeded": mean_of(ZERO_STD_SEEDED),
        "zero_std_share_plain": mean_of(ZERO_STD_PLAIN),
    }
    return {"tokens": tokens, "curves": curves, "result": result}


# ---------------------------------------------------------------------------------------------------------------------
# Statistics (pure: they read the CSV rows, so that a test can recompute them by hand)


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def paired_bootstrap_ci(
    differences: np.ndarray, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """Mean of a [seeds x prompts] matrix of paired differences and its bootstrap CI over seeds *and* prompts.

    Each replicate draws the RNG seeds with replacement, then the prompts with replacement, and averages the crossed
    sub-matrix: both the training noise (seeds) and the choice of held-out problems (prompts) count. Percentile
    interval; deterministic given `seed`. With one RNG seed only prompts are resampled.
    """
    differences = np.asarray(differences, dtype=np.float64)
    num_seeds, num_prompts = differences.shape
    rng = np.random.default_rng(seed)
    replicates = np.empty(samples)
    for b in range(samples):
        rows = rng.integers(num_seeds, size=num_seeds)
        columns = rng.integers(num_prompts, size=num_prompts)
        replicates[b] = differences[np.ix_(rows, columns)].mean()
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(differences.mean()), float(low), float(high)


def _rates(rows: list[dict], k: int) -> dict[tuple[str, int, int], tuple[float, np.ndarray]]:
    """(method, seed, step) -> (generated tokens at that step, per-prompt pass@k estimates ordered by prompt)."""
    grouped: dict[tuple[str, int, int], list[dict]] = {}
    for row in rows:
        grouped.setdefault((row["method"], int(row["seed"]), int(row["step"])), []).append(row)
    rates = {}
    for key, group in grouped.items():
        group.sort(key=lambda r: int(r["prompt"]))
        values = []
        for r in group:
            n, c = int(r["samples"]), int(r["passes"])
            values.append(1.0 - math.comb(n - c, k) / math.comb(n, k) if n >= k else math.nan)
        rates[key] = (float(group[0]["generated_tokens"]), np.array(values))
    return rates


def interpolate_at_tokens(points: list[tuple[float, np.ndarray]], budget: float) -> np.ndarray:
    """Per-prompt scores at `budget` generated tokens, linear between the two evaluations that bracket it."""
    points = sorted(points, key=lambda p: p[0])
    tokens = np.array([p[0] for p in points])
    if budget < tokens[0] or budget > tokens[-1]:
        raise ValueError(f"budget {budget} lies outside the evaluated tokens [{tokens[0]}, {tokens[-1]}]")
    values = np.stack([p[1] for p in points])
    return np.array([np.interp(budget, tokens, values[:, j]) for j in range(values.shape[1])])


def paired_differences(
    rows: list[dict], k_values=(1, PASS_K), baseline: str = BASELINE, methods: list[str] | None = None
) -> list[dict]:
    """Per method and pass@k: the paired difference against `baseline` at equal steps and at equal generated tokens.

    `rows` are `prompts.csv` rows (method, seed, step, prompt, passes, samples, generated_tokens). Equal steps: the
    last evaluated step. Equal tokens: the smallest final generated-token count over all runs (of every method in
    `rows`, whatever the baseline), where every run's per-prompt curve is interpolated. `methods`: the methods to
    compare with the baseline (default: all). Each difference carries the paired t analysis of its per-seed means
    (`stats.paired_t`: `t_low`, `t_high`, `p_value`, `sd`, `seeds`, `mde`) and, as a sensitivity check, the two-way
    bootstrap interval over seeds and prompts (`boot_low`, `boot_high`).
    """
    methods = methods or list(dict.fromkeys(r["method"] for r in rows))
    runs = sorted({(r["method"], int(r["seed"])) for r in rows})
    last = max(int(r["step"]) for r in rows)
    samples = min(int(r["samples"]) for r in rows)
    out = []
    for k in (k for k in k_values if k <= samples):
        rates = _rates(rows, k)
        budget = min(rates[(m, s, last)][0] for m, s in runs)
        curve = {(m, s): [v for (mm, ss, _), v in rates.items() if (mm, ss) == (m, s)] for m, s in runs}
        at_tokens = {key: interpolate_at_tokens(points, budget) for key, points in curve.items()}
        for method in methods:
            # Only RNG seeds that both this method and the baseline have finished are paired.
            seeds = [s for m, s in runs if m == method and (baseline, s) in curve]
            if method == baseline or not seeds:
                continue
            steps = np.stack([rates[(method, s, last)][1] - rates[(baseline, s, last)][1] for s in seeds])
            tokens = np.stack([at_tokens[(method, s)] - at_tokens[(baseline, s)] for s in seeds])
            for basis, matrix in (("steps", steps), ("tokens", tokens)):
                _, low, high = paired_bootstrap_ci(matrix)
                out.append(
                    {
                        "method": method,
                        "baseline": baseline,
                        "endpoint": f"pass@{k} at equal {basis}",
                        "budget": last if basis == "steps" else budget,
                        **_t_columns(matrix.mean(axis=1)),  # per-seed means: every seed has the same prompts
                        "boot_low": low,
                        "boot_high": high,
                    }
                )
    return out


def scalar_differences(
    results: list[dict],
    columns: Sequence[str] = SCALAR_ENDPOINTS,
    baseline: str = BASELINE,
    methods: list[str] | None = None,
) -> list[dict]:
    """Paired differences against `baseline` of per-run values (`compare.csv` columns such as `coverage`).

    The all-equal-group endpoint is within a run rather than against the baseline: per seed, the share of seeded
    groups whose rewards were all equal minus that share of the same run's plain groups (`ZERO_STD_GAP`), for
    methods that seed. Runs that lack a column (NaN or absent) are left out of its pairs.
    """
    methods = methods or list(dict.fromkeys(r["method"] for r in results))
    by_run = {(r["method"], int(r["seed"])): r for r in results}

    def value(method, seed, column) -> float:
        cell = by_run.get((method, seed), {}).get(column, "")
        return math.nan if cell in ("", None) else float(cell)

    out = []
    for method in (m for m in methods if m != baseline):
        seeds = sorted(s for m, s in by_run if m == method and (baseline, s) in by_run)
        for column in columns:
            differences = [value(method, s, column) - value(baseline, s, column) for s in seeds]
            if any(not math.isnan(d) for d in differences):
                out.append({"method": method, "baseline": baseline, "endpoint": column, **_t_columns(differences)})
        if baseline == BASELINE:
            seeds = sorted(s for m, s in by_run if m == method)
            gaps = [
                value(method, s, "zero_std_share_seeded") - value(method, s, "zero_std_share_plain") for s in seeds
            ]
            if any(not math.isnan(g) for g in gaps):
                out.append(
                    {"method": method, "baseline": "its plain groups", "endpoint": ZERO_STD_GAP, **_t_columns(gaps)}
                )
    return out


def _t_columns(per_seed: Sequence[float]) -> dict:
    result = paired_t(per_seed)
    return {
        "difference": result.mean,
        "seeds": result.n,
        "sd": result.sd,
        "t_low": result.low,
        "t_high": result.high,
        "p_value": result.p_value,
        "mde": result.mde,
    }


def assess(differences: list[dict]) -> list[dict]:
    """Marks the primary endpoint and Holm-corrects the secondary ones; returns the rows with `role`, `p_holm`,
    `significant`.

    Primary (fixed in advance): `PRIMARY`, pass@1 at equal optimizer steps, one test per comparison, judged by its
    paired t p-value at `ALPHA`. Every other endpoint of the same method against the same baseline is secondary: one
    family, Holm-adjusted (`p_holm`) and judged at `ALPHA`. The within-run all-equal gap joins its method's family
    against `none`.
    """
    out = [dict(d) for d in differences]
    families: dict[str, list[dict]] = {}
    for d in out:
        d["role"] = "primary" if d["endpoint"] == PRIMARY else "secondary"
        family = d["method"] if d["baseline"] in (BASELINE, "its plain groups") else f"{d['method']}|{d['baseline']}"
        families.setdefault(family, []).append(d)
    for family in families.values():
        secondary = [d for d in family if d["role"] == "secondary"]
        for d, p in zip(secondary, holm([d["p_value"] for d in secondary])):
            d["p_holm"] = p
    for d in out:
        p = d["p_value"] if d["role"] == "primary" else d["p_holm"]
        d.setdefault("p_holm", math.nan)
        d["significant"] = bool(p < ALPHA)
    return out


def all_differences(prompt_rows: list[dict], results: list[dict], columns: Sequence[str] = SCALAR_ENDPOINTS):
    """Every endpoint of every method against `none`, and the paper's other claims paired directly, assessed.

    `prompt_rows` and `results` are the rows of `prompts.csv` and `compare.csv`; `columns` the per-run endpoints.
    """
    differences = paired_differences(prompt_rows) + scalar_differences(results, columns)
    present = {r["method"] for r in results}
    for method, baseline in PAPER_CLAIMS:
        if {method, baseline} <= present:
            differences += paired_differences(prompt_rows, baseline=baseline, methods=[method])
            differences += scalar_differences(results, columns, baseline=baseline, methods=[method])
    return assess(differences)


# ---------------------------------------------------------------------------------------------------------------------
# Report


def summarize(results: list[dict]) -> list[dict]:
    """Mean and sample std over seeds, per method, in the order the methods ran."""
    summary = []
    for method in dict.fromkeys(r["method"] for r in results):
        runs = [r for r in results if r["method"] == method]
        scores = np.array([r["pass_at_1"] for r in runs])
        start = np.array([r["pass_at_1_start"] for r in runs])
        k_key = next(
            key for key in runs[0] if key.startswith("pass_at_") and key not in ("pass_at_1", "pass_at_1_start")
        )
        summary.append(
            {
                "method": method,
                "runs": len(runs),
                "pass_at_1_mean": float(scores.mean()),
                "pass_at_1_std": float(scores.std(ddof=1)) if len(runs) > 1 else math.nan,
                "gain_mean": float((scores - start).mean()),
                "pass_at_k_mean": float(np.mean([r[k_key] for r in runs])),
                "k": int(k_key.removeprefix("pass_at_")),
                "coverage_mean": float(np.mean([r["coverage"] for r in runs])),
                "generated_tokens": float(np.mean([r["generated_tokens"] for r in runs])),
                "reused_tokens": float(np.mean([r["reused_tokens"] for r in runs])),
                "wall_s": float(np.mean([r["wall_s"] for r in runs])),
            }
        )
    return summary


def _number(value: float, signed: bool = True) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.3f}" if signed else f"{value:.3f}"


def _interval(low: float, high: float) -> str:
    return "n/a" if math.isnan(low) else f"[{low:+.3f}, {high:+.3f}]"


def _p(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.3f}" if value >= 0.001 else "<0.001"


def difference_cells(d: dict) -> list[str]:
    """A difference's table cells: value (with * when significant), paired t interval, p, then the rest by role."""
    cells = [_number(d["difference"]) + (" *" if d["significant"] else ""), _interval(d["t_low"], d["t_high"])]
    cells.append(_p(d["p_value"]))
    if d["role"] == "primary":
        return cells + [_interval(d["boot_low"], d["boot_high"]), _number(d["mde"], signed=False)]
    return cells + [_p(d["p_holm"])]


def format_table(summary: list[dict], differences: list[dict], budget: Budget, args, total_s: float) -> str:
    start = summary[0]["pass_at_1_mean"] - summary[0]["gain_mean"]
    k = summary[0]["k"]
    lines = [
        f"{_title(args)}, {budget.steps} steps x "
        f"{budget.prompts_per_step} prompts x {budget.num_generations} generations, {summary[0]['runs']} RNG seeds; "
        f"held-out pass@1 and pass@{k} over {budget.n_eval} prompts x {budget.eval_samples} samples at temperature "
        f"{getattr(args, 'temperature', 1.0):g} (start pass@1: {start:.3f}).",
        "",
        f"| method | pass@1 (mean ± std) | change vs. start | pass@{k} | state coverage | generated tokens | "
        "reused tokens | wall time (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        std = "n/a" if math.isnan(s["pass_at_1_std"]) else f"{s['pass_at_1_std']:.3f}"
        lines.append(
            f"| {s['method']} | {s['pass_at_1_mean']:.3f} ± {std} | {s['gain_mean']:+.3f} | {s['pass_at_k_mean']:.3f} "
            f"| {s['coverage_mean']:.3f} | {s['generated_tokens']:,.0f} | {s['reused_tokens']:,.0f} | "
            f"{s['wall_s']:.0f} |"
        )
    tables = differences_tables(differences)
    return "\n".join([*lines, "", *tables, *([""] if tables else []), _footer(args, total_s)])


def differences_tables(differences: list[dict]) -> list[str]:
    """The primary and secondary endpoint tables of `assess`ed differences (markdown lines; [] when there are none)."""
    primary = [d for d in differences if d["role"] == "primary"]
    if not primary:
        return []
    tokens = next((d["budget"] for d in differences if d["endpoint"] == "pass@1 at equal tokens"), math.nan)
    lines = [
        f"Primary endpoint, fixed in advance: held-out pass@1 at equal optimizer steps ({primary[0]['budget']}), "
        "paired per RNG seed (each seed's mean over the held-out prompts), with a 95% paired t interval "
        f"(df = seeds - 1) and its p-value; * = p < {ALPHA}. The bootstrap interval (RNG seeds and prompts resampled) "
        "is a sensitivity check: with a few seeds it is too narrow. MDE: the smallest true difference the run would "
        f"detect with {POWER:.0%} power at two-sided {ALPHA}, (t_(1-a/2) + t_power) x SD / sqrt(seeds) from the "
        "observed SD of the per-seed differences.",
        "",
        "| method | against | pass@1 difference | 95% paired t CI | p | bootstrap CI | MDE |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {d['method']} | {d['baseline']} | " + " | ".join(difference_cells(d)) + " |" for d in primary]
    secondary = [d for d in differences if d["role"] == "secondary"]
    if secondary:
        lines += [
            "",
            "Secondary endpoints, Holm-corrected within each method's comparison (* = Holm p < "
            f"{ALPHA}); equal generated tokens: each run's per-prompt curve read at {tokens:,.0f} tokens, where the "
            f"cheapest run stops; '{ZERO_STD_GAP}': within each run, per RNG seed.",
            "",
            "| method | against | endpoint | difference | 95% paired t CI | p | Holm p |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {d['method']} | {d['baseline']} | {d['endpoint']} | " + " | ".join(difference_cells(d)) + " |"
            for d in secondary
        ]
    return lines


def _footer(args, total_s: float) -> str:

    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    return (
        f"Total time including warm-up and evaluation: {total_s / 60:.1f} min with {args.jobs} runs at a time "
        f"(load average at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f})."
    )


def plot(curves: list[dict], path, budget: Budget, args) -> None:
    """Six panels against optimizer step: training reward, held-out pass@1 and pass@k, coverage, zero-std groups."""
    import matplotlib  # lazy: start-up time; a figure is drawn once, at the end

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    kinds = list(dict.fromkeys(c["kind"] for c in curves))
    k_kind = next((kind for kind in kinds if kind.startswith("pass_at_") and kind != "pass_at_1"), None)
    panels = [
        ("train_reward", "training reward of plain groups (5-step mean)"),
        ("pass_at_1", f"held-out pass@1 ({budget.n_eval} prompts x {budget.eval_samples} samples)"),
        (k_kind, f"held-out {k_kind.replace('_at_', '@') if k_kind else ''}"),
        ("coverage", "state coverage of the warm model's states, E_q[min(1, p/q)]"),
        ("zero_std_groups", "share of groups with zero reward variance (no signal)"),
        ("zero_std_seeded", "the same share among seeded groups only"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    methods = list(dict.fromkeys(c["method"] for c in curves))
    for ax, (kind, title) in zip(axes.flat, panels):
        for method in methods:
            points = [c for c in curves if c["method"] == method and c["kind"] == kind]
            steps = sorted({int(c["step"]) for c in points})
            values = [[float(c["value"]) for c in points if int(c["step"]) == s] for s in steps]
            values = [[v for v in vs if not math.isnan(v)] for vs in values]
            keep = [i for i, v in enumerate(values) if v]
            if not keep:
                continue
            steps = [steps[i] for i in keep]
            mean = np.array([np.mean(values[i]) for i in keep])
            low = np.array([np.min(values[i]) for i in keep])
            high = np.array([np.max(values[i]) for i in keep])
            dense = kind in ("train_reward", "zero_std_groups", "zero_std_seeded")
            if dense and len(mean) >= 5:  # single steps are noisy
                mean = np.convolve(np.pad(mean, 2, mode="edge"), np.ones(5) / 5, mode="valid")
            line = ax.plot(steps, mean, "-" if dense else "-o", label=method, markersize=3)[0]
            if not dense:
                ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.12)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a panel may have no curve yet (no seeded step)
            ax.legend(fontsize=7)
    fig.suptitle(
        f"{_title(args)}, {len({c['seed'] for c in curves})} RNG seed(s) per method (mean; band: min-max over seeds), same steps and "
        f"prompts ({budget.prompts_per_step} x {budget.num_generations} rollouts per step)",
        fontsize=10,
    )
    save_figure(fig, path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(run_command(main, prog="ts_trl compare"))
