"""Reading any dataset of traces: Parquet files a batch of rows at a time, JSON, JSONL and CSV files whole, and each
row as a `Trace` (its prompt, its text, what the dataset says of it) from the named columns or the defaults.

A ts_trl seed folder (with a manifest) is opened by `external_seeds.open_traces`, which hands any other source to
`open_trace_files`; matching the traces to the training prompts and cutting them is `text_seeds.py`'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from .agent_traces import agent_trajectory, trajectory_text
from .schema import check_text

TRACE_EXTENSIONS = (".parquet", ".jsonl", ".json", ".csv")
STREAM_ROWS = 8192  # rows of a Parquet trace file read at a time: a batch of texts is held, never all


@dataclass
class Trace:
    """One trace of a foreign dataset: its prompt (text or messages), its text, and what the dataset said of it."""

    prompt: object
    text: str
    prompt_id: str | None = None
    rollout_id: str | None = None
    reward: float | None = None
    turns: list[dict] | None = None  # multi-turn runs: the trajectory's messages in TRL's form (`agent_traces.py`)


def open_trace_files(path: Path, source: str) -> TraceFiles:
    """A file or folder of traces to read in batches (`TraceFiles`): its Parquet files are read a few row groups at a
    time, JSON, JSONL or CSV files whole."""
    files = [path] if path.is_file() else []
    for extension in TRACE_EXTENSIONS if path.is_dir() else ():
        found = [f for f in sorted(path.rglob(f"*{extension}")) if _is_data_file(f, path)]
        if found:
            files = found
            break
    if not files or files[0].suffix not in TRACE_EXTENSIONS:
        raise ValueError(
            f"{source} holds no seeds or traces: expected a run directory, a seeds/ folder, or Parquet, JSON, JSONL "
            "or CSV files of traces. Pass the output_dir of an earlier run, or a file of traces."
        )
    if files[0].suffix == ".parquet":
        return TraceFiles.of_parquet(files, source)
    tables = [_read_file(f, source) for f in files]
    return TraceFiles.of_table(
        pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    )


@dataclass
class TraceFiles:
    """A dataset of traces, read a batch of rows at a time so that no more than a batch of its texts is held.

    `files`: Parquet files, read by `STREAM_ROWS` rows in order; `table`: rows read whole (any other source). `schema`:
    the columns of all files, as `pa.concat_tables(..., promote_options="permissive")` would give them.
    """

    schema: pa.Schema
    num_rows: int
    files: list[Path] = field(default_factory=list)
    table: pa.Table | None = None
    source: str = ""

    @classmethod
    def of_table(cls, table: pa.Table) -> TraceFiles:
        return cls(table.schema, table.num_rows, table=table)

    @classmethod
    def of_parquet(cls, files: list[Path], source: str) -> TraceFiles:
        try:
            metadata = [pq.read_metadata(f) for f in files]
            schema = pa.unify_schemas([m.schema.to_arrow_schema() for m in metadata], promote_options="permissive")
        except (pa.ArrowInvalid, OSError) as error:
            raise ValueError(f"{source}: cannot read {files} ({type(error).__name__}: {error}).") from None
        return cls(schema, sum(m.num_rows for m in metadata), files=files, source=source)

    @property
    def column_names(self) -> list[str]:
        return self.schema.names

    def batches(self, columns: list[str] | None = None):
        """The rows in order, as tables of at most `STREAM_ROWS` rows holding `columns` (default: all)."""
        names = [n for n in (columns or self.column_names) if n in self.column_names]
        if self.table is not None:
            yield from (self.table.select(names).slice(i, STREAM_ROWS) for i in range(0, self.num_rows, STREAM_ROWS))
            return
        schema = pa.schema([self.schema.field(n) for n in names])
        for path in self.files:
            try:
                reader = pq.ParquetFile(path)
                present = [n for n in names if n in reader.schema_arrow.names]
                for batch in reader.iter_batches(STREAM_ROWS, columns=present):
                    table = pa.Table.from_batches([batch])
                    yield check_text(_with_schema(table, schema), path)
            except (pa.ArrowInvalid, OSError) as error:
                raise ValueError(f"{self.source}: cannot read {path} ({type(error).__name__}: {error}).") from None

    def read(self, columns: list[str] | None = None) -> pa.Table:
        """Every row of `columns` (default: all) at once."""
        if not [n for n in (columns or self.column_names) if n in self.column_names]:
            return pa.table({})
        if self.table is not None:
            return self.table.select([n for n in (columns or self.column_names) if n in self.column_names])
        tables = list(self.batches(columns))
        names = [n for n in (columns or self.column_names) if n in self.column_names]
        empty = pa.schema([self.schema.field(n) for n in names]).empty_table()
        return pa.concat_tables(tables) if tables else empty


def _with_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with `schema`'s columns: its own cast to their types, the ones it lacks as nulls."""
    columns = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _is_data_file(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts
    return not any(p.startswith(".") or p == "superseded" for p in parts) and path.name != "manifest.json"


def _read_file(path: Path, source: str) -> pa.Table:
    try:
        if path.suffix == ".parquet":
            return check_text(pq.read_table(path), path)
        if path.suffix == ".csv":
            return pa_csv.read_csv(path)
        text = path.read_text()
        if path.suffix == ".json" and text.lstrip().startswith(("[", "{")) and not _is_json_lines(text):
            rows = json.loads(text)
            rows = rows.get("data", rows) if isinstance(rows, dict) else rows
            return pa.Table.from_pylist(rows) if isinstance(rows, list) else pa.table(rows)
        return pa.Table.from_pylist([json.loads(line) for line in text.splitlines() if line.strip()])
    except (pa.ArrowInvalid, ValueError, OSError, AttributeError) as error:
        raise ValueError(f"{source}: cannot read {path} ({type(error).__name__}: {error}).") from None


def _is_json_lines(text: str) -> bool:
    lines = [line for line in text.splitlines() if line.strip()]
    return len(lines) > 1 and all(line.lstrip().startswith("{") for line in lines)


def read_traces(
    table: pa.Table, prompt_column, completion_column, source: str, multi_turn: bool = False
) -> tuple[list[Trace], tuple]:
    """Every row's prompt and trace text, from the named columns or the defaults (`prompt`/`completion`, `messages`).

    `multi_turn` (a run with tools or environments): each trace is an agent trajectory (`agent_traces.py`), `messages`
    is the default column before `completion`, and a text trace is one final assistant turn. A ts_trl seed dataset of
    a multi-turn run (a `tool_mask` column) is read from its `messages` in any run: its `completion` is their JSON.
    """
    batches, columns = trace_batches(TraceFiles.of_table(table), prompt_column, completion_column, source, multi_turn)
    return [trace for batch in batches for trace in batch], columns


def trace_batches(dataset: TraceFiles, prompt_column, completion_column, source: str, multi_turn: bool = False):
    """(the traces of `dataset`, a list per batch of rows, in order; (prompt column, completion column)), as
    `read_traces` reads them; the columns are checked, and refused in one line, before any row is read."""
    names = dataset.column_names
    if dataset.num_rows == 0:
        raise ValueError(f"{source} holds no rows: seed from a dataset with at least one trace, or drop seed_dataset.")
    order = ("messages", "completion") if multi_turn or "tool_mask" in names else ("completion", "messages")
    default_completion = next((c for c in order if c in names), None)
    completion_column = completion_column or default_completion
    prompt_column = prompt_column or ("prompt" if "prompt" in names else None)
    for option, column in (("seed_completion_column", completion_column), ("seed_prompt_column", prompt_column)):
        if column is not None and column not in names:
            raise ValueError(f"{source} has no column {column!r} ({option}); its columns are {names}.")
    if completion_column is None:
        raise ValueError(
            f"{source} has no 'completion' or 'messages' column; its columns are {names}. Name the column of the "
            "traces with seed_completion_column."
        )
    columns = (prompt_column, completion_column)
    wanted = [c for c in (*columns, "prompt_id", "rollout_id", "reward") if c is not None]

    def batches():
        first = 0
        for table in dataset.batches(list(dict.fromkeys(wanted))):
            yield _traces_of(table, columns, source, multi_turn, first)
            first += table.num_rows

    return batches(), (prompt_column or f"{completion_column} (messages)", completion_column)


def _traces_of(table: pa.Table, columns: tuple, source: str, multi_turn: bool, first: int) -> list[Trace]:
    """The traces of one batch of rows, the first of which is row `first` of the dataset."""
    prompt_column, completion_column = columns
    names = table.column_names
    completions = table.column(completion_column).to_pylist()
    prompts = table.column(prompt_column).to_pylist() if prompt_column else [None] * len(completions)
    extra = {c: table.column(c).to_pylist() for c in ("prompt_id", "rollout_id", "reward") if c in names}
    traces = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        where = f"{source}, row {first + i} of column {completion_column!r}"
        turns = None
        if multi_turn and isinstance(completion, str):
            turns = [{"role": "assistant", "content": completion}]
            text = completion
        elif multi_turn:
            before, turns = agent_trajectory(completion, where)
            prompt, text = (prompt if prompt is not None else before or None), trajectory_text(turns)
        else:
            prompt, text = _split_messages(prompt, completion, where)
        if prompt is None:
            raise ValueError(
                f"{source}: row {first + i} has no prompt (no 'prompt' column, and its trace is not chat messages with "
                "a user turn). Name the prompt's column with seed_prompt_column."
            )
        reward = extra.get("reward", [None] * len(completions))[i]
        traces.append(
            Trace(
                prompt,
                text,
                _text_or_none(extra.get("prompt_id"), i),
                _text_or_none(extra.get("rollout_id"), i),
                float(reward) if isinstance(reward, (int, float)) else None,
                turns,
            )
        )
    return traces


def _text_or_none(values, i: int) -> str | None:
    return None if values is None or values[i] is None else str(values[i])


def _split_messages(prompt, completion, where: str) -> tuple[object, str]:
    """(prompt, trace text) of a row: a chat trace's last assistant message is the trace, the turns before it the
    prompt (unless a prompt column gave one)."""
    if isinstance(completion, str):
        return prompt, completion
    if isinstance(completion, list) and all(isinstance(m, dict) for m in completion):
        last = max((i for i, m in enumerate(completion) if m.get("role") == "assistant"), default=None)
        if last is not None and isinstance(completion[last].get("content"), str):
            return (prompt if prompt is not None else completion[:last] or None), completion[last]["content"]
    raise ValueError(f"{where} holds {type(completion).__name__}, not text or chat messages with an assistant turn.")
