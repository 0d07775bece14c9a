"""The seed dataset on disk: the manifest with a checksum of every file, and writing and reading shards and bank files
with the checks that a damaged, malformed or foreign dataset must pass. See docs/seed-dataset.md.

Layout of a run's output directory::

    seeds/manifest.json                 run id, model, tokenizer fingerprint, the shards and their SHA-256
    seeds/step-000100.parquet           the rollouts generated since the previous snapshot, one row each
    seeds/bank/step-000100.arrow        the same rows' bank columns, uncompressed Arrow IPC, for memory-mapping

Every file is written atomically (`files.atomic_write`), and the manifest is replaced after its shard, so a crash at
any moment leaves either the previous or the new snapshot, never a torn one. The Parquet shard is the seed dataset
(what the Hub and `load_dataset` read); its `.arrow` twin is a local copy of the columns the bank reads, so that a
damaged copy of either can be recovered from the other. The columns themselves are `schema.py`'s.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .files import atomic_write, atomic_write_json, file_sha256, hub_cache_blobs, same_file, set_aside_folder
from .schema import BANK_COLUMNS, bank_columns, check_text

logger = logging.getLogger(__name__)


SEEDS_DIR = "seeds"
MANIFEST = "manifest.json"
BANK_DIR = "bank"
MANIFEST_FORMAT = 2  # 2: every shard entry carries `sha256` and `bank_sha256`; 1 (no checksums) is still read
MANIFEST_KEYS = ("format", "run_id", "model", "tokenizer", "shards", "external")  # others are kept as they are


def shard_name(step: int) -> str:
    return f"step-{step:06d}.parquet"


def bank_file_name(step: int) -> str:
    return f"{BANK_DIR}/step-{step:06d}.arrow"


# ---------------------------------------------------------------------------------------------------------------------
# Writing


def write_shard(table: pa.Table, path: str | os.PathLike) -> str:
    """Writes one Parquet shard atomically; returns its SHA-256."""
    return atomic_write(path, lambda temporary: pq.write_table(table, temporary))


def write_bank_file(table: pa.Table, path: str | os.PathLike) -> str:
    """Writes the bank columns of `table` as an uncompressed Arrow IPC file, atomically; returns its SHA-256.

    The Parquet shard stays the seed dataset; this file is a local copy of it that every rank on the node maps, so the
    node holds one copy of the token ids in the page cache instead of one per rank.
    """
    table = table.select(bank_columns(table.column_names))

    def write(temporary: Path) -> None:
        with pa.OSFile(str(temporary), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)

    return atomic_write(path, write)


# ---------------------------------------------------------------------------------------------------------------------
# The manifest


class SeedManifest:
    """The shards of a run's seed dataset (`seeds/manifest.json`), with their checksums; replaced atomically."""

    def __init__(
        self,
        seeds_dir: Path,
        run_id: str,
        model: str,
        tokenizer: str,
        shards: list[dict] | None = None,
        external: dict | None = None,
    ):
        self.seeds_dir = Path(seeds_dir)
        self.run_id, self.model, self.tokenizer = run_id, model, tokenizer
        self.shards = shards or []
        self.external = external  # where the run's `seed_dataset` came from (see `external_seeds.py`), if any
        self.extra: dict = {}  # keys this release does not know (a later tool's), written back unchanged

    @staticmethod
    def path(seeds_dir: str | os.PathLike) -> Path:
        return Path(seeds_dir) / MANIFEST

    @classmethod
    def load(cls, seeds_dir: str | os.PathLike) -> SeedManifest | None:
        """The manifest in `seeds_dir`, None when there is none; refuses an unreadable one or a file outside it."""
        path = cls.path(seeds_dir)
        if not path.is_file():
            return None
        try:
            payload = json.loads(path.read_text())
            version = payload.get("format", 1)
            manifest = cls(seeds_dir, payload["run_id"], payload["model"], payload["tokenizer"], payload["shards"])
            manifest.external = payload.get("external")
            manifest.extra = {k: v for k, v in payload.items() if k not in MANIFEST_KEYS}
            names = [(s["file"], s.get("bank_file")) for s in manifest.shards]
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(
                f"{path} is not a readable seed manifest ({type(error).__name__}: {error}). Restore it (a copy, or "
                "the Hub seed dataset), or move the seeds folder away to start a new run."
            ) from None
        if not isinstance(version, int) or version > MANIFEST_FORMAT:
            raise ValueError(
                f"{path} is a seed manifest of format {version}, written by a later ts_trl (this one reads formats up "
                f"to {MANIFEST_FORMAT}); it is left unchanged. Upgrade ts_trl to read or continue this run."
            )
        files = [name for pair in names for name in pair if name is not None]
        twice = [name for i, name in enumerate(files) if name in files[:i]]
        if twice:
            raise ValueError(
                f"{path} lists {twice[0]} twice; each shard has one entry, so its rows would be read twice. Remove "
                "the repeated entry."
            )
        for name in (n for pair in names for n in pair if n is not None):
            manifest.resolve(name)
        return manifest

    def resolve(self, name: str) -> Path:
        """The path of a file the manifest names; a name that leads out of the seeds folder is refused.

        A manifest may come from elsewhere (a downloaded seed dataset): it must not make a run read, or a resume move,
        files outside its folder, whether by `..`, an absolute path or a symbolic link.
        """
        root = self.seeds_dir.resolve()
        target = (self.seeds_dir / name).resolve()
        blobs = hub_cache_blobs(self.seeds_dir)
        inside = target.is_relative_to(root) or (blobs is not None and target.is_relative_to(blobs))
        if Path(name).is_absolute() or ".." in Path(name).parts or not inside:
            raise ValueError(
                f"{self.path(self.seeds_dir)} names the file {name!r}, which lies outside {self.seeds_dir}; a seed "
                "dataset's files must be inside its folder. Remove that entry, or copy the file into the folder."
            )
        return self.seeds_dir / name

    def save(self) -> None:
        payload = {
            **self.extra,
            "format": MANIFEST_FORMAT,
            "run_id": self.run_id,
            "model": self.model,
            "tokenizer": self.tokenizer,
            "shards": self.shards,
        }
        if self.external is not None:
            payload["external"] = self.external
        atomic_write_json(self.path(self.seeds_dir), payload)

    def record(self, step: int, rows: int, sha256: str, bank_sha256: str) -> None:
        """Adds (or replaces) the entry of the shard of `step` and its bank file, with their checksums."""
        entry = {
            "file": shard_name(step),
            "step": step,
            "rows": rows,
            "sha256": sha256,
            "bank_file": bank_file_name(step),
            "bank_sha256": bank_sha256,
        }
        self.shards = [s for s in self.shards if s["step"] != step] + [entry]
        self.shards.sort(key=lambda s: s["step"])

    def paths(self, max_step: int | None = None) -> list[Path]:
        return [self.resolve(s["file"]) for s in self.shards if max_step is None or s["step"] <= max_step]

    @property
    def num_rows(self) -> int:
        return sum(s["rows"] for s in self.shards)

    def set_aside_after(self, step: int) -> list[str]:
        """Moves the shards of steps after `step` (an abandoned branch of a resumed run) to `seeds/superseded/`.

        They are kept, never deleted: a resumed run writes new shards under the same names.
        """
        later = [s for s in self.shards if s["step"] > step]
        if not later:
            return []
        target = set_aside_folder(self.seeds_dir / "superseded")
        for s in later:
            for name in (s["file"], s.get("bank_file")):
                if name and self.resolve(name).exists():
                    (target / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(self.resolve(name), target / name)
        self.shards = [s for s in self.shards if s["step"] <= step]
        self.save()
        return [s["file"] for s in later]


def set_aside_unlisted(seeds_dir: str | os.PathLike, listed: set[str]) -> list[str]:
    """Moves the shards and bank files in `seeds_dir` that `listed` (the manifest's names) lacks to `superseded/`.

    Such files are a crash's (renamed into place before the manifest listed them) or an earlier run's without a
    manifest: `load_dataset` would read them as this run's seeds, and this run would overwrite them.
    """
    seeds_dir = Path(seeds_dir)
    found = [*seeds_dir.glob("step-*.parquet"), *(seeds_dir / BANK_DIR).glob("step-*.arrow")]
    unlisted = sorted(name for name in (p.relative_to(seeds_dir).as_posix() for p in found) if name not in listed)
    if not unlisted:
        return []
    target = set_aside_folder(seeds_dir / "superseded")
    for name in unlisted:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(seeds_dir / name, target / name)
    return unlisted


# ---------------------------------------------------------------------------------------------------------------------
# Reading a run's own shards (resume)


def verify_shards(manifest: SeedManifest, shards: Sequence[dict], bank_files: bool = True) -> dict[str, str]:
    """What is wrong with each file of `shards` (manifest entries): {file name: problem}, files found whole left out.

    Every Parquet shard (and with `bank_files` every `.arrow` file) is checked against the SHA-256 the manifest
    recorded; entries of format 1 carry none and are only checked to exist. Files are hashed in parallel threads
    (hashlib releases the GIL).
    """
    keys = (("file", "sha256"), ("bank_file", "bank_sha256")) if bank_files else (("file", "sha256"),)
    names = [(s[key], s.get(checksum)) for s in shards for key, checksum in keys if s.get(key)]
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        problems = pool.map(lambda item: _damage(manifest.resolve(item[0]), item[1]), names)
    return {name: problem for (name, _), problem in zip(names, problems) if problem is not None}


def read_bank_table(
    manifest: SeedManifest,
    shards: Sequence[dict],
    vocab_size: int | None = None,
    problems: dict[str, str] | None = None,
    repair: bool = True,
) -> pa.Table | None:
    """The bank columns of `shards` (manifest entries), each from a copy whose checksum matches the manifest's.

    `problems` is `verify_shards`'s verdict (computed here when None). The memory-mapped `.arrow` file is read where
    it is whole; else the Parquet shard, and with `repair` the `.arrow` file is written again from it. A damaged
    Parquet shard whose `.arrow` copy is whole still restores the bank, with a warning that names it (the seed
    dataset lacks its other columns). Where neither copy is whole, or a token id lies outside `vocab_size`, one line
    names the file.
    """
    tables = read_bank_tables(manifest, shards, vocab_size, problems, repair)
    return pa.concat_tables(tables, promote_options="default") if tables else None


def read_bank_tables(
    manifest: SeedManifest,
    shards: Sequence[dict],
    vocab_size: int | None = None,
    problems: dict[str, str] | None = None,
    repair: bool = True,
) -> list[pa.Table]:
    """`read_bank_table`'s tables, one per shard."""
    problems = verify_shards(manifest, shards) if problems is None else problems
    tables = []
    for shard in shards:
        table, path = _read_bank_copy(manifest, shard, problems, repair)
        if vocab_size is not None:
            _check_token_ids(
                table.column("completion_ids"),
                vocab_size,
                str(path),
                "it is damaged, or this run's tokenizer is not the one that wrote it. Resume with the run's own "
                "tokenizer, or from a checkpoint before its step.",
            )
        tables.append(table)
    return tables


def same_bank_files(manifest: SeedManifest, shards: Sequence[dict]) -> list[bool]:
    """Whether each shard's `.arrow` file in `manifest`'s folder holds the bytes the entry's checksum records.

    What a rank that is not the main process checks before it maps its own copy (another node's disk may hold a stale
    copy, or none): an entry without a checksum cannot be vouched for, so it counts as different.
    """
    names = [(s.get("bank_file"), s.get("bank_sha256")) for s in shards]
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda item: None not in item and same_file(manifest.resolve(item[0]), item[1]), names))


def table_bytes(table: pa.Table) -> bytes:
    """`table` as an Arrow IPC stream, to send to another process (`table_of_bytes` reads it back)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def table_of_bytes(data: bytes) -> pa.Table:
    """The table `table_bytes` wrote; its columns are views of `data`, not copies."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def _read_bank_copy(
    manifest: SeedManifest, shard: dict, problems: dict[str, str], repair: bool
) -> tuple[pa.Table, Path]:
    """The bank columns of one shard and the copy they were read from."""
    parquet = manifest.resolve(shard["file"])
    arrow = manifest.resolve(shard["bank_file"]) if shard.get("bank_file") else None
    parquet_problem = problems.get(shard["file"])
    arrow_problem = problems.get(shard["bank_file"]) if arrow is not None else "not recorded"
    if arrow_problem is None:
        try:
            table = map_bank_file(arrow)
        except (pa.ArrowInvalid, OSError) as error:  # a copy without a checksum may still be torn
            arrow_problem = f"unreadable ({error})"
        else:
            if parquet_problem is not None:
                logger.warning(
                    f"The seed shard {parquet} is {parquet_problem}: the bank is restored from its copy {arrow}, but "
                    "the seed dataset (load_dataset, the Hub) lacks that shard's rows. Restore the file from the Hub "
                    "seed dataset if it was pushed."
                )
            return table, arrow
    if parquet_problem is None:
        try:
            table = pq.read_table(parquet, columns=bank_columns(pq.read_schema(parquet).names))
        except (pa.ArrowInvalid, OSError) as error:
            parquet_problem = f"unreadable ({error})"
        else:
            if arrow is not None:
                logger.warning(f"{arrow} is {arrow_problem}: the bank is read from {parquet}.")
                if repair:
                    shard["bank_sha256"] = write_bank_file(table, arrow)
            return table, parquet
    raise ValueError(
        f"Cannot read the seed shard {parquet}: it is {parquet_problem}, and its copy "
        f"{arrow if arrow is not None else '(no .arrow file)'} is {arrow_problem}. Restore the file (e.g. from the "
        "Hub seed dataset), or resume from a checkpoint before its step."
    )


def _damage(path: Path, checksum: str | None) -> str | None:
    """What is wrong with a copy (None: nothing found); a copy without a recorded checksum cannot be verified."""
    if not path.is_file():
        return "missing"
    if checksum is not None and file_sha256(path) != checksum:
        return "damaged (its SHA-256 differs from the manifest's)"
    return None


def map_bank_file(path: str | os.PathLike) -> pa.Table:
    """The bank columns of a snapshot, memory-mapped: reading them touches the page cache, not this process's heap."""
    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


def read_table(paths: Sequence[Path], columns: Sequence[str] | None = None) -> pa.Table | None:
    """The rows of Parquet files, concatenated; a file that is not Parquet is named in one line."""
    tables = []
    for path in paths:
        try:
            tables.append(check_text(pq.read_table(path, columns=None if columns is None else list(columns)), path))
        except (pa.ArrowInvalid, OSError) as error:
            raise ValueError(f"Cannot read the seed shard {path}: {error}. Restore or remove the file.") from None
    return pa.concat_tables(tables, promote_options="default") if tables else None


# ---------------------------------------------------------------------------------------------------------------------
# Reading another run's seed dataset (`seed_dataset`)


def resolve_seed_dataset(path: str | os.PathLike) -> list[Path]:
    """The Parquet shards of a local seed dataset: a run directory, its `seeds/` folder, a folder or one file.

    With a manifest, its shards are checked against their recorded checksums.
    """
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    for seeds_dir in (path / SEEDS_DIR, path):
        manifest = SeedManifest.load(seeds_dir)
        if manifest is not None:
            problems = verify_shards(manifest, manifest.shards, bank_files=False)
            if problems:
                name, problem = next(iter(problems.items()))
                raise ValueError(
                    f"The seed shard {manifest.resolve(name)} is {problem}. Restore it, or remove its entry from "
                    f"{SeedManifest.path(seeds_dir)}."
                )
            return manifest.paths()
    files = sorted(path.glob("**/*.parquet")) if path.is_dir() else []
    files = [f for f in files if "superseded" not in f.parts and not f.name.startswith(".")]
    if not files:
        raise ValueError(
            f"seed_dataset={str(path)!r} holds no seed dataset: expected a run directory with seeds/manifest.json, a "
            "folder of Parquet shards, or a .parquet file. Pass the output_dir of an earlier run, or its seeds/ folder."
        )
    return files


def load_seed_table(
    path: str | os.PathLike, tokenizer_fp: str, vocab_size: int, assume_same_tokenizer: bool = False
) -> pa.Table:
    """Reads a seed dataset and checks that it fits this run, column by column; the bank columns come back cast.

    Refused, naming the dataset and the column: a missing column, a type the bank cannot read as such (token ids that
    are not integers, log-probs or rewards that are not numbers), a null token id or row, a row whose log-probs do not
    align with its ids, another tokenizer's fingerprint, token ids outside the vocabulary, and rows without a
    tokenizer fingerprint unless `assume_same_tokenizer`.

    Long: one column after another, each refusal next to the condition it names.
    """
    source = f"seed_dataset={str(path)!r}"
    table = read_table(resolve_seed_dataset(path))
    missing = [c for c in BANK_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(
            f"{source} lacks the column(s) {missing}; a seed dataset needs {list(BANK_COLUMNS)}. Point seed_dataset "
            "at the seeds written by a ts_trl run."
        )
    for name in ("rollout_id", "prompt_id"):
        column = table.column(name)
        if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
            raise ValueError(f"{source}: column {name!r} must hold strings, not {column.type}.")
        if column.null_count:
            raise ValueError(f"{source}: column {name!r} has {column.null_count} null value(s); every row needs one.")
    ids = _list_column(table, "completion_ids", source, integers=True)
    logprobs = _list_column(table, "logprobs", source, integers=False)
    if not np.array_equal(_lengths(ids), _lengths(logprobs)):
        raise ValueError(f"{source}: the lists in 'logprobs' and 'completion_ids' differ in length; they must align.")
    for name, integers in (("reward", False), ("step", True)):
        column = table.column(name)
        if not (pa.types.is_integer(column.type) or (not integers and pa.types.is_floating(column.type))):
            raise ValueError(
                f"{source}: column {name!r} must hold {'integers' if integers else 'numbers'}, not {column.type}."
            )
        if integers and column.null_count:
            raise ValueError(f"{source}: column {name!r} has {column.null_count} null value(s).")
    found = set(table.column("tokenizer").unique().to_pylist()) if "tokenizer" in table.column_names else {None}
    if found - {None, tokenizer_fp}:
        raise ValueError(
            f"{source} was made with a tokenizer of another vocabulary (fingerprint {sorted(found - {None})}, this "
            f"run's is {tokenizer_fp!r}); its token ids would mean other text. Seed from a dataset made with the same "
            "tokenizer, or leave seed_dataset unset."
        )
    if None in found and not assume_same_tokenizer:
        raise ValueError(
            f"{source}: column 'tokenizer' is missing or null in some rows, so nothing says which tokenizer made its "
            "token ids; another tokenizer's ids would be trained on as other text. Seed from a dataset written by "
            "ts_trl, or set seed_dataset_same_tokenizer=True if you know the ids are this tokenizer's."
        )
    _check_token_ids(
        ids, vocab_size, source, "it comes from another tokenizer. Seed from a dataset made with the same tokenizer."
    )
    table = table.set_column(table.schema.get_field_index("completion_ids"), "completion_ids", ids)
    return table.set_column(table.schema.get_field_index("logprobs"), "logprobs", logprobs)


def _list_column(table: pa.Table, name: str, source: str, integers: bool) -> pa.ChunkedArray:
    """Column `name` as list<int32> (token ids) or list<float32> (log-probs); refuses what does not convert exactly."""
    column = table.column(name)
    what = "integer token ids" if integers else "numbers (log-probs)"
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        raise ValueError(f"{source}: column {name!r} must hold a list of {what} per row, not {column.type}.")
    values_type = column.type.value_type
    if not (pa.types.is_integer(values_type) or pa.types.is_floating(values_type)):
        raise ValueError(f"{source}: column {name!r} must hold lists of {what}, not lists of {values_type}.")
    if column.null_count:
        raise ValueError(f"{source}: column {name!r} has {column.null_count} null row(s); every row needs its list.")
    column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    values = column.flatten()
    if integers:
        if values.null_count:
            raise ValueError(f"{source}: column {name!r} holds {values.null_count} null token id(s).")
        if pa.types.is_floating(values_type):
            flat = values.to_numpy(zero_copy_only=False)
            if not np.array_equal(flat, np.round(flat)):
                raise ValueError(
                    f"{source}: column {name!r} holds fractional token ids, e.g. {flat[flat % 1 != 0][0]}."
                )
    target = pa.list_(pa.int32() if integers else pa.float32())
    try:
        return pa.chunked_array([column.cast(target)])
    except (pa.ArrowInvalid, OverflowError) as error:
        raise ValueError(f"{source}: column {name!r} does not fit {target}: {error}.") from None


def _lengths(column: pa.ChunkedArray) -> np.ndarray:
    return column.chunk(0).value_lengths().to_numpy(zero_copy_only=False)


def _check_token_ids(ids: pa.ChunkedArray, vocab_size: int, source: str, why: str) -> None:
    flat = pa.chunked_array([chunk.flatten() for chunk in ids.chunks], ids.type.value_type)
    if len(flat) == 0:
        return
    low, high = (value.as_py() for value in pc.min_max(flat).values())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"{source} holds token ids outside this tokenizer's vocabulary (size {vocab_size}; found {low}..{high}): "
            f"{why}"
        )
