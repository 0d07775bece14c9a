"""The rules by which `ts_trl train` (and `train.py`) refuses the settings a command line and its recipe give, each
one sentence, applied once by `arguments.parse_args` (`arguments.input_problems`) before any dataclass is built; and recipes
(`--config`), whose refusal (missing, not YAML, not a mapping) is the one made before TRL is imported.

Light (yaml, no torch): `ts_trl train` and `train.py` import it before the parser."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from ..resources import packaged_file, packaged_folder
from ..store.checkpoints import last_checkpoint, resume_problem

# The data of a run is a dataset (one of these named) or the built-in task; each reads its own settings only.
DATASET_KEYS = ("dataset_name", "dataset_path")
# Flags whose presence means "not the embedded default".
SOURCE_KEYS = ("model_name_or_path", *DATASET_KEYS)
_DATASET_ONLY = ("max_train_samples", "prompt_column", "answer_column", "domain", "system_prompt", "conversational")
_TASK_ONLY_PREFIX = "embedded_"
# How long `ts_trl train` waits for the Hub to say whether a model it does not hold exists: one request, no retries.
HUB_CHECK_SECONDS = 5


class ConfigError(ValueError):
    """Bad input found before training: printed as one line, exit status 2."""


def say_refusal(prog: str, problem: str) -> None:
    """Prints a refusal as its one `prog: error: ...` line on stderr. With several processes on a machine only its
    first says it: every rank finds the same problem (the same arguments and files, or the first rank's line)."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"{prog}: error: {' '.join(problem.split())}", file=sys.stderr, flush=True)


def missing_settings(*, with_dataset: bool, model: str | None, reward_funcs, dataset_path: str | None) -> str | None:
    """Every setting a run lacks, in one sentence (None: nothing is missing)."""
    problems = []
    if with_dataset and not model:
        problems.append(
            "--model_name_or_path is required with a dataset (the tiny built-in model only knows the built-in task)"
        )
    if with_dataset and not reward_funcs:
        problems.append("--reward_funcs is required with a dataset, e.g. --reward_funcs math format")
    if dataset_path and not Path(dataset_path).expanduser().exists():
        problems.append(f"--dataset_path {dataset_path}: no such file or folder")
    return "; ".join(problems) + "." if problems else None


def settings_of_other_data(given: set[str], with_dataset: bool) -> str | None:
    """Settings that the run's kind of data would silently ignore, in one sentence: the built-in task's (`--task`,
    `--embedded_*`) with a dataset, a dataset's (`--max_train_samples`, `--prompt_column`, ...) without."""
    if with_dataset:
        wrong = sorted(key for key in given if key.startswith(_TASK_ONLY_PREFIX) or key == "task")
        if wrong:
            return (
                f"{_flag_list(wrong)} set the built-in task, and this run trains on a dataset (--dataset_name or "
                "--dataset_path): drop them; --max_train_samples keeps the first rows of the dataset."
            )
        return None
    wrong = sorted(key for key in given if key in _DATASET_ONLY)
    if wrong:
        return (
            f"{_flag_list(wrong)} set a dataset's data, and this run trains on the built-in task (no --dataset_name "
            "nor --dataset_path): drop them; --embedded_train_problems sets how many training problems it has."
        )
    return None


def _flag_list(keys: list[str]) -> str:
    return ", ".join(f"--{key}" for key in keys)


def earlier_run_problem(output_dir: Path) -> str | None:
    """Why a new run may not start in `output_dir`: it holds checkpoints or a seed dataset of an earlier run.

    Checkpoints and seeds are one run: a new run into a folder that has either would mix them (a later resume would
    find another run's checkpoints, or shards moved aside).
    """
    if not output_dir.is_dir():
        return None
    from ..store.format import SEEDS_DIR, SeedManifest  # lazy: pyarrow, only when the folder exists

    last = last_checkpoint(output_dir)
    if last is None and not SeedManifest.path(output_dir / SEEDS_DIR).is_file():
        return None
    held = f"checkpoints up to {last.name}" if last else "a seed dataset (seeds/manifest.json)"
    resume = f"--resume_from_checkpoint {last}" if last else "--resume_from_checkpoint <its checkpoint>"
    return (
        f"--output_dir {output_dir} holds an earlier run ({held}). Continue it with {resume}, or start a new run in "
        "another --output_dir (or move the folder away)."
    )


def output_dir_problem(output_dir: Path, resume_from_checkpoint) -> str | None:
    """Why a run may not start in `output_dir`: it holds an earlier run (`earlier_run_problem`), or, resuming, the
    checkpoint named is not one (`resume_problem`)."""
    if resume_from_checkpoint:
        return resume_problem(resume_from_checkpoint, output_dir)
    return earlier_run_problem(output_dir)


def model_source_problem(name: str) -> str | None:
    """Why the model `name` cannot load: a local path that does not exist or holds no saved model, or a Hub id that is
    neither cached nor found on the Hub within `HUB_CHECK_SECONDS`, asked once, without the retries of a download
    (None: it may load)."""
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            return f"--model_name_or_path {name}: the folder has no config.json; it is not a saved model."
        return None
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep + os.sep in name
    if looks_local:
        return f"--model_name_or_path {name}: no such local folder."
    from huggingface_hub import HfApi, constants, try_to_load_from_cache  # lazy: a Hub id only (httpx takes a second)
    from huggingface_hub.errors import RepositoryNotFoundError  # lazy: as above

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return None
    fix = f"Name a local folder that holds a saved model, or a Hub id that is reachable or cached (`hf download {name}`)."
    if constants.HF_HUB_OFFLINE:
        return f"--model_name_or_path {name}: not in the local Hugging Face cache, and HF_HUB_OFFLINE is set. {fix}"
    try:
        HfApi().model_info(name, timeout=HUB_CHECK_SECONDS)
    except RepositoryNotFoundError:
        return f"--model_name_or_path {name}: no such model on {constants.ENDPOINT} (or it is private). {fix}"
    except Exception as error:  # a refused connection, a timeout, a 5xx: the HTTP client's own types vary by version
        return (
            f"--model_name_or_path {name}: not in the local Hugging Face cache, and {constants.ENDPOINT} did not answer "
            f"({type(error).__name__}). {fix}"
        )
    return None


def quantized_without_model(quantized: bool, model: str | None) -> str | None:
    """`--load_in_4bit/8bit` on the embedded default's tiny model, which is not quantized."""
    if quantized and not model:
        return (
            "--load_in_4bit/--load_in_8bit quantize a model named with --model_name_or_path (bitsandbytes, on GPU); "
            "the embedded default's tiny model is not quantized. Drop the flag or name a model."
        )
    return None


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


def refuse_bad_recipe(prog: str, argv: list[str] | None = None) -> None:
    """Refuses a bad `--config` (one `prog: error: ...` line, exit status 2) before the heavy imports; returns
    otherwise, and the parser reads the recipe again."""
    try:
        read_recipe(list(sys.argv[1:] if argv is None else argv))
    except ConfigError as error:
        say_refusal(prog, str(error))
        raise SystemExit(2) from None
