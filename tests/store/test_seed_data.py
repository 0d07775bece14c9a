"""The seed dataset's integrity as a user meets it: resuming after a crash or from damaged files, leftover temporary
files, and `seed_dataset`s whose manifest or columns are wrong. Every file is damaged with pyarrow or plain bytes,
not through ts_trl, so these tests read the files as the user's disk holds them."""

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import tests.conftest as c
from tests.cli.test_cli import ROOT, SMALL, _data_args, _launch, tiny_dir  # noqa: F401 (tiny_dir: a fixture)
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A seeded run of 4 steps with checkpoints 2 and 4; tests damage copies of it."""
    output_dir = tmp_path_factory.mktemp("finished") / "run"
    tokenizer = c.build_tokenizer()
    args = SeedGRPOConfig(**{**c.TINY_SETTINGS, "max_steps": 4, "output_dir": str(output_dir)})
    trainer = SeedGRPOTrainer(
        model=c.build_tiny_model(tokenizer),
        reward_funcs=c.count_reward,
        args=args,
        train_dataset=c.tiny_prompts(),
        processing_class=tokenizer,
    )
    trainer.train()
    return output_dir


@pytest.fixture
def run(finished_run, tmp_path) -> Path:
    """A copy of the finished run, free to damage."""
    return Path(shutil.copytree(finished_run, tmp_path / "run", symlinks=True))


def _shard_rows(run: Path) -> list[tuple[str, list[int]]]:
    """(rollout id, token ids) of every row of the run's shards, in manifest order, read before any damage."""
    manifest = json.loads((run / "seeds" / "manifest.json").read_text())
    tables = [pq.read_table(run / "seeds" / s["file"]) for s in manifest["shards"]]
    return [(r["rollout_id"], r["completion_ids"]) for t in tables for r in t.to_pylist()]


def _bank_rows(trainer) -> list[tuple[str, list[int]]]:
    bank = trainer.seed_bank
    return [(bank.get(i).rollout_id, bank.get(i).completion_ids.tolist()) for i in range(len(bank))]


def _resume(make_trainer, run: Path, max_steps: int = 4, **settings):
    """Resumes `run` as a user does (`resume_from_checkpoint=True`); with max_steps=4, no further step is trained."""
    trainer = make_trainer(output_dir=str(run), max_steps=max_steps, **settings)
    trainer.train(resume_from_checkpoint=True)
    return trainer


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_token_bit(path: Path) -> None:
    """Flips the lowest bit of the first token id in an uncompressed Arrow file (the id stays in the vocabulary)."""
    table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    data = bytearray(path.read_bytes())
    rows = [ids for ids in table.column("completion_ids").to_pylist() if len(ids) >= 4]
    patterns = [b"".join(i.to_bytes(4, "little") for i in ids) for ids in rows]
    at = next(data.find(p) for p in patterns if data.count(p) == 1)
    data[at] ^= 1
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------------------------------------------------------
# A crash while a checkpoint folder is created


def test_resume_skips_a_checkpoint_folder_a_crash_left_empty(run, make_trainer, caplog):
    expected = _shard_rows(run)  # the shards of steps 2 and 4: what checkpoint-4's bank held
    (run / "checkpoint-6").mkdir()  # transformers creates the folder first; a kill -9 then leaves it empty
    resumed = make_trainer(output_dir=str(run), max_steps=6)
    seen_at_start = []
    original = resumed.seed_store.start
    resumed.seed_store.start = lambda checkpoint: (original(checkpoint), seen_at_start.extend(_bank_rows(resumed)))
    with caplog.at_level(logging.WARNING):
        resumed.train(resume_from_checkpoint=True)
    assert seen_at_start == expected
    assert "Resuming from checkpoint-4" in caplog.text and "checkpoint-6" in caplog.text
    assert resumed.state.global_step == 6 and (run / "checkpoint-6" / "trainer_state.json").is_file()


# ---------------------------------------------------------------------------------------------------------------------
# Damaged files on resume


def test_a_damaged_bank_file_is_read_from_its_parquet_shard_and_rewritten(run, make_trainer, caplog):
    expected = _shard_rows(run)
    bank_file = run / "seeds" / "bank" / "step-000004.arrow"
    _truncate(bank_file)
    with caplog.at_level(logging.WARNING):
        resumed = _resume(make_trainer, run)
    assert _bank_rows(resumed) == expected
    assert "step-000004.arrow" in caplog.text
    pa.ipc.open_file(pa.memory_map(str(bank_file))).read_all()  # whole again
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # and its new checksum is recorded: the next resume finds nothing wrong
        assert _bank_rows(_resume(make_trainer, run)) == expected
    assert "step-000004" not in caplog.text


def test_a_flipped_bit_is_caught_by_the_checksum_and_the_other_copy_is_read(run, make_trainer):
    expected = _shard_rows(run)
    _flip_a_token_bit(run / "seeds" / "bank" / "step-000002.arrow")
    assert _bank_rows(_resume(make_trainer, run)) == expected  # not the flipped token


def test_a_damaged_parquet_shard_is_named_even_when_its_bank_file_restores_the_bank(run, make_trainer, caplog):
    expected = _shard_rows(run)
    _truncate(run / "seeds" / "step-000002.parquet")
    with caplog.at_level(logging.WARNING):
        resumed = _resume(make_trainer, run)
    assert _bank_rows(resumed) == expected
    assert "step-000002.parquet is damaged" in caplog.text


@pytest.mark.parametrize("damage", ["truncated shard, bank file gone", "flipped bit, shard gone"])
def test_resume_stops_with_one_line_naming_the_file_when_neither_copy_is_whole(run, make_trainer, damage):
    seeds = run / "seeds"
    if damage == "truncated shard, bank file gone":
        _truncate(seeds / "step-000004.parquet")
        (seeds / "bank" / "step-000004.arrow").unlink()
        named = ("step-000004.parquet: it is damaged", "step-000004.arrow is missing")
    else:
        _flip_a_token_bit(seeds / "bank" / "step-000004.arrow")
        (seeds / "step-000004.parquet").unlink()
        named = ("step-000004.parquet: it is missing", "step-000004.arrow is damaged")
    with pytest.raises(ValueError, match="Cannot read the seed shard") as error:
        _resume(make_trainer, run)
    assert all(part in str(error.value) for part in named) and "\n" not in str(error.value)


def test_token_ids_outside_the_vocabulary_are_refused_on_resume(run, make_trainer, tokenizer):
    """A bank file whose checksum was recorded after its damage (or a manifest without checksums) still has its ids
    checked against the vocabulary."""
    seeds = run / "seeds"
    bank_file = seeds / "bank" / "step-000004.arrow"
    table = pa.ipc.open_file(pa.BufferReader(bank_file.read_bytes())).read_all()
    ids = table.column("completion_ids").combine_chunks()
    values = ids.values.to_numpy().copy()
    values[0] = 11 * len(tokenizer)
    ids = pa.ListArray.from_arrays(ids.offsets, pa.array(values))
    table = table.set_column(table.schema.get_field_index("completion_ids"), "completion_ids", ids)
    with pa.OSFile(str(bank_file), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    manifest = json.loads((seeds / "manifest.json").read_text())
    for shard in manifest["shards"]:
        shard.pop("bank_sha256", None)  # as a manifest written before checksums
    (seeds / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=rf"step-000004.arrow holds token ids outside .*{11 * len(tokenizer)}"):
        _resume(make_trainer, run)


@pytest.mark.slow  # two 2-rank launches, about a minute each on 2 loaded cores
@c.RANKS
def test_two_ranks_resume_alike_from_a_damaged_bank_file(tiny_dir, tmp_path):  # noqa: F811
    """The main process checks the checksums and every rank reads the copy it found whole: no rank maps the torn file."""
    output_dir = tmp_path / "run"
    two_ranks = ["--config_file", str(ROOT / "accelerate_configs" / "multi_gpu.yaml")]
    two_ranks += ["--num_processes", "2", "--mixed_precision", "no"]
    train = [*_data_args(tiny_dir, output_dir), *SMALL, "--per_device_train_batch_size", "4", "--use_cpu"]
    _launch(tmp_path, two_ranks, [*train, "--max_steps", "2"])
    bank_file = output_dir / "seeds" / "bank" / "step-000002.arrow"
    _truncate(bank_file)
    resume = ["--max_steps", "3", "--resume_from_checkpoint", str(output_dir / "checkpoint-2")]
    result = _launch(tmp_path, two_ranks, [*train, *resume])
    assert "step-000002.arrow is damaged" in result.stderr
    pa.ipc.open_file(pa.memory_map(str(bank_file))).read_all()  # written again from the Parquet shard


def test_resuming_with_another_tokenizer_is_refused(run, make_trainer):
    manifest = json.loads((run / "seeds" / "manifest.json").read_text())
    manifest["tokenizer"] = "0123456789abcdef"  # as written by a run whose tokenizer maps text to other ids
    (run / "seeds" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="tokenizer of another vocabulary"):
        _resume(make_trainer, run)


# ---------------------------------------------------------------------------------------------------------------------
# Temporary files a killed writer left


def test_temporary_files_of_dead_writers_are_removed_and_live_ones_kept(run, make_trainer):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid, live_pid = int(dead.stdout), subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        left = [
            run / "seeds" / f".step-000006.parquet.tmp-{dead_pid}",
            run / "seeds" / "bank" / f".step-000006.arrow.tmp-{dead_pid}",
            run / "seeds" / f".manifest.json.tmp-{dead_pid}",
            run / "checkpoint-4" / f".seed_snapshot.json.tmp-{dead_pid}",
        ]
        in_progress = run / "seeds" / f".step-000006.parquet.tmp-{live_pid.pid}"
        for path in [*left, in_progress]:
            path.write_bytes(b"PAR1 torn")
        _resume(make_trainer, run)
        assert [path for path in left if path.exists()] == []
        assert in_progress.exists()
    finally:
        live_pid.kill()
        live_pid.wait()


# ---------------------------------------------------------------------------------------------------------------------
# seed_dataset: a manifest naming files elsewhere, malformed columns


@pytest.mark.parametrize("where", ["parent folder", "absolute path", "symbolic link"])
def test_a_manifest_entry_outside_the_seeds_folder_is_refused(run, make_trainer, tmp_path, where):
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(run / "seeds" / "step-000002.parquet", other / "x.parquet")
    manifest = json.loads((run / "seeds" / "manifest.json").read_text())
    name = {"parent folder": "../../other/x.parquet", "absolute path": str(other / "x.parquet")}.get(
        where, "x.parquet"
    )
    if where == "symbolic link":
        (run / "seeds" / "x.parquet").symlink_to(other / "x.parquet")
    manifest["shards"] = [{"file": name, "step": 2, "rows": 16}]
    (run / "seeds" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="outside") as error:
        make_trainer(output_dir=str(tmp_path / "new"), seed_dataset=str(run))
    assert "x.parquet" in str(error.value)


def _seed_dataset(run: Path, folder: Path, change) -> str:
    """A one-shard seed dataset made from `run`'s first shard, with `change(table)` applied."""
    folder.mkdir()
    pq.write_table(change(pq.read_table(run / "seeds" / "step-000002.parquet")), folder / "step-000002.parquet")
    return str(folder)


def _replace(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def _ids_as(table: pa.Table, kind: str) -> pa.Table:
    ids = table.column("completion_ids").combine_chunks()
    values = ids.values
    if kind == "null id":
        values = pa.array([None if i == 3 else v for i, v in enumerate(values.to_pylist())], pa.int32())
    elif kind == "fractional":
        values = pa.array([v + (0.5 if i == 3 else 0.0) for i, v in enumerate(values.to_pylist())], pa.float64())
    elif kind == "strings":
        values = pc.cast(values, pa.string())
    return _replace(table, "completion_ids", pa.ListArray.from_arrays(ids.offsets, values))


MALFORMED = {
    "null token id": ("completion_ids", "null token id", lambda t: _ids_as(t, "null id")),
    "fractional ids": ("completion_ids", "fractional token ids", lambda t: _ids_as(t, "fractional")),
    "ids as strings": ("completion_ids", "lists of string", lambda t: _ids_as(t, "strings")),
    "ids as one string": (
        "completion_ids",
        "a list of integer token ids per row, not string",
        lambda t: _replace(t, "completion_ids", pa.array([str(v) for v in t.column("completion_ids").to_pylist()])),
    ),
    "string log-probs": (
        "logprobs",
        "lists of string",
        lambda t: _replace(t, "logprobs", pc.cast(t.column("logprobs"), pa.list_(pa.string()))),
    ),
    "string rewards": (
        "reward",
        "must hold numbers",
        lambda t: _replace(t, "reward", pc.cast(t.column("reward"), pa.string())),
    ),
    "no tokenizer fingerprint": (
        "tokenizer",
        "seed_dataset_same_tokenizer=True",
        lambda t: _replace(t, "tokenizer", pa.nulls(t.num_rows, pa.string())),
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_seed_dataset_columns_are_refused_at_construction(run, make_trainer, tmp_path, case):
    column, what, change = MALFORMED[case]
    dataset = _seed_dataset(run, tmp_path / "malformed", change)
    with pytest.raises(ValueError) as error:
        make_trainer(output_dir=str(tmp_path / "new"), seed_dataset=dataset)
    message = str(error.value)
    assert dataset in message and f"'{column}'" in message and what in message and "\n" not in message


def test_a_seed_dataset_without_fingerprints_is_used_when_the_user_opts_in(run, make_trainer, tmp_path):
    dataset = _seed_dataset(run, tmp_path / "bare", lambda t: t.drop_columns(["tokenizer"]))
    trainer = make_trainer(output_dir=str(tmp_path / "new"), seed_dataset=dataset, seed_dataset_same_tokenizer=True)
    assert len(trainer.seed_bank) == pq.read_metadata(Path(dataset) / "step-000002.parquet").num_rows
