"""Which columns of a dataset hold the prompts and the references, by name, without `datasets`:
`loaders.to_prompt_dataset` picks them by this rule, and `ts_trl train` applies it to a local file's first row before
the data is loaded."""

from __future__ import annotations

import csv
import json
from pathlib import Path

MATH_PROMPT_COLUMNS = ("problem", "question", "prompt", "instruction", "query")
MATH_ANSWER_COLUMNS = ("answer", "final_answer", "gold", "solution")  # a short final answer beats a worked solution
CODE_PROMPT_COLUMNS = ("prompt", "text", "question", "question_content", "problem", "description", "instruction")
# In order of preference; each is turned into a `tests` string by `data._tests_of`.
CODE_TESTS_COLUMNS = ("tests", "test_list", "test", "input_output", "public_test_cases", "public_tests")


def _pick_column(columns: list[str], given: str | None, candidates: tuple[str, ...], what: str, flag: str) -> str:
    if given is not None and given in columns:
        return given
    if given is None:
        for name in candidates:
            if name in columns:
                return name
    wanted = f"column {given!r}" if given is not None else f"{what} column (one of {', '.join(candidates)})"
    raise ValueError(f"The dataset has no {wanted}; its columns are {columns}. Name the right one with {flag}.")


def pick_columns(columns: list[str], prompt_column: str | None, answer_column: str | None, domain: str):
    """The prompt column and the reference column (the answer for math, the tests for code) among `columns`: those
    given, else the first of the common public names; a `ValueError` names the first one missing."""
    if domain not in ("math", "code"):
        raise ValueError(f"domain must be 'math' or 'code', got {domain!r}")
    math = domain == "math"
    prompt_candidates, reference_candidates = (
        (MATH_PROMPT_COLUMNS, MATH_ANSWER_COLUMNS) if math else (CODE_PROMPT_COLUMNS, CODE_TESTS_COLUMNS)
    )
    prompt = _pick_column(columns, prompt_column, prompt_candidates, "prompt", "--prompt_column")
    reference = _pick_column(
        columns, answer_column, reference_candidates, "answer" if math else "tests", "--answer_column"
    )
    return prompt, reference


def first_row_columns(path: Path) -> list[str] | None:
    """The columns of a local data file as `datasets` reads them, from its first row or schema alone: a JSON-lines
    file's first object, a CSV file's header, a Parquet file's schema. None where that cannot be told so cheaply (a
    folder, a JSON array, an Arrow file, an unreadable first row): the columns are then checked once it is loaded."""
    try:
        if path.suffix in (".jsonl", ".json"):
            with path.open() as f:
                line = next((line for line in f if line.strip()), "")
            row = json.loads(line)
            return list(row) if isinstance(row, dict) else None
        if path.suffix == ".csv":
            with path.open(newline="") as f:
                header = next(csv.reader(f), [])
            # pandas names an empty header `Unnamed: N` and a repeated one `a.1`: not told here.
            return header if all(header) and len(set(header)) == len(header) else None
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq  # lazy: a Parquet file only (a tenth of a second)

            return list(pq.read_schema(path).names)
    except (OSError, ValueError):  # (pyarrow's ArrowInvalid is a ValueError): a broken file, which datasets names
        return None
    return None


def columns_problem(settings: dict) -> str | None:
    """Why a local data file has no prompt or reference column (`columns.pick_columns`), told from its first row or
    schema before it is loaded; None when it has both, or when that cannot be told without loading it."""
    path, domain = settings.get("dataset_path"), settings.get("domain", "math")
    if not path or not Path(path).expanduser().is_file() or domain not in ("math", "code"):
        return None
    columns = first_row_columns(Path(path).expanduser())
    if columns is None:
        return None
    try:
        pick_columns(columns, settings.get("prompt_column"), settings.get("answer_column"), domain)
    except ValueError as error:
        return str(error)
    return None
