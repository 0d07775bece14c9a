"""The seed dataset on disk, in one place: its schema, the manifest with a checksum of every file, atomic writes, and
reading with the checks that a damaged, malformed or foreign dataset must pass. See docs/seed-dataset.md.

Layout of a run's output directory::

    seeds/manifest.json                 run id, model, tokenizer fingerprint, the shards and their SHA-256
    seeds/step-000100.parquet           the rollouts generated since the previous snapshot, one row each
    seeds/bank/step-000100.arrow        the same rows' bank columns, uncompressed Arrow IPC, for memory-mapping

Every file is written to a temporary `.<name>.tmp-<pid>` beside it, flushed and renamed, and the manifest is replaced
the same way after its shard, so a crash at any moment leaves either the previous or the new snapshot, never a torn
one. The Parquet shard is the seed dataset (what the Hub and `load_dataset` read); its `.arrow` twin is a local copy
of the columns the bank reads, so that a damaged copy of either can be recovered from the other.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

logger = logging.getLogger(__name__)


SEEDS_DIR = "seeds"
MANIFEST = "manifest.json"
BANK_DIR = "bank"
MANIFEST_FORMAT = 2  # 2: every shard entry carries `sha256` and `bank_sha256`; 1 (no checksums) is still read
MANIFEST_KEYS = ("format", "run_id", "model", "tokenizer", "shards", "external")  # others are kept as they are
SAMPLING_METADATA_KEY = b"ts_trl.sampling"  # a shard's Parquet metadata: how its rollouts were sampled (JSON)
TEMPORARY = re.compile(r"^\..+\.tmp-(\d+)$")  # `atomic_write`'s temporary files: `.<name>.tmp-<pid>`


@dataclass(frozen=True)
class Rollout:
    """One generated response, as written to the seed dataset (one Parquet row)."""

    rollout_id: str
    prompt_id: str
    prompt: str
    completion: str
    completion_ids: Sequence[int]
    logprobs: Sequence[float]
    reward: float
    step: int
    prefix_len: int = 0
    seed_origin: str | None = None
    rewards: dict[str, float] = field(default_factory=dict)  # per reward function
    tool_mask: Sequence[int] | None = None  # multi-turn rollouts: 1 on model tokens, 0 on tool results (TRL's)


class SeedColumn(NamedTuple):
    name: str
    type: pa.DataType
    meaning: str
    nullable: bool = False


# The columns of a seed dataset, in shard order; `reward_<name>` columns (float32, one per reward function) go
# after `reward`.
SEED_COLUMNS = (
    SeedColumn("rollout_id", pa.string(), "Unique id of the rollout."),
    SeedColumn("prompt_id", pa.string(), "Stable id of the prompt (a hash of it unless the training set had one)."),
    SeedColumn(
        "prompt",
        pa.string(),
        "The prompt; JSON text of the messages for conversational prompts, or of the row for rows whose environment "
        "makes the prompt.",
    ),
    SeedColumn("completion", pa.string(), "The decoded response: seed prefix (if any), then the generated tokens."),
    SeedColumn("completion_ids", pa.list_(pa.int32()), "Token ids of the response."),
    SeedColumn("logprobs", pa.list_(pa.float32()), "Per-token log-probs of the policy that produced each token."),
    SeedColumn("reward", pa.float32(), "Total reward of the whole response.", nullable=True),
    SeedColumn("step", pa.int32(), "Training step at which the rollout was generated."),
    SeedColumn(
        "checkpoint", pa.string(), "The checkpoint folder whose snapshot holds the row, e.g. `checkpoint-100`."
    ),
    SeedColumn("prefix_len", pa.int32(), "Number of leading tokens copied from a seed (0: from the prompt alone)."),
    SeedColumn("seed_origin", pa.string(), "`rollout_id` of the seed the prefix was cut from.", nullable=True),
    SeedColumn("model", pa.string(), "The model that was trained."),
    SeedColumn("tokenizer", pa.string(), "Fingerprint of the tokenizer's vocabulary."),
)
BANK_COLUMNS = ("rollout_id", "prompt_id", "completion_ids", "logprobs", "reward", "step")  # what the bank reads


def column_type_name(column: SeedColumn) -> str:
    """How a dataset card shows a column's type: `list<int32>`, `string (nullable)`."""
    name = str(column.type).replace("item: ", "")
    return f"{name} (nullable)" if column.nullable else name


# Multi-turn rollouts (tools, environments) add two columns after these: TRL's tool mask and the OpenAI-style messages.
TOOL_CALL_TYPE = pa.struct(
    [("type", pa.string()), ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))]
)
MESSAGE_TYPE = pa.struct(
    [("role", pa.string()), ("content", pa.string()), ("name", pa.string()), ("tool_calls", pa.list_(TOOL_CALL_TYPE))]
)
TURN_COLUMNS = (
    SeedColumn(
        "tool_mask",
        pa.list_(pa.int8()),
        "Multi-turn rollouts: per token of `completion_ids`, 1 for the model's tokens, 0 for tool results.",
        nullable=True,
    ),
    SeedColumn(
        "messages",
        pa.list_(MESSAGE_TYPE),
        "Multi-turn rollouts: the response as OpenAI-style messages (assistant turns with `tool_calls`, whose "
        "`arguments` are JSON text, and `tool` results).",
        nullable=True,
    ),
)


def openai_messages(completion: str) -> list[dict]:
    """A multi-turn completion (JSON of TRL's messages) as rows of `MESSAGE_TYPE`."""
    rows = []
    for message in json.loads(completion):
        calls = [
            {
                "type": call.get("type", "function"),
                "function": {
                    "name": call["function"]["name"],
                    "arguments": json.dumps(call["function"].get("arguments", {})),
                },
            }
            for call in message.get("tool_calls") or []
        ]
        content = message.get("content")
        rows.append(
            {
                "role": message["role"],
                "content": content if isinstance(content, str) or content is None else json.dumps(content),
                "name": message.get("name"),
                "tool_calls": calls or None,
            }
        )
    return rows


def seed_schema(reward_names: Sequence[str]) -> pa.Schema:
    """The Arrow schema of a run's shards, with one `reward_<name>` column per reward function."""
    fields = []
    for column in SEED_COLUMNS:
        fields.append(pa.field(column.name, column.type))
        if column.name == "reward":
            fields += [pa.field(f"reward_{name}", pa.float32()) for name in reward_names]
    return pa.schema(fields)


def bank_columns(names: Sequence[str]) -> list[str]:
    """The columns of a table the bank reads: its own and the per-function rewards (one may be the success reward),
    and for multi-turn rollouts their tool mask and completion (the recorded messages that a replay needs)."""
    turns = ("tool_mask", "completion") if "tool_mask" in names else ()
    return [n for n in names if n in BANK_COLUMNS or n.startswith("reward_") or n in turns]


def shard_name(step: int) -> str:
    return f"step-{step:06d}.parquet"


def bank_file_name(step: int) -> str:
    return f"{BANK_DIR}/step-{step:06d}.arrow"


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the vocabulary (token -> id), equal for tokenizers that map text to the same ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------------------
# Writing


def rollouts_to_table(
    rollouts: Sequence[Rollout],
    checkpoint: str,
    model: str,
    tokenizer: str,
    reward_names: Sequence[str],
    sampling: dict | None = None,
) -> pa.Table:
    """The seed-dataset rows of `rollouts`, with list columns built from flat arrays (no per-token Python objects).

    `sampling` (see `snapshots.sampling_settings`) goes into the table's metadata.
    """
    lengths = np.fromiter((len(r.completion_ids) for r in rollouts), dtype=np.int32, count=len(rollouts))
    offsets = np.zeros(len(rollouts) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat_ids = np.concatenate([np.asarray(r.completion_ids, np.int32) for r in rollouts] or [np.zeros(0, np.int32)])
    flat_logps = np.concatenate([np.asarray(r.logprobs, np.float32) for r in rollouts] or [np.zeros(0, np.float32)])
    columns = {
        "rollout_id": [r.rollout_id for r in rollouts],
        "prompt_id": [r.prompt_id for r in rollouts],
        "prompt": [r.prompt for r in rollouts],
        "completion": [r.completion for r in rollouts],
        "completion_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat_ids)),
        "logprobs": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat_logps)),
        "reward": [r.reward for r in rollouts],
        **{f"reward_{name}": [r.rewards.get(name) for r in rollouts] for name in reward_names},
        "step": [r.step for r in rollouts],
        "checkpoint": [checkpoint] * len(rollouts),
        "prefix_len": [r.prefix_len for r in rollouts],
        "seed_origin": [r.seed_origin for r in rollouts],
        "model": [model] * len(rollouts),
        "tokenizer": [tokenizer] * len(rollouts),
    }
    schema = seed_schema(reward_names)
    if any(r.tool_mask is not None for r in rollouts):
        columns["tool_mask"] = [None if r.tool_mask is None else [int(x) for x in r.tool_mask] for r in rollouts]
        columns["messages"] = [None if r.tool_mask is None else openai_messages(r.completion) for r in rollouts]
        for column in TURN_COLUMNS:
            schema = schema.append(pa.field(column.name, column.type))
    table = pa.table([pa.array(columns[f.name], f.type) for f in schema], schema=schema)
    return with_sampling_metadata(table, sampling)


def with_sampling_metadata(table: pa.Table, sampling: dict | None) -> pa.Table:
    """`table` carrying `sampling` in its Parquet metadata; unchanged when None."""
    if not sampling:
        return table
    return table.replace_schema_metadata({SAMPLING_METADATA_KEY: json.dumps(sampling, sort_keys=True).encode()})


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> str:
    """Has `write(temporary)` write the file, then flushes it, renames it to `path` and returns its SHA-256.

    Readers never see a partial file: a crash leaves the previous `path` (or none) and at most a temporary file,
    which `remove_stale_temporaries` clears at the next start. The checksum is of the bytes on disk, read back from
    the page cache before the rename.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(temporary)
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
        checksum = file_sha256(temporary)
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):  # the cleanup's own failure (a read-only disk) must not hide the cause
            temporary.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise _write_error(path, error) from None
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a power cut once the folder is flushed
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return checksum


def _write_error(path: Path, error: OSError) -> OSError:
    """One line naming the file that could not be written, and why; the file's previous version is untouched."""
    code = error.errno  # pyarrow's writers set it too
    if code in (errno.ENOSPC, errno.EDQUOT):
        why = "the disk is full (or over quota)"
        fix = f"Free space on the disk of {path.parent}, then resume from the last checkpoint"
    else:
        why = " ".join(str(error).split())
        fix = "Fix the folder, then resume from the last checkpoint"
    return OSError(
        code,
        f"Cannot write {path}: {why}. The files written before it are whole and listed in the manifest. {fix}.",
    )


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> str:
    return atomic_write(path, lambda temporary: Path(temporary).write_bytes(data))


def atomic_write_json(path: str | os.PathLike, payload: dict) -> str:
    return atomic_write_bytes(path, (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode())


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


def file_sha256(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def remove_stale_temporaries(folders: Sequence[str | os.PathLike]) -> list[Path]:
    """Deletes the temporary files that a killed writer left in `folders` (those of processes no longer alive).

    A temporary file of a live process is left alone: it may be a write in progress. This process's own are stale
    when it calls this (it writes nothing meanwhile), so a run that crashed and restarted in one process clears them.
    """
    removed = []
    for folder in map(Path, folders):
        for path in folder.glob(".*.tmp-*") if folder.is_dir() else ():
            match = TEMPORARY.match(path.name)
            if match and path.is_file() and not _is_other_live_process(int(match.group(1))):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def _is_other_live_process(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


# ---------------------------------------------------------------------------------------------------------------------
# The manifest


def hub_cache_blobs(folder: Path) -> Path | None:
    """The `blobs/` folder of the Hugging Face cache repo whose snapshot holds `folder`, if it lies in one: the cache
    stores a snapshot's files as symbolic links into it, so a downloaded seeds folder's files lead there."""
    parts = Path(folder).absolute().parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith(("datasets--", "models--")):
            return (Path(*parts[:i]) / "blobs").resolve()
    return None


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


def set_aside_folder(root: Path) -> Path:
    """A new folder under `root` named by the time to the second, suffixed `-2`, `-3`... when that name is taken:
    two set-asides in one second must not overwrite each other's files."""
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1, 10_000):
        target = root / (stamp if attempt == 1 else f"{stamp}-{attempt}")
        try:
            target.mkdir()
        except FileExistsError:
            continue
        return target
    raise FileExistsError(f"{root} holds 9999 folders named {stamp}*; move some away.")


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


def same_file(path: Path, checksum: str) -> bool:
    """Whether `path` is a file whose SHA-256 is `checksum`."""
    return path.is_file() and file_sha256(path) == checksum


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


def check_text(table: pa.Table, path: str | os.PathLike) -> pa.Table:
    """`table`, once its text columns are checked to be UTF-8: Parquet readers do not check, and a bad byte would
    otherwise surface as a `UnicodeDecodeError` at the first step that reads the row."""
    for name, column in zip(table.column_names, table.columns):
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            try:
                column.validate(full=True)
            except pa.ArrowInvalid as error:
                raise ValueError(
                    f"{path}: column {name!r} holds text that is not valid UTF-8 ({error}). Repair or remove the file."
                ) from None
    return table


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


def is_hub_id(name: str | None) -> bool:
    """Whether `name` reads as a Hub repo id (`org/name`) rather than a local path: no such path exists, and it is
    two names of letters, digits, `_`, `.` and `-` (neither starting with `.` or `-`), joined by one slash."""
    return (
        bool(name) and re.fullmatch(r"\w[\w.-]*/\w[\w.-]*", name) is not None and not Path(name).expanduser().exists()
    )


def prompt_id_of(prompt: str | list[dict]) -> str:
    """Stable id of a prompt: 16 hex chars of the sha1 of its text, or of its canonical JSON for chat messages."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]
