"""The seed dataset on disk: Parquet shards written atomically at each checkpoint, a manifest, and their loading.

Layout of a run's output directory::

    seeds/manifest.json            run id, model, tokenizer fingerprint, and the list of shards
    seeds/step-000100.parquet      the rollouts generated since the previous snapshot, one row each
    checkpoint-100/seed_snapshot.json   which shards (and how many rows) the bank held at that checkpoint

A shard is written to a temporary file, flushed and renamed, then the manifest is replaced the same way, so a crash
at any moment leaves either the previous or the new snapshot readable, never a torn one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from accelerate.utils import broadcast_object_list, gather_object
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .bank import TABLE_COLUMNS, Rollout, SeedBank

logger = logging.getLogger(__name__)
HUB_CLOSE_TIMEOUT = 600.0  # seconds the end of training waits for seed uploads before reporting what is left

SEEDS_DIR = "seeds"
MANIFEST = "manifest.json"
CHECKPOINT_POINTER = "seed_snapshot.json"
BANK_DIR = "bank"  # seeds/bank/step-XXXXXX.arrow: memory-mappable copies of the shards' bank columns
MANIFEST_FORMAT = 1
SAMPLING_METADATA_KEY = b"ts_trl.sampling"  # a shard's Parquet metadata: how its rollouts were sampled (JSON)
REQUIRED_COLUMNS = TABLE_COLUMNS


def shard_name(step: int) -> str:
    return f"step-{step:06d}.parquet"


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the vocabulary (token -> id), equal for tokenizers that map text to the same ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Writes `data` to `path` through a flushed temporary file and a rename, so readers never see a partial file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, payload: dict) -> None:
    atomic_write_bytes(path, (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode())


def sampling_settings(args, use_vllm: bool) -> dict:
    """How a run samples, recorded in each shard's metadata: analyses read the log-probs and sample the same way.

    `logprobs` says what the stored log-probs are: vLLM's processed ones (after top-k / top-p) or, with HF
    `generate`, the training forward's (logits / temperature over the whole vocabulary). `seed` is also the built-in
    task's train / held-out split.
    """
    settings = {
        "temperature": args.temperature,
        "top_k": args.top_k or 0,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
    }
    settings.update({k: v for k, v in (args.generation_kwargs or {}).items() if k in settings})
    return {
        **settings,
        "max_completion_length": args.max_completion_length,
        "seed": args.seed,
        "cut_at_newline": args.cut_at_newline,
        "logprobs": "sampler" if use_vllm else "policy",
    }


def rollouts_to_table(
    rollouts: Sequence[Rollout],
    checkpoint: str,
    model: str,
    tokenizer: str,
    reward_names: Sequence[str],
    sampling: dict | None = None,
) -> pa.Table:
    """The seed-dataset rows of `rollouts`, with list columns built from flat arrays (no per-token Python objects).

    `sampling` (see `sampling_settings`) goes into the table's metadata.
    """
    lengths = np.fromiter((len(r.completion_ids) for r in rollouts), dtype=np.int32, count=len(rollouts))
    offsets = np.zeros(len(rollouts) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat_ids = np.concatenate([np.asarray(r.completion_ids, np.int32) for r in rollouts] or [np.zeros(0, np.int32)])
    flat_logps = np.concatenate([np.asarray(r.logprobs, np.float32) for r in rollouts] or [np.zeros(0, np.float32)])
    columns = {
        "rollout_id": pa.array([r.rollout_id for r in rollouts], pa.string()),
        "prompt_id": pa.array([r.prompt_id for r in rollouts], pa.string()),
        "prompt": pa.array([r.prompt for r in rollouts], pa.string()),
        "completion": pa.array([r.completion for r in rollouts], pa.string()),
        "completion_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat_ids)),
        "logprobs": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat_logps)),
        "reward": pa.array([r.reward for r in rollouts], pa.float32()),
    }
    for name in reward_names:
        columns[f"reward_{name}"] = pa.array([r.rewards.get(name) for r in rollouts], pa.float32())
    columns |= {
        "step": pa.array([r.step for r in rollouts], pa.int32()),
        "checkpoint": pa.array([checkpoint] * len(rollouts), pa.string()),
        "prefix_len": pa.array([r.prefix_len for r in rollouts], pa.int32()),
        "seed_origin": pa.array([r.seed_origin for r in rollouts], pa.string()),
        "model": pa.array([model] * len(rollouts), pa.string()),
        "tokenizer": pa.array([tokenizer] * len(rollouts), pa.string()),
    }
    return with_sampling_metadata(pa.table(columns), sampling)


def with_sampling_metadata(table: pa.Table, sampling: dict | None) -> pa.Table:
    """`table` carrying `sampling` (see `sampling_settings`) in its Parquet metadata; unchanged when None."""
    if not sampling:
        return table
    return table.replace_schema_metadata({SAMPLING_METADATA_KEY: json.dumps(sampling, sort_keys=True).encode()})


def write_shard(table: pa.Table, path: Path) -> None:
    """Writes one shard atomically (temporary file, fsync, rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


class SeedManifest:
    """The list of shards of a run's seed dataset (`seeds/manifest.json`), replaced atomically on every change."""

    def __init__(self, seeds_dir: Path, run_id: str, model: str, tokenizer: str, shards: list[dict] | None = None):
        self.seeds_dir = Path(seeds_dir)
        self.run_id, self.model, self.tokenizer = run_id, model, tokenizer
        self.shards = shards or []

    @classmethod
    def load(cls, seeds_dir: Path) -> SeedManifest | None:
        path = Path(seeds_dir) / MANIFEST
        if not path.exists():
            return None
        payload = json.loads(path.read_text())
        return cls(seeds_dir, payload["run_id"], payload["model"], payload["tokenizer"], payload["shards"])

    def save(self) -> None:
        payload = {
            "format": MANIFEST_FORMAT,
            "run_id": self.run_id,
            "model": self.model,
            "tokenizer": self.tokenizer,
            "shards": self.shards,
        }
        atomic_write_json(self.seeds_dir / MANIFEST, payload)

    def record(self, file: str, step: int, rows: int, bank_file: str | None = None) -> None:
        entry = {"file": file, "step": step, "rows": rows} | ({"bank_file": bank_file} if bank_file else {})
        self.shards = [s for s in self.shards if s["file"] != file] + [entry]
        self.shards.sort(key=lambda s: s["step"])

    def paths(self, max_step: int | None = None) -> list[Path]:
        return [self.seeds_dir / s["file"] for s in self.shards if max_step is None or s["step"] <= max_step]

    def set_aside_after(self, step: int) -> list[str]:
        """Moves the shards of steps after `step` (an abandoned branch of a resumed run) to `seeds/superseded/`.

        They are kept, never deleted: a resumed run writes new shards under the same names.
        """
        later = [s for s in self.shards if s["step"] > step]
        if not later:
            return []
        target = self.seeds_dir / "superseded" / time.strftime("%Y%m%d-%H%M%S")
        target.mkdir(parents=True, exist_ok=True)
        for s in later:
            for name in (s["file"], s.get("bank_file")):
                if name and (self.seeds_dir / name).exists():
                    (target / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(self.seeds_dir / name, target / name)
        self.shards = [s for s in self.shards if s["step"] <= step]
        self.save()
        return [s["file"] for s in later]


def bank_file_name(step: int) -> str:
    return f"{BANK_DIR}/step-{step:06d}.arrow"


def write_bank_file(table: pa.Table, path: Path) -> None:
    """Writes the columns the seed bank reads as an uncompressed Arrow IPC file, atomically, for memory-mapping.

    The Parquet shard stays the seed dataset; this file is a local cache of it that every rank on the node maps, so
    the node holds one copy of the token ids in the page cache instead of one per rank.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    table = table.select(_bank_columns(table.column_names))
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def map_bank_file(path: Path) -> pa.Table:
    """The bank columns of a snapshot, memory-mapped: reading them touches the page cache, not this process's heap."""
    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


def read_bank_tables(seeds_dir: Path, shards: Sequence[dict]) -> pa.Table | None:
    """The bank columns of `shards`: from their memory-mapped Arrow files where present, else from the Parquet."""
    tables = []
    for shard in shards:
        bank_file = Path(seeds_dir) / shard["bank_file"] if shard.get("bank_file") else None
        if bank_file is not None and bank_file.exists():
            tables.append(map_bank_file(bank_file))
        else:
            path = Path(seeds_dir) / shard["file"]
            tables.append(pq.read_table(path, columns=_bank_columns(pq.read_schema(path).names)))
    return pa.concat_tables(tables, promote_options="default") if tables else None


def read_table(paths: Sequence[Path], columns: Sequence[str] | None = None) -> pa.Table | None:
    tables = [pq.read_table(p, columns=None if columns is None else list(columns)) for p in paths]
    return pa.concat_tables(tables, promote_options="default") if tables else None


def fill_bank(bank: SeedBank, table: pa.Table, external: bool = False) -> None:
    """Adds every row of a seed-dataset table to `bank`, column by column (the token buffers are not copied).

    The success reward's own column is the bank's reward where the dataset has it (a ts_trl run's shards do), else the
    weighted total.
    """
    if table is None or table.num_rows == 0:
        return
    success_column = f"reward_{bank.success_reward}"
    if bank.success_reward and success_column in table.column_names:
        table = table.set_column(table.schema.get_field_index("reward"), "reward", table.column(success_column))
    bank.add_table(table, external=external)


def _bank_columns(names: Sequence[str]) -> list[str]:
    """The columns the bank reads: its own and the per-function rewards (one may be the success reward)."""
    return [n for n in names if n in TABLE_COLUMNS or n.startswith("reward_")]


def resolve_seed_dataset(path: str | os.PathLike) -> list[Path]:
    """The Parquet shards of a local seed dataset: a run directory, its `seeds/` folder, a folder or one file."""
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    for seeds_dir in (path / SEEDS_DIR, path):
        manifest = SeedManifest.load(seeds_dir)
        if manifest is not None:
            return manifest.paths()
    files = sorted(path.glob("**/*.parquet")) if path.is_dir() else []
    files = [f for f in files if "superseded" not in f.parts and not f.name.startswith(".")]
    if not files:
        raise ValueError(
            f"seed_dataset={str(path)!r} holds no seed dataset: expected a run directory with seeds/manifest.json, a "
            "folder of Parquet shards, or a .parquet file. Pass the output_dir of an earlier run, or its seeds/ folder."
        )
    return files


def load_seed_table(path: str | os.PathLike, tokenizer_fp: str, vocab_size: int) -> pa.Table:
    """Reads a seed dataset and checks that it fits this run: required columns, same tokenizer, ids in the vocab."""
    table = read_table(resolve_seed_dataset(path))
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(
            f"seed_dataset={str(path)!r} lacks the column(s) {missing}; a seed dataset needs {list(REQUIRED_COLUMNS)}. "
            "Point seed_dataset at the seeds written by a ts_trl run."
        )
    if "tokenizer" in table.column_names:
        found = set(table.column("tokenizer").unique().to_pylist()) - {None}
        if found and found != {tokenizer_fp}:
            raise ValueError(
                f"seed_dataset={str(path)!r} was made with a tokenizer of another vocabulary (fingerprint "
                f"{sorted(found)}, this run's is {tokenizer_fp!r}); its token ids would mean other text. Seed from a "
                "dataset made with the same tokenizer, or leave seed_dataset unset."
            )
    flat = table.column("completion_ids").combine_chunks().values.to_numpy(zero_copy_only=False)
    if len(flat) and (flat.min() < 0 or flat.max() >= vocab_size):
        raise ValueError(
            f"seed_dataset={str(path)!r} holds token ids outside this tokenizer's vocabulary (size {vocab_size}); it "
            "comes from another tokenizer. Seed from a dataset made with the same tokenizer."
        )
    return table


@dataclass
class PendingRollout:
    """A local rollout waiting for its behaviour log-probs (filled by the training forward pass)."""

    rollout: Rollout
    prefix_logprobs: np.ndarray  # the seed's stored log-probs of the prefix tokens
    logprobs: np.ndarray | None = None

    def complete(self) -> Rollout:
        logprobs = self.logprobs
        if logprobs is None:  # never expected: every row goes through the loss once; keep the row, flag it NaN
            logprobs = np.full(len(self.rollout.completion_ids), np.nan, np.float32)
        k = len(self.prefix_logprobs)
        logprobs = np.concatenate([self.prefix_logprobs, logprobs[k:]]).astype(np.float32)
        return Rollout(**{**self.rollout.__dict__, "logprobs": logprobs})


class SeedStore:
    """Everything a seeded run persists, behind one object: the bank, run id, manifest, shards, pointers, Hub pushes.

    The trainer owns it and hands it rollouts; `SeedSnapshotCallback` tells it when to write. All ranks hold the
    same bank; only the main process writes files and pushes to the Hub.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        accelerator,
        model_name: str,
        tokenizer_fp: str,
        reward_names: Sequence[str],
        external_seeds: pa.Table | None = None,
        hub_dataset_id: str | None = None,
        hub_token: str | None = None,
        hub_private: bool | None = None,
        metrics: dict | None = None,
        card_license: str | None = None,
        trained_model_id: str | None = None,
        success_reward: str | None = None,
        success_threshold: float = 0.0,
        snapshot_steps: int | None = None,
        sampling: dict | None = None,
    ):
        self.output_dir = Path(output_dir)
        self.accelerator = accelerator
        self.model_name, self.tokenizer_fp, self.reward_names = model_name, tokenizer_fp, list(reward_names)
        self.external_seeds = external_seeds
        self.sampling = sampling  # written into every shard's metadata
        self.metrics = metrics if metrics is not None else {}  # the trainer's train metrics: hub/* are logged there
        self.card_license, self.trained_model_id = card_license, trained_model_id
        self.hub_dataset_id = hub_dataset_id
        self.success = (success_reward, success_threshold)
        self.snapshot_steps = snapshot_steps
        # What else a checkpoint must keep for a resumed run to plan as the uninterrupted one (the planner's
        # statistics): `checkpoint_state()` is written into each checkpoint pointer, read back as `resumed_state`.
        self.checkpoint_state = dict
        self.resumed_state: dict = {}
        self.bank = SeedBank(*self.success)
        if external_seeds is not None:
            fill_bank(self.bank, external_seeds, external=True)
        self.run_id: str | None = None
        self.manifest: SeedManifest | None = None
        self.pending: list[PendingRollout] = []  # this rank's rollouts waiting for their behaviour log-probs
        # Main process: the rollouts of all ranks since the last snapshot, as Arrow tables (the shard's own columns,
        # ~8 bytes a token plus the text) rather than Python lists (~36 bytes a token).
        self.unsnapshotted: list[pa.Table] = []
        self.pusher = None
        if hub_dataset_id is not None and accelerator.is_main_process:
            from .hub import SeedHubPusher

            self.pusher = SeedHubPusher(hub_dataset_id, token=hub_token, private=hub_private)
            self.pusher.check_visibility()  # a private run stops here, before training, rather than leak its seeds

    @property
    def seeds_dir(self) -> Path:
        return self.output_dir / SEEDS_DIR

    def start(self, checkpoint: str | None) -> None:
        """Rebuilds the bank: the given seed dataset, then (on resume) exactly the shards the checkpoint covered."""
        accelerator = self.accelerator
        self.bank = SeedBank(*self.success)
        self.pending, self.unsnapshotted, self.resumed_state = [], [], {}
        if self.external_seeds is not None:
            fill_bank(self.bank, self.external_seeds, external=True)
        manifest = SeedManifest.load(self.seeds_dir)
        if checkpoint is not None:
            step = checkpoint_step(checkpoint)
            self.resume_shards(checkpoint)  # stops with one line when this folder lacks the checkpoint's shards
            pointer = Path(checkpoint) / CHECKPOINT_POINTER
            if pointer.exists():
                payload = json.loads(pointer.read_text())
                shards = payload["shards"]
                self.resumed_state = payload.get("state", {})
            else:  # crashed between the shard and the pointer: the shard of this step is on disk already
                shards = [s for s in manifest.shards if s["step"] <= step]
                logger.warning(
                    f"{pointer} is missing: the bank is rebuilt from the shards up to step {step}, but the pass rates "
                    "of seed_selection='passrate' start afresh."
                )
            fill_bank(self.bank, read_bank_tables(self.seeds_dir, shards))
            self.bank.mark_snapshotted()
            run_id = manifest.run_id
            accelerator.wait_for_everyone()  # every rank has read the shards before any is set aside
            if accelerator.is_main_process:
                moved = manifest.set_aside_after(step)
                if moved:
                    logger.warning(f"Resuming at step {step}: later shards {moved} moved to seeds/superseded/.")
        else:
            run_id = secrets.token_hex(4)
            if accelerator.is_main_process and manifest is not None:
                moved = manifest.set_aside_after(-1)
                logger.warning(
                    f"{self.seeds_dir} held the seeds of an earlier run ({len(moved)} shards); they were moved to "
                    "seeds/superseded/. To continue that run instead, pass resume_from_checkpoint."
                )
                manifest = None
        self.run_id = broadcast_object_list([run_id])[0] if accelerator.num_processes > 1 else run_id
        if accelerator.is_main_process:
            self.seeds_dir.mkdir(parents=True, exist_ok=True)
            if manifest is None:
                manifest = SeedManifest(self.seeds_dir, self.run_id, self.model_name, self.tokenizer_fp)
                manifest.save()
            self.manifest = manifest

    def resume_shards(self, checkpoint: str | os.PathLike) -> list[Path]:
        """The shards that rebuild the bank `checkpoint` saw; a one-line `ValueError` when this folder lacks them.

        A checkpoint records its run id and shards (`seed_snapshot.json`). They are gone from `seeds/` when another
        run started in the folder later, or a resume from an earlier checkpoint set them aside: the bank could then
        not be rebuilt exactly, so resuming stops (the shards are still in `seeds/superseded/`, never deleted).
        """
        manifest = SeedManifest.load(self.seeds_dir)
        if manifest is None:
            raise ValueError(
                f"Cannot resume the seed bank: {self.seeds_dir} has no manifest.json. Resume from a checkpoint "
                "in the output_dir of the run that wrote it, or start a new run."
            )
        pointer_path = Path(checkpoint) / CHECKPOINT_POINTER
        if not pointer_path.exists():  # crashed between the shard and the pointer: the shard is on disk already
            return manifest.paths(max_step=checkpoint_step(checkpoint))
        pointer = json.loads(pointer_path.read_text())
        current = {s["file"]: s for s in manifest.shards}
        missing = [s["file"] for s in pointer["shards"] if current.get(s["file"]) != s]
        if pointer.get("run_id") != manifest.run_id or missing:
            why = (
                f"it belongs to run {pointer.get('run_id')}, but {self.seeds_dir} now holds run {manifest.run_id}'s seeds"
                if pointer.get("run_id") != manifest.run_id
                else f"its shards {missing[:3]} are no longer in {self.seeds_dir}"
            )
            raise ValueError(
                f"Cannot resume from {checkpoint}: {why} (a later run or resume moved them to seeds/superseded/). "
                f"Resume from a checkpoint of the run in {self.seeds_dir}, or start a new run in another output_dir."
            )
        return [self.seeds_dir / s["file"] for s in pointer["shards"]]

    def queue(self, rollouts: Sequence[PendingRollout | None]) -> list[int]:
        """Queues a batch's local rollouts until the next `flush`; returns each one's row in the queue (-1 for None).

        A rollout without behaviour log-probs gets them from the training forward, by its row (`fill_logprobs`).
        """
        rows = []
        for pending in rollouts:
            if pending is not None:
                self.pending.append(pending)
            rows.append(len(self.pending) - 1 if pending is not None else -1)
        return rows

    def fill_logprobs(self, rows: Sequence[int], logprobs: np.ndarray) -> None:
        """Sets the behaviour log-probs of the queued rollouts at `rows` (-1: none) from the training forward's."""
        for j, row in enumerate(rows):
            if row >= 0:
                pending = self.pending[row]
                pending.logprobs = logprobs[j, : len(pending.rollout.completion_ids)]

    def flush(self) -> None:
        """Moves the completed local rollouts of every rank into the bank (and, on the main process, the snapshot)."""
        local = [p.complete() for p in self.pending]
        self.pending = []
        rollouts = gather_object(local) if self.accelerator.num_processes > 1 else local
        self.bank.add_rollouts(rollouts)
        if self.accelerator.is_main_process:
            if rollouts:
                table = rollouts_to_table(rollouts, "", self.model_name, self.tokenizer_fp, self.reward_names)
                self.unsnapshotted.append(table)

    def write_snapshot(self, step: int, final: bool = False) -> Path | None:
        """Writes the rollouts since the last snapshot as `seeds/step-XXXXXX.parquet` (main process) and marks them."""
        if self.run_id is None:
            return None
        self.flush()
        path = None
        # An empty shard marks a checkpoint without new rollouts; one already written for this step is kept (a step
        # can both reach `snapshot_steps` and save a checkpoint).
        done = self.manifest is not None and any(s["step"] == step for s in self.manifest.shards)
        if self.accelerator.is_main_process and (self.unsnapshotted or not (final or done)):
            checkpoint = "final" if final else f"{PREFIX_CHECKPOINT_DIR}-{step}"
            tables = self.unsnapshotted or [
                rollouts_to_table([], "", self.model_name, self.tokenizer_fp, self.reward_names)
            ]
            table = pa.concat_tables(tables)
            column = table.schema.get_field_index("checkpoint")
            table = table.set_column(column, "checkpoint", pa.array([checkpoint] * table.num_rows, pa.string()))
            table = with_sampling_metadata(table, self.sampling)
            path = self.seeds_dir / shard_name(step)
            write_shard(table, path)
            write_bank_file(table, self.seeds_dir / bank_file_name(step))
            self.manifest.record(path.name, step, table.num_rows, bank_file_name(step))
            self.manifest.save()
            self.unsnapshotted = []
            self.write_dataset_card(path)
            if self.pusher is not None:
                card = self.dataset_card(path, self.hub_dataset_id, local=False)
                self.pusher.submit(path, card_text=str(card))  # returns at once; the upload runs in the background
                for name, value in self.pusher.status().items():
                    if isinstance(value, int):
                        self.metrics.setdefault(f"hub/{name}", []).append(value)
        self._attach_snapshot(step)
        return path

    def dataset_card(self, shard: Path, dataset_id: str, local: bool):
        from .cards import dataset_card_for_shard

        return dataset_card_for_shard(
            shard, dataset_id, license=self.card_license, trained_model_id=self.trained_model_id, local=local
        )

    def write_dataset_card(self, shard: Path) -> None:
        """Writes `seeds/README.md` for the local layout, so that `load_dataset(<seeds folder>)` reads this run's shards."""
        card = self.dataset_card(shard, str(self.seeds_dir), local=True)
        atomic_write_bytes(self.seeds_dir / "README.md", str(card).encode())

    def _attach_snapshot(self, step: int) -> None:
        """Every rank moves the new rollouts' token ids onto the memory-mapped snapshot the main process just wrote.

        So the ranks of a node share one copy of every snapshotted token id (the page cache) and keep only per-rollout
        metadata of their own. A rank that cannot see the file (another node without a shared output_dir) keeps its
        own copy. Every rank calls this, at every snapshot: the barrier is a collective, and every rank must run the same
        collectives.
        """
        fresh = len(self.bank) - self.bank.num_snapshotted
        if self.accelerator.num_processes > 1:
            self.accelerator.wait_for_everyone()  # the main process has written the file
        path = self.seeds_dir / bank_file_name(step)
        if fresh and path.exists():
            self.bank.attach_snapshot(map_bank_file(path))
        self.bank.mark_snapshotted()

    def write_checkpoint_pointer(self, step: int) -> None:
        """Records in `checkpoint-<step>/` which shards, hence which bank, that checkpoint saw."""
        folder = self.output_dir / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        if self.manifest is None or not folder.is_dir():
            return
        shards = [s for s in self.manifest.shards if s["step"] <= step]
        payload = {"run_id": self.run_id, "step": step, "shards": shards, "rows": sum(s["rows"] for s in shards)}
        payload["state"] = self.checkpoint_state()
        atomic_write_json(folder / CHECKPOINT_POINTER, payload)

    def finish_pushes(self, timeout: float = HUB_CLOSE_TIMEOUT) -> None:
        """Waits (bounded) for the background uploads; what could not be pushed stays on disk and is reported."""
        if self.pusher is not None:
            self.pusher.close(timeout=timeout)


def local_seed_dataset(seed_dataset: str) -> str | Path:
    """A local path as is; a Hub id ('org/name') that is not a local path is downloaded (or read from the cache)."""
    if Path(seed_dataset).expanduser().exists() or seed_dataset.count("/") != 1 or seed_dataset.startswith((".", "/")):
        return seed_dataset
    from .hub import download_seed_dataset

    return download_seed_dataset(seed_dataset)


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    state = Path(checkpoint) / "trainer_state.json"
    if state.exists():
        return int(json.loads(state.read_text())["global_step"])
    name = Path(checkpoint).name
    if name.startswith(f"{PREFIX_CHECKPOINT_DIR}-"):
        return int(name.rsplit("-", 1)[1])
    raise ValueError(f"{checkpoint} is not a checkpoint folder (no trainer_state.json, not named checkpoint-<step>).")


def check_resume_checkpoint(checkpoint: str | os.PathLike, output_dir: str | os.PathLike) -> None:
    """Fails with one line when `checkpoint` is not a checkpoint folder, naming the checkpoints that do exist.

    Checked before the model is loaded (`ts_trl train`) and before `train` rebuilds the seed bank, whose own
    complaints (no seed manifest, no weights) would hide the real mistake: a mistyped or deleted checkpoint.
    """
    path = Path(checkpoint).expanduser()
    if path.is_dir() and (path / "trainer_state.json").is_file():
        return
    problem = "does not exist" if not path.exists() else "is not a checkpoint folder (it has no trainer_state.json)"
    # The checkpoints beside the one asked for, else those of this run's output_dir.
    folder = path.parent if path.parent.is_dir() and path.parent != Path(".") else Path(output_dir)
    found = sorted(
        (p for p in folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if (p / "trainer_state.json").is_file()),
        key=lambda p: checkpoint_step(p),
    )
    existing = (
        f"the checkpoints in {folder} are {', '.join(p.name for p in found)}"
        if found
        else f"{folder} holds no checkpoint"
    )
    raise ValueError(
        f"resume_from_checkpoint={str(checkpoint)!r} {problem}: {existing}. Pass one of those, or leave "
        "resume_from_checkpoint unset to start a new run."
    )


class SeedSnapshotCallback(TrainerCallback):
    """Writes a shard every `seed_snapshot_steps` steps and at the end, and records each checkpoint's shards.

    The shard of a checkpoint is written by `SeedGRPOTrainer._save_checkpoint`, which every save strategy goes
    through right before the checkpoint folder is written, so a checkpoint on disk always has its shard; `on_save`
    then records in the checkpoint which shards it covers.
    """

    def __init__(self, store: SeedStore):
        self.store = store

    def on_step_end(self, args, state, control, **kwargs):
        every = self.store.snapshot_steps
        if every and state.global_step % every == 0:
            self.store.write_snapshot(state.global_step)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.store.write_checkpoint_pointer(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self.store.write_snapshot(state.global_step, final=True)
        self.store.finish_pushes()


class SaveOnInterrupt(TrainerCallback):
    """On Ctrl-C, finishes the current step, saves a checkpoint (and its seed shard) and stops; a second Ctrl-C aborts.

    The save goes through `SeedGRPOTrainer._save_checkpoint` like any other, which writes the seed shard first. Set
    `accelerator` to the trainer's once it exists: with several processes the flag then goes through
    `Accelerator.set_trigger`/`check_trigger` at every step end, so that all ranks save the same step.
    """

    def __init__(self):
        self.interrupted = False
        self.accelerator = None
        self._signalled = False
        self._previous = None

    def _handle(self, signum, frame):
        self._signalled = True
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)
        print(
            "\nInterrupted: saving a checkpoint and its seed snapshot at the end of this step (Ctrl-C again aborts).",
            file=sys.stderr,
            flush=True,
        )

    def on_train_begin(self, args, state, control, **kwargs):
        if os.name == "posix" and hasattr(signal, "SIGINT"):
            with contextlib.suppress(ValueError):  # not the main thread: leave Ctrl-C alone
                self._previous = signal.signal(signal.SIGINT, self._handle)

    def on_step_end(self, args, state, control, **kwargs):
        interrupted = self._signalled
        if self.accelerator is not None and self.accelerator.num_processes > 1:
            # Ranks may see the signal at different steps: every rank asks at every step, and saves where one did.
            if interrupted:
                self.accelerator.set_trigger()
            interrupted = self.accelerator.check_trigger()
        if interrupted:
            self.interrupted = True
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self._previous is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGINT, self._previous)
            self._previous = None
