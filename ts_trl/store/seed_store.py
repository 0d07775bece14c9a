"""The seed store: a run's bank and what it persists (run id, shards, checkpoint pointers, Hub pushes), and resume.

It puts the floors below together: the bank (`bank.py`), the files on disk (`schema.py`, `format.py`, `files.py`),
the checks of a resume (`resume.py`), the dataset card (`dataset_card.py`) and the background pushes (`hub.py`). The
seeds of a `seed_dataset` are read by `external_seeds.py` and handed over at construction.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from accelerate.utils import broadcast_object_list, gather_object
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .bank import SeedBank
from .dataset_card import dataset_card_of
from .files import atomic_write_bytes, atomic_write_json, remove_stale_temporaries, same_file
from .format import (
    BANK_DIR,
    SEEDS_DIR,
    SeedManifest,
    bank_file_name,
    map_bank_file,
    read_bank_tables,
    same_bank_files,
    set_aside_unlisted,
    shard_name,
    table_bytes,
    table_of_bytes,
    verify_shards,
    write_bank_file,
    write_shard,
)
from .hub import ShardPusher
from .lock import OutputDirLock
from .resume import CHECKPOINT_POINTER, Resume, main_process_resume
from .schema import Rollout, model_name_of, rollouts_to_table, tokenizer_fingerprint, with_sampling_metadata

logger = logging.getLogger(__name__)
HUB_CLOSE_TIMEOUT = 600.0  # seconds the end of training waits for seed uploads before reporting what is left


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
        external=None,
    ):
        self.output_dir = Path(settings.output_dir)
        self.accelerator = accelerator
        self.model_name = model_name_of(model)
        self.tokenizer_fp, self.reward_names = tokenizer_fingerprint(tokenizer), list(reward_names)
        # Ids the model can emit: its embedding rows may outnumber the tokenizer's entries (padded vocabularies).
        self.vocab_size = max(len(tokenizer), getattr(model.config, "vocab_size", 0) or 0)
        # `seed_dataset`'s seeds (`external_seeds.ExternalSeeds`, read on every rank by the trainer), or None
        self.external_seeds = external.table if external is not None else None
        self.external_provenance = external.provenance if external is not None else None
        self.text_cuts = external.text_cuts if external is not None else {}  # rollout id -> where it may be cut
        self.sampling = settings.sampling  # written into every shard's metadata
        self.metrics = metrics if metrics is not None else {}  # the trainer's train metrics: hub/* are logged there
        self.card_license = settings.card_license
        self.card_columns: list[str] | None = None  # the columns of the newest shard, which the card describes
        self.unpushed: Path | None = None  # the newest shard, until it goes to the pusher with its card
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
            self.pusher = ShardPusher(self.hub_dataset_id, token=settings.hub_token, private=settings.hub_private)
            self.pusher.check_visibility()  # a private run stops here, before training, rather than leak its seeds

    @property
    def seeds_dir(self) -> Path:
        return self.output_dir / SEEDS_DIR

    def start(self, checkpoint: str | os.PathLike | None) -> None:
        """Rebuilds the bank: the given seed dataset, then (on resume) exactly the shards the checkpoint covered.

        Long: the bank's rebuild in the order a resume needs it (stale files cleared, shards checked, read, set
        aside), around the collectives all ranks must reach.
        """
        accelerator = self.accelerator
        self.bank = SeedBank(*self.success)
        self.pending, self.unsnapshotted, self.resumed_state, self.damaged = [], [], {}, set()
        self.unpushed = None
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
        # The card of the manifest in memory, with the columns of the newest listed shard (read once, at start).
        card = self.dataset_card(pq.read_schema(list(shards)[-1]).names) if shards else None
        # Every listed name, damaged ones included: their copy on the Hub may be the only good one, never set aside.
        # A fresh run's manifest lists none: the repo's data/ shards are an earlier run's.
        names = [s["file"] for s in self.manifest.shards]
        self.pusher.submit_backlog(shards, card_text=card, listed=names)

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

    def main_process_resume(self, checkpoint: str | os.PathLike) -> Resume:
        """What the main process's seeds say about resuming from `checkpoint`, on every rank (`resume.py`)."""
        manifest = SeedManifest.load(self.seeds_dir) if self.accelerator.is_main_process else None
        names, provenance = self.reward_names, self.external_provenance
        return main_process_resume(
            self.accelerator, checkpoint, manifest, self.seeds_dir, self.tokenizer_fp, names, provenance
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

    def write_snapshot(self, step: int, final: bool = False, at_checkpoint: bool = False) -> Path | None:
        """Writes the rollouts since the last snapshot as `seeds/step-XXXXXX.parquet` (main process) and marks them.

        `at_checkpoint`: the shard of a checkpoint about to be saved, whose card (and push) waits for its folder
        (`write_checkpoint_pointer`), so that the one card rendered for this snapshot counts that checkpoint.
        """
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
            self.card_columns, self.unpushed = table.column_names, path
            if not at_checkpoint:
                self.publish_card()
        self._attach_snapshot(step, bank_checksum)
        return path

    def dataset_card(self, columns: list[str]) -> str:
        """The card of this run's seed dataset, from its manifest as held in memory and its shards' `columns`: one text
        for the `seeds/` folder and the Hub repo, which it names when the run pushes (never this machine's path)."""
        repo_id, pushed = self.hub_dataset_id or str(self.seeds_dir), self.hub_dataset_id is not None
        license, model_id = self.card_license, self.trained_model_id
        card = dataset_card_of(self.manifest, columns, repo_id, license=license, trained_model_id=model_id, hub=pushed)
        return str(card)

    def publish_card(self) -> None:
        """Renders the card once (main process), writes it as `seeds/README.md`, so that `load_dataset(<seeds folder>)`
        reads this run's shards, and hands the same text to the pusher with the shard waiting for its push."""
        if self.card_columns is None:  # no shard written yet
            return
        card = self.dataset_card(self.card_columns)
        atomic_write_bytes(self.seeds_dir / "README.md", card.encode())
        if self.pusher is not None and self.unpushed is not None:
            self.pusher.submit(self.unpushed, card_text=card)  # returns at once; the upload runs in the background
            for name, value in self.pusher.status().items():
                if isinstance(value, int):
                    self.metrics.setdefault(f"hub/{name}", []).append(value)
        self.unpushed = None

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
        if self.manifest is None:
            return
        if folder.is_dir():
            shards = [s for s in self.manifest.shards if s["step"] <= step]
            payload = {"run_id": self.run_id, "step": step, "shards": shards, "rows": sum(s["rows"] for s in shards)}
            payload["state"] = self.checkpoint_state()
            atomic_write_json(folder / CHECKPOINT_POINTER, payload)
        self.publish_card()  # the checkpoint's snapshot card, which counts it now that its folder exists, and its push

    def finish_pushes(self, timeout: float = HUB_CLOSE_TIMEOUT) -> None:
        """Waits (bounded) for the background uploads; what could not be pushed stays on disk and is reported."""
        if self.pusher is not None:
            self.pusher.close(timeout=timeout)


class SeedSnapshotCallback(TrainerCallback):
    """Writes a shard every `seed_snapshot_steps` steps and at the end, and records each checkpoint's shards.

    The shard of a checkpoint is written by `SeedGRPOTrainer._save_checkpoint`, which every save strategy goes
    through right before the checkpoint folder is written, so a checkpoint on disk always has its shard; `on_save`
    then records in the checkpoint which shards it covers, and writes and pushes that snapshot's card.
    """

    def __init__(self, store: SeedStore):
        self.store = store

    def on_step_end(self, args, state, control, **kwargs):
        every = self.store.snapshot_steps
        # A step that also saves a checkpoint (decided before this callback runs) gets its shard from the save.
        saving = control.should_save and args.save_strategy != "best"
        if every and state.global_step % every == 0 and not saving:
            self.store.write_snapshot(state.global_step)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.store.write_checkpoint_pointer(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self.store.write_snapshot(state.global_step, final=True)
        self.store.finish_pushes()
