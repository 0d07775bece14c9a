"""Seeds from elsewhere (`seed_dataset`): a `ts_trl` seed dataset of this tokenizer, read with its token ids; or one
of another tokenizer, or any dataset of reasoning traces, re-tokenised from its text with this run's tokenizer.

Text seeds carry no behaviour log-probs (another policy sampled them, or none did), so they serve
`prefix_mode="state"` with `seed_method="seeds"` only. Each is cut only where its text has a boundary (whitespace or
a newline) *and* this tokenizer's own tokens of the text before the boundary are the trace's first tokens: the prefix
a row continues from is then exactly the trace's text up to the boundary, tokenised as this tokenizer tokenises it.
Each trace is matched to a training prompt by `prompt_id`, else by normalised prompt text; with `seed_filter="success"`
only the traces this run's success reward scores as successful are kept.

The result is computed once at construction and cached in `<output_dir>/external_seeds/` (the bank columns, the cut
positions and where the seeds came from), so a resumed run reads back exactly the same seeds without recomputing.
A Hub id is downloaded first (`download_seed_dataset`). The format stays `format.py`'s and `schema.py`'s; this module
only turns foreign data into rows of that schema. The trainer reads the seeds on every rank at once
(`read_external_seeds_on_every_rank`) and hands them to the seed store.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import re
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from accelerate.utils import broadcast_object_list, gather_object
from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
from tqdm.auto import tqdm

from .agent_traces import TurnTemplate, agent_trajectory, trajectory_text, turn_text_cuts
from .bank import _string_buffers
from .files import atomic_write_json, file_sha256, is_hub_id
from .format import (
    SEEDS_DIR,
    SeedManifest,
    check_text,
    load_seed_table,
    read_table,
    resolve_seed_dataset,
    table_bytes,
    write_shard,
)
from .hub import CARD_FILE, DATA_DIR, hub_endpoint
from .local_cuts import LocalCuts
from .schema import prompt_id_of

logger = logging.getLogger(__name__)

# What a seed dataset repo holds; anything else in it (scripts, other data) is not fetched.
SEED_DATASET_PATTERNS = [f"{DATA_DIR}/*.parquet", CARD_FILE]
# What is fetched of a `seed_dataset` that may be any dataset of traces (a ts_trl seed dataset included).
TRACE_DATASET_PATTERNS = ["*.parquet", "*.jsonl", "*.json", "*.csv", CARD_FILE]
CACHE_DIR = "external_seeds"  # in output_dir: the text seeds a run computed, read back on resume
CACHE_TABLE = "seeds.parquet"
CACHE_PROVENANCE = "provenance.json"
CACHE_CHECKSUM = "table_sha256"  # in provenance.json: the SHA-256 of seeds.parquet, checked when it is read back
TRACE_EXTENSIONS = (".parquet", ".jsonl", ".json", ".csv")
SCORE_BATCH = 64  # traces per reward call of `seed_filter="success"`
CUT_POSITIONS = "cut_positions"  # the cached table's column: where each text seed may be cut
MAX_CUT_CANDIDATES = 64  # text boundaries checked per trace (evenly spread): enough for any cut ratio
STREAM_ROWS = 8192  # rows of a Parquet trace file read at a time: a batch of texts is held, never all
RETOKENISE_BATCH = 64  # traces re-tokenised together (larger batches ran slower: their lists outgrow the caches)


@dataclass
class ExternalSeeds:
    """Seeds from `seed_dataset`: the bank's columns, the cut positions of text seeds, and where they came from."""

    table: pa.Table
    provenance: dict
    text_cuts: Mapping[str, np.ndarray] = field(default_factory=dict)  # rollout id -> allowed cuts (`TextCuts`)


@dataclass
class Trace:
    """One trace of a foreign dataset: its prompt (text or messages), its text, and what the dataset said of it."""

    prompt: object
    text: str
    prompt_id: str | None = None
    rollout_id: str | None = None
    reward: float | None = None
    turns: list[dict] | None = None  # multi-turn runs: the trajectory's messages in TRL's form (`agent_traces.py`)


@dataclass(frozen=True)
class ExternalSeedSettings:
    """The settings `seed_dataset` is read with, validated once by `SeedGRPOConfig` (its fields of the same names)."""

    seed_dataset: str | None = None
    seed_dataset_revision: str | None = None
    seed_dataset_same_tokenizer: bool = False
    seed_prompt_column: str | None = None
    seed_completion_column: str | None = None
    seed_filter: str | None = None
    success_threshold: float = 0.0
    max_completion_length: int = 256
    cut_at_newline: bool = False
    prefix_mode: str = "state"
    seed_method: str = "seeds"
    output_dir: str = "."

    @classmethod
    def of(cls, config) -> ExternalSeedSettings:
        """These fields of `config` (a `SeedGRPOConfig`, or anything with those attributes)."""
        return cls(**{f: getattr(config, f) for f in cls.__dataclass_fields__})


def read_external_seeds(
    settings,
    tokenizer,
    tokenizer_fp: str,
    train_dataset,
    reward_funcs=(),
    reward_names=(),
    success_reward=None,
    main=True,
    template: TurnTemplate | None = None,
) -> ExternalSeeds | None:
    """The seeds of `settings.seed_dataset` (an `ExternalSeedSettings`) for this run, or None without one; refusals are one line each.

    `main`: this process writes the cache (every process computes the same seeds). `template`: a multi-turn run's
    (tools or environments), whose text seeds are agent trajectories rendered as TRL's tool loop writes them.

    Long: the source's kinds (run folder, Hub seed dataset, text traces) and their checks in one dispatch.
    """
    if settings.seed_dataset is None:
        return None
    source = f"seed_dataset={settings.seed_dataset!r}"
    local = Path(settings.seed_dataset).expanduser().resolve()
    output_dir = Path(settings.output_dir).expanduser().resolve()
    if local.exists() and (local == output_dir or local.is_relative_to(output_dir)):
        raise ValueError(
            f"{source} lies in this run's own output_dir ({output_dir}): the run would seed from the shards it writes, "
            "which a resume sets aside. Seed from another run's output_dir (or a copy of it)."
        )
    key = _cache_key(settings, tokenizer_fp, train_dataset, success_reward, template)
    cached = _read_cache(Path(settings.output_dir) / CACHE_DIR, key, source)
    if cached is not None:
        refuse_text_seed_modes(settings, source)
        logger.info(f"{source}: {cached.table.num_rows} text seeds read back from {settings.output_dir}/{CACHE_DIR}.")
        return cached
    folder, revision = _local_copy(settings.seed_dataset, settings.seed_dataset_revision)
    dataset = open_traces(folder, source)  # read a batch of rows at a time: never every text at once
    about = dataset.read(["model", "tokenizer"])  # the small columns of what made it
    provenance = {"dataset": settings.seed_dataset, "revision": revision, **_source_model(about)}
    if _is_same_tokenizer_seed_dataset(dataset.column_names, about, tokenizer_fp):
        seeds = _same_tokenizer_seeds(settings, folder, tokenizer, tokenizer_fp, train_dataset, source, template)
        provenance.update(kind="seed dataset", tokenizer=tokenizer_fp, rows=seeds.num_rows)
        return ExternalSeeds(seeds, provenance)
    refuse_text_seed_modes(settings, source)
    multi_turn = template is not None
    batches, columns = trace_batches(
        dataset, settings.seed_prompt_column, settings.seed_completion_column, source, multi_turn
    )
    provenance.update(
        kind="seed dataset of another tokenizer" if "completion_ids" in dataset.column_names else "traces",
        prompt_column=columns[0],
        completion_column=columns[1],
        rows=dataset.num_rows,
        turns=multi_turn,
    )
    success = (reward_funcs, reward_names, success_reward)
    seeds = stream_text_seeds(settings, tokenizer, batches, train_dataset, success, source, main, template)
    seeds.provenance = {**provenance, **seeds.provenance, "cache_key": key}
    if main:
        _write_cache(Path(settings.output_dir) / CACHE_DIR, seeds)
    return seeds


def read_external_seeds_on_every_rank(
    settings: ExternalSeedSettings,
    accelerator,
    tokenizer,
    tokenizer_fp: str,
    train_dataset=None,
    reward_funcs=(),
    reward_names=(),
    success_reward: str | None = None,
    template: TurnTemplate | None = None,
) -> ExternalSeeds | None:
    """`read_external_seeds` on every rank, each ending with the main process's seeds, or its one-line refusal.

    Every rank reads `seed_dataset` itself (and the text-seed cache in its own output_dir): on node-local disks a
    node may lack the dataset, or hold a cache or a copy that gives other seeds. A rank whose seeds differ from the
    main process's (a digest of the table and the cut positions), or that could not read them, takes the main
    process's. A collective: every rank calls it, at the trainer's construction.
    """
    problem = external = None
    try:
        external = read_external_seeds(
            settings,
            tokenizer,
            tokenizer_fp,
            train_dataset,
            reward_funcs,
            list(reward_names),
            success_reward,
            main=accelerator.is_main_process,
            template=template,  # a multi-turn run's: text seeds are agent trajectories (`agent_traces.py`)
        )
    except ValueError as error:
        problem = str(error)
    if accelerator.num_processes > 1 and settings.seed_dataset is not None:
        external, problem = _main_process_seeds(accelerator, external, problem)
    if problem is not None:
        raise ValueError(problem)
    return external


def _main_process_seeds(accelerator, external: ExternalSeeds | None, problem: str | None):
    """The main process's seeds and refusal (None: none) on every rank; see `read_external_seeds_on_every_rank`."""
    main = accelerator.is_main_process
    digest = external_seeds_digest(external) if problem is None else None
    found = gather_object([(problem, digest)])
    if found[0][0] is not None:
        return None, found[0][0]  # the main process's refusal, on every rank
    differ = [rank for rank, (_, other) in enumerate(found) if other != found[0][1]]
    if not differ:
        return external, None
    sent = broadcast_object_list([external if main else None])[0]
    if accelerator.process_index in differ:
        rank = accelerator.process_index
        logger.warning(
            f"Rank {rank} could not read seed_dataset ({problem}); it takes the main process's seeds instead."
            if problem is not None
            else f"Rank {rank} read other seeds from seed_dataset than the main process (its own copy or cache "
            "differs); it takes the main process's instead."
        )
        return sent, None
    return external, None


def _same_tokenizer_seeds(settings, folder, tokenizer, tokenizer_fp, train_dataset, source, template) -> pa.Table:
    """A seed dataset this tokenizer wrote, read with its token ids and log-probs, or a one-line refusal: its prompts
    must be this training set's, and tool results only enter a run that has tools."""
    seeds = load_seed_table(folder, tokenizer_fp, len(tokenizer), settings.seed_dataset_same_tokenizer)
    if "prompt" in seeds.column_names and hasattr(train_dataset, "column_names"):
        # plain values: a conversational prompt's JSON text is parsed only from a str, not an Arrow scalar
        prompts = seeds.column("prompt").to_pylist()
        check_prompt_texts(seeds.column("prompt_id").to_pylist(), prompts, train_dataset, source)
    if template is None and _holds_tool_results(seeds):
        raise ValueError(
            f"{source} holds multi-turn rollouts (tool results inside their completion_ids), and this run has no "
            "tools or environment_factory: a prefix would carry tool results no tool produced here. Seed a run "
            "with the same tools or environment, or use a single-turn seed dataset."
        )
    if settings.seed_filter:
        logger.warning(f"{source} is this tokenizer's seed dataset: seed_filter applies to text seeds only.")
    return seeds


def refuse_text_seed_modes(settings, source: str) -> None:
    """Text seeds have no behaviour log-probs: what needs them is refused, in one line."""
    if settings.prefix_mode == "action" or settings.seed_method == "replay":
        setting = "prefix_mode='action'" if settings.prefix_mode == "action" else "seed_method='replay'"
        raise ValueError(
            f"{source} holds text seeds (another tokenizer's or a trace dataset's, re-tokenised), which have no "
            f"behaviour log-probs, and {setting} trains on the seeds' own tokens with them. Use prefix_mode='state' "
            "and seed_method='seeds', or a seed dataset written by this tokenizer."
        )


# ---------------------------------------------------------------------------------------------------------------------
# Reading any dataset of traces


def _local_copy(seed_dataset: str, revision: str | None) -> tuple[Path, str | None]:
    """A local folder or file of the dataset, and the Hub commit it came from (None for a local path)."""
    if not is_hub_id(seed_dataset):
        path = Path(seed_dataset).expanduser()
        if not path.exists():
            raise ValueError(f"seed_dataset={seed_dataset!r}: no such file or folder, and not a Hub id ('org/name').")
        return path, None

    folder = download_seed_dataset(seed_dataset, revision=revision, traces=True)
    return folder, folder.name  # the Hugging Face cache names a snapshot folder by its commit


def download_seed_dataset(
    repo_id: str,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    token: str | None = None,
    traces: bool = False,
) -> Path:
    """Fetches the shards and card of a seed dataset repo into the Hugging Face cache; returns the local folder.

    The shards are under `<folder>/data/`; a folder that is already cached is used without network access, so this
    also works with `HF_HUB_OFFLINE=1` once the dataset was downloaded. With `traces`, the repo may be any dataset
    of traces: its Parquet, JSON, JSONL and CSV files are fetched, wherever they are. The folder's name is the commit.
    """
    try:
        folder = snapshot_download(
            repo_id,
            repo_type="dataset",
            revision=revision,
            allow_patterns=TRACE_DATASET_PATTERNS if traces else SEED_DATASET_PATTERNS,
            cache_dir=cache_dir,
            token=token,
        )
    except RepositoryNotFoundError as error:
        raise FileNotFoundError(
            f"The Hub has no dataset repo {repo_id!r} that this token can read ({hub_endpoint()}). Check the id "
            "('org/name' of a seed dataset), log in with `hf auth login` if it is private, or pass a local path."
        ) from error
    except RevisionNotFoundError as error:
        raise FileNotFoundError(
            f"The seed dataset {repo_id!r} has no revision {revision!r}; pass an existing branch, tag or commit."
        ) from error
    except LocalEntryNotFoundError as error:
        if constants.is_offline_mode():
            raise FileNotFoundError(
                f"The seed dataset {repo_id!r} is not in the Hugging Face cache, and HF_HUB_OFFLINE=1 forbids "
                "downloading it. Run once with network access (unset HF_HUB_OFFLINE) to cache it, or pass a local "
                "path (a run's output_dir or its seeds/ folder) as seed_dataset."
            ) from error
        raise ConnectionError(
            f"Could not download the seed dataset {repo_id!r} from {hub_endpoint()}, and it is not in the cache: "
            f"{error}. Check the network, or pass a local path as seed_dataset."
        ) from error
    folder = Path(folder)
    if not traces and not any((folder / DATA_DIR).glob("*.parquet")):
        raise ValueError(
            f"The dataset repo {repo_id!r} holds no {DATA_DIR}/*.parquet shards, so it is not a seed dataset written "
            "by ts_trl. Pass the repo a SeedHubPusher pushed to, or a local seed folder."
        )
    return folder


def read_any(path: Path, source: str) -> pa.Table:
    """The rows of a seed dataset or trace dataset, all at once: a file or folder of Parquet, JSON, JSONL or CSV files.

    A folder with a ts_trl manifest (a run, its seeds/ folder) is read through it, checksums checked.
    """
    return open_traces(path, source).read()


def open_traces(path: Path, source: str) -> TraceFiles:
    """A seed dataset or trace dataset to read in batches (`TraceFiles`): its Parquet files are read a few row groups
    at a time, a ts_trl manifest folder (checksums checked) and JSON, JSONL or CSV files whole."""
    if path.is_dir() and any(SeedManifest.path(folder).is_file() for folder in (path / SEEDS_DIR, path)):
        return TraceFiles.of_table(read_table(resolve_seed_dataset(path)))
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


def _is_same_tokenizer_seed_dataset(names: list[str], about: pa.Table, tokenizer_fp: str) -> bool:
    """A ts_trl seed dataset read with its token ids: it has them (`names`: its columns) and no other tokenizer's
    fingerprint (`about`: its `tokenizer` column, if any).

    Rows without a fingerprint go that way too, where `seed_dataset_same_tokenizer` or the refusal decides.
    """
    if "completion_ids" not in names:
        return False
    found = set(about.column("tokenizer").unique().to_pylist()) if "tokenizer" in about.column_names else {None}
    return not (found - {None, tokenizer_fp}) or "completion" not in names


def _holds_tool_results(seeds: pa.Table) -> bool:
    """Whether any seed has tokens a tool wrote (a 0 in a multi-turn run's `tool_mask`)."""
    if "tool_mask" not in seeds.column_names:
        return False
    masks = pc.list_flatten(seeds.column("tool_mask"))
    return len(masks) > 0 and not pc.all(pc.equal(masks, 1)).as_py()


def _source_model(table: pa.Table) -> dict:
    """The model and tokenizer a dataset says made it (ts_trl's `model` and `tokenizer` columns), None if unknown."""
    info = {}
    for name in ("model", "tokenizer"):
        values = table.column(name).unique().to_pylist() if name in table.column_names else []
        values = [v for v in values if v is not None]
        info[name] = values[0] if len(values) == 1 else (values or None)
    return info


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


# ---------------------------------------------------------------------------------------------------------------------
# Matching, re-tokenising, scoring


def normalised(prompt) -> list[str]:
    """The keys a prompt is matched by: its whole text and its last user turn, NFKC with whitespace collapsed.

    A conversational prompt may come as messages or as their JSON text (a ts_trl seed dataset's `prompt` column).
    """
    if isinstance(prompt, str) and prompt.lstrip().startswith("[{"):
        try:
            prompt = json.loads(prompt)
        except ValueError:
            pass
    if isinstance(prompt, list):
        turns = [m for m in prompt if isinstance(m, dict) and m.get("role") != "assistant"]
        users = [str(m.get("content", "")) for m in turns if m.get("role") == "user"]
        texts = ["\n".join(str(m.get("content", "")) for m in turns), *users[-1:]]
    else:
        texts = [str(prompt)]
    keys = [" ".join(unicodedata.normalize("NFKC", text).split()) for text in texts]
    return [key for key in dict.fromkeys(keys) if key]


def same_prompt(one, other) -> bool:
    """Whether two prompts (text, messages or their JSON) are one, up to Unicode form and whitespace."""
    return bool(set(normalised(one)) & set(normalised(other))) or not normalised(one) or not normalised(other)


def check_prompt_texts(prompt_ids, prompts, train_dataset, source: str, ours: dict | None = None) -> None:
    """Refuses, in one line, a seed whose `prompt_id` names another prompt in this training set: its rollout would
    be continued as the answer to a prompt it never saw. `ours` (the training prompts by id, `training_prompts`)
    saves rebuilding them at every batch of a streamed file."""
    if not hasattr(train_dataset, "__len__"):
        return
    ours = training_prompts(train_dataset) if ours is None else ours
    checked = set()
    for prompt_id, prompt in zip(list(prompt_ids), list(prompts)):
        prompt_id = None if prompt_id is None else str(prompt_id)
        if prompt_id not in ours or prompt is None or (prompt_id, str(prompt)) in checked:
            continue
        checked.add((prompt_id, str(prompt)))
        if not same_prompt(prompt, ours[prompt_id]):
            raise ValueError(
                f"{source}: prompt_id {prompt_id!r} is the prompt {str(prompt)[:60]!r} there, but "
                f"{str(ours[prompt_id])[:60]!r} in this training set, so its seeds would continue another prompt. "
                "Seed from a dataset of this training set, or give the training prompts ids that mean the same prompts."
            )


def training_prompts(train_dataset) -> dict:
    """The training prompts by prompt id, as `check_prompt_texts` compares them."""
    return dict(zip(_prompt_ids(train_dataset), train_dataset["prompt"]))


def match_prompts(traces: list[Trace], train_dataset, source: str) -> list[int | None]:
    """The training row each trace's prompt is, by `prompt_id`, else by normalised text; None where none matches.

    Refuses, in one line, a training set it cannot index and traces none of which match.
    """
    rows = PromptIndex(train_dataset, source).rows(traces)
    report_matches(sum(row is not None for row in rows), len(traces), traces[0].prompt if traces else None, source)
    return rows


class PromptIndex:
    """The training rows traces are matched to, by `prompt_id`, else by normalised prompt text (`match_prompts`)."""

    def __init__(self, train_dataset, source: str):
        if train_dataset is None or not hasattr(train_dataset, "__len__"):
            raise ValueError(
                f"{source} holds text seeds, which are matched to the training prompts, but the training set cannot "
                "be indexed (an iterable dataset). Pass a map-style Dataset, or a seed dataset written by this "
                "tokenizer."
            )
        prompts = train_dataset["prompt"]
        ids = train_dataset["prompt_id"] if "prompt_id" in train_dataset.column_names else [None] * len(prompts)
        self.by_id, self.by_text = {}, {}
        for row, (prompt, prompt_id) in enumerate(zip(prompts, ids)):
            self.by_id.setdefault(str(prompt_id) if prompt_id is not None else prompt_id_of(prompt), row)
            for key in normalised(prompt):
                self.by_text.setdefault(key, row)
        self.train_dataset, self.source = train_dataset, source
        self.prompts = training_prompts(train_dataset)  # once, not at every batch of a streamed file

    def rows(self, traces: list[Trace]) -> list[int | None]:
        """Each trace's training row, None where none matches; a `prompt_id` naming another prompt is refused."""
        prompt_ids, prompts = [t.prompt_id for t in traces], [t.prompt for t in traces]
        check_prompt_texts(prompt_ids, prompts, self.train_dataset, self.source, self.prompts)
        rows = []
        for trace in traces:
            row = self.by_id.get(trace.prompt_id) if trace.prompt_id is not None else None
            if row is None:
                row = next((self.by_text[key] for key in normalised(trace.prompt) if key in self.by_text), None)
            rows.append(row)
        return rows


def report_matches(matched: int, total: int, first_prompt, source: str) -> None:
    """Logs how many traces match a training prompt; refuses, in one line, traces none of which match."""
    if not matched:
        example = normalised(first_prompt)[:1] if total else []
        raise ValueError(
            f"{source}: none of its {total} traces' prompts matches a training prompt (by prompt_id or by "
            f"normalised text; e.g. {example[0][:60] if example else ''!r}). Seed from traces of this training set, or "
            "name the prompt's column with seed_prompt_column."
        )
    report = logger.info if matched == total else logger.warning  # unmatched traces are left out
    report(f"{source}: {matched} of {total} traces match a training prompt; only those seed this run.")


def retokenise(tokenizer, text: str, newline_only: bool = False) -> tuple[list[int], np.ndarray]:
    """This tokenizer's ids of `text`, and the positions `k` the seed may be cut at.

    `k` is allowed where the text before it ends at a text boundary (next to whitespace; with `newline_only`, right
    after a newline) and this tokenizer, given that text alone, returns exactly `ids[:k]` and decodes them back to it:
    the cut never falls inside a token it would split differently. At most `MAX_CUT_CANDIDATES` boundaries, evenly
    spread over the text, are checked, which bounds the cost at that many tokenisations of a prefix per trace.
    """
    ids, cuts = retokenise_many(tokenizer, [text], newline_only)[0]
    return [int(i) for i in ids], cuts


@dataclass
class TextCodec:
    """How `retokenise_many` tokenises: `encode` and `decode` of lists (`_fast_codec`), and, for a byte-level BPE
    tokenizer proven local, the cuts from one encoding of each trace (`local_cuts.py`; None: every prefix encoded)."""

    encode: object
    decode: object
    local: LocalCuts | None = None

    @classmethod
    def of(cls, tokenizer) -> TextCodec:
        encode, decode, backend = _fast_codec(tokenizer)
        return cls(encode, decode, LocalCuts.of(backend) if backend is not None else None)


def retokenise_many(
    tokenizer, texts: list[str], newline_only: bool = False, codec: TextCodec | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """`retokenise` of each text (its ids as int32), the same cuts found with less work.

    A trace the codec's `local` cuts serve is encoded once; the others with one tokenizer call for all their
    prefixes and one for all their decodings. `codec`: `TextCodec.of(tokenizer)`, built once for many calls.
    """
    codec = codec or TextCodec.of(tokenizer)
    ends = [_boundaries(text, newline_only) for text in texts]
    done = [codec.local.cuts(text, found) if codec.local else None for text, found in zip(texts, ends)]
    rest = [t for t, result in enumerate(done) if result is None]
    for t, result in zip(rest, _encoded_cuts(codec, [texts[t] for t in rest], [ends[t] for t in rest])):
        done[t] = result
    return done


def _encoded_cuts(codec: TextCodec, texts: list[str], ends: list[list[int]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """`retokenise` by its definition: every candidate prefix encoded, and decoded where its ids begin the trace's."""
    if not texts:
        return []
    encoded = codec.encode([*texts, *(text[:p] for text, found in zip(texts, ends) for p in found)])
    whole, encoded = encoded[: len(texts)], iter(encoded[len(texts) :])
    candidates = []  # (trace, p, ids of text[:p]) where those ids are the trace's first ids
    for t, (ids, found) in enumerate(zip(whole, ends)):
        for p, e in zip(found, encoded):
            if 0 < len(e) < len(ids) and ids[: len(e)] == e:
                candidates.append((t, p, e))
    decoded = codec.decode([e for _, _, e in candidates]) if candidates else []
    cuts: list[set[int]] = [set() for _ in texts]
    for (t, p, e), back in zip(candidates, decoded):
        if back == texts[t][:p]:
            cuts[t].add(len(e))
    return [(np.asarray(ids, np.int32), np.array(sorted(found), np.int32)) for ids, found in zip(whole, cuts)]


_SPACE = re.compile(r"\s")  # CPython's `\s` on str is `str.isspace` (both `Py_UNICODE_ISSPACE`)


def _boundaries(text: str, newline_only: bool) -> list[int]:
    """The text boundaries a cut is checked at (at most `MAX_CUT_CANDIDATES`, evenly spread): positions `p` with
    `0 < p < len(text)` right after a newline (`newline_only`), else next to whitespace."""
    if newline_only:
        ends = [m.end() for m in re.finditer("\n", text) if m.end() < len(text)]
    else:
        spaces = [m.start() for m in _SPACE.finditer(text)]
        ends = sorted({p for i in spaces for p in (i, i + 1) if 0 < p < len(text)})
    if len(ends) > MAX_CUT_CANDIDATES:  # each check tokenises a prefix: O(length) per candidate
        ends = [ends[i] for i in np.unique(np.linspace(0, len(ends) - 1, MAX_CUT_CANDIDATES).round().astype(int))]
    return ends


def _fast_codec(tokenizer):
    """(encode, decode, backend) of lists: exactly `tokenizer(texts, add_special_tokens=False)["input_ids"]` and
    `tokenizer.batch_decode(ids, skip_special_tokens=False)`.

    For a `transformers` fast tokenizer that overrides none of the methods these go through, with no truncation,
    padding or clean-up of spaces, they are the Rust backend's `encode` and `decode_batch` (transformers' own calls
    convert every id through Python, which made re-tokenising 10^5 traces take minutes), and the backend; otherwise the
    tokenizer's own methods and None.
    """

    def encode(texts):
        return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []

    def decode(ids):
        return tokenizer.batch_decode(ids, skip_special_tokens=False)

    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase  # lazy: private modules, may move
        from transformers.tokenization_utils_tokenizers import TokenizersBackend  # lazy: as above
    except ImportError:  # another transformers: its own methods
        return encode, decode, None
    kind = type(tokenizer)
    plain = isinstance(tokenizer, TokenizersBackend) and all(
        getattr(kind, name, None) is getattr(base, name, None)
        for base, names in (
            (PreTrainedTokenizerBase, ("__call__", "batch_decode", "_get_padding_truncation_strategies")),
            (TokenizersBackend, ("_encode_plus", "set_truncation_and_padding", "decode", "_decode")),
        )
        for name in names
    )
    if not plain:
        return encode, decode, None
    encode(["a"])  # transformers' own call sets the backend's truncation, padding and special-token splitting
    backend = tokenizer.backend_tokenizer
    if backend.truncation is not None or backend.padding is not None or tokenizer.clean_up_tokenization_spaces:
        return encode, decode, None
    if backend.encode_special_tokens != bool(tokenizer.split_special_tokens):
        return encode, decode, None

    def fast_encode(texts):  # one text at a time: the batch call's worker threads cost more CPU than they save
        return [backend.encode(text, add_special_tokens=False).ids for text in texts]

    def fast_decode(ids):
        return backend.decode_batch(ids, skip_special_tokens=False)

    return fast_encode, fast_decode, backend


def success_scores(traces, rows, train_dataset, success, source, main=True) -> np.ndarray:
    """The success reward of each trace, scored as this run scores its own rollouts, with a progress bar.

    `success`: (the run's reward functions, their names, the success reward's name); `rows`: each trace's training row,
    whose columns (e.g. `answer`) the reward function gets as TRL passes them.
    """

    reward_funcs, reward_names, success_reward = success
    func = reward_funcs[list(reward_names).index(success_reward)]
    if not callable(func) or hasattr(func, "forward"):
        raise ValueError(
            f"{source}: seed_filter='success' scores traces with the reward function {success_reward!r}, which is a "
            "reward model; only reward functions (callables) can score them here. Set success_reward to one."
        )
    columns = [c for c in train_dataset.column_names if c not in ("prompt", "completion", "completion_ids")]
    scores = np.full(len(traces), np.nan, np.float32)
    batches = range(0, len(traces), SCORE_BATCH)
    for start in tqdm(batches, desc=f"Scoring the traces of {source}", disable=not main):
        batch = range(start, min(start + SCORE_BATCH, len(traces)))
        examples = [train_dataset[rows[i]] for i in batch]
        prompts = [example["prompt"] for example in examples]
        completions = [
            traces[i].turns
            if traces[i].turns is not None
            else [{"role": "assistant", "content": traces[i].text}]
            if isinstance(p, list)
            else traces[i].text
            for i, p in zip(batch, prompts)
        ]
        kwargs = {c: [example[c] for example in examples] for c in columns}
        kwargs.update(trainer_state=None, log_extra=_ignore, log_metric=_ignore)
        values = func(prompts=prompts, completions=completions, completion_ids=[None] * len(batch), **kwargs)
        if inspect.isawaitable(values):
            values = asyncio.run(values)
        scores[start : start + len(batch)] = [np.nan if v is None else float(v) for v in values]
    return scores


def _ignore(*args, **kwargs) -> None:
    """What a reward function's `log_extra` and `log_metric` do while traces are scored: nothing is logged."""


def text_seeds(
    settings, tokenizer, traces, train_dataset, success, source: str, main: bool = True, template=None
) -> ExternalSeeds:
    """`stream_text_seeds` of one list of traces."""
    return stream_text_seeds(settings, tokenizer, [traces], train_dataset, success, source, main, template)


@dataclass
class _Tally:
    """What `stream_text_seeds` counts over every batch for its refusals, which name the whole dataset's numbers."""

    rows: int = 0
    matched: int = 0
    successful: int = 0
    first_prompt: object = None
    over_characters: list[int] = field(default_factory=list)  # non-blank characters of traces that cannot fit
    over_budget: list[int] = field(default_factory=list)  # tokens of traces over max_completion_length
    character_limit: int = 0  # `_character_limit` of this tokenizer and budget


def stream_text_seeds(
    settings, tokenizer, batches, train_dataset, success, source: str, main: bool = True, template=None
) -> ExternalSeeds:
    """The bank rows of re-tokenised traces that match a training prompt, fit the budget and (with the filter) passed.

    `batches`: the traces, a list at a time (`trace_batches`); of a batch only its seeds' Arrow columns are kept (as
    the result's chunks, never concatenated), so no more than a batch of texts is ever held. The refusals wait for the
    last batch and count every trace, as if all had been read at once; a trace that cannot fit by its length alone is
    never tokenised or scored.
    `success`: (the run's reward functions, their names, the success reward's name), for `seed_filter="success"`.
    `template`: a multi-turn run's `TurnTemplate`; each trace's turns are then rendered (`render_trajectory`).

    Long: one pass over each batch: match, check, score, re-tokenise, cut points; the refusals after the last.
    """
    index, prompt_ids = PromptIndex(train_dataset, source), _prompt_ids(train_dataset)
    limit = _character_limit(tokenizer, settings.max_completion_length)
    codec = TextCodec.of(tokenizer) if template is None else None
    tally, tables = _Tally(character_limit=limit), []
    for traces in batches:
        first, tally.rows = tally.rows, tally.rows + len(traces)
        if first == 0 and traces:
            tally.first_prompt = traces[0].prompt
        rows = index.rows(traces)
        kept = [i for i, row in enumerate(rows) if row is not None]
        tally.matched += len(kept)
        over = {i: _non_blank(traces[i].text) for i in kept if len(traces[i].text) > limit}
        tally.over_characters += [n for n in over.values() if n > limit]
        kept = [i for i in kept if over.get(i, 0) <= limit]
        rewards = {i: traces[i].reward for i in kept}
        if settings.seed_filter == "success" and kept:
            scores = success_scores(
                [traces[i] for i in kept], [rows[i] for i in kept], train_dataset, success, source, main
            )
            rewards = dict(zip(kept, scores.tolist()))
            kept = [i for i in kept if rewards[i] > settings.success_threshold]
        tally.successful += len(kept)
        ids = [traces[i].rollout_id or f"trace-{first + i}" for i in kept]
        turns = None
        if template is not None:
            rendered = {i: render_trajectory(template, traces[i].turns, settings.cut_at_newline, source) for i in kept}
            tokenised = {i: rendered[i][:2] for i in kept}
            turns = [(rendered[i][2], json.dumps(traces[i].turns)) for i in kept]
        else:
            tokenised = {}
            for start in range(0, len(kept), RETOKENISE_BATCH):
                batch = kept[start : start + RETOKENISE_BATCH]
                texts = [traces[i].text for i in batch]
                tokenised.update(zip(batch, retokenise_many(tokenizer, texts, settings.cut_at_newline, codec)))
        tally.over_budget += [n for n in (len(tokenised[i][0]) for i in kept) if n > settings.max_completion_length]
        columns = ([prompt_ids[rows[i]] for i in kept], [tokenised[i] for i in kept], [rewards[i] for i in kept])
        tables.append(seed_rows_table(ids, *columns, turns))
    return ExternalSeeds(*_refusals_or_table(tally, tables, settings, success, source))


def _refusals_or_table(tally: _Tally, tables: list[pa.Table], settings, success, source: str):
    """(the seeds' table, their provenance) of every batch, or the first refusal `text_seeds` makes, in one line."""
    report_matches(tally.matched, tally.rows, tally.first_prompt, source)
    if tally.over_characters:
        raise ValueError(
            f"{source}: {len(tally.over_characters)} of its {tally.matched} traces are over {tally.character_limit} "
            "characters (the "
            f"longest: {max(tally.over_characters)}), more than max_completion_length={settings.max_completion_length} "
            "tokens of this tokenizer can hold. Raise max_completion_length, or drop the long traces from the dataset."
        )
    provenance = {"matched": tally.matched}
    if settings.seed_filter == "success":
        provenance.update(filter="success", success_reward=success[2], successful=tally.successful)
        if not tally.successful:
            raise ValueError(
                f"{source}: none of its {tally.matched} matched traces scores above success_threshold="
                f"{settings.success_threshold} with the reward function {success[2]!r}; seed_filter='success' keeps "
                "none. Check the traces' answers, or leave seed_filter unset."
            )
    table = pa.concat_tables(tables)  # the batches' own buffers, as chunks: no copy of every seed
    twice = _first_repeated(table.column("rollout_id"))
    if twice is not None:
        raise ValueError(
            f"{source}: rollout_id {twice!r} names two traces (several files numbering their rows alike?); a "
            "seed's id must be unique. Make the ids unique across files (e.g. prefix each with its file's name), or "
            "drop the rollout_id column."
        )
    if tally.over_budget:
        raise ValueError(
            f"{source}: {len(tally.over_budget)} of its {tally.successful} traces are longer than "
            f"max_completion_length={settings.max_completion_length} tokens once tokenised with this tokenizer (the "
            f"longest: {max(tally.over_budget)}). Raise max_completion_length, or drop the long traces from the "
            "dataset."
        )
    provenance["kept"] = table.num_rows
    return table, provenance, TextCuts(table)


def _first_repeated(rollout_ids: pa.ChunkedArray) -> str | None:
    """The first rollout id that an earlier row has too, or None: Arrow's hash of the ids, not a set of their strings
    (100 bytes a seed), and the ids in Python only when one repeats."""
    if len(pc.unique(rollout_ids)) == len(rollout_ids):
        return None
    seen = set()
    return next(rollout_id for rollout_id in rollout_ids.to_pylist() if rollout_id in seen or seen.add(rollout_id))


def _character_limit(tokenizer, budget: int) -> int:
    """The most characters a trace of `budget` tokens may have, whatever its tokens.

    No token decodes to more characters than the longest vocabulary entry (byte-level entries spell a character with
    one or more), so a trace with more non-blank characters than `budget` such tokens (twice, for normalisers that
    merge characters) is over the budget whatever its tokens; tokenising 200,000 characters would take seconds each.
    """
    longest_token = max((len(token) for token in tokenizer.get_vocab()), default=1)
    return 2 * budget * max(longest_token, 1)


def _non_blank(text: str) -> int:
    return len("".join(text.split()))


def _prompt_ids(train_dataset) -> list[str]:
    """Each training row's prompt id, as the trainer keys it (`seed_batch.prompt_key`)."""
    if "prompt_id" in train_dataset.column_names:
        ids = train_dataset["prompt_id"]
        return [str(i) if i is not None else prompt_id_of(p) for i, p in zip(ids, train_dataset["prompt"])]
    return [prompt_id_of(prompt) for prompt in train_dataset["prompt"]]


def render_trajectory(template: TurnTemplate, turns: list[dict], newline_only: bool, source: str):
    """(ids, where they may be cut, tool mask) of an agent trajectory rendered with this run's template."""
    ids, mask = template.trajectory_ids(turns, source)
    tokenizer = template.tokenizer
    cuts = turn_text_cuts(tokenizer, ids, mask, lambda text: retokenise(tokenizer, text, newline_only))
    return ids, cuts, mask


def seed_rows_table(rollout_ids, prompt_ids, tokenised, rewards, turns=None) -> pa.Table:
    """Text seeds as bank rows: this tokenizer's ids, null log-probs (no behaviour policy sampled them; the bank reads
    NaN), and where each may be cut; each list column is one int32 buffer and its offsets.

    `turns` (multi-turn text seeds): per row, its tool mask and the JSON of its messages in TRL's form, which the bank
    reads from the `tool_mask` and `completion` columns as it reads a multi-turn shard's.
    """
    extra = {}
    if turns is not None:
        extra = {
            "tool_mask": pa.array([mask for mask, _ in turns], pa.list_(pa.int8())),
            "completion": pa.array([messages for _, messages in turns], pa.string()),
        }
    return pa.table(
        {
            "rollout_id": pa.array(rollout_ids, pa.string()),
            "prompt_id": pa.array(prompt_ids, pa.string()),
            "completion_ids": _int32_lists([pair[0] for pair in tokenised]),
            "logprobs": pa.nulls(len(tokenised), pa.list_(pa.float32())),
            "reward": pa.array(rewards, pa.float32()),
            "step": pa.array(np.zeros(len(tokenised), np.int32)),
            CUT_POSITIONS: _int32_lists([pair[1] for pair in tokenised]),
            **extra,
        }
    )


def _int32_lists(rows: list) -> pa.ListArray:
    """Rows of integers (arrays or lists) as list<int32> of one values buffer, sized exactly, without a Python int
    per value."""
    offsets = np.zeros(len(rows) + 1, np.int32)
    np.cumsum([len(row) for row in rows], out=offsets[1:])
    values = np.concatenate(rows).astype(np.int32, copy=False) if rows else np.zeros(0, np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values), type=pa.list_(pa.int32()))


class TextCuts(Mapping):
    """Rollout id -> the positions its text seed may be cut at (int32), read from the seeds' table in place.

    No Python object per seed (a dict of 10^6 ids and arrays took 250 MB): an id is found by its `hash` among the ids'
    hashes, sorted (8 bytes a seed; equal hashes are told apart by the text), and its cuts are a view of the column.
    Python salts `hash` per process, so a pickled `TextCuts` is rebuilt from its table where it is unpickled.
    """

    def __init__(self, table: pa.Table):
        self._table = table.select(["rollout_id", CUT_POSITIONS])
        batches = [batch for batch in self._table.to_batches() if batch.num_rows]
        self._ids = [_string_buffers(batch.column(0)) for batch in batches]  # bytes and offsets
        cuts = [batch.column(1) for batch in batches]
        self._cuts = [(c.values.to_numpy(zero_copy_only=False), c.offsets.to_numpy()) for c in cuts]  # views
        self._firsts = np.cumsum([0] + [batch.num_rows for batch in batches])  # each batch's first row
        hashes = np.fromiter((hash(i) for b in batches for i in b.column(0).to_pylist()), np.int64, len(self))
        self._order = np.argsort(hashes, kind="stable")
        self._hashes = hashes[self._order]

    def __reduce__(self):
        return TextCuts, (self._table,)

    def __getitem__(self, rollout_id: str) -> np.ndarray:
        hashed, text = hash(rollout_id), rollout_id.encode()
        position = int(self._hashes.searchsorted(hashed))
        while position < len(self._hashes) and self._hashes[position] == hashed:
            row = int(self._order[position])
            batch = int(self._firsts.searchsorted(row, side="right")) - 1
            i = row - int(self._firsts[batch])
            data, offsets = self._ids[batch]
            if data[offsets[i] : offsets[i + 1]].tobytes() == text:
                values, offsets = self._cuts[batch]
                return values[offsets[i] : offsets[i + 1]]
            position += 1
        raise KeyError(rollout_id)

    def __iter__(self) -> Iterator[str]:
        for batch in self._table.to_batches():
            yield from batch.column(0).to_pylist()

    def __len__(self) -> int:
        return int(self._firsts[-1])


# ---------------------------------------------------------------------------------------------------------------------
# The cache next to the run


def _cache_key(settings, tokenizer_fp: str, train_dataset, success_reward, template=None) -> str:
    """What the text seeds depend on: the dataset (and a local one's files), the options, tokenizer and prompts."""
    parts = {
        name: getattr(settings, name)
        for name in (
            "seed_dataset",
            "seed_dataset_revision",
            "seed_prompt_column",
            "seed_completion_column",
            "seed_filter",
            "max_completion_length",
            "cut_at_newline",
        )
    }
    if settings.seed_filter:
        parts.update(success_reward=success_reward, success_threshold=settings.success_threshold)
    path = Path(settings.seed_dataset).expanduser()
    files = sorted(path.rglob("*")) if path.is_dir() else [path] if path.is_file() else []
    parts["files"] = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file()]
    prompts = train_dataset["prompt"] if hasattr(train_dataset, "column_names") else []
    parts["prompts"] = hashlib.sha256(json.dumps(list(prompts), sort_keys=True).encode()).hexdigest()
    parts["tokenizer"] = tokenizer_fp
    if template is not None:  # agent trajectories, rendered with this chat template
        parts["turns"] = template.key()
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _read_cache(folder: Path, key: str, source: str) -> ExternalSeeds | None:
    """The text seeds cached in `folder` for `key`, or None: none cached, or a cache that cannot serve this run (other
    settings, another version of the dataset, a damaged file), which is said in a warning before the dataset is read
    again."""
    if not (folder / CACHE_PROVENANCE).exists():
        return None
    try:
        provenance = json.loads((folder / CACHE_PROVENANCE).read_text())
        checksum = provenance.pop(CACHE_CHECKSUM, None)
        if provenance.get("cache_key") != key:
            logger.warning(
                f"{folder} holds text seeds of other settings or of another version of {source}: reading it again "
                "(a resumed run then seeds from what is read now)."
            )
            return None
        if checksum is None or file_sha256(folder / CACHE_TABLE) != checksum:
            logger.warning(
                f"{folder / CACHE_TABLE} does not match its checksum in {CACHE_PROVENANCE}: reading {source} again."
            )
            return None
        table = pq.read_table(folder / CACHE_TABLE)
    except (OSError, ValueError, AttributeError, pa.ArrowInvalid) as error:
        logger.warning(f"{folder}: the cached text seeds cannot be read ({error}); reading {source} again.")
        return None
    return ExternalSeeds(table, provenance, TextCuts(table))


def _write_cache(folder: Path, seeds: ExternalSeeds) -> None:
    checksum = write_shard(seeds.table, folder / CACHE_TABLE)
    atomic_write_json(folder / CACHE_PROVENANCE, {**seeds.provenance, CACHE_CHECKSUM: checksum})


def external_seeds_digest(external) -> str | None:
    """A SHA-256 of a `seed_dataset`'s seeds as the bank takes them: their table and the text seeds' cut positions."""
    if external is None:
        return None
    digest = hashlib.sha256(table_bytes(external.table.combine_chunks()))  # however the rows were chunked
    for rollout_id in sorted(external.text_cuts):
        digest.update(rollout_id.encode() + b"\0" + np.asarray(external.text_cuts[rollout_id], np.int64).tobytes())
    return digest.hexdigest()
