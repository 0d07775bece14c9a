"""The rules by which `ts_trl train` (and `train.py`) refuses input before training, each one sentence: the full
parser applies them, and `early` before TRL is imported, so both say the same."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

# The data of a run is a dataset (one of these named) or the built-in task; each reads its own settings only.
DATASET_KEYS = ("dataset_name", "dataset_path")
# Flags whose presence means "not the embedded default".
SOURCE_KEYS = ("model_name_or_path", *DATASET_KEYS)
_DATASET_ONLY = ("max_train_samples", "prompt_column", "answer_column", "domain", "system_prompt", "conversational")
_TASK_ONLY_PREFIX = "embedded_"
# transformers' checkpoint folders (`PREFIX_CHECKPOINT_DIR`), and the file it writes last into one
# (`TRAINER_STATE_NAME`): tests/test_early.py checks that both are transformers'.
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"


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


def reward_module(path: str) -> tuple[str, str]:
    """The module and the function a dotted reward path names: `pkg.mod:func`, or `pkg.mod.func`."""
    module, _, function = path.rpartition(":") if ":" in path else path.rpartition(".")
    return module, function


def unknown_reward(name: str, known: list[str]) -> str:
    return f"Unknown reward {name!r}; known rewards are {sorted(known)}, or give `pkg.mod:func`."


def unimportable_reward(path: str, error: Exception) -> str:
    return f"Cannot import reward function {path!r}: {error}"


def reward_problems(names, known: list[str]) -> list[str]:
    """Why `--reward_funcs` entries name no reward, one sentence each, as `rewards.get_reward_funcs` says it: a name
    that is neither registered (`known`) nor a dotted path, or a dotted path whose top package is nowhere (on the
    import path or in the working folder, which `get_reward_funcs` adds). A module that is found is not imported here:
    a user's module may be slow or import torch; what it holds is checked when the run imports it."""
    problems = []
    for name in map(str, names if isinstance(names, list) else [names] if names else []):
        if name in known:
            continue
        if "." not in name and ":" not in name:
            problems.append(unknown_reward(name, known))
            continue
        top = reward_module(name)[0].partition(".")[0]
        if top.isidentifier() and not _findable(top):
            problems.append(unimportable_reward(name, ModuleNotFoundError(f"No module named {top!r}")))
    return problems


def _findable(package: str) -> bool:
    """Whether importing the top-level `package` would find it, from the import path or the working folder."""
    try:
        spec = importlib.util.find_spec(package) or importlib.machinery.PathFinder.find_spec(package, [os.getcwd()])
    except (ImportError, ValueError):  # `__main__`, whose spec may be None: left to the import
        return True
    return spec is not None


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


def last_checkpoint(folder: Path) -> Path | None:
    """The `checkpoint-N` folder of `folder` with the largest N, as transformers' `get_last_checkpoint` finds it."""
    steps = {}
    for child in folder.iterdir():
        match = _CHECKPOINT.match(child.name)
        if match and child.is_dir():
            steps[int(match.group(1))] = child
    return steps[max(steps)] if steps else None


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


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    """The step a checkpoint folder was saved at: its trainer state's, else its name's."""
    state = Path(checkpoint) / TRAINER_STATE
    if state.exists():
        return int(json.loads(state.read_text())["global_step"])
    name = Path(checkpoint).name
    if name.startswith("checkpoint-"):
        return int(name.rsplit("-", 1)[1])
    raise ValueError(f"{checkpoint} is not a checkpoint folder (no {TRAINER_STATE}, not named checkpoint-<step>).")


def resume_problem(checkpoint: str | os.PathLike, output_dir: str | os.PathLike) -> str | None:
    """Why `checkpoint` cannot be resumed from: it does not exist, or is not a checkpoint folder (no trainer state,
    which transformers writes last); the sentence names the checkpoints that do exist (None: it is one)."""
    path = Path(checkpoint).expanduser()
    if path.is_dir() and (path / TRAINER_STATE).is_file():
        return None
    problem = "does not exist" if not path.exists() else f"is not a checkpoint folder (it has no {TRAINER_STATE})"
    # The checkpoints beside the one asked for, else those of this run's output_dir.
    folder = path.parent if path.parent.is_dir() and path.parent != Path(".") else Path(output_dir)
    found = sorted((p for p in folder.glob("checkpoint-*") if (p / TRAINER_STATE).is_file()), key=checkpoint_step)
    existing = (
        f"the checkpoints in {folder} are {', '.join(p.name for p in found)}"
        if found
        else f"{folder} holds no checkpoint"
    )
    return (
        f"resume_from_checkpoint={str(checkpoint)!r} {problem}: {existing}. Pass one of those, or leave "
        "resume_from_checkpoint unset to start a new run."
    )


def model_source_problem(name: str) -> str | None:
    """Why the model `name` cannot load: a local path that does not exist or holds no saved model, or a Hub id that is
    not in the local cache while `HF_HUB_OFFLINE` is set (None: it may load)."""
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            return f"--model_name_or_path {name}: the folder has no config.json; it is not a saved model."
        return None
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep + os.sep in name
    if looks_local:
        return f"--model_name_or_path {name}: no such local folder."
    from huggingface_hub import constants, try_to_load_from_cache  # lazy: a Hub id only (httpx takes a second)

    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(name, "config.json"), str):
        return (
            f"--model_name_or_path {name}: not in the local Hugging Face cache, and HF_HUB_OFFLINE is set. "
            f"Download it first (`hf download {name}`) or unset HF_HUB_OFFLINE."
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
