"""`ts_trl compare --config <recipe>`: the methods on a recipe's own model, data and rewards, one run after another.

    ts_trl compare --config my_recipe.yaml --methods none seeds-state --num-seeds 5 [--eval_dataset test.jsonl]
    accelerate launch --config_file multi_gpu.yaml -m ts_trl compare --config my_recipe.yaml [...] [--max_steps 200]

Each arm (method x RNG seed) is a `ts_trl train` run of the recipe, with the method's seeding settings and the RNG seed
replacing the recipe's, in `<output-dir>/runs/<method>-seed<N>`, under whatever accelerate setup launched the command.
Flags the command does not know go to every arm, as they would to `ts_trl train`. An arm that finished (its
`output.json` is written) is skipped on a rerun; one that stopped half-way resumes from its last checkpoint. After an
arm trains, the start model and each checkpoint it kept are scored on the held-out prompts (the recipe's test split or
`--eval_dataset`) with the recipe's reward functions, every arm with the same sampling seed per RNG seed (common random
numbers); a sample passes when the success reward (`success_reward`, by default the first) exceeds
`success_threshold`, as in seed selection. The CSVs, tables and plot are those of the embedded comparison.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import shutil
import time
from pathlib import Path

import torch
import yaml
from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import AutoModelForCausalLM
from transformers.trainer_utils import get_last_checkpoint

from ..cli import train as training_script
from ..cli.arguments import is_embedded_task, make_parser, parse_args, resolve_recipe
from ..cli.environment import ConfigError
from ..data.loaders import load_training_data, prompt_rows, read_hub, read_local
from ..embedded.evaluate import pass_at_k
from ..flags import accept_both_spellings
from ..rewards import get_reward_funcs
from ..tiny import load_tokenizer
from .common import (
    InputError,
    Sampling,
    load_checkpoint,
    output_dir,
    prefix_overlap,
    prompt_token_ids,
    quiet_libraries,
    sample_continuations,
    token_logprobs,
)
from .compare_protocol import BASELINE, COVERAGE_CUT, DEFAULT_METHODS, METHODS, PASS_K, SCALAR_ENDPOINTS, Budget
from .compare_report import write_report
from .compare_runs import training_log

# Set per arm by the command: a recipe value or flag for them would be silently replaced, so they are refused.
ARM_FLAGS = ("seed", "seed_method", "prefix_mode", "seed_selection", "output_dir", "resume_from_checkpoint")
EVAL_RNG_OFFSET = 1000  # sampling seed of the held-out evaluation at RNG seed s: 1000 + s, the embedded compare's


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ts_trl compare --config",
        description=__doc__.split("\n")[0],
        epilog="Any other flag (e.g. --max_steps 200) is passed to every arm as to `ts_trl train`.",
    )
    parser.add_argument("--config", required=True, help="The recipe: a YAML file or the name of a shipped recipe.")
    parser.add_argument(
        "--methods", nargs="+", default=DEFAULT_METHODS, choices=list(METHODS), help="'none' is always run."
    )
    parser.add_argument("--num-seeds", "--num_seeds", dest="num_seeds", type=int, default=5, help="RNG seeds 0..N-1.")
    parser.add_argument(
        "--eval_dataset",
        "--eval-dataset",
        dest="eval_dataset",
        help="Held-out prompts: a local file or folder, or a Hub dataset id (its `dataset_test_split`), read with the "
        "recipe's column settings. Default: the recipe dataset's `dataset_test_split`.",
    )
    parser.add_argument("--n-eval", "--n_eval", dest="n_eval", type=int, help="Keep the first N held-out prompts.")
    parser.add_argument(
        "--eval-samples", "--eval_samples", dest="eval_samples", type=int, default=PASS_K, help="Samples per prompt."
    )
    parser.add_argument(
        "--n-probe", "--n_probe", dest="n_probe", type=int, default=32, help="Training prompts for state coverage."
    )
    parser.add_argument(
        "--eval-batch-size", "--eval_batch_size", dest="eval_batch_size", type=int, default=64, help="Per process."
    )
    parser.add_argument(
        "--output-dir", "--output_dir", dest="output_dir", default="compare", help="Where it all goes."
    )
    return accept_both_spellings(parser)


def main(argv: list[str]) -> list[dict]:
    """Runs `ts_trl compare --config RECIPE` on `argv`; returns the result rows.

    Long: the command's linear script (parse, arms, runs, evaluation, report), as TRL's scripts are.
    """
    args, passed_on = build_parser().parse_known_args(argv)
    args.methods = [BASELINE] + [m for m in dict.fromkeys(args.methods) if m != BASELINE]
    for name in ("num_seeds", "eval_samples", "n_probe", "eval_batch_size") + (("n_eval",) if args.n_eval else ()):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}.")
    given = sorted({a.split("=", 1)[0].lstrip("-") for a in passed_on if a.startswith("--")} & set(ARM_FLAGS))
    if given:
        raise InputError(f"--{', --'.join(given)}: set per arm by compare --config; leave it out.")
    quiet_libraries()

    state = PartialState()
    out = output_dir(args.output_dir)
    started = time.time()
    script_args, training_args, model_args = _arm_args(args, passed_on, BASELINE, 0, out / "runs")
    _check_recipe(args, script_args, training_args)
    held_out = _held_out(args, script_args)

    try:
        train_set, _ = load_training_data(script_args)
        reward_funcs = get_reward_funcs(script_args.reward_funcs)
    except (ValueError, FileNotFoundError, ImportError) as error:
        raise InputError(f"--config {args.config}: {' '.join(str(error).split())}") from error
    _claim_folder(out, args, passed_on, state)  # only once the input is known good: a corrected rerun is not refused
    scorer = Scorer(args, training_args, held_out, reward_funcs, state)
    start_model = model_args.model_name_or_path
    if not (out / "probe.json").is_file():
        scorer.write_probe(start_model, train_set["prompt"][: args.n_probe], out / "probe.json")
    scorer.probe = json.loads((out / "probe.json").read_text())

    outputs = []
    for seed in range(args.num_seeds):  # seed-major: whatever has finished at any moment are complete pairs
        outputs.append(_saved(out, "start", seed) or _save(out, "start", seed, scorer.start(start_model, seed), state))
        for method in args.methods:
            saved = _saved(out, method, seed)
            if saved is None:
                saved = _run_arm(args, passed_on, method, seed, out, scorer, state)
                if saved is None:  # interrupted with Ctrl-C: the arm's checkpoint is safe, a rerun resumes it
                    state.print("Interrupted; rerun the same command to resume the comparison.")
                    raise SystemExit(130)
            outputs.append(saved)
    budget = Budget(
        steps=max(o["result"]["steps"] for o in outputs if o["kind"] == "train"),
        n_train=len(train_set),
        n_eval=len(held_out),
        prompts_per_step=_rows_per_step(training_args, state) // training_args.num_generations,
        num_generations=training_args.num_generations,
        max_completion_length=training_args.max_completion_length,
        eval_samples=args.eval_samples,
        eval_every=training_args.save_steps,
        warmup_steps=0,
        num_seeds=args.num_seeds,
        n_probe=args.n_probe,
    )
    report_args = argparse.Namespace(
        methods=args.methods,
        jobs=1,
        temperature=training_args.temperature,
        title=f"Recipe {Path(args.config).name} ({start_model})",
        endpoints=SCALAR_ENDPOINTS,
    )
    if not state.is_main_process:
        return []
    table, results, paths = write_report(outputs, budget, report_args, out, time.time() - started, partial=False)
    print(table)
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return results


# ---------------------------------------------------------------------------------------------------------------------
# Arms


def _arm_args(args, passed_on: list[str], method: str, seed: int, run_dir: Path, resume: str | None = None):
    """The parsed `ts_trl train` arguments of one arm: the recipe, the flags passed on, then the arm's own settings."""

    arm = ["--output_dir", str(run_dir), "--seed", str(seed), "--logging_steps", "1", "--push_to_hub", "false"]
    arm += [item for key, value in METHODS[method].items() for item in (f"--{key}", str(value))]
    arm += ["--resume_from_checkpoint", resume] if resume else []
    try:
        # logging every step: the equal-token comparison needs each step's generated tokens. The arms are not pushed.
        return parse_args(make_parser(prog="ts_trl compare"), ["--config", args.config, *passed_on, *arm])
    except ConfigError as error:
        raise InputError(str(error)) from error


def _check_recipe(args, script_args, training_args) -> None:

    if is_embedded_task(script_args):
        raise InputError(
            f"--config {args.config} names no dataset, so it trains the built-in task: run `ts_trl compare` without "
            "--config for that."
        )
    if not script_args.reward_funcs:
        raise InputError(f"--config {args.config}: the recipe names no reward_funcs.")
    if training_args.save_strategy == "no":
        raise InputError(
            f"--config {args.config}: save_strategy is 'no', but compare resumes arms from their checkpoints and scores "
            "them; use save_strategy: steps."
        )


def _claim_folder(out: Path, args, passed_on: list[str], state) -> None:
    """Records what this comparison is; refuses a folder that holds a comparison of another recipe or other flags."""

    settings = {
        "recipe": yaml.safe_load(resolve_recipe(args.config).read_text()),
        "flags": passed_on,
        "eval": {k: getattr(args, k) for k in ("eval_dataset", "n_eval", "eval_samples", "n_probe")},
    }
    path = out / "settings.json"
    if path.is_file():
        held = json.loads(path.read_text())
        if held != settings:
            differ = sorted(k for k in settings if held.get(k) != settings[k])
            raise InputError(
                f"--output-dir {out} holds a comparison with another {' and '.join(differ)}; rerun it with the same "
                "settings to resume, or use another --output-dir."
            )
        return
    if state.is_main_process:
        path.write_text(json.dumps(settings, indent=1))
    state.wait_for_everyone()


def _run_arm(args, passed_on, method: str, seed: int, out: Path, scorer: Scorer, state) -> dict | None:
    """Trains one arm (resuming its last checkpoint if any), scores its checkpoints, saves its output; None if
    interrupted."""

    run_dir = out / "runs" / f"{method}-seed{seed}"
    last = get_last_checkpoint(str(run_dir)) if run_dir.is_dir() else None
    if run_dir.is_dir() and last is None and state.is_main_process:
        # Stopped before its first checkpoint: nothing to resume from. Kept aside, not deleted.
        aside = run_dir.with_name(f"{run_dir.name}.no-checkpoint")
        shutil.rmtree(aside, ignore_errors=True)
        run_dir.rename(aside)
    state.wait_for_everyone()
    script_args, training_args, model_args = _arm_args(args, passed_on, method, seed, run_dir, last)
    started = time.time()
    # Through the module, so that the run is the script's `main` as it stands (tests watch it).
    if training_script.main(script_args, training_args, model_args) in training_script.INTERRUPTED_STATUSES:
        return None
    wall = time.time() - started
    _free_accelerator_memory()
    checkpoints = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    log_history = json.loads((checkpoints[-1] / "trainer_state.json").read_text())["log_history"]
    training = training_log(log_history, method, seed, _rows_per_step(training_args, state))
    prompts, curves = [], training["curves"]
    for checkpoint in checkpoints:
        step = int(checkpoint.name.rsplit("-", 1)[1])
        scores = scorer.evaluate(checkpoint, seed, step)
        at = training["tokens"][min(step, len(training["tokens"]) - 1)]
        prompts += [{**row, "method": method, "generated_tokens": at} for row in scores["prompts"]]
        for kind in ("pass_at_1", scorer.k_key, "coverage"):
            curves.append({"method": method, "seed": seed, "step": step, "kind": kind, "value": scores[kind]})
    result = {
        "method": method,
        "seed": seed,
        "pass_at_1": scores["pass_at_1"],
        scorer.k_key: scores[scorer.k_key],
        "coverage": scores["coverage"],
        **training["result"],
        "wall_s": round(wall, 1),
    }
    output = {"kind": "train", "seed": seed, "method": method, "result": result, "curves": curves, "prompts": prompts}
    return _save(out, method, seed, output, state)


def _rows_per_step(training_args, state) -> int:
    """Rollouts per optimizer step over all processes (what `completions/mean_length` is a mean over)."""
    return training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps * state.num_processes


def _output_path(out: Path, method: str, seed: int) -> Path:
    return out / "runs" / f"{method}-seed{seed}" / "output.json"


def _saved(out: Path, method: str, seed: int) -> dict | None:
    path = _output_path(out, method, seed)
    return json.loads(path.read_text()) if path.is_file() else None


def _save(out: Path, method: str, seed: int, output: dict, state) -> dict:
    """Writes an arm's output atomically (main process): a crash leaves no output, and the arm is redone."""
    if state.is_main_process:
        path = _output_path(out, method, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(output))
        temporary.replace(path)
    state.wait_for_everyone()
    return output


def _free_accelerator_memory() -> None:

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------------------
# Held-out evaluation


def _held_out(args, script_args):
    """The held-out prompts as `to_prompt_dataset` rows: `--eval_dataset`, else the recipe dataset's test split."""

    source = args.eval_dataset
    try:
        if source is None:
            if script_args.dataset_path is not None and not _has_splits(script_args.dataset_path):
                raise InputError(
                    f"the recipe's dataset_path {script_args.dataset_path} is one split only, so it holds no held-out "
                    "prompts; give --eval_dataset (a local file or a Hub dataset id)."
                )
            if script_args.dataset_path is not None:
                raw = read_local(script_args.dataset_path, script_args.dataset_test_split)
            else:
                raw = read_hub(script_args.dataset_name, script_args.dataset_config, script_args.dataset_test_split)
        elif Path(source).expanduser().exists():
            raw = read_local(source)
        else:
            raw = read_hub(source, None, script_args.dataset_test_split)
        rows = prompt_rows(raw, script_args)
    except (ValueError, FileNotFoundError) as error:
        if isinstance(error, InputError):
            raise
        raise InputError(f"held-out prompts: {' '.join(str(error).split())}") from error
    if len(rows) == 0:
        raise InputError(f"held-out prompts: {source or 'the recipe test split'} is empty.")
    return rows.select(range(min(args.n_eval, len(rows)))) if args.n_eval else rows


def _has_splits(path: str) -> bool:
    folder = Path(path).expanduser()
    return folder.is_dir() and (folder / "dataset_dict.json").exists()


class Scorer:
    """Scores a model on the held-out prompts with the recipe's rewards, and its state coverage of the probe prefixes.

    Every process scores its share of the prompts (`split_between_processes`), and the shares are gathered in order.
    """

    def __init__(self, args, training_args, held_out, reward_funcs, state):

        self.args, self.state, self.reward_funcs = args, state, reward_funcs
        self.rows = held_out.to_list()
        self.max_new_tokens = training_args.max_completion_length
        self.sampling = Sampling(
            temperature=training_args.temperature,
            top_k=training_args.top_k or 0,
            top_p=training_args.top_p,
            min_p=training_args.min_p,
            repetition_penalty=training_args.repetition_penalty,
        )
        names = [getattr(f, "__name__", str(f)) for f in reward_funcs]
        success = training_args.success_reward
        self.success_index = names.index(success) if success in names else 0
        self.threshold = training_args.success_threshold
        self.k = min(PASS_K, args.eval_samples)
        self.k_key = f"pass_at_{self.k}"
        self.probe = None

    def _load(self, source):

        if Path(source).expanduser().is_dir():
            model, tokenizer = load_checkpoint(source)
        else:  # a Hub id: the start model of a recipe that names one
            model, tokenizer = AutoModelForCausalLM.from_pretrained(source).eval(), load_tokenizer(source)
        return model.to(self.state.device), tokenizer

    def write_probe(self, source, prompts, path: Path) -> None:
        """The start model's rollouts on training prompts, first halves kept, with their log-probs under it (q)."""

        if self.state.is_main_process:
            model, tokenizer = self._load(source)
            contexts = [prompt_token_ids(tokenizer, p) for p in prompts] * 2
            budgets = [self.max_new_tokens] * len(contexts)
            rollouts = sample_continuations(
                model, tokenizer, contexts, budgets, rng_seed=12345, sampling=self.sampling
            )
            prefixes = [ids[: max(1, int(COVERAGE_CUT * len(ids)))] for ids in rollouts]
            logq = [sum(lp) for lp in token_logprobs(model, contexts, prefixes, sampling=self.sampling)]
            path.write_text(json.dumps({"contexts": contexts, "prefixes": prefixes, "logq": logq}))
            del model
        self.state.wait_for_everyone()

    def start(self, source, seed: int) -> dict:
        return {"kind": "start", "seed": seed, **self.evaluate(source, seed, 0)}

    def evaluate(self, source, seed: int, step: int) -> dict:
        """Held-out pass@1 and pass@k per prompt, and coverage, of the model at `source` (folder or Hub id)."""

        model, tokenizer = self._load(source)
        samples = self.args.eval_samples
        with self.state.split_between_processes(list(range(len(self.rows)))) as mine:
            rows = [self.rows[i] for i in mine]
            contexts = [prompt_token_ids(tokenizer, row["prompt"]) for row in rows for _ in range(samples)]
            completion_ids = sample_continuations(
                model,
                tokenizer,
                contexts,
                [self.max_new_tokens] * len(contexts),
                rng_seed=EVAL_RNG_OFFSET + seed,  # the same sampling noise for every method at a given RNG seed
                batch_size=self.args.eval_batch_size,
                sampling=self.sampling,
                desc="held-out",
            )
            passed = self._passed(rows, samples, tokenizer, completion_ids)
            local = [(i, sum(passed[j * samples : (j + 1) * samples])) for j, i in enumerate(mine)]
        probe = self.probe
        with self.state.split_between_processes(list(range(len(probe["contexts"])))) as mine:
            logp = token_logprobs(
                model,
                [probe["contexts"][i] for i in mine],
                [probe["prefixes"][i] for i in mine],
                sampling=self.sampling,
            )
            local_logp = [(i, sum(lp)) for i, lp in zip(mine, logp)]
        del model
        _free_accelerator_memory()
        passes = dict(gather_object(local))
        logp_all = dict(gather_object(local_logp))
        scores = [[1.0] * passes[i] + [0.0] * (samples - passes[i]) for i in range(len(self.rows))]
        return {
            "pass_at_1": pass_at_k(scores, 1),
            self.k_key: pass_at_k(scores, self.k),
            "coverage": prefix_overlap([logp_all[i] for i in range(len(probe["logq"]))], probe["logq"]),
            "prompts": [
                {"seed": seed, "step": step, "prompt": i, "passes": passes[i], "samples": samples}
                for i in range(len(self.rows))
            ],
        }

    def _passed(self, rows: list[dict], samples: int, tokenizer, completion_ids) -> list[bool]:
        """Whether each sample's success reward exceeds the threshold; rewards get the row's columns, as in TRL."""
        texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in completion_ids]
        prompts = [row["prompt"] for row in rows for _ in range(samples)]
        completions = [
            [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
            for prompt, text in zip(prompts, texts)
        ]
        if not completions:  # this process's share of the prompts is empty
            return []
        columns = {key: [row[key] for row in rows for _ in range(samples)] for key in rows[0] if key != "prompt"}
        function = self.reward_funcs[self.success_index]
        values = function(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        return [v is not None and not math.isnan(v) and v > self.threshold for v in values]
