"""What `ts_trl train` (and `train.py`) answers before torch, transformers and TRL are imported, which takes from
seconds on an idle machine to a minute on a busy one: the help when it is cached (and a line saying what the wait is
for when it is not), and bad input: a recipe that is missing or not a mapping, unknown flags and recipe keys, values
that do not parse, seeding settings that break a rule, settings of the other kind of data, the settings a dataset run
lacks, a local data file without a prompt or answer column, reward names that name nothing (all at once), and an output
folder that holds an earlier run, or a checkpoint to resume from that is not one.

The checks are the parser's own (`input_problems`): the full parser runs them again on its live table of flags, so
both say the same line. Without a table for this install (`flag_table.load_table`), only the help and the recipe are
answered here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from ..method.settings import RULE_FIELDS, seeding_problems
from ..resources import packaged_file, packaged_folder
from ..rewards import reward_problems
from ..smollm2 import SMOLLM2_NAME
from .columns import first_row_columns, pick_columns
from .flag_table import is_true, load_table, parse_flags, recipe_problems
from .flags import cached_help, wants_help
from .refusals import (
    DATASET_KEYS,
    SOURCE_KEYS,
    ConfigError,
    missing_settings,
    model_source_problem,
    output_dir_problem,
    quantized_without_model,
    say_refusal,
    settings_of_other_data,
)

# ---------------------------------------------------------------------------------------------------------------------
# Recipes


def shipped_names(kind: str) -> list[str]:
    """The shipped recipes (`kind="recipes"`) or accelerate configs, by name."""
    folder = packaged_folder(kind)
    return sorted(path.stem for path in folder.glob("*.yaml")) if folder else []


def resolve_recipe(name: str) -> Path:
    """A recipe file as given, else the shipped recipe of that name (`embedded` -> `recipes/embedded.yaml`)."""
    if Path(name).expanduser().is_file():
        return Path(name).expanduser()
    shipped = packaged_file("recipes", name if name.endswith(".yaml") else f"{name}.yaml")
    if shipped is None:
        raise ConfigError(
            f"--config {name}: no such recipe file, nor a shipped recipe of that name (shipped: "
            f"{', '.join(shipped_names('recipes'))})."
        )
    return shipped


def read_recipe(argv: list[str]) -> tuple[str | None, dict]:
    """The `--config` recipe of `argv` (its path and values; None and {} without one), with `argv` rewritten in place
    to name the recipe's file (`--config embedded` -> the shipped file; `--config=X` -> `--config X`, as TRL reads it)."""
    for index, arg in enumerate(argv):
        if arg.startswith("--config="):
            argv[index : index + 1] = ["--config", arg.split("=", 1)[1]]
    if "--config" not in argv:
        return None, {}
    index = argv.index("--config") + 1
    if index == len(argv):
        raise ConfigError("--config needs a recipe file or the name of a shipped recipe, e.g. --config embedded.")
    path = argv[index] = str(resolve_recipe(argv[index]))
    try:
        recipe = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"--config {path}: not valid YAML ({' '.join(str(error).split())}).") from None
    if not isinstance(recipe, dict):
        raise ConfigError(f"--config {path}: a recipe must be a YAML mapping of argument names to values.")
    return path, recipe


def _without_config(argv: list[str]) -> list[str]:
    if "--config" not in argv:
        return argv
    index = argv.index("--config")
    return argv[:index] + argv[index + 2 :]


# ---------------------------------------------------------------------------------------------------------------------
# The checks, run here and again by the full parser


def _first(value):
    return value[0] if isinstance(value, list) and value else value


def input_problems(table: dict, argv: list[str], recipe: dict, path: str | None) -> tuple[dict, list[str]]:
    """The settings that `argv` and the recipe give (flags over recipe), and every problem the parser's table shows
    with them, one sentence each: unknown flags and keys, values that do not parse, seeding settings that break a rule,
    settings of the other kind of data, the settings a dataset run lacks, a local data file without the columns it
    needs, rewards that name nothing, quantization of the tiny model, a model that cannot load."""
    given, problems = parse_flags(table, _without_config(argv))
    if path is not None:
        problems += recipe_problems(table, recipe, path)
    settings = {**recipe, **given}
    with_dataset = any(settings.get(key) for key in DATASET_KEYS)
    other = settings_of_other_data(set(recipe) | set(given), with_dataset)
    missing = missing_settings(
        with_dataset=with_dataset,
        model=_first(settings.get("model_name_or_path")),
        reward_funcs=settings.get("reward_funcs"),
        dataset_path=_first(settings.get("dataset_path")),
    )
    seeding = seeding_problems(rule_values(table, settings))
    rewards = reward_problems(settings.get("reward_funcs"), table["rewards"])
    model = _first(settings.get("model_name_or_path"))
    quantized = quantized_without_model(any(is_true(settings.get(k)) for k in ("load_in_4bit", "load_in_8bit")), model)
    # The real model's name is a folder converted on first use (`smollm2.model_path`): the full parser checks it.
    source = model_source_problem(str(model)) if model and str(model).lower() != SMOLLM2_NAME else None
    columns = _columns_problem(settings) if with_dataset else None
    later = [problem for problem in (quantized, source) if problem]
    return settings, problems + seeding + [p for p in (other, missing, columns) if p] + rewards + later


def _columns_problem(settings: dict) -> str | None:
    """Why a local data file has no prompt or reference column (`columns.pick_columns`), told from its first row or
    schema; None when it has both, or when that cannot be told without loading it."""
    path = _first(settings.get("dataset_path"))
    domain = _first(settings.get("domain", "math"))
    if not path or not Path(path).expanduser().is_file() or domain not in ("math", "code"):
        return None
    columns = first_row_columns(Path(path).expanduser())
    if columns is None:
        return None
    try:
        pick_columns(columns, _first(settings.get("prompt_column")), _first(settings.get("answer_column")), domain)
    except ValueError as error:
        return str(error)
    return None


def run_kind(settings: dict) -> str:
    """Which defaults a run with `settings` (flags over recipe) starts from: `""` when it names a model or a dataset
    (the dataclasses' own), else its built-in task's (`"default"`: `--task` not given), the embedded default's values
    under the task's."""
    if any(settings.get(key) for key in SOURCE_KEYS):
        return ""
    return str(_first(settings.get("task")) or "default")


def rule_values(table: dict, settings: dict) -> dict:
    """The values of the settings `seeding_problems` reads, as `SeedGRPOConfig` will hold them: the run's defaults
    (`run_kind`), under the given values. A given value the table already refuses (it does not parse, or is not one of
    its flag's choices) is left out, and its rules with it: said once."""
    choices = {flag["dest"]: flag["choices"] for flag in table["flags"] if flag.get("choices")}
    defaults = table["defaults"].get(run_kind(settings), {})  # none for a `--task` the table refuses
    values = {name: defaults[name] for name in RULE_FIELDS if name in defaults}
    for name, kind in RULE_FIELDS.items():
        if name not in settings:
            continue
        value = _first(settings[name])
        values.pop(name, None)
        if value is None or str(value).lower() in ("none", "null"):
            if name in ("seed_filter", "seed_snapshot_steps"):  # the fields that may be unset
                values[name] = None
            continue
        if name in choices and str(value) not in choices[name]:
            continue
        try:
            values[name] = kind(value)
        except (TypeError, ValueError):
            continue
    return values


# ---------------------------------------------------------------------------------------------------------------------
# The output folder


def _output_dir(table: dict, settings: dict) -> str | None:
    """The output folder the run would use: given, else the built-in task's, else TRL's default."""
    if "output_dir" in settings:  # `output_dir: null` in a recipe: TRL's default, which transformers sets later
        return _first(settings["output_dir"])
    return table["defaults"].get(run_kind(settings), {}).get("output_dir")


# ---------------------------------------------------------------------------------------------------------------------
# Before the import


def _refuse(prog: str, problem: str):
    say_refusal(prog, problem)
    raise SystemExit(2)


def _answer_help(prog: str, argv: list[str]) -> None:
    """The cached help (exit 0), or a line saying that the help is being built and what takes the time."""
    text = None if "--config" in argv else cached_help(prog)
    if text is not None:
        print(text, end="")  # what `--help` printed last time, without importing TRL
        raise SystemExit(0)
    cached = "" if "--config" in argv else "; it is cached, so the next --help prints at once"
    print(
        f"{prog}: building the help: importing TRL, transformers and torch (seconds, or a minute on a busy "
        f"machine){cached}.",
        file=sys.stderr,
        flush=True,
    )


def answer_early(prog: str, argv: list[str] | None = None) -> None:
    """Answers `--help` from the cache (exit 0) or bad input with one `prog: error: ...` line (exit 2), without
    importing TRL; otherwise returns, and the full parser reads the command line.

    The output folder (or the checkpoint resumed from) is checked last and alone, as the full parser does once every
    value is known; it is left to the full parser under a launcher of several processes (each rank checks its own
    folder, and all stop with the first rank's line).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        _answer_help(prog, argv)
        return
    try:
        path, recipe = read_recipe(argv)
    except ConfigError as error:
        _refuse(prog, str(error))
    table = load_table()
    if table is None or Path(sys.argv[0]).with_suffix(".args").is_file():  # HfArgumentParser reads `<script>.args`
        return
    settings, problems = input_problems(table, argv, recipe, path)
    if problems:
        _refuse(prog, " ".join(problems))
    output_dir = _output_dir(table, settings)
    resume = _first(settings.get("resume_from_checkpoint"))
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if output_dir and isinstance(resume, (str, type(None))) and not several:  # a recipe's `true`: TRL's to read
        try:
            problem = output_dir_problem(Path(output_dir), resume)
        except ValueError:  # a checkpoint's trainer state that does not read: the full parser says so
            problem = None
        if problem:
            _refuse(prog, problem)
