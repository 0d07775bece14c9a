"""The arguments of `ts_trl train`: TRL's script, GRPO and model arguments plus the seeding and embedded-task ones,
parsed by TRL's `TrlParser`, with recipes (`--config`) and the embedded default's values (the shipped `embedded`
recipe)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from dataclasses import dataclass, field

from trl import ModelConfig, ScriptArguments, TrlParser

from ..data.columns import columns_problem
from ..embedded.tasks import DEFAULT_TASK, TASKS, recipe_values, task_spec
from ..flags import DefaultsHelpFormatter
from ..rewards import REWARD_NAMES, reward_problems
from ..smollm2 import SMOLLM2_NAME
from ..trainer.seed_grpo_config import SeedGRPOConfig
from .environment import check_output_dir, cpu_only, skip_deepspeed_shm_build
from .refusals import (  # noqa: F401 (resolve_recipe: re-exported)
    DATASET_KEYS,
    SOURCE_KEYS,
    ConfigError,
    missing_settings,
    model_source_problem,
    quantized_without_model,
    read_recipe,
    resolve_recipe,
    settings_of_other_data,
    shipped_names,
)

# Used when neither a model nor a dataset is named (on the command line or in the --config recipe): the shipped
# `embedded` recipe is their one home. Sized so that the whole run fits in minutes on two CPU cores.
EMBEDDED_DEFAULTS = recipe_values("embedded")


@dataclass
class SeedScriptArguments(ScriptArguments):
    """Script arguments of `ts_trl train`: TRL's [`~trl.ScriptArguments`], the data of a dataset run and the
    built-in task's (used when no dataset is given; see docs/chain-task.md and docs/agent-task.md); each field's help
    says what it does."""

    dataset_path: str | None = field(
        default=None,
        metadata={
            "help": "Local data instead of dataset_name: a .jsonl/.json/.parquet/.csv file, or a folder of them."
        },
    )
    prompt_column: str | None = field(
        default=None, metadata={"help": "Prompt column; auto-detected among common names (problem, question, ...)."}
    )
    answer_column: str | None = field(
        default=None, metadata={"help": "Answer (math) or tests (code) column; auto-detected if unset."}
    )
    domain: str = field(
        default="math",
        metadata={"help": "'math' (rows get prompt, answer) or 'code' (prompt, tests).", "choices": ["math", "code"]},
    )
    system_prompt: str | None = field(
        default=None, metadata={"help": "Prepended to every prompt (a system message when conversational)."}
    )
    conversational: bool = field(default=False, metadata={"help": "Make prompts chat messages (chat template)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first rows for training."})
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward names (math, format, code, binary_code, embedded) or dotted paths (pkg.mod:func); "
            "required with a dataset."
        },
    )
    task: str = field(
        default="add",
        metadata={
            "help": "Built-in task: " + ", ".join(TASKS) + " (docs/chain-task.md, docs/agent-task.md).",
            "choices": list(TASKS),
        },
    )
    # The hard, sparse-reward slice: warm pass@1 about 0.16 with 3 numbers at temperature 1, against 0.45 for 2.
    embedded_difficulty: int = field(default=2, metadata={"help": "Built-in task: most additions per problem."})
    embedded_min_difficulty: int = field(default=1, metadata={"help": "Built-in task: fewest additions per problem."})
    # Too many to memorise, few enough that prompts come back (about eleven times each in the default run, the first
    # time at step 29 of 300) and find seeds in the bank.
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
        default=600,
        metadata={"help": "Supervised warm-up steps of the tiny model (cached; 700 with --task chain, 400 agents)."},
    )


TRAIN_DESCRIPTION = (
    "Trains with Thinking Seeds: TRL's GRPO flags plus the seeding ones. Without --model_name_or_path and a dataset it "
    "runs the embedded default (the built-in task and the package's tiny model, offline on CPU), which changes the "
    "defaults marked 'embedded default' below (the shipped recipe `embedded` holds them)."
)


class SeedParser(TrlParser):
    """TRL's parser, whose own refusals (a value that does not parse, a flag without its value) raise `ConfigError`
    (one line) instead of printing the usage and exiting."""

    def error(self, message):
        raise ConfigError(re.sub(r"(--\w+)(/--[\w-]+)+", r"\1", message).rstrip(".") + ".")  # one spelling per flag


def make_parser(prog: str | None = None) -> SeedParser:
    """The parser of `ts_trl train`, as TRL's scripts build theirs.

    Its help shows the defaults of TRL's fields as they hold in general, each with the embedded default's value where
    that differs, and lists `--config`.
    """
    parser = SeedParser(
        (SeedScriptArguments, SeedGRPOConfig, ModelConfig),
        prog=prog,
        formatter_class=DefaultsHelpFormatter,
        description=TRAIN_DESCRIPTION,
        usage="%(prog)s [--config RECIPE] [--<flag> VALUE ...]",
    )
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
    Bad input raises `ConfigError`: argparse's own refusals, then every problem of the flags and recipe given
    (`input_problems`) in one sentence, then the dataclasses' own checks (the seeding rules among them), then
    the output folder.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    path, recipe = read_recipe(argv)
    given = given_flags(parser, argv)
    recipe_problems = _recipe_problems(parser, recipe, path)
    settings = {**{key: value for key, value in recipe.items() if key != "env"}, **given}
    problems = recipe_problems + input_problems(settings, set(settings), REWARD_NAMES)
    if problems:
        raise ConfigError(" ".join(problems))
    kind = run_kind(settings)
    if kind:
        spec = task_spec(DEFAULT_TASK if kind == "default" else kind)
        unused = parser.set_defaults_with_config(**{**EMBEDDED_DEFAULTS, **spec.train_defaults})
        assert not unused, unused  # every embedded default is a real field
    skip_deepspeed_shm_build()
    if cpu_only():
        # No GPU, or `use_cpu: true` in the accelerate config (cpu.yaml): train on CPU in float32 rather than fail on
        # GRPOConfig's bf16 default (bf16 autocast on CPU is slow and perturbs the sampling log-probs). `use_cpu` is
        # also what makes accelerate join several CPU processes (over gloo), DeepSpeed's included: without it, it
        # looks for a GPU backend and each rank trains alone. DeepSpeed picks its CPU accelerator (DS_ACCELERATOR=cpu).
        parser.set_defaults_with_config(bf16=False, use_cpu=True)
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except ValueError as error:  # the dataclasses' own checks: SeedGRPOConfig's seeding rules, TRL's, transformers'
        raise ConfigError(str(error).replace("\n", " ")) from error
    check_output_dir(training_args)
    return script_args, training_args, model_args


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> dict:
    """The values the flags of `argv` give, by field, as `parser` converts them (its defaults left out); a flag it
    does not know, or a value that follows no flag, is refused with the nearest known flag."""
    unset = object()
    namespace = argparse.Namespace(**{action.dest: unset for action in parser._actions})
    namespace, rest = parser.parse_known_args(argv, namespace)
    unknown = [arg.split("=", 1)[0] for arg in rest if arg.startswith("-")]
    if unknown:
        raise ConfigError(f"unknown flag(s): {_nearest(unknown, [o for o in parser._option_string_actions])}.")
    if rest:
        raise ConfigError(f"unexpected value(s): {' '.join(rest)} (each value follows its --flag).")
    return {dest: value for dest, value in vars(namespace).items() if value is not unset and dest != "config"}


def _nearest(names: list[str], known: list[str]) -> str:
    return ", ".join(
        f"{n} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(n, known, 1)) else n for n in names
    )


def _recipe_problems(parser: argparse.ArgumentParser, recipe: dict, path: str | None) -> list[str]:
    """Every problem of a recipe's keys and values, in one sentence: keys the parser does not know, values its flags'
    own conversions and choices refuse (a recipe's values become the parser's defaults, which argparse converts only
    when they are text)."""
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    problems = []
    unknown = sorted(set(recipe) - set(actions) - {"env"})
    if unknown:
        problems.append(f"unknown key(s): {_nearest(unknown, sorted(actions))}")
    for key, value in recipe.items():
        action = actions.get(key)
        if action is None or action.type is None or value is None:
            continue
        values = value if isinstance(value, list) and action.nargs in ("+", "*") else [value]
        for one in values:
            if isinstance(one, (list, dict)):
                problem = None if action.type is str else "expected a single value"
            else:
                try:
                    converted = action.type(str(one))
                    choices = ", ".join(map(str, action.choices or ()))
                    problem = None if not choices or converted in action.choices else f"choose one of {choices}"
                except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
                    problem = str(error) or f"expected {getattr(action.type, '__name__', 'another value')}"
            if problem:
                problems.append(f"{key}: {value}: {problem}")
                break
    return [f"--config {path}: {'; '.join(problems)}."] if problems else []


def input_problems(settings: dict, given: set[str], rewards: list[str]) -> list[str]:
    """Every problem with `settings` (flags over recipe, as the parser converts them; `given`: the names set), one
    sentence each: settings of the other kind of data, the settings a dataset run lacks, a local data file without
    the columns it needs, reward names that name nothing (`rewards`: those registered), quantization of the tiny
    model, a model that cannot load."""
    with_dataset = any(settings.get(key) for key in DATASET_KEYS)
    model = settings.get("model_name_or_path")
    missing = missing_settings(
        with_dataset=with_dataset,
        model=model,
        reward_funcs=settings.get("reward_funcs"),
        dataset_path=settings.get("dataset_path"),
    )
    columns = columns_problem(settings) if with_dataset else None
    quantized = quantized_without_model(bool(settings.get("load_in_4bit") or settings.get("load_in_8bit")), model)
    # The real model's name is a folder converted on first use (`smollm2.model_path`): checked when it loads.
    source = model_source_problem(str(model)) if model and str(model).lower() != SMOLLM2_NAME else None
    rewards = reward_problems(settings.get("reward_funcs"), rewards)
    return (
        [p for p in (settings_of_other_data(given, with_dataset), missing, columns) if p]
        + rewards
        + [p for p in (quantized, source) if p]
    )


def run_kind(settings: dict) -> str:
    """Which defaults a run with `settings` (flags over recipe) starts from: `""` when it names a model or a dataset
    (the dataclasses' own), else its built-in task's (`"default"`: `--task` not given), the embedded default's values
    under the task's."""
    if any(settings.get(key) for key in SOURCE_KEYS):
        return ""
    return str(settings.get("task") or "default")


def is_embedded_task(script_args: SeedScriptArguments) -> bool:
    return all(getattr(script_args, key) is None for key in DATASET_KEYS)
