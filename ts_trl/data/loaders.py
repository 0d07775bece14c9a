"""Training data: local files or Hub datasets read and mapped from public math and code schemas to `prompt` +
`answer` (math) or `prompt` + `tests` (code)."""

from __future__ import annotations

import json
from pathlib import Path

from datasets import Dataset, load_dataset, load_from_disk
from huggingface_hub import constants

from ..store.schema import prompt_id_of
from .columns import pick_columns

DATA_EXTENSIONS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


def gsm8k_final_answer(answer: str) -> str:
    """The text after the last `####` of a GSM8K solution; other answers are returned stripped."""
    return answer.rsplit("####", 1)[-1].strip()


def _as_prompt(value, system_prompt: str | None, conversational: bool):
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    if isinstance(value, list):  # already chat messages
        return value if value and value[0].get("role") == "system" else system + value
    if conversational:
        return system + [{"role": "user", "content": str(value)}]
    return f"{system_prompt}\n\n{value}" if system_prompt else str(value)


def _is_empty(prompt) -> bool:
    if prompt is None or isinstance(prompt, str):
        return not (prompt or "").strip()
    return not any(str(message.get("content") or "").strip() for message in prompt if message.get("role") != "system")


def _stdio_tests(inputs: list, outputs: list) -> str:
    return json.dumps({"inputs": [str(x) for x in inputs], "outputs": [str(y) for y in outputs]})


def _tests_of(column: str, value, row: dict) -> str:
    """One row's tests as a string: Python assert code, or the JSON of `{"inputs": [...], "outputs": [...]}`."""
    if isinstance(value, str) and column in ("input_output", "public_test_cases"):
        value = json.loads(value)
    if column == "test_list":  # MBPP: a list of asserts, with optional setup/imports in sibling columns
        setup = [row.get("test_setup_code") or "", *(row.get("test_imports") or [])]
        return "\n".join(line for line in [*setup, *value] if line)
    if column == "public_test_cases":  # LiveCodeBench: [{"input": ..., "output": ..., "testtype": ...}, ...]
        return _stdio_tests([case["input"] for case in value], [case["output"] for case in value])
    if isinstance(value, dict):  # APPS `input_output`, CodeContests `public_tests`, or a `tests` dict
        inputs = value.get("inputs", value.get("input"))
        outputs = value.get("outputs", value.get("output"))
        if value.get("fn_name") or inputs is None or outputs is None:
            raise ValueError(f"Unsupported tests in column {column!r}: expected stdin/stdout inputs and outputs.")
        return _stdio_tests(inputs, outputs)
    return str(value)


def to_prompt_dataset(
    dataset: Dataset,
    prompt_column: str | None = None,
    answer_column: str | None = None,
    system_prompt: str | None = None,
    conversational: bool = False,
    domain: str = "math",
) -> Dataset:
    """Returns `dataset` as `prompt`, `answer` (math) or `tests` (+ `entry_point` if any) (code), and `prompt_id`.

    Columns are auto-detected among the common public names unless given; `answer_column` names the tests column
    for code. A GSM8K-style answer keeps only the text after `####`; an MBPP-style prompt (tests in `test_list`) gets
    its first assert appended, which names the function to write. Other columns are dropped; a `prompt_id` column
    is kept if the dataset has one, else it is the hash of the prompt (`prompt_id_of`).

    Long: one column after another, each refusal next to the condition it names.
    """
    columns = list(dataset.column_names)
    math = domain == "math"
    prompt_col, reference_col = pick_columns(columns, prompt_column, answer_column, domain)
    empty = [index for index, prompt in enumerate(dataset[prompt_col]) if _is_empty(prompt)]
    if empty:
        raise ValueError(
            f"{len(empty)} empty prompt(s) in column {prompt_col!r} (first at row {empty[0]}); filter them out first."
        )
    has_entry_point = not math and "entry_point" in columns
    has_prompt_id = "prompt_id" in columns

    def convert(row: dict) -> dict:
        value = row[prompt_col]
        if reference_col == "test_list" and isinstance(value, str) and row[reference_col]:
            # MBPP's task text never names the function its asserts call; it is posed with a test that does.
            value = f"{value}\nYour code should pass this test:\n{row[reference_col][0]}"
        prompt = _as_prompt(value, system_prompt, conversational)
        out = {"prompt": prompt, "prompt_id": str(row["prompt_id"]) if has_prompt_id else prompt_id_of(prompt)}
        if math:
            out["answer"] = gsm8k_final_answer(str(row[reference_col]))
        else:
            out["tests"] = _tests_of(reference_col, row[reference_col], row)
        if has_entry_point:
            out["entry_point"] = row["entry_point"]
        return out

    # Build the new rows in one pass and drop the source columns, whose names (e.g. GSM8K's `answer`) we reuse.
    converted = dataset.map(convert, remove_columns=columns)
    order = ["prompt", "prompt_id", "answer" if math else "tests"] + (["entry_point"] if has_entry_point else [])
    return converted.select_columns(order)


def read_local(path: str, split: str = "train"):
    """A local `.jsonl`/`.json`/`.parquet`/`.csv`/`.arrow` file, a folder of them, or a `save_to_disk` folder."""

    source = Path(path).expanduser()
    if not source.exists():
        raise FileNotFoundError(f"--dataset_path {path}: no such file or folder.")
    if source.is_dir() and ((source / "dataset_info.json").exists() or (source / "dataset_dict.json").exists()):
        loaded = load_from_disk(str(source))
        return loaded[split] if hasattr(loaded, "keys") else loaded
    files = sorted(p for p in source.rglob("*") if p.suffix in DATA_EXTENSIONS) if source.is_dir() else [source]
    builders = {DATA_EXTENSIONS.get(p.suffix) for p in files}
    if not files or None in builders or len(builders) != 1:
        raise ValueError(
            f"--dataset_path {path}: expected .jsonl, .json, .parquet, .csv or .arrow files of one kind, found "
            f"{sorted(p.name for p in files)[:5] or 'none'}."
        )
    return load_dataset(builders.pop(), data_files=[str(p) for p in files], split="train")


def read_hub(name: str, config: str | None = None, split: str = "train", streaming: bool = False):
    """A split of a Hub dataset, with one-line errors for a missing split and for "not found" or "offline"."""

    try:
        return load_dataset(name, config, split=split, streaming=streaming)
    except ValueError as error:
        if "split" in str(error).lower():
            raise ValueError(f"--dataset_name {name}: {error}") from error
        raise
    except Exception as error:  # datasets raises many types for "not found" and "offline"
        hint = " (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE is set and it is not cached)" if constants.HF_HUB_OFFLINE else ""
        raise ValueError(f"--dataset_name {name}: cannot load it{hint}: {type(error).__name__}: {error}") from error


def load_training_data(script_args, with_eval: bool = False, task=None):
    """The training set (and the evaluation set, or None) of a `ts_trl train` run, as `to_prompt_dataset` rows.

    With `task` (the embedded default's built-in task), its training and held-out sets.
    """
    if task is not None:
        return task.make_splits(script_args.embedded_train_problems, script_args.embedded_eval_problems)
    if script_args.dataset_name is None and script_args.dataset_path is None:
        raise ValueError("No training data: set --dataset_name or --dataset_path (or neither, for the embedded task).")

    def read(split):
        if script_args.dataset_path is not None:
            return read_local(script_args.dataset_path, split)
        return read_hub(script_args.dataset_name, script_args.dataset_config, split, script_args.dataset_streaming)

    train = read(script_args.dataset_train_split)
    if script_args.max_train_samples is not None and hasattr(train, "select"):
        train = train.select(range(min(script_args.max_train_samples, len(train))))
    test = prompt_rows(read(script_args.dataset_test_split), script_args) if with_eval else None
    return prompt_rows(train, script_args), test


def prompt_rows(dataset, script_args):
    """`to_prompt_dataset` with the column, prompt and domain settings of a run's script arguments."""
    return to_prompt_dataset(
        dataset,
        prompt_column=script_args.prompt_column,
        answer_column=script_args.answer_column,
        system_prompt=script_args.system_prompt,
        conversational=script_args.conversational,
        domain=script_args.domain,
    )
