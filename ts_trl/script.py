"""Train with Thinking Seeds: the installed script, shaped like TRL's `trl/scripts/grpo.py`.

    ts_trl train [--config embedded|<recipe.yaml>] [--flag value ...]              # one process, in this process
    accelerate launch [--config_file cpu|<accelerate.yaml>] -m ts_trl train [...]   # any accelerate setup

With no model and no dataset it runs the *embedded default*: the built-in task, the package's own tiny model warmed up
on CPU, then Thinking Seeds, all offline, ending with a report of held-out pass@1 before and after; its settings are
`EMBEDDED_DEFAULTS` (the shipped `embedded` recipe holds the same values). Any recipe value or flag overrides them.
Recipes and accelerate configs shipped with the package can be named without a path (`--config embedded`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trl import ScriptArguments, TrlParser

from .collectives import is_deepspeed
from .flags import store_help, wants_help
from .resources import packaged_file

logger = logging.getLogger(__name__)

# Used when neither a model nor a dataset is named (on the command line or in the --config recipe). Sized so that
# the whole run fits in minutes on two CPU cores; recipes/embedded.yaml holds the same values, a test checks it.
EMBEDDED_DEFAULTS = {
    "output_dir": "runs/embedded",
    "use_cpu": True,
    "seed": 0,
    # Chosen by on-policy GRPO's held-out gain alone (docs/results-add.md, "How the task and budget were chosen"):
    # with 8 prompts per step, lr 1e-4 stayed flat and 2e-4 or more fell; 32 prompts per step at 1e-4 rose.
    "learning_rate": 1e-4,
    "lr_scheduler_type": "constant",
    "per_device_train_batch_size": 256,  # 32 prompt groups of eight per step
    "num_generations": 8,
    "max_completion_length": 32,  # the longest solution is 26 characters and EOS
    "temperature": 1.0,
    "beta": 0.0,
    "activation_checkpointing": False,  # the tiny model fits easily; recomputing its forward pass only costs time
    "max_steps": 300,  # the seeded main job still gains from 200 to 300 (docs/results-add.md)
    "save_steps": 20,
    "logging_steps": 5,
    "report_to": "none",
    "seed_method": "seeds",
    "seed_fraction": 0.5,
    "cut_ratio_min": 0.1,
    "cut_ratio_max": 0.9,
    "prefix_mode": "state",
    "seed_selection": "uniform",
    "reward_funcs": ["embedded"],
    "card_license": "apache-2.0",  # the package's own model and task
}

# Flags whose presence means "not the embedded default".
_SOURCE_KEYS = ("model_name_or_path", "dataset_name", "dataset_path")
# The exit status of a run stopped by Ctrl-C once its checkpoint is safe (128 + SIGINT, what shells report).
INTERRUPTED_STATUS = 130


class ConfigError(ValueError):
    """Bad input found before training: printed as one line, exit status 2."""


@dataclass
class SeedScriptArguments(ScriptArguments):
    r"""
    Script arguments of `ts_trl train`: TRL's [`~trl.ScriptArguments`] plus the fields below.

    Parameters:
        > Parameters that control the data

        dataset_path (`str`, *optional*):
            Local data instead of `dataset_name`: a `.jsonl`/`.json`/`.parquet`/`.csv` file, or a folder of them.
        prompt_column (`str`, *optional*):
            Column holding the prompt; auto-detected among common names (`problem`, `question`, `prompt`, ...).
        answer_column (`str`, *optional*):
            Column holding the reference: the final answer (math) or the tests (code); auto-detected if unset.
        domain (`str`, *optional*, defaults to `"math"`):
            `"math"` (rows get `prompt`, `answer`) or `"code"` (rows get `prompt`, `tests`).
        system_prompt (`str`, *optional*):
            Prepended to every prompt (as a system message when `conversational`).
        conversational (`bool`, *optional*, defaults to `False`):
            Turn prompts into chat messages, so the tokenizer's chat template is applied.
        max_train_samples (`int`, *optional*):
            Keep only the first rows of the training split.
        reward_funcs (`list[str]`, *optional*):
            Reward functions by registry name (`math`, `format`, `code`, `binary_code`, `embedded`) or dotted path
            (`my_pkg.rewards:my_reward`). Defaults to `embedded` on the built-in task; required otherwise.

        > Parameters of the embedded default (used when no dataset is given)

        task (`str`, *optional*, defaults to `"add"`):
            The built-in task: `add` (add 2-3 numbers), `chain` (4-6 digits whose wrong partial sums can be
            repaired, with a 3-layer model and a 72-token budget; `embedded_difficulty` does not apply) or
            `chain-strict` (the same, scored by the whole chain). See docs/chain-task.md.
        embedded_difficulty (`int`, *optional*, defaults to `2`):
            Most additions per problem of the built-in task: 3 numbers, the hard, sparse-reward slice (warm pass@1
            about 0.16 at temperature 1, against 0.45 for 2 numbers).
        embedded_min_difficulty (`int`, *optional*, defaults to `1`):
            Fewest additions per problem; each level from here to `embedded_difficulty` is equally likely.
        embedded_train_problems (`int`, *optional*, defaults to `896`):
            Size of the built-in training set: too many to memorise, few enough that prompts come back (about eleven
            times each in the default run, the first time at step 29 of 300) and find seeds in the bank.
        embedded_eval_problems (`int`, *optional*, defaults to `256`):
            Size of the held-out set on which pass@1 is measured during training (0: no evaluation).
        embedded_eval_samples (`int`, *optional*, defaults to `8`):
            Sampled completions per held-out problem for pass@1.
        embedded_eval_every (`int`, *optional*, defaults to `20`):
            Held-out pass@1 every this many steps for the learning curve (`learning_curve.png`; 0: start and end).
        embedded_warmup_steps (`int`, *optional*, defaults to `600`):
            Supervised warm-up steps of the tiny model (cached on disk; only used when no model is given); 700 by
            default with `--task chain` or `chain-strict`.
    """

    dataset_path: str | None = field(
        default=None, metadata={"help": "Local .jsonl/.json/.parquet/.csv file or folder, instead of dataset_name."}
    )
    prompt_column: str | None = field(default=None, metadata={"help": "Prompt column (auto-detected if unset)."})
    answer_column: str | None = field(
        default=None, metadata={"help": "Answer (math) or tests (code) column (auto-detected if unset)."}
    )
    domain: str = field(default="math", metadata={"help": "'math' or 'code'.", "choices": ["math", "code"]})
    system_prompt: str | None = field(default=None, metadata={"help": "Prepended to every prompt."})
    conversational: bool = field(default=False, metadata={"help": "Make prompts chat messages (chat template)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first rows for training."})
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": "Reward names (math, format, code, binary_code, embedded) or dotted paths (pkg.mod:func)."},
    )
    task: str = field(
        default="add",
        metadata={"help": "Built-in task: add, chain or chain-strict.", "choices": ["add", "chain", "chain-strict"]},
    )
    embedded_difficulty: int = field(default=2, metadata={"help": "Built-in task: most additions per problem."})
    embedded_min_difficulty: int = field(default=1, metadata={"help": "Built-in task: fewest additions per problem."})
    embedded_train_problems: int = field(default=896, metadata={"help": "Built-in task: training problems."})
    embedded_eval_problems: int = field(
        default=256, metadata={"help": "Built-in task: held-out problems for pass@1 (0: no evaluation)."}
    )
    embedded_eval_samples: int = field(default=8, metadata={"help": "Built-in task: samples per held-out problem."})
    embedded_eval_every: int = field(
        default=20, metadata={"help": "Built-in task: held-out pass@1 every N steps for the learning curve."}
    )
    embedded_warmup_steps: int = field(
        default=600, metadata={"help": "Supervised warm-up steps of the tiny model (cached; 700 with --task chain)."}
    )


# ---------------------------------------------------------------------------------------------------------------------
# Arguments


TRAIN_DESCRIPTION = (
    "Trains with Thinking Seeds: TRL's GRPO flags plus the seeding ones. Without --model_name_or_path and a dataset it "
    "runs the embedded default (the built-in task and the package's tiny model, offline on CPU), which changes the "
    "defaults marked 'embedded default' below (the shipped recipe `embedded` holds them)."
)


def make_parser(subparsers: argparse._SubParsersAction | None = None, prog: str | None = None) -> TrlParser:
    """The parser of `ts_trl train` (a subcommand of `subparsers` when given), as TRL's scripts build theirs.

    Its help shows the defaults of TRL's fields as they hold in general, each with the embedded default's value where
    that differs, and lists `--config`.
    """
    from trl import ModelConfig

    from .config import SeedGRPOConfig
    from .flags import DefaultsHelpFormatter

    kwargs = {
        "dataclass_types": (SeedScriptArguments, SeedGRPOConfig, ModelConfig),
        "formatter_class": DefaultsHelpFormatter,
        "description": TRAIN_DESCRIPTION,
        "usage": "%(prog)s [--config RECIPE] [--<flag> VALUE ...]",
    }
    if subparsers is not None:
        parser = subparsers.add_parser("train", help=TRAIN_DESCRIPTION.split(":")[0], **kwargs)
    else:
        parser = TrlParser(prog=prog, **kwargs)
    # TrlParser reads --config itself before argparse parses; declared here so that --help lists it, first.
    config = parser.add_argument(
        "--config",
        metavar="RECIPE",
        default=argparse.SUPPRESS,
        help="A recipe: a YAML file of these flags, or a shipped recipe's name ("
        + ", ".join(_shipped_names("recipes"))
        + "). Flags on the command line override it.",
    )
    parser._optionals._group_actions.remove(config)
    parser._optionals._group_actions.insert(1, config)  # after -h
    for action in parser._actions:
        if action.dest in EMBEDDED_DEFAULTS and EMBEDDED_DEFAULTS[action.dest] != action.default:
            embedded = EMBEDDED_DEFAULTS[action.dest]
            embedded = " ".join(embedded) if isinstance(embedded, list) else embedded
            action.help = f"{action.help or ''} (default: %(default)s; embedded default: {embedded})".lstrip()
    return parser


def parse_args(parser: TrlParser, argv: list[str] | None = None):
    """`parser.parse_args_and_config`, with the embedded defaults when no model or dataset is named anywhere.

    `--config` takes a recipe file or the name of a shipped recipe (`embedded`, `qwen2.5-math-1.5b_gsm8k`, ...).
    Unknown recipe keys and flags raise `ConfigError`.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv) and "--config" not in argv:
        # The general defaults, not the embedded default's or this machine's; saved for the next --help.
        text = parser.format_help()
        store_help(parser.prog, text)
        print(text, end="")
        raise SystemExit(0)
    recipe = {}
    if "--config" in argv:
        index = argv.index("--config") + 1
        if index == len(argv):
            raise ConfigError("--config needs a recipe file or the name of a shipped recipe, e.g. --config embedded.")
        path = argv[index] = str(resolve_recipe(argv[index]))
        import yaml

        recipe = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(recipe, dict):
            raise ConfigError(f"--config {path}: a recipe must be a YAML mapping of argument names to values.")
    known = ({action.dest for action in parser._actions} - {"config"}) | {"env"}
    unknown = sorted(set(recipe) - known)
    if unknown:
        import difflib

        hints = [
            f"{key} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(key, known, 1)) else key
            for key in unknown
        ]
        raise ConfigError(f"--config {path}: unknown key(s): {', '.join(hints)}.")
    named = any(recipe.get(key) for key in _SOURCE_KEYS) or any(
        arg.split("=", 1)[0] == f"--{key}" for arg in argv for key in _SOURCE_KEYS
    )
    if not named:
        from .embedded.tasks import task_named, task_spec

        spec = task_spec(task_named(argv, recipe))
        unused = parser.set_defaults_with_config(**{**EMBEDDED_DEFAULTS, **spec.train_defaults})
        assert not unused, unused  # every embedded default is a real field
    skip_deepspeed_shm_build()
    if _cpu_only():
        # No GPU, or `use_cpu: true` in the accelerate config (cpu.yaml): train on CPU in float32 rather than fail on
        # GRPOConfig's bf16 default (bf16 autocast on CPU is slow and perturbs the sampling log-probs). DeepSpeed
        # picks its CPU accelerator by itself (DS_ACCELERATOR=cpu).
        parser.set_defaults_with_config(bf16=False, **({} if is_deepspeed() else {"use_cpu": True}))
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except ValueError as error:  # unknown recipe keys or flags, bad values
        raise ConfigError(str(error).replace("\n", " ")) from error
    check_output_dir(training_args)
    return script_args, training_args, model_args


def resolve_recipe(name: str) -> Path:
    """A recipe file as given, else the shipped recipe of that name (`embedded` -> `recipes/embedded.yaml`)."""
    if Path(name).expanduser().is_file():
        return Path(name).expanduser()
    shipped = packaged_file("recipes", name if name.endswith(".yaml") else f"{name}.yaml")
    if shipped is None:
        raise ConfigError(
            f"--config {name}: no such recipe file, nor a shipped recipe of that name (shipped: "
            f"{', '.join(_shipped_names('recipes'))})."
        )
    return shipped


def _shipped_names(kind: str) -> list[str]:
    from .resources import packaged_folder

    folder = packaged_folder(kind)
    return sorted(path.stem for path in folder.glob("*.yaml")) if folder else []


def _cpu_only() -> bool:
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return True
    import torch

    return not (torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()))


def skip_deepspeed_shm_build() -> None:
    """Under DeepSpeed on CPU with one process, skips the JIT build of DeepSpeed's shared-memory all-reduce kernel.

    DeepSpeed compiles that C++ op when its communication backend starts, even for a single process, where there is
    nothing to reduce; with `DS_BUILD_OPS=0` that is minutes of compiling, and needs a compiler. Nothing else changes.
    """
    if not is_deepspeed() or os.environ.get("WORLD_SIZE", "1") != "1":
        return
    import torch

    if torch.cuda.is_available():
        return
    import importlib

    with contextlib.suppress(ImportError):
        # import_module, not `import deepspeed.comm.torch as`: that attribute of deepspeed.comm is torch itself
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def check_output_dir(training_args) -> None:
    """One rule for a folder that holds another run: continue it with resume_from_checkpoint, or use a new folder.

    Checkpoints and seeds are one run: a new run into a folder that has either would mix them (a later resume would
    find another run's checkpoints, or shards moved aside), so it is refused before anything is loaded or written.
    """
    from transformers.trainer_utils import get_last_checkpoint

    from .seed_data import SEEDS_DIR, SeedManifest

    output_dir = Path(training_args.output_dir)
    if training_args.resume_from_checkpoint:
        from .snapshots import check_resume_checkpoint

        check_resume_checkpoint(training_args.resume_from_checkpoint, output_dir)
        return
    if not output_dir.is_dir():
        return
    last = get_last_checkpoint(str(output_dir))
    if last is None and not SeedManifest.path(output_dir / SEEDS_DIR).is_file():
        return
    held = f"checkpoints up to {Path(last).name}" if last else "a seed dataset (seeds/manifest.json)"
    resume = f"--resume_from_checkpoint {last}" if last else "--resume_from_checkpoint <its checkpoint>"
    raise ConfigError(
        f"--output_dir {output_dir} holds an earlier run ({held}). Continue it with {resume}, or start a new run in "
        "another --output_dir (or move the folder away)."
    )


@contextlib.contextmanager
def fail_clearly(prog: str | None = None):
    """Turns bad input found before training into one line on stderr and exit status 2 (no traceback)."""
    try:
        yield
    except (ValueError, FileNotFoundError, ImportError, OSError) as error:
        message = " ".join(str(error).split())
        print(f"{prog or _prog()}: error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def _prog() -> str:
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "ts_trl train"


# ---------------------------------------------------------------------------------------------------------------------
# Model


def check_model_source(name: str) -> None:
    """Fails early and clearly on a local model path that does not exist, or a Hub id not cached when offline."""
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ConfigError(f"--model_name_or_path {name}: the folder has no config.json; it is not a saved model.")
        return
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep + os.sep in name
    if looks_local:
        raise ConfigError(f"--model_name_or_path {name}: no such local folder.")
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
        if not isinstance(cached, str):
            raise ConfigError(
                f"--model_name_or_path {name}: not in the local Hugging Face cache, and HF_HUB_OFFLINE is set. "
                f"Download it first (`hf download {name}`) or unset HF_HUB_OFFLINE."
            )


def learning_curve(script_args, training_args, eval_dataset):
    """The embedded default's learning-curve callback (held-out pass@1 every `embedded_eval_every` steps)."""
    from .embedded.curve import LearningCurve

    return LearningCurve(
        eval_dataset if eval_dataset is not None else [],
        every=script_args.embedded_eval_every,
        num_samples=script_args.embedded_eval_samples,
        max_new_tokens=training_args.max_completion_length,
        temperature=training_args.temperature,
        seed=training_args.seed,
    )


def embedded_task(script_args: SeedScriptArguments, seed: int):
    """The built-in task of the embedded default, as the script arguments set it; its warm-up and data both use it."""
    from .embedded.tasks import make_task

    return make_task(
        script_args.task,
        seed=seed,
        difficulty=script_args.embedded_difficulty,
        min_difficulty=script_args.embedded_min_difficulty,
    )


def load_model(script_args: SeedScriptArguments, training_args, model_args, task=None):
    """The model and tokenizer to train: a Hub id or folder (loaded by the trainer), or the tiny model warmed up on
    `task` (the embedded default's `embedded_task`).

    A named model is returned as its name with `processing_class=None`, so that `GRPOTrainer` loads it itself (under
    ZeRO-3 that is what shards the weights at load time; `--load_in_4bit/8bit` reach it as TRL's scripts pass them);
    the embedded one is built and warmed up here.
    """
    quantized = model_args.load_in_4bit or model_args.load_in_8bit
    if model_args.model_name_or_path is not None:
        check_model_source(model_args.model_name_or_path)
        model_init_kwargs = {
            "revision": model_args.model_revision,
            "trust_remote_code": training_args.trust_remote_code,
            "attn_implementation": model_args.attn_implementation,
            "dtype": model_args.dtype,
        }
        training_args.model_init_kwargs = {**model_init_kwargs, **(training_args.model_init_kwargs or {})}
        return model_args.model_name_or_path, None
    if not is_embedded_task(script_args):
        raise ConfigError(
            "--model_name_or_path is required with a dataset (the tiny built-in model only knows the built-in task)."
        )
    if quantized:
        raise ConfigError(
            "--load_in_4bit/--load_in_8bit quantize a model named with --model_name_or_path (bitsandbytes, on GPU); "
            "the embedded default's tiny model is not quantized. Drop the flag or name a model."
        )
    from .embedded.tasks import build_task_model

    task = task or embedded_task(script_args, training_args.seed)
    return build_task_model(
        script_args.task, task, warmup_steps=script_args.embedded_warmup_steps, seed=training_args.seed
    )


def is_embedded_task(script_args: SeedScriptArguments) -> bool:
    return script_args.dataset_name is None and script_args.dataset_path is None


# ---------------------------------------------------------------------------------------------------------------------
# The run


def resume_command(checkpoint: str | None) -> str:
    """The command line that continues this run from `checkpoint`: the one that started it, plus the checkpoint.

    Under `accelerate launch` the worker's own argv lacks the launcher's options, so the launcher's command line is
    read from the parent process where the system shows it (Linux); elsewhere it is this process's.
    """
    argv = [Path(sys.executable).name, *sys.argv]
    if os.environ.get("ACCELERATE_CONFIG_DS_FIELDS") is not None or "LOCAL_RANK" in os.environ:
        with contextlib.suppress(OSError):
            parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
            parent = [part.decode() for part in parent if part]
            if any("accelerate" in part for part in parent):
                argv = ["accelerate", "launch", *parent[parent.index("launch") + 1 :]] if "launch" in parent else argv
    if argv[0].startswith("python") and len(argv) > 1 and Path(argv[1]).name == "__main__.py":
        argv = [argv[0], "-m", "ts_trl", *argv[2:]]  # `ts_trl train` runs through ts_trl/__main__.py
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume_from_checkpoint":
            skip = True
        elif not arg.startswith("--resume_from_checkpoint="):
            kept.append(arg)
    return shlex.join([*kept, "--resume_from_checkpoint", checkpoint or "<checkpoint>"])


def main(script_args: SeedScriptArguments, training_args, model_args) -> int:
    """Trains with Thinking Seeds; returns 0, or `INTERRUPTED_STATUS` after a Ctrl-C once the checkpoint is saved.

    Bad input found before training is one line on stderr and `SystemExit(2)`.
    """
    from trl import get_peft_config, get_quantization_config

    from . import SeedGRPOTrainer
    from .console import use_compact_console
    from .data import load_training_data
    from .embedded.cpu import embedded_training_threads, torch_threads
    from .report import held_out_pass_at_1, report_run
    from .rewards import check_reward_columns, get_reward_funcs
    from .snapshots import SaveOnInterrupt

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    start = time.time()
    embedded = is_embedded_task(script_args)
    with fail_clearly():
        if not script_args.reward_funcs and not embedded:
            raise ConfigError("--reward_funcs is required with a dataset, e.g. --reward_funcs math format.")
        task = embedded_task(script_args, training_args.seed) if embedded else None
        model, tokenizer = load_model(script_args, training_args, model_args, task)
        train_dataset, eval_dataset = load_training_data(
            script_args, with_eval=not embedded and training_args.eval_strategy != "no", task=task
        )
        reward_funcs = get_reward_funcs(script_args.reward_funcs or ["embedded"])
        check_reward_columns(train_dataset, reward_funcs)
        interrupt = SaveOnInterrupt()
        curve = learning_curve(script_args, training_args, eval_dataset) if embedded else None
        trainer = SeedGRPOTrainer(
            model=model,
            reward_funcs=reward_funcs,
            args=training_args,
            train_dataset=train_dataset,
            eval_dataset=None if embedded else eval_dataset,  # the built-in held-out set is scored below instead
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args),
            quantization_config=get_quantization_config(model_args),  # None unless --load_in_4bit/--load_in_8bit
            # A Ctrl-C save is a checkpoint like any other, with its seed shard; the learning curve is the built-in
            # task's held-out pass@1 every few steps (learning_curve.png).
            callbacks=[interrupt] + ([curve] if curve else []),
        )
        interrupt.accelerator = trainer.accelerator
        if curve:
            curve.report_through(trainer)  # held-out pass@1 reaches every report_to tracker
        use_compact_console(trainer)  # one line per logging step; every metric still reaches report_to
        if training_args.resume_from_checkpoint and training_args.seed_method != "none":
            trainer.seed_store.check_resume(training_args.resume_from_checkpoint)  # one line, not a traceback
    trainer.accelerator.print(
        f"Training on {trainer.accelerator.num_processes} process(es), DeepSpeed: {trainer.is_deepspeed_enabled}"
    )
    samples = script_args.embedded_eval_samples
    before = held_out_pass_at_1(trainer, eval_dataset, samples) if embedded else None
    with torch_threads(embedded_training_threads() if embedded else None):
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    after = held_out_pass_at_1(trainer, eval_dataset, samples) if embedded else None

    trainer.save_model(training_args.output_dir)
    metrics = {"held_out_pass@1_before": before, "held_out_pass@1_after": after} if embedded else {}
    card = {"dataset_name": script_args.dataset_name, "metrics": {k: v for k, v in metrics.items() if v is not None}}
    push_error = None
    if training_args.push_to_hub:
        try:
            trainer.push_to_hub(**card)  # writes the model card through create_model_card, then uploads
        except ConnectionError as error:  # the model is saved: report the run, then the failed push
            push_error = error
    else:
        trainer.create_model_card(**card)
    report = report_run(trainer, start, metrics, interrupted=interrupt.interrupted)
    trainer.end()
    if interrupt.interrupted:
        trainer.accelerator.print(
            f"Interrupted at step {report['steps']}; the checkpoint and its seed shard are saved. Resume with:\n"
            f"  {resume_command(report['last_checkpoint'])}"
        )
        return INTERRUPTED_STATUS
    if push_error is not None:
        print(f"{_prog()}: error: {push_error}", file=sys.stderr, flush=True)
        return 1
    return 0


def run(argv: list[str] | None = None, parser: TrlParser | None = None, prog: str | None = None) -> int:
    """Parses `argv` (default: the command line) and trains: what `ts_trl train`, `train.py` and `-m ts_trl` run."""
    with fail_clearly(prog):  # bad input: one line on stderr and exit status 2, before any training
        script_args, training_args, model_args = parse_args(parser or make_parser(prog=prog), argv)
    return main(script_args, training_args, model_args)
