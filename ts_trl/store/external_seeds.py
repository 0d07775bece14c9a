"""Seeds from elsewhere (`seed_dataset`): a `ts_trl` seed dataset of this tokenizer, read with its token ids; or one
of another tokenizer, or any dataset of reasoning traces, re-tokenised from its text with this run's tokenizer.

This module decides which, and keeps the result: it finds the dataset (a local path, or a Hub id downloaded first by
`download_seed_dataset`), reads a seed dataset of this tokenizer through `format.py`, and hands text to its two
rooms: `traces.py` reads the traces, `text_seeds.py` matches them to the training prompts, re-tokenises and cuts
them (text seeds carry no behaviour log-probs, so they serve `prefix_mode="state"` with `seed_method="seeds"` only).
With `seed_filter="success"` the traces are scored by the function the trainer passes in.

The result is computed once at construction and cached in `<output_dir>/external_seeds/` (the bank columns, the cut
positions and where the seeds came from), so a resumed run reads back exactly the same seeds without recomputing.
The trainer reads the seeds on every rank at once (`read_external_seeds_on_every_rank`) and hands them to the seed
store.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from accelerate.utils import broadcast_object_list, gather_object
from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

from .agent_traces import TurnTemplate
from .files import atomic_write_json, file_sha256, is_hub_id
from .format import (
    SEEDS_DIR,
    SeedManifest,
    load_seed_table,
    read_table,
    resolve_seed_dataset,
    table_bytes,
    write_shard,
)
from .hub import CARD_FILE, DATA_DIR, hub_endpoint
from .text_seeds import ExternalSeeds, TextCuts, check_prompt_texts, stream_text_seeds
from .traces import TraceFiles, open_trace_files, trace_batches

logger = logging.getLogger(__name__)
SEED_DATASET_PATTERNS = [f"{DATA_DIR}/*.parquet", CARD_FILE]
TRACE_DATASET_PATTERNS = ["*.parquet", "*.jsonl", "*.json", "*.csv", CARD_FILE]
CACHE_DIR = "external_seeds"  # in output_dir: the text seeds a run computed, read back on resume
CACHE_TABLE = "seeds.parquet"
CACHE_PROVENANCE = "provenance.json"
CACHE_CHECKSUM = "table_sha256"  # in provenance.json: the SHA-256 of seeds.parquet, checked when it is read back


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
    score=None,
    success_reward=None,
    main=True,
    template: TurnTemplate | None = None,
) -> ExternalSeeds | None:
    """The seeds of `settings.seed_dataset` (an `ExternalSeedSettings`) for this run, or None without one; refusals are one line each.

    `score`: with `seed_filter="success"`, the trainer's function that scores traces with the success reward (named
    `success_reward`; see `text_seeds.stream_text_seeds`). `main`: this process writes the cache (every process
    computes the same seeds). `template`: a multi-turn run's (tools or environments), whose text seeds are agent
    trajectories rendered as TRL's tool loop writes them.

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
    seeds = stream_text_seeds(settings, tokenizer, batches, train_dataset, (score, success_reward), source, template)
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
    score=None,
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
            score,
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
# Where the seeds are, and what they are


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
            "by ts_trl. Pass the repo a run pushed its seeds to (push_seeds_to_hub), or a local seed folder."
        )
    return folder


def read_any(path: Path, source: str) -> pa.Table:
    """The rows of a seed dataset or trace dataset, all at once: a file or folder of Parquet, JSON, JSONL or CSV files.

    A folder with a ts_trl manifest (a run, its seeds/ folder) is read through it, checksums checked.
    """
    return open_traces(path, source).read()


def open_traces(path: Path, source: str) -> TraceFiles:
    """A seed dataset or trace dataset to read in batches (`traces.TraceFiles`): a ts_trl manifest folder whole, its
    checksums checked; any other file or folder as `traces.open_trace_files` reads it."""
    if path.is_dir() and any(SeedManifest.path(folder).is_file() for folder in (path / SEEDS_DIR, path)):
        return TraceFiles.of_table(read_table(resolve_seed_dataset(path)))
    return open_trace_files(path, source)


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
