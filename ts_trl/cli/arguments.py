"""The arguments of `ts_trl train`: TRL's script, GRPO and model arguments plus the seeding and embedded-task ones,
recipes (`--config`), and the embedded default's values."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field

from trl import ModelConfig, ScriptArguments, TrlParser

from ..embedded.tasks import DEFAULT_TASK, TASKS, task_spec
from ..method.settings import RULE_FIELDS
from ..rewards import REWARD_NAMES
from ..trainer.collectives import is_deepspeed
from ..trainer.seed_grpo_config import SeedGRPOConfig
from .early import (  # noqa: F401 (resolve_recipe: re-exported)
    input_problems,
    read_recipe,
    resolve_recipe,
    run_kind,
    shipped_names,
)
from .environment import check_output_dir, cpu_only, skip_deepspeed_shm_build
from .flag_table import store_table, table_of
from .flags import DefaultsHelpFormatter, store_help, wants_help
from .refusals import ConfigError

# Used when neither a model nor a dataset is named (on the command line or in the --config recipe). Sized so that
# the whole run fits in minutes on two CPU cores; recipes/embedded.yaml holds the same values, a test checks it.
EMBEDDED_DEFAULTS = {
    "output_dir": "runs/embedded",
    "use_cpu": True,
    "seed": 0,
    # Chosen by on-policy GRPO's held-out gain alone (research/results-add.md, "How the task and budget were chosen"):
    # with 8 prompts per step, lr 1e-4 stayed flat and 2e-4 or more fell; 32 prompts per step at 1e-4 rose.
    "learning_rate": 1e-4,
    "lr_scheduler_type": "constant",
    "per_device_train_batch_size": 256,  # 32 prompt groups of eight per step
    "num_generations": 8,
    "max_completion_length": 32,  # the longest solution is 26 characters and EOS
    "temperature": 1.0,
    "beta": 0.0,
    "activation_checkpointing": False,  # the tiny model fits easily; recomputing its forward pass only costs time
    "max_steps": 300,  # the seeded main job still gains from 200 to 300 (research/results-add.md)
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
            `chain-strict` (the same, scored by the whole chain). See docs/chain-task.md. The agent tasks add 2-3
            numbers through tool calls: `calculator` (the tool `add(a, b)`) or `register` (an environment whose
            `add(n)` and `read()` change a register); 400 warm-up steps, 96 tokens. See docs/agent-task.md.
        embedded_difficulty (`int`, *optional*, defaults to `2`):
            Most additions per problem of the built-in task: 3 numbers, the hard, sparse-reward slice (warm pass@1
            about 0.16 at temperature 1, against 0.45 for 2 numbers).
        embedded_min_difficulty (`int`, *optional*, defaults to `1`):
            Fewest additions per problem; each level from here to `embedded_difficulty` is equally likely.
        embedded_train_problems (`int`, *optional*, defaults to `896`):
            Size of the built-in training set: too many to memorise, few enough that prompts come back (about eleven
            times each in the default run, the first time at step 29 of 300) and find seeds in the bank. 64 with
            `calculator` or `register` (8 prompts a step: seeding starts at step 11 of 100).
        embedded_eval_problems (`int`, *optional*, defaults to `256`):
            Size of the held-out set on which pass@1 is measured during training (0: no evaluation).
        embedded_eval_samples (`int`, *optional*, defaults to `8`):
            Sampled completions per held-out problem for pass@1.
        embedded_eval_every (`int`, *optional*, defaults to `20`):
            Held-out pass@1 every this many steps for the learning curve (`learning_curve.png`; 0: start and end).
        embedded_warmup_steps (`int`, *optional*, defaults to `600`):
            Supervised warm-up steps of the tiny model (cached on disk; only used when no model is given); 700 by
            default with `--task chain` or `chain-strict`, 400 with `calculator` or `register`.
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
        metadata={"help": "Built-in task: " + ", ".join(TASKS) + ".", "choices": list(TASKS)},
    )
    embedded_difficulty: int = field(default=2, metadata={"help": "Built-in task: most additions per problem."})
    embedded_min_difficulty: int = field(default=1, metadata={"help": "Built-in task: fewest additions per problem."})
    embedded_train_problems: int = field(
        default=896, metadata={"help": "Built-in task: training problems (64 with --task calculator or register)."}
    )
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
        + ", ".join(shipped_names("recipes"))
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
    Bad input raises `ConfigError`: first every problem `early.input_problems` finds (the checks `ts_trl train` makes
    before TRL is imported, here on the live parser's flags), then the parser's and the dataclasses' own.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    table = table_of(parser, run_defaults(), REWARD_NAMES)
    store_table(table)  # the next command checks its flags before importing TRL, whatever TRL's version
    if wants_help(argv) and "--config" not in argv:
        # The general defaults, not the embedded default's or this machine's; saved for the next --help.
        text = parser.format_help()
        store_help(parser.prog, text)
        print(text, end="")
        raise SystemExit(0)
    path, recipe = read_recipe(argv)
    settings, problems = input_problems(table, argv, recipe, path)
    if problems:
        raise ConfigError(" ".join(problems))
    kind = run_kind(settings)  # the defaults the early checks assumed: the same rule picks them here
    if kind:
        spec = task_spec(DEFAULT_TASK if kind == "default" else kind)
        unused = parser.set_defaults_with_config(**{**EMBEDDED_DEFAULTS, **spec.train_defaults})
        assert not unused, unused  # every embedded default is a real field
    skip_deepspeed_shm_build()
    if cpu_only():
        # No GPU, or `use_cpu: true` in the accelerate config (cpu.yaml): train on CPU in float32 rather than fail on
        # GRPOConfig's bf16 default (bf16 autocast on CPU is slow and perturbs the sampling log-probs). DeepSpeed
        # picks its CPU accelerator by itself (DS_ACCELERATOR=cpu).
        parser.set_defaults_with_config(bf16=False, **({} if is_deepspeed() else {"use_cpu": True}))
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except ValueError as error:  # what the table does not show: the dataclasses' own checks
        raise ConfigError(str(error).replace("\n", " ")) from error
    check_output_dir(training_args)
    return script_args, training_args, model_args


def run_defaults() -> dict[str, dict]:
    """The defaults of each kind of run (`early.run_kind`) for the settings checked before TRL is imported: the
    output folder and the settings of the seeding rules. A named model's or dataset's (`""`) are `SeedGRPOConfig`'s
    own; a built-in task's (`"default"`: `--task`'s default) the embedded default's and the task's over them."""
    names = ("output_dir", *RULE_FIELDS)
    own = {f.name: f.default for f in dataclasses.fields(SeedGRPOConfig) if f.name in names}
    tasks = {}
    for name in TASKS:
        embedded = {**EMBEDDED_DEFAULTS, **task_spec(name).train_defaults}
        tasks[name] = {**own, **{key: value for key, value in embedded.items() if key in names}}
    return {"": own, "default": tasks[DEFAULT_TASK], **tasks}


def is_embedded_task(script_args: SeedScriptArguments) -> bool:
    return script_args.dataset_name is None and script_args.dataset_path is None
