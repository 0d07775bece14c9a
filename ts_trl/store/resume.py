"""Resume checks: which checkpoint a run resumes from, on every rank at once, and whether the seeds it names are
still there (`check_resume`). A checkpoint folder knows the shards its bank held::

    checkpoint-100/seed_snapshot.json   run id, step, the manifest entries of the shards up to step 100, planner state

The manifest itself is `format.SeedManifest`'s; the seed store reads it and hands it here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from accelerate.utils import DistributedType, broadcast_object_list, gather_object
from transformers.trainer import FSDP_MODEL_NAME, TRAINER_STATE_NAME
from transformers.utils import (
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)

from .checkpoints import checkpoint_folders, checkpoint_step, resume_problem

logger = logging.getLogger(__name__)


CHECKPOINT_POINTER = "seed_snapshot.json"


SHARD_IDENTITY = ("file", "step", "rows", "sha256")  # what a checkpoint pointer and the manifest must agree on


@dataclass
class Resume:
    """What resuming from a checkpoint restores: the shards its bank held (manifest entries) and the planner state."""

    checkpoint: Path
    step: int
    manifest: Any  # `format.SeedManifest`: the run id, the shards and where their files are
    shards: list[dict]
    state: dict = field(default_factory=dict)


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str:
    """The newest `checkpoint-<step>` folder in `output_dir` that was written to the end; what `resume=True` means.

    Transformers writes `trainer_state.json` last, so a folder without it is a save that a crash cut short (often
    empty): it is passed over with a warning that names it, rather than resumed from.
    """
    folders = checkpoint_folders(output_dir)
    complete = [path for _, path in checkpoint_folders(output_dir, complete=True)]
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

    Checked before the model is loaded (`ts_trl train`, which also checks it before TRL is imported) and before `train`
    rebuilds the seed bank, whose own complaints (no seed manifest, no weights) would hide the real mistake: a
    mistyped or deleted checkpoint.
    """
    problem = resume_problem(checkpoint, output_dir)
    if problem is not None:
        raise ValueError(problem)


def resume_checkpoint_on_every_rank(
    checkpoint: str | os.PathLike | bool | None, output_dir, accelerator
) -> str | None:
    """The checkpoint this rank resumes from (`resume_from_checkpoint` as given), checked on every rank at once.

    Every rank loads transformers' part of a checkpoint (weights, optimizer, its RNG state) from its own disk. With
    True the main process picks its newest complete checkpoint, and every rank takes the folder of that name in its own
    output_dir. A rank that lacks it or its weights (node-local disks: transformers writes the weights on the main
    process only, even with `save_on_each_node`), or whose checkpoint is at another step than the main process's, stops
    every rank with the same line, rather than leave the others waiting in a collective.

    Long: the main process's choice, its broadcast and every rank's check, around the collectives all ranks must
    reach.
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


def check_resume(
    checkpoint: str | os.PathLike, manifest, seeds_dir: Path, tokenizer_fp: str, reward_names: list[str]
) -> Resume:
    """The shards that rebuild the bank `checkpoint` saw; a one-line `ValueError` when `seeds_dir` lacks them.

    A checkpoint records its run id and shards (`seed_snapshot.json`). They are gone from `seeds/` when another
    run started in the folder later, or a resume from an earlier checkpoint set them aside: the bank could then
    not be rebuilt exactly, so resuming stops (the shards are still in `seeds/superseded/`, never deleted). Whether
    the files themselves are whole is checked when they are read (`SeedStore.start`). `manifest` is `seeds_dir`'s
    (`format.SeedManifest`, None where it has none); the run's tokenizer and reward functions must be the checkpoint's.

    Long: one check after another, each refusal next to the condition it names.
    """
    checkpoint = Path(checkpoint)
    if manifest is None:
        raise ValueError(
            f"Cannot resume the seed bank: {seeds_dir} has no manifest.json. Resume from a checkpoint "
            "in the output_dir of the run that wrote it, or start a new run."
        )
    step = checkpoint_step(checkpoint)
    pointer_path = checkpoint / CHECKPOINT_POINTER
    if not pointer_path.exists():  # crashed between the shard and the pointer: the shard is on disk already
        _check_tokenizer(checkpoint, manifest, tokenizer_fp)
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
            f"it belongs to run {pointer.get('run_id')}, but {seeds_dir} now holds run {manifest.run_id}'s seeds"
            if pointer.get("run_id") != manifest.run_id
            else f"its shards {missing[:3]} are no longer in {seeds_dir}"
        )
        raise ValueError(
            f"Cannot resume from {checkpoint}: {why} (a later run or resume moved them to seeds/superseded/). "
            f"Resume from a checkpoint of the run in {seeds_dir}, or start a new run in another output_dir."
        )
    _check_tokenizer(checkpoint, manifest, tokenizer_fp)
    _check_reward_columns(checkpoint, manifest, reward_names)
    shards = [current[s["file"]] for s in pointer["shards"]]  # the manifest's: it has the bank files' checksums
    return Resume(checkpoint, step, manifest, shards, pointer.get("state", {}))


def main_process_resume(
    accelerator,
    checkpoint: str | os.PathLike,
    manifest,
    seeds_dir: Path,
    tokenizer_fp: str,
    reward_names: list[str],
    provenance: dict | None,
) -> Resume:
    """What the main process's seeds say about resuming from `checkpoint`, on every rank (or its one line).

    Only the main process reads the manifest (`manifest`: its `seeds_dir`'s, None on the other ranks) and the
    checkpoint pointer: on node-local disks the other nodes may hold no seeds, or a stale copy of another timeline's,
    so theirs are never consulted. `provenance`: where this run's `seed_dataset` came from (`check_seed_dataset_unchanged`).
    A collective: every rank calls it.
    """
    resume, problem = None, None
    if accelerator.is_main_process:
        try:
            resume = check_resume(checkpoint, manifest, seeds_dir, tokenizer_fp, reward_names)
            check_seed_dataset_unchanged(checkpoint, resume.manifest, provenance)
        except ValueError as error:
            problem = str(error)
    if accelerator.num_processes > 1:
        problem, resume = broadcast_object_list([problem, resume])
    if problem is not None:
        raise ValueError(problem)
    if not accelerator.is_main_process:  # this rank's own folder, for whatever copies it holds
        resume.manifest.seeds_dir, resume.checkpoint = seeds_dir, Path(checkpoint)
    return resume


def check_seed_dataset_unchanged(checkpoint, manifest, provenance: dict | None) -> None:
    """A resumed run's `seed_dataset` must give the bank it gave: a same-tokenizer seed dataset is read afresh
    (text seeds come from the run's cache), so one that gained or lost rows would change the bank."""
    then, now = manifest.external or {}, provenance or {}
    if then.get("kind") != "seed dataset" or now.get("kind") != "seed dataset":
        return
    if (then.get("dataset"), then.get("rows")) != (now.get("dataset"), now.get("rows")):
        raise ValueError(
            f"Cannot resume from {checkpoint}: its seed_dataset changed since the run started "
            f"({then.get('dataset')}, {then.get('rows')} rows then; {now.get('dataset')}, {now.get('rows')} rows "
            "now), so the bank would differ. Resume with the seed dataset as it was (e.g. a copy), or start a new run."
        )


def _check_tokenizer(checkpoint: Path, manifest, tokenizer_fp: str) -> None:
    if manifest.tokenizer != tokenizer_fp:
        raise ValueError(
            f"Cannot resume from {checkpoint}: its seeds were made with a tokenizer of another vocabulary "
            f"(fingerprint {manifest.tokenizer!r}, this run's is {tokenizer_fp!r}). Resume with the run's own "
            "tokenizer."
        )


def _check_reward_columns(checkpoint: Path, manifest, reward_names: list[str]) -> None:
    """A resumed run writes the same `reward_<name>` columns as its shards hold: shards that disagree on columns
    do not load as one dataset (`load_dataset` fails on the seeds folder)."""
    if not manifest.shards:
        return
    try:
        names = pq.read_schema(manifest.resolve(manifest.shards[-1]["file"])).names
    except (pa.ArrowInvalid, OSError):  # a missing or damaged shard is named when the bank is read
        return
    found = [n for n in names if n.startswith("reward_")]
    expected = [f"reward_{name}" for name in reward_names]
    if found != expected:
        raise ValueError(
            f"Cannot resume from {checkpoint} with these reward functions: its seed shards have the columns "
            f"{found}, this run would write {expected}, and shards with other columns do not load as one "
            "dataset. Resume with the run's reward functions (same names, same order), or start a new run."
        )
