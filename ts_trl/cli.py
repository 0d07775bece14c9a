"""Everything `train.py` needs, so that it stays one linear `main()`: arguments, data, rewards, Ctrl-C, the report.

`train.py` with no model and no dataset is the *embedded default*: the built-in task, the package's own tiny model
warmed up on CPU, then Thinking Seeds, all offline; its settings are `EMBEDDED_DEFAULTS` (mirrored in
`recipes/embedded.yaml`). Any recipe value or flag overrides them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from accelerate import PartialState
from transformers import TrainerCallback
from trl import ScriptArguments, TrlParser

logger = logging.getLogger(__name__)

# Used when neither a model nor a dataset is named (on the command line or in the --config recipe). Sized so that
# the whole run fits in minutes on two CPU cores; recipes/embedded.yaml holds the same values, a test checks it.
EMBEDDED_DEFAULTS = {
    "output_dir": "runs/embedded",
    "use_cpu": True,
    "seed": 0,
    "learning_rate": 1e-4,  # 3e-4 collapsed pass@1 in trials; 5e-5 left it flat within 80 steps
    "lr_scheduler_type": "constant",
    "per_device_train_batch_size": 64,  # eight prompt groups of eight per step
    "num_generations": 8,
    "max_completion_length": 40,
    "temperature": 1.0,
    "beta": 0.0,
    "max_steps": 160,  # at 80, held-out pass@1 rose with two threads but not with one (OMP_NUM_THREADS=1)
    "save_steps": 10,
    "logging_steps": 5,
    "report_to": "none",
    "seed_method": "seeds",
    "seed_fraction": 0.5,
    "cut_ratio_min": 0.1,
    "cut_ratio_max": 0.9,
    "prefix_mode": "state",
    "seed_selection": "uniform",
    "reward_funcs": ["embedded"],
}

# Flags whose presence means "not the embedded default".
_SOURCE_KEYS = ("model_name_or_path", "dataset_name", "dataset_path")
_DATA_EXTENSIONS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


class ConfigError(ValueError):
    """Bad input found before training: `train.py` prints it as one line and exits with status 2."""


@dataclass
class SeedScriptArguments(ScriptArguments):
    r"""
    Script arguments of `train.py`: TRL's [`~trl.ScriptArguments`] plus the fields below.

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

        embedded_difficulty (`int`, *optional*, defaults to `2`):
            Additions per problem of the built-in task.
        embedded_train_problems (`int`, *optional*, defaults to `64`):
            Size of the built-in training set; small, so that prompts come back and find seeds in the bank.
        embedded_eval_problems (`int`, *optional*, defaults to `128`):
            Size of the held-out set on which pass@1 is measured before and after training (0: no evaluation).
        embedded_eval_samples (`int`, *optional*, defaults to `4`):
            Sampled completions per held-out problem for pass@1.
        embedded_warmup_steps (`int`, *optional*, defaults to `600`):
            Supervised warm-up steps of the tiny model (cached on disk; only used when no model is given).
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
    embedded_difficulty: int = field(default=2, metadata={"help": "Built-in task: additions per problem."})
    embedded_train_problems: int = field(default=64, metadata={"help": "Built-in task: training problems."})
    embedded_eval_problems: int = field(
        default=128, metadata={"help": "Built-in task: held-out problems for pass@1 (0: no evaluation)."}
    )
    embedded_eval_samples: int = field(default=4, metadata={"help": "Built-in task: samples per held-out problem."})
    embedded_warmup_steps: int = field(
        default=600, metadata={"help": "Supervised warm-up steps of the tiny model (cached)."}
    )


# ---------------------------------------------------------------------------------------------------------------------
# Arguments


def make_parser() -> TrlParser:
    from trl import ModelConfig

    from .config import SeedGRPOConfig

    return TrlParser((SeedScriptArguments, SeedGRPOConfig, ModelConfig))


def parse_args(parser: TrlParser, argv: list[str] | None = None):
    """`parser.parse_args_and_config`, with the embedded defaults when no model or dataset is named anywhere.

    Unknown recipe keys and flags raise `ConfigError`.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    recipe = {}
    if "--config" in argv:
        path = argv[argv.index("--config") + 1]
        if not Path(path).is_file():
            raise ConfigError(f"--config {path}: no such recipe file.")
        import yaml

        recipe = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(recipe, dict):
            raise ConfigError(f"--config {path}: a recipe must be a YAML mapping of argument names to values.")
    known = {action.dest for action in parser._actions} | {"env"}
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
        unused = parser.set_defaults_with_config(**EMBEDDED_DEFAULTS)
        assert not unused, unused  # every embedded default is a real field
    skip_deepspeed_shm_build()
    if _cpu_only():
        # No GPU, or `use_cpu: true` in the accelerate config (cpu.yaml): train on CPU in float32 rather than fail on
        # GRPOConfig's bf16 default (bf16 autocast on CPU is slow and perturbs the sampling log-probs). DeepSpeed
        # picks its CPU accelerator by itself (DS_ACCELERATOR=cpu).
        deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true")
        parser.set_defaults_with_config(bf16=False, **({} if deepspeed else {"use_cpu": True}))
    try:
        return parser.parse_args_and_config(argv)
    except ValueError as error:  # unknown recipe keys or flags, bad values
        raise ConfigError(str(error).replace("\n", " ")) from error


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
    if (
        os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() not in ("1", "true")
        or os.environ.get("WORLD_SIZE", "1") != "1"
    ):
        return
    import torch

    if torch.cuda.is_available():
        return
    import importlib

    with contextlib.suppress(ImportError):
        # import_module, not `import deepspeed.comm.torch as`: that attribute of deepspeed.comm is torch itself
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def is_embedded_task(script_args: SeedScriptArguments) -> bool:
    return script_args.dataset_name is None and script_args.dataset_path is None


@contextlib.contextmanager
def fail_clearly(prog: str = "train.py"):
    """Turns bad input found before training into one line on stderr and exit status 2 (no traceback)."""
    try:
        yield
    except (ConfigError, ValueError, FileNotFoundError, ImportError, OSError) as error:
        message = " ".join(str(error).split())
        print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


# ---------------------------------------------------------------------------------------------------------------------
# Model


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


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
    if _offline():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
        if not isinstance(cached, str):
            raise ConfigError(
                f"--model_name_or_path {name}: not in the local Hugging Face cache, and HF_HUB_OFFLINE is set. "
                f"Download it first (`hf download {name}`) or unset HF_HUB_OFFLINE."
            )


def load_model(script_args: SeedScriptArguments, training_args, model_args):
    """The model and tokenizer to train: a Hub id or folder (loaded by the trainer), or the embedded tiny model.

    A named model is returned as its name with `processing_class=None`, so that `GRPOTrainer` loads it itself (under
    ZeRO-3 that is what shards the weights at load time); the embedded one is built and warmed up here.
    """
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
    from .embedded import EmbeddedTask, build_warm_model

    task = EmbeddedTask(difficulty=script_args.embedded_difficulty, seed=training_args.seed)
    model, tokenizer = build_warm_model(task, steps=script_args.embedded_warmup_steps, seed=training_args.seed)
    model.config._name_or_path = "ts_trl/tiny-embedded"  # shows in the seed dataset and the model card
    return model, tokenizer


# ---------------------------------------------------------------------------------------------------------------------
# Data


def _read_local(path: str, split: str):
    from datasets import load_dataset, load_from_disk

    source = Path(path).expanduser()
    if not source.exists():
        raise ConfigError(f"--dataset_path {path}: no such file or folder.")
    if source.is_dir() and ((source / "dataset_info.json").exists() or (source / "dataset_dict.json").exists()):
        loaded = load_from_disk(str(source))
        return loaded[split] if hasattr(loaded, "keys") else loaded
    files = sorted(p for p in source.rglob("*") if p.suffix in _DATA_EXTENSIONS) if source.is_dir() else [source]
    builders = {_DATA_EXTENSIONS.get(p.suffix) for p in files}
    if not files or None in builders or len(builders) != 1:
        raise ConfigError(
            f"--dataset_path {path}: expected .jsonl, .json, .parquet, .csv or .arrow files of one kind, found "
            f"{sorted(p.name for p in files)[:5] or 'none'}."
        )
    return load_dataset(builders.pop(), data_files=[str(p) for p in files], split="train")


def _read_hub(script_args: SeedScriptArguments, split: str):
    from datasets import load_dataset

    name = script_args.dataset_name
    try:
        return load_dataset(name, script_args.dataset_config, split=split, streaming=script_args.dataset_streaming)
    except ValueError as error:
        if "split" in str(error).lower():
            raise ConfigError(f"--dataset_name {name}: {error}") from error
        raise
    except Exception as error:  # datasets raises many types for "not found" and "offline"
        hint = " (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE is set and it is not cached)" if _offline() else ""
        raise ConfigError(f"--dataset_name {name}: cannot load it{hint}: {type(error).__name__}: {error}") from error


def load_training_data(script_args: SeedScriptArguments, training_args):
    """The training set (and the evaluation set, or None) as `prompt` + `answer`/`tests` + `prompt_id` rows."""
    if is_embedded_task(script_args):
        from .embedded import EmbeddedTask

        task = EmbeddedTask(difficulty=script_args.embedded_difficulty, seed=training_args.seed)
        train, held_out = task.make_splits(script_args.embedded_train_problems, script_args.embedded_eval_problems)
        return train, held_out
    from .data import to_prompt_dataset

    def read(split):
        if script_args.dataset_path is not None:
            return _read_local(script_args.dataset_path, split)
        return _read_hub(script_args, split)

    def convert(dataset):
        return to_prompt_dataset(
            dataset,
            prompt_column=script_args.prompt_column,
            answer_column=script_args.answer_column,
            system_prompt=script_args.system_prompt,
            conversational=script_args.conversational,
            domain=script_args.domain,
        )

    train = read(script_args.dataset_train_split)
    if script_args.max_train_samples is not None and hasattr(train, "select"):
        train = train.select(range(min(script_args.max_train_samples, len(train))))
    train = convert(train)
    evaluation = None
    if training_args.eval_strategy != "no":
        evaluation = convert(read(script_args.dataset_test_split))
    return train, evaluation


# ---------------------------------------------------------------------------------------------------------------------
# Rewards


def resolve_rewards(names: list[str] | None, embedded: bool) -> list:
    """The reward functions named in `names`: `embedded`, a name of `ts_trl.rewards.REWARDS`, or a dotted path."""
    if not names:
        if not embedded:
            raise ConfigError("--reward_funcs is required with a dataset, e.g. --reward_funcs math format.")
        names = ["embedded"]
    if os.getcwd() not in sys.path:  # like TRL's grpo.py: dotted paths may name a module of the working directory
        sys.path.insert(0, os.getcwd())
    from .rewards import get_reward_funcs

    functions = []
    for name in names:
        if name == "embedded":
            from .embedded import embedded_reward

            functions.append(embedded_reward)
        else:
            try:
                functions.extend(get_reward_funcs([name]))
            except ValueError as error:
                raise ConfigError(f"--reward_funcs: {error}") from error
    return functions


def check_columns(dataset, reward_funcs) -> None:
    """Fails early when a reward needs a column the data lacks (rewards get every column as a keyword)."""
    import inspect

    columns = set(getattr(dataset, "column_names", None) or [])
    for function in reward_funcs:
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):
            continue
        for parameter in parameters:
            required = parameter.default is inspect.Parameter.empty and parameter.kind in (
                parameter.POSITIONAL_OR_KEYWORD,
                parameter.KEYWORD_ONLY,
            )
            if required and parameter.name not in {"completions", "prompts", "completion_ids"} | columns:
                name = getattr(function, "__name__", repr(function))
                raise ConfigError(
                    f"Reward {name} needs a column {parameter.name!r}, the data has {sorted(columns)}. Name the right "
                    "one with --answer_column (or --domain code for tests)."
                )


# ---------------------------------------------------------------------------------------------------------------------
# Ctrl-C


class SaveOnInterrupt(TrainerCallback):
    """On Ctrl-C, finishes the current step, saves a checkpoint (and its seed shard) and stops; a second Ctrl-C aborts.

    The save goes through `SeedGRPOTrainer._save_checkpoint` like any other, which writes the seed shard first. With
    several processes the flag is agreed on at every step end, so all ranks save the same step.
    """

    def __init__(self):
        self.interrupted = False
        self._previous = None

    def _handle(self, signum, frame):
        self.interrupted = True
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)
        print(
            "\nInterrupted: saving a checkpoint and its seed snapshot at the end of this step (Ctrl-C again aborts).",
            file=sys.stderr,
            flush=True,
        )

    def on_train_begin(self, args, state, control, **kwargs):
        if os.name == "posix" and hasattr(signal, "SIGINT"):
            with contextlib.suppress(ValueError):  # not the main thread: leave Ctrl-C alone
                self._previous = signal.signal(signal.SIGINT, self._handle)

    def on_step_end(self, args, state, control, **kwargs):
        interrupted = self.interrupted
        state = PartialState()
        if state.num_processes > 1:  # ranks may see the signal at different steps: save where the first one did
            import torch
            from accelerate.utils import gather

            interrupted = bool(gather(torch.tensor([float(interrupted)], device=state.device)).max().item() > 0)
        if interrupted:
            self.interrupted = True
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self._previous is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGINT, self._previous)
            self._previous = None


# ---------------------------------------------------------------------------------------------------------------------
# Cards and the embedded report


def write_cards(trainer, script_args: SeedScriptArguments, model_args, metrics: dict | None = None) -> dict:
    """Writes the model card (`README.md`) and the seed-dataset card (`seeds/README.md`) into the output directory."""
    from .cards import dataset_card_for_shard, render_model_card

    output_dir = Path(trainer.args.output_dir)
    paths = {}
    if not trainer.accelerator.is_main_process:
        return paths
    args = trainer.args
    base_model = model_args.model_name_or_path or "ts_trl/tiny-embedded"
    hub_model_id = args.hub_model_id if args.push_to_hub else None
    seed_dataset_id = f"{hub_model_id}-seeds" if hub_model_id else None
    card = render_model_card(
        base_model=base_model,
        model_name=output_dir.name,
        hub_model_id=hub_model_id,
        dataset_name=script_args.dataset_name or ("ts_trl/embedded-task" if is_embedded_task(script_args) else None),
        seed_dataset_id=seed_dataset_id,
        is_peft=bool(model_args.use_peft),
        seed_config={k: v for k, v in vars(args).items() if not k.startswith("_")},
        metrics=metrics or {},
    )
    card.save(str(output_dir / "README.md"))
    paths["model_card"] = output_dir / "README.md"
    shards = sorted((output_dir / "seeds").glob("step-*.parquet"))
    if shards:
        dataset_card = dataset_card_for_shard(shards[-1], seed_dataset_id or f"{output_dir.name}-seeds")
        dataset_card.save(str(output_dir / "seeds" / "README.md"))
        paths["dataset_card"] = output_dir / "seeds" / "README.md"
    return paths


def held_out_pass_at_1(trainer, script_args: SeedScriptArguments, dataset) -> float | None:
    """Sampled pass@1 on the built-in held-out set at the training temperature (None when there is none)."""
    if dataset is None or len(dataset) == 0 or not trainer.accelerator.is_main_process:
        return None
    if trainer.is_deepspeed_enabled:  # ZeRO-3 shards the weights: generate() outside the engine would see none
        return None
    from .embedded import embedded_reward, pass_at_1

    model = trainer.accelerator.unwrap_model(trainer.model)
    return pass_at_1(
        model,
        trainer.processing_class,
        dataset,
        embedded_reward,
        max_new_tokens=trainer.args.max_completion_length,
        temperature=trainer.args.temperature,
        num_samples=script_args.embedded_eval_samples,
        seed=trainer.args.seed,
    )


def seed_statistics(trainer) -> dict:
    """Means over the run of the seeding metrics TRL logged, and counts read back from the seed dataset."""
    history = trainer.state.log_history
    names = (
        "seeds/seeded_group_share",
        "seeds/reward_seeded",
        "seeds/reward_unseeded",
        "seeds/prefix_len_mean",
        "seeds/seed_age_mean",
        "seeds/bank_size",
    )
    stats = {}
    for name in names:
        values = [h[name] for h in history if name in h and h[name] == h[name]]
        if values:
            key = name.removeprefix("seeds/")
            stats[key] = int(values[-1]) if key == "bank_size" else sum(values) / len(values)
    manifest = Path(trainer.args.output_dir) / "seeds" / "manifest.json"
    if manifest.is_file():
        import pyarrow.parquet as pq

        shards = json.loads(manifest.read_text())["shards"]
        rows = [pq.read_table(manifest.parent / s["file"], columns=["seed_origin"]) for s in shards]
        origins = [o for table in rows for o in table.column("seed_origin").to_pylist()]
        stats["rollouts"] = len(origins)
        stats["continuations"] = sum(o is not None for o in origins)
        stats["shards"] = len(shards)
    return stats


def format_report(report: dict) -> str:
    """The final report of `train.py` as aligned text lines."""
    lines = ["", "=" * 72, "Thinking Seeds run finished"]

    def show(value):
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    for key, value in report.items():
        if isinstance(value, dict):
            lines.append(f"  {key}")
            lines += [f"    {name:<22} {show(item)}" for name, item in value.items()]
        else:
            lines.append(f"  {key:<24} {show(value)}")
    lines.append("=" * 72)
    return "\n".join(lines)


def report_run(trainer, start: float, metrics: dict, cards: dict) -> dict:
    """Prints the final report (pass@1, seeding statistics, where everything was written) and saves `report.json`."""
    from transformers.trainer_utils import get_last_checkpoint

    output_dir = Path(trainer.args.output_dir)
    report = {
        **metrics,
        "seeds": seed_statistics(trainer),
        "steps": trainer.state.global_step,
        "minutes": (time.time() - start) / 60,
        "model": str(output_dir),
        "last_checkpoint": get_last_checkpoint(str(output_dir)),
        "seed_dataset": str(output_dir / "seeds"),
        **{name: str(path) for name, path in cards.items()},
    }
    if trainer.accelerator.is_main_process:
        print(format_report(report), flush=True)
        (output_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
