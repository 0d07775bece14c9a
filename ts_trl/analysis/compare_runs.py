"""The runs of `ts_trl compare`: the warm model's probe, one job per RNG seed and arm (its start scores, or a training
run and its held-out evaluations) in worker processes, and the saved output a rerun with the same settings reuses."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import signal
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, TrainerCallback
from transformers.trainer_callback import PrinterCallback

from ..embedded.agent import AGENT_TASKS, AgentTask, sample_agent_rewards
from ..embedded.chain import read_trace, trace_rates
from ..embedded.cpu import torch_threads
from ..embedded.evaluate import pass_at_k, sample_rewards
from ..embedded.tasks import CHAIN_TASKS, task_spec
from ..tiny import load_tokenizer
from ..trainer.seed_grpo_config import SeedGRPOConfig
from ..trainer.seed_grpo_trainer import SeedGRPOTrainer
from .common import (
    prefix_overlap,
    quiet_libraries,
    sample_continuations,
    token_logprobs,
)
from .compare_protocol import (
    BASELINE,
    COVERAGE_CUT,
    METHODS,
    PASS_K,
    TRACE_KEYS,
    ZERO_STD_PLAIN,
    ZERO_STD_SEEDED,
    Budget,
    task_of,
)


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


def saved_output(job: dict) -> dict | None:
    path = _output_path(job)
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    return saved["output"] if _comparable(saved["settings"], job) == _comparable(job["settings"], job) else None


def map_jobs(function, items, jobs):
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


def write_probe(model, tokenizer, train_set, budget: Budget, path: Path) -> None:
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


def run_job(job: dict) -> dict:
    """One worker job: the warm model's held-out scores at one RNG seed (`start`), or one training run (`train`)."""

    torch.set_num_threads(1)  # the tiny model gains nothing from a second thread, and loses much on a busy machine
    quiet_libraries()
    out, settings = Path(job["out"]), job["settings"]
    budget = Budget(**settings["budget"])
    args = argparse.Namespace(**settings)
    _, eval_set = task_of(args).make_splits(budget.n_train, budget.n_eval)
    model = AutoModelForCausalLM.from_pretrained(out / "warm")
    tokenizer = load_tokenizer(out / "warm")
    probe = json.loads((out / "probe.json").read_text())
    seed = job["seed"]

    agent = task_of(args) if args.task in AGENT_TASKS else None

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
    task = task_of(args)
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
