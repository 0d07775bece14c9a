"""The seed store: a run's bank and what it persists (run id, shards, checkpoint pointers, Hub pushes), and resume.

The on-disk format (schema, manifest, checksums, atomic writes, reading) is `seed_data`'s. A checkpoint folder knows
the shards its bank held::

    checkpoint-100/seed_snapshot.json   run id, step, the manifest entries of the shards up to step 100, planner state
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from accelerate.utils import DistributedType, broadcast_object_list, gather_object
from transformers import TrainerCallback
from transformers.trainer import FSDP_MODEL_NAME, TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import (
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)

from .bank import SeedBank
from .cards import dataset_card_for_shard, model_name_of
from .external_seeds import ExternalSeedSettings, read_external_seeds
from .format import (
    BANK_DIR,
    SEEDS_DIR,
    Rollout,
    SeedManifest,
    atomic_write_bytes,
    atomic_write_json,
    bank_file_name,
    map_bank_file,
    read_bank_tables,
    remove_stale_temporaries,
    rollouts_to_table,
    same_bank_files,
    same_file,
    set_aside_unlisted,
    shard_name,
    table_bytes,
    table_of_bytes,
    tokenizer_fingerprint,
    verify_shards,
    with_sampling_metadata,
    write_bank_file,
    write_shard,
)
from .hub import SeedHubPusher
from .lock import OutputDirLock

logger = logging.getLogger(__name__)
HUB_CLOSE_TIMEOUT = 600.0  # seconds the end of training waits for seed uploads before reporting what is left
CHECKPOINT_POINTER = "seed_snapshot.json"
SHARD_IDENTITY = ("file", "step", "rows", "sha256")  # what a checkpoint pointer and the manifest must agree on


@dataclass(frozen=True)
class StoreSettings:
    """What a `SeedStore` reads of the run's config, built once by the trainer (`StoreSettings.of`)."""

    output_dir: str
    snapshot_steps: int | None = None
    success_threshold: float = 0.0
    card_license: str | None = None
    trained_model_id: str | None = None  # the Hub model repo the dataset card links to (None: not pushed)
    hub_dataset_id: str | None = None  # where shards are pushed (None: not pushed)
    hub_private: bool | None = None
    hub_token: str | None = None
    sampling: dict = field(default_factory=dict)  # how the run samples, written into every shard's metadata
    external: ExternalSeedSettings = field(default_factory=ExternalSeedSettings)

    @classmethod
    def of(cls, config, use_vllm: bool = False) -> StoreSettings:
        """The store's settings from `config` (a `SeedGRPOConfig`)."""
        return cls(
            output_dir=str(config.output_dir),
            snapshot_steps=config.seed_snapshot_steps,
            success_threshold=config.success_threshold,
            card_license=config.card_license,
            trained_model_id=config.hub_model_id if config.push_to_hub else None,
            hub_dataset_id=config.hub_seed_dataset_id if config.push_seeds_to_hub else None,
            hub_private=config.hub_private_repo if config.hub_seeds_private is None else config.hub_seeds_private,
            hub_token=config.hub_token,
            sampling=sampling_settings(config, use_vllm),
            external=ExternalSeedSettings.of(config),
        )


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


def fill_bank(bank: SeedBank, table: pa.Table | None, external: bool = False) -> None:
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


@dataclass
class Resume:
    """What resuming from a checkpoint restores: the shards its bank held (manifest entries) and the planner state."""

    checkpoint: Path
    step: int
    manifest: SeedManifest
    shards: list[dict]
    state: dict = field(default_factory=dict)


class SeedStore:
    """Everything a seeded run persists, behind one object: the bank, run id, manifest, shards, pointers, Hub pushes.

    The trainer owns it and hands it rollouts; `SeedSnapshotCallback` tells it when to write. All ranks hold the
    same bank; only the main process writes files and pushes to the Hub. Settings come from the run's
    `StoreSettings`; `seed_dataset` is read and checked here, at construction.
    """

    def __init__(
        self,
        settings: StoreSettings,
        accelerator,
        model,
        tokenizer,
        reward_names: list[str],
        success_reward: str | None = None,
        metrics: dict | None = None,
        train_dataset=None,
        reward_funcs=(),
        turn_template=None,
    ):
        if not isinstance(settings, StoreSettings):  # a `SeedGRPOConfig`, as earlier releases took
            settings = StoreSettings.of(settings)
        self.output_dir = Path(settings.output_dir)
        self.accelerator = accelerator
        self.model_name = model_name_of(model)
        self.tokenizer_fp, self.reward_names = tokenizer_fingerprint(tokenizer), list(reward_names)
        # Ids the model can emit: its embedding rows may outnumber the tokenizer's entries (padded vocabularies).
        self.vocab_size = max(len(tokenizer), getattr(model.config, "vocab_size", 0) or 0)
        # `seed_dataset`: another run's seeds or any traces (text seeds are re-tokenised, see `external_seeds.py`)
        problem = external = None
        try:
            external = read_external_seeds(
                settings.external,
                tokenizer,
                self.tokenizer_fp,
                train_dataset,
                reward_funcs,
                reward_names,
                success_reward,
                main=accelerator.is_main_process,
                template=turn_template,  # a multi-turn run's: text seeds are agent trajectories (`agent_traces.py`)
            )
        except ValueError as error:
            problem = str(error)
        if accelerator.num_processes > 1 and settings.external.seed_dataset is not None:
            external, problem = self._main_process_external_seeds(external, problem)
        if problem is not None:
            raise ValueError(problem)
        self.external_seeds = external.table if external is not None else None
        self.external_provenance = external.provenance if external is not None else None
        self.text_cuts = external.text_cuts if external is not None else {}  # rollout id -> where it may be cut
        self.sampling = settings.sampling  # written into every shard's metadata
        self.metrics = metrics if metrics is not None else {}  # the trainer's train metrics: hub/* are logged there
        self.card_license = settings.card_license
        self.trained_model_id = settings.trained_model_id
        self.hub_dataset_id = settings.hub_dataset_id
        self.success = (success_reward, settings.success_threshold)
        self.snapshot_steps = settings.snapshot_steps
        # What else a checkpoint must keep for a resumed run to plan as the uninterrupted one (the planner's
        # statistics): `checkpoint_state()` is written into each checkpoint pointer, read back as `resumed_state`.
        self.checkpoint_state = dict
        self.resumed_state: dict = {}
        self.bank = SeedBank(*self.success)
        fill_bank(self.bank, self.external_seeds, external=True)
        self.run_id: str | None = None
        self.manifest: SeedManifest | None = None
        self.pending: list[PendingRollout] = []  # this rank's rollouts waiting for their behaviour log-probs
        # Main process: the rollouts of all ranks since the last snapshot, as Arrow tables (the shard's own columns,
        # ~8 bytes a token plus the text) rather than Python lists (~36 bytes a token).
        self.unsnapshotted: list[pa.Table] = []
        self.lock = OutputDirLock(self.output_dir)  # held by the main process from `start` to `release`
        self.damaged: set[str] = set()  # files of the manifest the resume found missing or damaged
        self.pusher = None
        if self.hub_dataset_id is not None and accelerator.is_main_process:
            self.pusher = SeedHubPusher(self.hub_dataset_id, token=settings.hub_token, private=settings.hub_private)
            self.pusher.check_visibility()  # a private run stops here, before training, rather than leak its seeds

    def _main_process_external_seeds(self, external, problem: str | None):
        """The main process's `seed_dataset` seeds on every rank, and its refusal (None: none).

        Every rank reads `seed_dataset` itself (and the text-seed cache in its own output_dir): on node-local disks a
        node may lack the dataset, or hold a cache or a copy that gives other seeds. A rank whose seeds differ from the
        main process's (a digest of the table and the cut positions), or that could not read them, takes the main
        process's. A collective: every rank calls it, at construction.
        """
        main = self.accelerator.is_main_process
        digest = external_seeds_digest(external) if problem is None else None
        found = gather_object([(problem, digest)])
        if found[0][0] is not None:
            return None, found[0][0]  # the main process's refusal, on every rank
        differ = [rank for rank, (_, other) in enumerate(found) if other != found[0][1]]
        if not differ:
            return external, None
        sent = broadcast_object_list([external if main else None])[0]
        if self.accelerator.process_index in differ:
            rank = self.accelerator.process_index
            logger.warning(
                f"Rank {rank} could not read seed_dataset ({problem}); it takes the main process's seeds instead."
                if problem is not None
                else f"Rank {rank} read other seeds from seed_dataset than the main process (its own copy or cache "
                "differs); it takes the main process's instead."
            )
            return sent, None
        return external, None

    @property
    def seeds_dir(self) -> Path:
        return self.output_dir / SEEDS_DIR

    def start(self, checkpoint: str | os.PathLike | None) -> None:
        """Rebuilds the bank: the given seed dataset, then (on resume) exactly the shards the checkpoint covered."""
        accelerator = self.accelerator
        self.bank = SeedBank(*self.success)
        self.pending, self.unsnapshotted, self.resumed_state, self.damaged = [], [], {}, set()
        fill_bank(self.bank, self.external_seeds, external=True)
        self._hold_output_dir()
        if accelerator.is_main_process:  # the one writer, before it writes: what a killed writer left is stale
            folders = [self.seeds_dir, self.seeds_dir / BANK_DIR, *self.output_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*")]
            for path in remove_stale_temporaries(folders):
                logger.info(f"Removed {path}, left by a write that did not finish.")
        if checkpoint is not None:
            resume = self.main_process_resume(checkpoint)
            fill_bank(self.bank, self._read_bank(resume))
            self.bank.mark_snapshotted()
            self.resumed_state = resume.state
            manifest, run_id = resume.manifest, resume.manifest.run_id
            accelerator.wait_for_everyone()  # every rank has read the shards before any is set aside
            if accelerator.is_main_process:
                moved = manifest.set_aside_after(resume.step)
                if moved:
                    logger.warning(f"Resuming at step {resume.step}: later shards {moved} moved to seeds/superseded/.")
        else:
            run_id = secrets.token_hex(4)
            manifest = SeedManifest.load(self.seeds_dir) if accelerator.is_main_process else None
            if manifest is not None:
                moved = manifest.set_aside_after(-1)
                logger.warning(
                    f"{self.seeds_dir} held the seeds of an earlier run ({len(moved)} shards); they were moved to "
                    "seeds/superseded/. To continue that run instead, pass resume_from_checkpoint."
                )
                manifest = None
        self.run_id = broadcast_object_list([run_id])[0] if accelerator.num_processes > 1 else run_id
        if accelerator.is_main_process:
            self.seeds_dir.mkdir(parents=True, exist_ok=True)
            listed = {n for s in (manifest.shards if manifest else []) for n in (s["file"], s.get("bank_file")) if n}
            moved = set_aside_unlisted(self.seeds_dir, listed)
            if moved:
                logger.warning(
                    f"{self.seeds_dir} held {len(moved)} file(s) its manifest does not list ({', '.join(moved[:3])}): "
                    "a crash's or an earlier run's; they were moved to seeds/superseded/ rather than read or overwritten."
                )
            if manifest is None:
                manifest = SeedManifest(self.seeds_dir, self.run_id, self.model_name, self.tokenizer_fp)
                manifest.external = self.external_provenance
                manifest.save()
            elif manifest.external != self.external_provenance:  # a resumed run's seeds came from elsewhere
                manifest.external = self.external_provenance
                manifest.save()
            self.manifest = manifest
            self._push_backlog()

    def _push_backlog(self) -> None:
        """Hands the pusher every shard the manifest lists (main process, at start), to push in the background those
        the Hub dataset does not hold: pushes that failed or were still queued when the run stopped (a crash, `kill -9`)
        died with its process. Set-aside shards are not listed, so never pushed; the repo's `data/` shards the manifest
        does not list are moved to `superseded/` there."""
        if self.pusher is None:
            return
        # A shard the resume found missing or damaged (restored into the bank from its .arrow copy) was warned about.
        listed = [s for s in self.manifest.shards if s["file"] not in self.damaged]
        shards = {self.manifest.resolve(s["file"]): s.get("sha256") for s in listed}
        shards = {path: sha256 for path, sha256 in shards.items() if path.is_file()}
        card = self.dataset_card(list(shards)[-1], self.hub_dataset_id, local=False) if shards else None
        # Every listed name, damaged ones included: their copy on the Hub may be the only good one, never set aside.
        # A fresh run's manifest lists none: the repo's data/ shards are an earlier run's.
        names = [s["file"] for s in self.manifest.shards]
        self.pusher.submit_backlog(shards, card_text=str(card) if card else None, listed=names)

    def _hold_output_dir(self) -> None:
        """The main process locks the output_dir (one line when another run holds it); every rank stops with it."""
        problem = None
        if self.accelerator.is_main_process:
            try:
                self.lock.acquire()
            except ValueError as error:
                problem = str(error)
        if self.accelerator.num_processes > 1:
            problem = broadcast_object_list([problem])[0]
        if problem is not None:
            raise ValueError(problem)

    def release(self) -> None:
        """Lets go of the output_dir, at the end of `train` however it ended."""
        self.lock.release()

    def check_resume(self, checkpoint: str | os.PathLike) -> Resume:
        """The shards that rebuild the bank `checkpoint` saw; a one-line `ValueError` when this folder lacks them.

        A checkpoint records its run id and shards (`seed_snapshot.json`). They are gone from `seeds/` when another
        run started in the folder later, or a resume from an earlier checkpoint set them aside: the bank could then
        not be rebuilt exactly, so resuming stops (the shards are still in `seeds/superseded/`, never deleted). Whether
        the files themselves are whole is checked when they are read (`start`).
        """
        checkpoint = Path(checkpoint)
        manifest = SeedManifest.load(self.seeds_dir)
        if manifest is None:
            raise ValueError(
                f"Cannot resume the seed bank: {self.seeds_dir} has no manifest.json. Resume from a checkpoint "
                "in the output_dir of the run that wrote it, or start a new run."
            )
        step = checkpoint_step(checkpoint)
        pointer_path = checkpoint / CHECKPOINT_POINTER
        if not pointer_path.exists():  # crashed between the shard and the pointer: the shard is on disk already
            self._check_tokenizer(checkpoint, manifest)
            logger.warning(
                f"{pointer_path} is missing: the bank is rebuilt from the shards up to step {step}, but the pass rates "
                "of seed_selection='passrate' start afresh."
            )
            return Resume(checkpoint, step, manifest, [s for s in manifest.shards if s["step"] <= step])
        try:
            pointer = json.loads(pointer_path.read_text())
            pointer["shards"] = [dict(s) for s in pointer["shards"]]
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(
                f"Cannot resume from {checkpoint}: {pointer_path} is damaged ({type(error).__name__}: {error}), so "
                "nothing says which seeds that checkpoint saw. Resume from another checkpoint, or delete that file to "
                "rebuild the bank from the shards up to its step."
            ) from None
        current = {s["file"]: s for s in manifest.shards}
        identity = [{k: s.get(k) for k in SHARD_IDENTITY} for s in pointer["shards"]]
        missing = [s["file"] for s in identity if {k: current.get(s["file"], {}).get(k) for k in SHARD_IDENTITY} != s]
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
        self._check_tokenizer(checkpoint, manifest)
        self._check_reward_columns(checkpoint, manifest)
        shards = [current[s["file"]] for s in pointer["shards"]]  # the manifest's: it has the bank files' checksums
        return Resume(checkpoint, step, manifest, shards, pointer.get("state", {}))

    def main_process_resume(self, checkpoint: str | os.PathLike) -> Resume:
        """What the main process's seeds say about resuming from `checkpoint`, on every rank (or its one line).

        Only the main process reads the manifest and the checkpoint pointer: on node-local disks the other nodes may
        hold no seeds, or a stale copy of another timeline's, so theirs are never consulted.
        """
        resume, problem = None, None
        if self.accelerator.is_main_process:
            try:
                resume = self.check_resume(checkpoint)
                self._check_seed_dataset_unchanged(checkpoint, resume.manifest)
            except ValueError as error:
                problem = str(error)
        if self.accelerator.num_processes > 1:
            problem, resume = broadcast_object_list([problem, resume])
        if problem is not None:
            raise ValueError(problem)
        if not self.accelerator.is_main_process:  # this rank's own folder, for whatever copies it holds
            resume.manifest.seeds_dir, resume.checkpoint = self.seeds_dir, Path(checkpoint)
        return resume

    def _check_seed_dataset_unchanged(self, checkpoint, manifest: SeedManifest) -> None:
        """A resumed run's `seed_dataset` must give the bank it gave: a same-tokenizer seed dataset is read afresh
        (text seeds come from the run's cache), so one that gained or lost rows would change the bank."""
        then, now = manifest.external or {}, self.external_provenance or {}
        if then.get("kind") != "seed dataset" or now.get("kind") != "seed dataset":
            return
        if (then.get("dataset"), then.get("rows")) != (now.get("dataset"), now.get("rows")):
            raise ValueError(
                f"Cannot resume from {checkpoint}: its seed_dataset changed since the run started "
                f"({then.get('dataset')}, {then.get('rows')} rows then; {now.get('dataset')}, {now.get('rows')} rows "
                "now), so the bank would differ. Resume with the seed dataset as it was (e.g. a copy), or start a new run."
            )

    def _check_tokenizer(self, checkpoint: Path, manifest: SeedManifest) -> None:
        if manifest.tokenizer != self.tokenizer_fp:
            raise ValueError(
                f"Cannot resume from {checkpoint}: its seeds were made with a tokenizer of another vocabulary "
                f"(fingerprint {manifest.tokenizer!r}, this run's is {self.tokenizer_fp!r}). Resume with the run's own "
                "tokenizer."
            )

    def _check_reward_columns(self, checkpoint: Path, manifest: SeedManifest) -> None:
        """A resumed run writes the same `reward_<name>` columns as its shards hold: shards that disagree on columns
        do not load as one dataset (`load_dataset` fails on the seeds folder)."""
        if not manifest.shards:
            return
        try:
            names = pq.read_schema(manifest.resolve(manifest.shards[-1]["file"])).names
        except (pa.ArrowInvalid, OSError):  # a missing or damaged shard is named when the bank is read
            return
        found = [n for n in names if n.startswith("reward_")]
        expected = [f"reward_{name}" for name in self.reward_names]
        if found != expected:
            raise ValueError(
                f"Cannot resume from {checkpoint} with these reward functions: its seed shards have the columns "
                f"{found}, this run would write {expected}, and shards with other columns do not load as one "
                "dataset. Resume with the run's reward functions (same names, same order), or start a new run."
            )

    def check_unchanged(self) -> None:
        """Stops the run in one line when the files its manifest lists vanished from disk while it trained (all
        ranks): a checkpoint would then name seeds that are gone, and could not be resumed."""
        problem = None
        if self.accelerator.is_main_process and self.manifest is not None:
            lost = [s["file"] for s in self.manifest.shards if not self.manifest.resolve(s["file"]).is_file()]
            if not SeedManifest.path(self.seeds_dir).is_file():
                lost.insert(0, "manifest.json")
            if lost:
                problem = (
                    f"{self.seeds_dir} lost {', '.join(lost[:4])}{' ...' if len(lost) > 4 else ''} while this run "
                    "trained: a checkpoint now would name seeds that are gone. Restore the files and resume from the "
                    "last checkpoint, or start a new run in another output_dir."
                )
        if self.accelerator.num_processes > 1:
            problem = broadcast_object_list([problem])[0]
        if problem is not None:
            raise ValueError(problem)

    def _read_bank(self, resume: Resume) -> pa.Table | None:
        """The bank columns of a resume's shards, the main process's on every rank.

        The main process reads each shard from a copy whose checksum matches its manifest (repairing a damaged `.arrow`
        file from the Parquet shard). Every other rank maps its own `.arrow` file only where that file's SHA-256 is the
        one the main process vouches for (a shared disk: the same file); a shard it lacks, or holds in another version
        (node-local disks, a stale copy), is sent by the main process and kept in memory. So every rank holds the main
        process's bank, and only the main node needs the seed files.
        """
        accelerator, main = self.accelerator, self.accelerator.is_main_process
        tables = None
        if main:
            problems = verify_shards(resume.manifest, resume.shards)
            tables = read_bank_tables(resume.manifest, resume.shards, self.vocab_size, problems, repair=True)
            if problems:
                resume.manifest.save()  # a rewritten .arrow file's new checksum
            self.damaged = set(problems)  # names of the files found missing or damaged: never pushed (main process)
        if accelerator.num_processes > 1:
            tables = self._main_process_tables(resume, tables)
        return pa.concat_tables(tables, promote_options="default") if tables else None

    def _main_process_tables(self, resume: Resume, tables: list[pa.Table] | None) -> list[pa.Table]:
        """Every rank's copy of the main process's `tables` (one per shard of `resume`): mapped where its own file
        is the same, sent by the main process where not. A collective: every rank calls it."""
        main = self.accelerator.is_main_process
        shards = broadcast_object_list([resume.shards if main else None])[0]  # with a repaired file's new checksum
        if main:
            same = [True] * len(shards)
        else:
            same = same_bank_files(resume.manifest, shards)
            tables = [
                map_bank_file(resume.manifest.resolve(s["bank_file"])) if ok else None for s, ok in zip(shards, same)
            ]
            stale = [
                s["bank_file"]
                for s, ok in zip(shards, same)
                if not ok and s.get("bank_file") and resume.manifest.resolve(s["bank_file"]).exists()
            ]
            if stale:
                logger.warning(
                    f"Rank {self.accelerator.process_index}: {self.seeds_dir} holds {', '.join(stale[:3])} in another "
                    "version than the main process's (a stale copy?); that rank takes the main process's rows instead."
                )
        lacking = [i for i, ok in enumerate(same) if not ok]
        wanted = sorted({i for rank_lacks in gather_object([lacking]) for i in rank_lacks})
        for i in wanted:  # one shard at a time: the bytes in flight stay one shard's
            data = broadcast_object_list([table_bytes(tables[i]) if main else None])[0]
            if tables[i] is None:
                tables[i] = table_of_bytes(data)
        return tables

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
        self.check_unchanged()
        path = bank_checksum = None
        # An empty shard marks a checkpoint without new rollouts; one already written for this step is kept (a step
        # can both reach `snapshot_steps` and save a checkpoint).
        done = self.manifest is not None and any(s["step"] == step for s in self.manifest.shards)
        if self.accelerator.is_main_process and (self.unsnapshotted or not (final or done)):
            checkpoint = "final" if final else f"{PREFIX_CHECKPOINT_DIR}-{step}"
            tables = self.unsnapshotted or [
                rollouts_to_table([], "", self.model_name, self.tokenizer_fp, self.reward_names)
            ]
            table = pa.concat_tables(tables, promote_options="default")  # multi-turn columns or not
            column = table.schema.get_field_index("checkpoint")
            table = table.set_column(column, "checkpoint", pa.array([checkpoint] * table.num_rows, pa.string()))
            table = with_sampling_metadata(table, self.sampling)
            path = self.seeds_dir / shard_name(step)
            checksum = write_shard(table, path)
            bank_checksum = write_bank_file(table, self.seeds_dir / bank_file_name(step))
            self.manifest.record(step, table.num_rows, checksum, bank_checksum)
            self.manifest.save()
            self.unsnapshotted = []
            self.write_dataset_card(path)
            if self.pusher is not None:
                card = self.dataset_card(path, self.hub_dataset_id, local=False)
                self.pusher.submit(path, card_text=str(card))  # returns at once; the upload runs in the background
                for name, value in self.pusher.status().items():
                    if isinstance(value, int):
                        self.metrics.setdefault(f"hub/{name}", []).append(value)
        self._attach_snapshot(step, bank_checksum)
        return path

    def dataset_card(self, shard: Path, dataset_id: str, local: bool):

        return dataset_card_for_shard(
            shard, dataset_id, license=self.card_license, trained_model_id=self.trained_model_id, local=local
        )

    def write_dataset_card(self, shard: Path) -> None:
        """Writes `seeds/README.md` for the local layout, so that `load_dataset(<seeds folder>)` reads this run's shards."""
        card = self.dataset_card(shard, str(self.seeds_dir), local=True)
        atomic_write_bytes(self.seeds_dir / "README.md", str(card).encode())

    def _attach_snapshot(self, step: int, checksum: str | None) -> None:
        """Every rank moves the new rollouts' token ids onto the memory-mapped snapshot the main process just wrote.

        So the ranks of a node share one copy of every snapshotted token id (the page cache) and keep only per-rollout
        metadata of their own. The main process sends the SHA-256 of the bank file it wrote (`checksum`; None when it
        wrote none), and another rank maps its own file of that name only when it holds those bytes: a rank that
        cannot see the main process's file (node-local disks), or sees another version of it (a stale copy of another
        timeline), keeps its own copy in memory. Every rank calls this, at every snapshot: the broadcast is a
        collective, and every rank must run the same collectives.
        """
        fresh = len(self.bank) - self.bank.num_snapshotted
        if self.accelerator.num_processes > 1:
            checksum = broadcast_object_list([checksum])[0]  # sent once the main process has written the file
        path = self.seeds_dir / bank_file_name(step)
        if fresh and checksum is not None and (self.accelerator.is_main_process or same_file(path, checksum)):
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


def external_seeds_digest(external) -> str | None:
    """A SHA-256 of a `seed_dataset`'s seeds as the bank takes them: their table and the text seeds' cut positions."""
    if external is None:
        return None
    digest = hashlib.sha256(table_bytes(external.table.combine_chunks()))  # however the rows were chunked
    for rollout_id in sorted(external.text_cuts):
        digest.update(rollout_id.encode() + b"\0" + np.asarray(external.text_cuts[rollout_id], np.int64).tobytes())
    return digest.hexdigest()


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    state = Path(checkpoint) / TRAINER_STATE_NAME
    if state.exists():
        return int(json.loads(state.read_text())["global_step"])
    name = Path(checkpoint).name
    if name.startswith(f"{PREFIX_CHECKPOINT_DIR}-"):
        return int(name.rsplit("-", 1)[1])
    raise ValueError(f"{checkpoint} is not a checkpoint folder (no trainer_state.json, not named checkpoint-<step>).")


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str:
    """The newest `checkpoint-<step>` folder in `output_dir` that was written to the end; what `resume=True` means.

    Transformers writes `trainer_state.json` last, so a folder without it is a save that a crash cut short (often
    empty): it is passed over with a warning that names it, rather than resumed from.
    """
    pattern = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
    folders = sorted(
        (int(match.group(1)), path)
        for path in Path(output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*")
        if (match := pattern.match(path.name)) and path.is_dir()
    )
    complete = [path for _, path in folders if (path / TRAINER_STATE_NAME).is_file()]
    if not complete:
        raise ValueError(f"No complete checkpoint found in output_dir={str(output_dir)!r} to resume from.")
    skipped = [path.name for step, path in folders if step > checkpoint_step(complete[-1])]
    if skipped:
        logger.warning(
            f"Resuming from {complete[-1].name}: {', '.join(skipped)} has no {TRAINER_STATE_NAME} (its save did not "
            "finish), so it is skipped."
        )
    return str(complete[-1])


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


def resume_checkpoint_on_every_rank(
    checkpoint: str | os.PathLike | bool | None, output_dir, accelerator
) -> str | None:
    """The checkpoint this rank resumes from (`resume_from_checkpoint` as given), checked on every rank at once.

    Every rank loads transformers' part of a checkpoint (weights, optimizer, its RNG state) from its own disk. With
    True the main process picks its newest complete checkpoint, and every rank takes the folder of that name in its own
    output_dir. A rank that lacks it or its weights (node-local disks: transformers writes the weights on the main
    process only, even with `save_on_each_node`), or whose checkpoint is at another step than the main process's, stops
    every rank with the same line, rather than leave the others waiting in a collective.
    """
    several = accelerator.num_processes > 1
    if checkpoint is True:
        checkpoint = str(Path(output_dir) / _newest_on_the_main_process(output_dir, accelerator))
    if checkpoint is None or checkpoint is False:
        return None
    problem = step = state = None
    try:
        check_resume_checkpoint(checkpoint, output_dir)
        step = checkpoint_step(checkpoint)
        state = timeline_of(checkpoint)
    except (ValueError, OSError) as error:  # (a JSONDecodeError is a ValueError)
        problem = str(error)
    if (
        problem is None
        and several
        and accelerator.distributed_type != DistributedType.DEEPSPEED
        and not has_weights(checkpoint)
    ):
        problem = f"{checkpoint} holds no model weights (transformers writes them on the main process only)"
    if not several:
        if problem is not None:
            raise ValueError(problem)
        return str(checkpoint)
    found = gather_object([(problem, step, state, str(checkpoint))])
    for rank, (problem, step, state, path) in enumerate(found):
        if problem is not None and rank == 0:
            raise ValueError(problem)
        if problem is not None or step != found[0][1] or state != found[0][2]:
            if problem is not None:
                why = problem.rstrip(".")
            elif step != found[0][1]:
                why = f"{path} is at step {step}"
            else:  # the same step of another timeline (a copy made before a resume from an earlier checkpoint)
                why = f"the log history in {path}/{TRAINER_STATE_NAME} differs from the main process's (a copy from "
                why += "another timeline)"
            raise ValueError(
                f"Rank {rank} cannot resume from its checkpoint: {why}, and the main process resumes from "
                f"{found[0][3]} (step {found[0][1]}). Every rank loads the weights, optimizer and RNG state from its "
                "own output_dir: with node-local disks, copy the main node's checkpoint folder to the other nodes "
                "before resuming (the seeds/ folder need not be copied)."
            )
    return str(checkpoint)


def _newest_on_the_main_process(output_dir, accelerator) -> str:
    """The name of the main process's newest complete checkpoint, on every rank (or its one-line refusal)."""
    name = problem = None
    if accelerator.is_main_process:
        try:
            name = Path(last_complete_checkpoint(output_dir)).name
        except ValueError as error:
            problem = str(error)
    if accelerator.num_processes > 1:
        name, problem = broadcast_object_list([name, problem])
    if problem is not None:
        raise ValueError(problem)
    return name


TIMELINE_KEYS = ("step", "epoch", "loss", "grad_norm", "learning_rate")  # logged alike on every rank


def timeline_of(checkpoint: str | os.PathLike) -> str:
    """A digest of a checkpoint's log history, of the values every rank logs alike (the gathered loss, the norm of
    the all-reduced gradients): two copies of one run agree, whichever node wrote them (`save_on_each_node`); a
    checkpoint of the same step from another timeline does not. Per-rank values (TRL's `step_time`) are left out."""
    state = json.loads((Path(checkpoint) / TRAINER_STATE_NAME).read_text())
    history = [{k: entry[k] for k in TIMELINE_KEYS if k in entry} for entry in state.get("log_history", [])]
    return hashlib.sha256(json.dumps(history, sort_keys=True).encode()).hexdigest()


def has_weights(checkpoint: str | os.PathLike) -> bool:
    """Whether a checkpoint folder holds model weights in a form transformers resumes from (whole or sharded, an
    adapter, FSDP), in it or in one of its subfolders (several adapters)."""
    names = (WEIGHTS_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_INDEX_NAME)
    names += (ADAPTER_WEIGHTS_NAME, ADAPTER_SAFE_WEIGHTS_NAME)
    folder = Path(checkpoint)
    for place in [folder, *(p for p in folder.iterdir() if p.is_dir())]:
        if any((place / name).is_file() for name in names) or FSDP_MODEL_NAME in place.name:
            return True
    return any(FSDP_MODEL_NAME in p.name for p in folder.iterdir())


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
