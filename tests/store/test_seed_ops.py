"""Seed data under real operations (issue 40): two runs in one folder, set-asides in one second, damaged or foreign
manifests and pointers, full and read-only disks, prompt ids that mean two prompts."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from datasets import Dataset
from huggingface_hub import DatasetCard
from transformers import TrainerCallback

from tests.conftest import seed_manifest, tiny_prompts

REPO = Path(__file__).resolve().parents[2]


def _one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


# ---------------------------------------------------------------------------------------------------------------------
# 1. One run at a time in an output_dir


class RunBeside(TrainerCallback):
    """At step 2 of the first run, starts a second one (fresh, then resumed) in the same folder, and records how each
    was refused."""

    def __init__(self, make_second):
        self.make_second, self.refusals = make_second, []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != 2:
            return
        for resume in (None, str(Path(args.output_dir) / "checkpoint-1")):
            with pytest.raises(ValueError) as error:
                self.make_second().train(resume_from_checkpoint=resume)
            self.refusals.append(_one_line(error))


def test_a_second_run_in_the_same_output_dir_is_refused_while_the_first_lives(make_trainer):
    settings = dict(dataset=tiny_prompts(2), max_steps=3, save_steps=1)
    first = make_trainer(**settings)
    watch = RunBeside(lambda: make_trainer(**settings))
    first.add_callback(watch)
    first.train()
    assert len(watch.refusals) == 2 and all("in use" in r and first.args.output_dir in r for r in watch.refusals)
    # The first run's seeds are whole: its manifest lists its three shards, and its checkpoints resume.
    assert [s["step"] for s in seed_manifest(first.args.output_dir)["shards"]] == [1, 2, 3]
    second = make_trainer(**{**settings, "max_steps": 4})
    second.train(resume_from_checkpoint=str(Path(first.args.output_dir) / "checkpoint-3"))  # the lock was let go
    assert second.state.global_step == 4


def test_a_folder_without_locks_is_held_by_a_marker_that_a_dead_run_leaves_behind(make_trainer, monkeypatch):
    import errno

    from ts_trl.store import lock

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(lock.fcntl, "flock", no_locks)  # as on a FUSE mount without locks
    settings = dict(dataset=tiny_prompts(2), max_steps=2, save_steps=1)
    first = make_trainer(**settings)
    marker = Path(first.args.output_dir) / lock.RUNNING_FILE
    seen = []

    class Look(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(marker.read_text())  # held while it trains, naming the run

    first.add_callback(Look())
    first.train()
    assert seen and all(f"pid {os.getpid()}" in text for text in seen) and not marker.exists()  # let go at the end
    marker.write_text("pid 1 on node-0, since 2026-12-04 10:00:00\n")  # what a run killed there leaves
    with pytest.raises(ValueError) as error:
        make_trainer(**{**settings, "max_steps": 3}).train(resume_from_checkpoint=str(marker.parent / "checkpoint-2"))
    assert str(marker) in _one_line(error) and "pid 1 on node-0" in str(error.value) and "delete" in str(error.value)
    marker.unlink()  # the user's word that no run is alive there
    resumed = make_trainer(**{**settings, "max_steps": 3})
    resumed.train(resume_from_checkpoint=str(marker.parent / "checkpoint-2"))
    assert resumed.state.global_step == 3 and not marker.exists()


CHILD = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.conftest import TINY_SETTINGS, count_reward, tiny_prompts
from transformers import TrainerCallback
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
from ts_trl.tiny import build_tiny_model, build_tokenizer

class Hang(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3:  # checkpoint-2 is saved after step 2's callbacks
            Path({marker!r}).write_text("training")
            signal.pause()  # killed here by the test, as a node failure would

args = SeedGRPOConfig(**{{**TINY_SETTINGS, "output_dir": {output_dir!r}, "max_steps": 4, "save_steps": 1}})
tokenizer = build_tokenizer()
trainer = SeedGRPOTrainer(model=build_tiny_model(tokenizer), reward_funcs=count_reward, args=args,
                          train_dataset=tiny_prompts(2), processing_class=tokenizer, callbacks=[Hang()])
trainer.train()
"""


def test_a_killed_runs_folder_is_refused_while_it_lives_then_resumes(make_trainer, tmp_path):
    output_dir, marker = tmp_path / "run", tmp_path / "marker"
    script = CHILD.format(repo=str(REPO), marker=str(marker), output_dir=str(output_dir))
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env={**os.environ, "PYTHONPATH": ""})
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert child.poll() is None, "the first run ended before step 3"
            assert time.monotonic() < deadline, "the first run did not reach step 3"
            time.sleep(0.5)
        with pytest.raises(ValueError) as error:  # another process holds the folder
            make_trainer(dataset=tiny_prompts(2), save_steps=1).train(str(output_dir / "checkpoint-1"))
        assert "in use" in _one_line(error) and f"pid {child.pid}" in str(error.value)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    resumed = make_trainer(dataset=tiny_prompts(2), save_steps=1, max_steps=3)
    resumed.train(resume_from_checkpoint=str(output_dir / "checkpoint-2"))  # a killed run leaves no lock behind
    assert resumed.state.global_step == 3


# ---------------------------------------------------------------------------------------------------------------------
# 7. Set-asides in one second


def test_set_asides_in_one_second_keep_every_shard(make_trainer, monkeypatch):
    monkeypatch.setattr(time, "strftime", lambda *args: "20260101-000000")  # every set-aside in the same second
    shards = []
    for _ in range(3):  # runs 2 and 3 each find the previous run's seeds and set them aside
        trainer = make_trainer(dataset=tiny_prompts(2), max_steps=2, save_steps=1)
        trainer.train()
        shards += [s["sha256"] for s in seed_manifest(trainer.args.output_dir)["shards"]]
    superseded = Path(trainer.args.output_dir) / "seeds" / "superseded"
    kept = sorted(p for p in superseded.rglob("*.parquet"))
    assert len(kept) == 4  # runs 1 and 2, two shards each: none overwritten
    from ts_trl.store.files import file_sha256

    assert sorted(map(file_sha256, kept)) == sorted(shards[:4])


# ---------------------------------------------------------------------------------------------------------------------
# 12. Manifests and pointers that are not this release's, damaged or malformed


@pytest.fixture
def finished_run(make_trainer):
    trainer = make_trainer(dataset=tiny_prompts(2), max_steps=2, save_steps=1)
    trainer.train()
    return Path(trainer.args.output_dir)


def _edit_manifest(output_dir: Path, edit) -> Path:
    path = output_dir / "seeds" / "manifest.json"
    payload = json.loads(path.read_text())
    edit(payload)
    path.write_text(json.dumps(payload))
    return path


def _resume(make_trainer, output_dir: Path, step: int = 2, max_steps: int = 3):
    trainer = make_trainer(dataset=tiny_prompts(2), max_steps=max_steps, save_steps=1)
    trainer.train(resume_from_checkpoint=str(output_dir / f"checkpoint-{step}"))
    return trainer


def test_a_manifest_of_a_later_format_is_refused_and_left_alone(make_trainer, finished_run):
    path = _edit_manifest(finished_run, lambda payload: payload.update(format=99))
    before = path.read_bytes()
    with pytest.raises(ValueError) as error:
        _resume(make_trainer, finished_run)
    assert "format 99" in _one_line(error) and str(path) in str(error.value)
    assert path.read_bytes() == before


def test_unknown_manifest_keys_are_kept(make_trainer, finished_run):
    _edit_manifest(finished_run, lambda payload: payload.update(curated_by="a later tool"))
    _resume(make_trainer, finished_run)
    manifest = seed_manifest(finished_run)
    assert manifest["curated_by"] == "a later tool" and [s["step"] for s in manifest["shards"]] == [1, 2, 3]


def test_a_shard_listed_twice_is_refused(make_trainer, finished_run):
    path = _edit_manifest(finished_run, lambda payload: payload["shards"].append(dict(payload["shards"][0])))
    with pytest.raises(ValueError) as error:
        _resume(make_trainer, finished_run)
    assert "step-000001.parquet" in _one_line(error) and "twice" in str(error.value) and str(path) in str(error.value)


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],
        lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "shards"}),
    ],
    ids=["truncated", "no-shards"],
)
def test_a_damaged_checkpoint_pointer_is_named_in_one_line(make_trainer, finished_run, damage):
    pointer = finished_run / "checkpoint-2" / "seed_snapshot.json"
    pointer.write_text(damage(pointer.read_text()))
    with pytest.raises(ValueError) as error:
        _resume(make_trainer, finished_run)
    assert str(pointer) in _one_line(error)


# ---------------------------------------------------------------------------------------------------------------------
# 12. Full and read-only disks (a small tmpfs; mounting needs root)


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_while_writing_a_shard_is_named_in_one_line(make_trainer, small_disk):
    trainer = make_trainer(
        dataset=tiny_prompts(2),
        output_dir=str(small_disk / "run"),
        save_strategy="no",
        seed_snapshot_steps=1,
        max_steps=200,
        max_completion_length=64,
    )
    with pytest.raises(OSError) as error:
        trainer.train()
    message = _one_line(error)
    assert "full" in message and str(small_disk / "run" / "seeds") in message
    assert trainer.state.global_step < 200
    manifest = seed_manifest(small_disk / "run")  # what was written before is listed and whole
    from ts_trl.store.files import file_sha256

    for shard in manifest["shards"]:
        assert file_sha256(small_disk / "run" / "seeds" / shard["file"]) == shard["sha256"]


def test_a_read_only_output_dir_is_refused_before_training(make_trainer, small_disk):
    (small_disk / "run").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    trainer = make_trainer(dataset=tiny_prompts(2), output_dir=str(small_disk / "run"))
    with pytest.raises(ValueError) as error:
        trainer.train()
    assert "not writable" in _one_line(error) and str(small_disk / "run") in str(error.value)
    assert trainer.state.global_step == 0


# ---------------------------------------------------------------------------------------------------------------------
# 9. Prompt ids


def test_a_training_set_with_two_prompts_under_one_prompt_id_is_refused(make_trainer):
    dataset = Dataset.from_dict({"prompt": ["Q: 1+2=", "Q: 2+3=", "Q: 3+4="], "prompt_id": ["a", "b", "a"]})
    with pytest.raises(ValueError) as error:
        make_trainer(dataset=dataset)
    message = _one_line(error)
    assert "'a'" in message and "prompt_id" in message
    make_trainer(dataset=Dataset.from_dict({"prompt": ["Q: 1+2=", "Q: 1+2="], "prompt_id": ["a", "a"]}))  # same text


# ---------------------------------------------------------------------------------------------------------------------
# 4, 5. Shards the manifest does not list; seeds/ deleted while training


def test_a_shard_the_manifest_does_not_list_is_set_aside_not_overwritten(make_trainer, finished_run):
    seeds = finished_run / "seeds"
    from ts_trl.store.files import file_sha256

    # A crash after step 3's shard was renamed into place, before the manifest listed it.
    shutil.copy(seeds / "step-000002.parquet", seeds / "step-000003.parquet")
    stray = file_sha256(seeds / "step-000003.parquet")
    _resume(make_trainer, finished_run, max_steps=4)
    assert [s["step"] for s in seed_manifest(finished_run)["shards"]] == [1, 2, 3, 4]
    assert stray in {file_sha256(p) for p in (seeds / "superseded").rglob("step-000003.parquet")}
    assert file_sha256(seeds / "step-000003.parquet") != stray


def test_shards_without_a_manifest_are_set_aside_by_a_new_run(make_trainer, finished_run):
    seeds = finished_run / "seeds"
    from ts_trl.store.files import file_sha256

    old = {file_sha256(p) for p in seeds.glob("step-*.parquet")}
    (seeds / "manifest.json").unlink()
    trainer = make_trainer(dataset=tiny_prompts(2), max_steps=2, save_steps=1)
    trainer.train()
    assert old <= {file_sha256(p) for p in (seeds / "superseded").rglob("step-*.parquet")}
    assert not old & {file_sha256(p) for p in seeds.glob("step-*.parquet")}


class DeleteSeeds(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            shutil.rmtree(Path(args.output_dir) / "seeds")


def test_seeds_deleted_while_training_stop_the_run_in_one_line(make_trainer):
    trainer = make_trainer(dataset=tiny_prompts(2), max_steps=4, save_steps=1)
    trainer.add_callback(DeleteSeeds())
    with pytest.raises(ValueError) as error:
        trainer.train()
    assert "seeds" in _one_line(error) and "step-000001.parquet" in str(error.value)
    output_dir = Path(trainer.args.output_dir)
    assert not (output_dir / "checkpoint-3").exists()  # no checkpoint that could not be resumed


# ---------------------------------------------------------------------------------------------------------------------
# 6. Another reward set on resume


def other_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def test_a_resume_with_another_reward_set_is_refused(make_trainer, finished_run):
    from tests.conftest import count_reward

    trainer = make_trainer(dataset=tiny_prompts(2), max_steps=3, save_steps=1, reward=[count_reward, other_reward])
    with pytest.raises(ValueError) as error:
        trainer.train(resume_from_checkpoint=str(finished_run / "checkpoint-2"))
    assert "reward_other_reward" in _one_line(error)


# ---------------------------------------------------------------------------------------------------------------------
# 9. A seed's prompt_id must mean the same prompt here


def test_a_seed_dataset_whose_prompt_ids_mean_other_prompts_here_is_refused(make_trainer, tmp_path):
    ids = ["p0", "p1"]
    first = make_trainer(
        dataset=Dataset.from_dict({"prompt": ["Q: 0+1=", "Q: 1+2="], "prompt_id": ids}),
        output_dir=str(tmp_path / "a"),
        max_steps=2,
        save_steps=1,
    )
    first.train()
    other_prompts = Dataset.from_dict({"prompt": ["Q: 5+6=", "Q: 6+7="], "prompt_id": ids})
    with pytest.raises(ValueError) as error:
        make_trainer(dataset=other_prompts, output_dir=str(tmp_path / "b"), seed_dataset=str(tmp_path / "a"))
    assert "'p0'" in _one_line(error) or "'p1'" in str(error.value)
    same_prompts = Dataset.from_dict({"prompt": ["Q: 0+1=", "Q: 1+2="], "prompt_id": ids})
    make_trainer(dataset=same_prompts, output_dir=str(tmp_path / "c"), seed_dataset=str(tmp_path / "a"))


def test_a_trace_whose_prompt_id_and_prompt_disagree_is_refused(make_trainer, tmp_path):
    dataset = Dataset.from_dict({"prompt": ["Q: 0+1=", "Q: 1+2="], "prompt_id": ["p0", "p1"]})
    traces = tmp_path / "traces.jsonl"
    rows = [
        {"prompt_id": "p0", "prompt": "Q: 0+1=", "completion": " 1\nA: 1"},
        {"prompt_id": "p1", "prompt": "Q: 8+9=", "completion": " 17\nA: 17"},  # p1 is "Q: 1+2=" here
    ]
    traces.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError) as error:
        make_trainer(dataset=dataset, seed_dataset=str(traces), max_completion_length=40)
    assert "'p1'" in _one_line(error) and "Q: 8+9=" in str(error.value)


# ---------------------------------------------------------------------------------------------------------------------
# 13. Traces far over the budget


def test_traces_far_over_the_budget_are_refused_by_their_length_before_tokenising(make_trainer, tmp_path):
    dataset = Dataset.from_dict({"prompt": ["Q: 0+1=", "Q: 1+2="]})
    traces = tmp_path / "traces.jsonl"
    rows = [{"prompt": "Q: 0+1=", "completion": " 1\nA: 1"}]
    rows += [{"prompt": "Q: 1+2=", "completion": "3+" * 100_000} for _ in range(8)]
    traces.write_text("".join(json.dumps(row) + "\n" for row in rows))
    started = time.monotonic()
    with pytest.raises(ValueError) as error:
        make_trainer(dataset=dataset, seed_dataset=str(traces), max_completion_length=40)
    assert "8 of its 9 traces are over" in _one_line(error) and "characters" in str(error.value)
    print(f"refused in {time.monotonic() - started:.1f} s")


# ---------------------------------------------------------------------------------------------------------------------
# 11, 12. seed_dataset: the run's own folder, a dataset that changed before a resume, clashing ids, invalid UTF-8


def test_a_seed_dataset_in_the_runs_own_output_dir_is_refused(make_trainer, finished_run):
    for seed_dataset in (finished_run, finished_run / "seeds"):
        with pytest.raises(ValueError) as error:
            make_trainer(dataset=tiny_prompts(2), seed_dataset=str(seed_dataset))
        assert "own output_dir" in _one_line(error)


def test_a_seed_dataset_that_gained_a_shard_before_a_resume_is_refused(make_trainer, tmp_path):
    source = make_trainer(dataset=tiny_prompts(2), output_dir=str(tmp_path / "a"), max_steps=2, save_steps=1)
    source.train()
    settings = dict(dataset=tiny_prompts(2), output_dir=str(tmp_path / "b"), seed_dataset=str(tmp_path / "a"))
    seeded = make_trainer(**settings, max_steps=2, save_steps=1)
    seeded.train()
    more = make_trainer(dataset=tiny_prompts(2), output_dir=str(tmp_path / "a"), max_steps=3, save_steps=1)
    more.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))  # the seed dataset gains step 3
    with pytest.raises(ValueError) as error:
        make_trainer(**settings, max_steps=3, save_steps=1).train(str(tmp_path / "b" / "checkpoint-2"))
    assert "changed" in _one_line(error) and str(tmp_path / "a") in str(error.value)


def test_two_trace_files_numbering_rollout_ids_alike_are_refused(make_trainer, tmp_path):
    dataset = Dataset.from_dict({"prompt": ["Q: 0+1=", "Q: 1+2="]})
    (tmp_path / "traces").mkdir()
    for name, prompt in (("a.jsonl", "Q: 0+1="), ("b.jsonl", "Q: 1+2=")):
        row = {"rollout_id": "0", "prompt": prompt, "completion": " 1\nA: 1"}
        (tmp_path / "traces" / name).write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError) as error:
        make_trainer(dataset=dataset, seed_dataset=str(tmp_path / "traces"), max_completion_length=40)
    assert "rollout_id '0'" in _one_line(error)


def test_invalid_utf8_in_a_seed_parquet_is_named_in_one_line(make_trainer, finished_run, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(finished_run / "seeds" / "step-000001.parquet")
    column = table.column("prompt_id").combine_chunks()
    data = bytearray(column.buffers()[2].to_pybytes())
    data[0] = 0xFF  # not a UTF-8 byte anywhere
    broken = pa.Array.from_buffers(
        pa.string(), len(column), [column.buffers()[0], column.buffers()[1], pa.py_buffer(bytes(data))]
    )
    table = table.set_column(table.schema.get_field_index("prompt_id"), "prompt_id", broken)
    pq.write_table(table, tmp_path / "broken.parquet")
    with pytest.raises(ValueError) as error:
        make_trainer(
            dataset=tiny_prompts(2), output_dir=str(tmp_path / "b"), seed_dataset=str(tmp_path / "broken.parquet")
        )
    assert "UTF-8" in _one_line(error) and "prompt_id" in str(error.value)


def test_a_runs_seeds_folder_uploaded_to_the_hub_seeds_another_run(hub, make_trainer, finished_run, tmp_path):
    """The Hub cache stores files as symbolic links into its blobs/: a manifest's files are found through them."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.endpoint)
    api.create_repo("org/run-seeds", repo_type="dataset")
    api.upload_folder(folder_path=str(finished_run / "seeds"), repo_id="org/run-seeds", repo_type="dataset")
    trainer = make_trainer(dataset=tiny_prompts(2), output_dir=str(tmp_path / "b"), seed_dataset="org/run-seeds")
    rows = sum(s["rows"] for s in seed_manifest(finished_run)["shards"])
    assert len(trainer.seed_bank) == rows > 0


# ---------------------------------------------------------------------------------------------------------------------
# 10. Seeds none of which can be cut


def test_a_seed_dataset_none_of_whose_seeds_can_be_cut_is_refused_at_construction(
    make_trainer, finished_run, tmp_path
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(finished_run / "seeds" / "step-000001.parquet")
    one = table.column("completion_ids").to_pylist()
    for name, values in (("completion_ids", [ids[:1] for ids in one]), ("logprobs", [[-0.5]] * len(one))):
        column = pa.array(values, table.schema.field(name).type)
        table = table.set_column(table.schema.get_field_index(name), name, column)
    pq.write_table(table, tmp_path / "one-token.parquet")  # one-token seeds: no cut leaves a token of the seed out
    with pytest.raises(ValueError) as error:
        make_trainer(
            dataset=tiny_prompts(2), output_dir=str(tmp_path / "b"), seed_dataset=str(tmp_path / "one-token.parquet")
        )
    assert "none of its" in _one_line(error) and "cut" in str(error.value)
    make_trainer(dataset=tiny_prompts(2), output_dir=str(tmp_path / "c"), seed_dataset=str(finished_run))


# ---------------------------------------------------------------------------------------------------------------------
# 3. Hub pushes that a crash left undone

CRASH_CHILD = """
import signal, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.conftest import TINY_SETTINGS, count_reward, tiny_prompts
from transformers import TrainerCallback
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
from ts_trl.tiny import build_tiny_model, build_tokenizer

signals = Path({signals!r})

def wait(condition):
    deadline = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.05)

class Steer(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:  # checkpoint-1's shard was submitted: let it arrive, then the Hub fails
            wait(lambda: self.pusher.status()["pushed"] == 1)
            (signals / "first-pushed").write_text("")
            wait((signals / "hub-failing").exists)
        if state.global_step == 6:  # checkpoint-5 is saved; the pushes of shards 2 to 5 are failing
            (signals / "crash-here").write_text("")
            signal.pause()  # killed here by the test, as by a crash

settings = {{**TINY_SETTINGS, "output_dir": {output_dir!r}, "max_steps": 6, "save_steps": 1}}
args = SeedGRPOConfig(**settings, push_seeds_to_hub=True, hub_seed_dataset_id={repo_id!r})
tokenizer = build_tokenizer()
steer = Steer()
trainer = SeedGRPOTrainer(model=build_tiny_model(tokenizer), reward_funcs=count_reward, args=args,
                          train_dataset=tiny_prompts(2), processing_class=tokenizer, callbacks=[steer])
steer.pusher = trainer.seed_store.pusher
trainer.train()
"""


def _wait_for_file(path: Path, child: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not path.exists():
        assert child.poll() is None, f"the child run ended before writing {path.name}"
        assert time.monotonic() < deadline, f"the child run did not write {path.name}"
        time.sleep(0.1)


def _hub_shards(hub, repo_id):
    return sorted(path for path in hub.files(repo_id) if path.startswith("data/"))


def test_pushes_a_crash_left_undone_are_made_at_the_next_start(hub, make_trainer, tmp_path, caplog):
    """Pushes fail from step 2 on, the run is killed (-9) at step 6, and resumed from checkpoint-4 with the Hub back:
    shards 2 to 4 reach the Hub with one log line, shard 1 is not pushed again, the set-aside shard 5 never is."""
    repo_id, output_dir, signals = "org/seeds", tmp_path / "run", tmp_path / "signals"
    signals.mkdir()
    script = CRASH_CHILD.format(repo=str(REPO), signals=str(signals), output_dir=str(output_dir), repo_id=repo_id)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env={**os.environ, "PYTHONPATH": ""})
    try:
        _wait_for_file(signals / "first-pushed", child)
        hub.fail_next(10**6, path_contains="/commit/")
        (signals / "hub-failing").write_text("")
        _wait_for_file(signals / "crash-here", child)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    hub.heal()
    assert _hub_shards(hub, repo_id) == ["data/step-000001.parquet"]
    assert [s["step"] for s in seed_manifest(output_dir)["shards"]] == [1, 2, 3, 4, 5]
    commits = len(hub.commit_titles(repo_id))
    abandoned = (output_dir / "seeds" / "step-000005.parquet").read_bytes()

    resumed = make_trainer(
        dataset=tiny_prompts(2), max_steps=6, save_steps=1, push_seeds_to_hub=True, hub_seed_dataset_id=repo_id
    )
    resumed.train(resume_from_checkpoint=str(output_dir / "checkpoint-4"))

    listed = [s["file"] for s in seed_manifest(output_dir)["shards"]]
    assert listed == [f"step-00000{step}.parquet" for step in range(1, 7)]
    assert _hub_shards(hub, repo_id) == [f"data/{name}" for name in listed]
    files = hub.files(repo_id)
    assert all(files[f"data/{name}"] == (output_dir / "seeds" / name).read_bytes() for name in listed)
    assert hub.commit_titles(repo_id)[commits:] == [f"Add seed shard {name}" for name in listed[1:]]
    lines = [r.getMessage() for r in caplog.records if "does not hold yet" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert (
        "Pushing 3 seed shard(s)" in lines[0] and "step-000002.parquet, step-000003.parquet, step-000004." in lines[0]
    )
    # The abandoned branch's shard 5 (in seeds/superseded/) was never in any commit; the resumed run's own shard 5 is.
    assert abandoned != (output_dir / "seeds" / "step-000005.parquet").read_bytes()
    assert abandoned in [p.read_bytes() for p in (output_dir / "seeds" / "superseded").rglob("step-000005.parquet")]
    assert all(c.files.get("data/step-000005.parquet") != abandoned for c in hub.repos[("dataset", repo_id)].commits)


def test_a_resume_moves_the_hub_shards_its_manifest_does_not_list_out_of_data(hub, make_trainer, tmp_path, caplog):
    """A run pushes shards 1 to 5 and is resumed from checkpoint-3 to end at step 4: the abandoned branch's shards 4
    and 5 are not the manifest's (shard 5 is never written again), so the resume moves them out of data/ in the repo,
    byte for byte, in one commit with one warning; the run pushes its own shard 4, and load_dataset reads only the
    manifest's shards."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    repo_id, output_dir = "org/seeds", tmp_path / "run"
    pushing = dict(dataset=tiny_prompts(2), save_steps=1, push_seeds_to_hub=True, hub_seed_dataset_id=repo_id)
    make_trainer(**pushing, max_steps=5).train()
    assert _hub_shards(hub, repo_id) == [f"data/step-00000{step}.parquet" for step in range(1, 6)]
    abandoned = {name: hub.files(repo_id)[f"data/{name}"] for name in ("step-000004.parquet", "step-000005.parquet")}
    commits = len(hub.commit_titles(repo_id))

    make_trainer(**pushing, max_steps=4).train(resume_from_checkpoint=str(output_dir / "checkpoint-3"))

    listed = [s["file"] for s in seed_manifest(output_dir)["shards"]]
    assert listed == [f"step-00000{step}.parquet" for step in range(1, 5)]
    assert _hub_shards(hub, repo_id) == [f"data/{name}" for name in listed]
    files = hub.files(repo_id)
    assert all(files[f"data/{name}"] == (output_dir / "seeds" / name).read_bytes() for name in listed)
    moved = {path.rsplit("/", 1)[1]: data for path, data in files.items() if path.startswith("superseded/")}
    assert moved == abandoned  # nothing lost: both set-aside shards, byte for byte, under one superseded/<time>/
    assert len({path.rsplit("/", 1)[0] for path in files if path.startswith("superseded/")}) == 1
    assert sorted(path for path in files if not path.startswith(("data/", "superseded/"))) == [
        ".gitattributes",
        "README.md",
    ]
    card = DatasetCard(files["README.md"].decode())  # configs: data/ (and the folder's top level), not superseded/
    assert card.data.configs[0]["data_files"] == [{"split": "train", "path": ["step-*.parquet", "data/*.parquet"]}]
    titles = hub.commit_titles(repo_id)[commits:]
    assert len(titles) == 2 and "does not list" in titles[0] and titles[1] == "Add seed shard step-000004.parquet"
    lines = [r.getMessage() for r in caplog.records if "that the run's manifest does not list" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "step-000004.parquet, step-000005.parquet" in lines[0]

    loaded = datasets.load_dataset(repo_id, split="train", cache_dir=str(tmp_path / "datasets-cache"))
    expected = [pq.read_table(output_dir / "seeds" / name) for name in listed]
    assert len(loaded) == sum(table.num_rows for table in expected) > 0
    assert all(pq.read_table(pa.BufferReader(data)).num_rows > 0 for data in abandoned.values())
    rows = sorted(zip(loaded["step"], loaded["completion"]))
    assert rows == sorted(
        pair for table in expected for pair in zip(*table.select(["step", "completion"]).to_pydict().values())
    )


def test_a_fresh_run_moves_an_earlier_runs_hub_shards_out_of_data(hub, make_trainer, tmp_path, caplog):
    """A fresh run in a folder whose earlier run pushed shards 1 to 3: the earlier run's shards leave data/ for
    superseded/ (shard 3, which this run never writes, included), so the repo's data/ is this run's manifest."""
    repo_id, output_dir = "org/seeds", tmp_path / "run"
    pushing = dict(dataset=tiny_prompts(2), save_steps=1, push_seeds_to_hub=True, hub_seed_dataset_id=repo_id)
    make_trainer(**pushing, max_steps=3).train()
    earlier = {path.removeprefix("data/"): data for path, data in hub.files(repo_id).items() if "data/" in path}

    make_trainer(**pushing, max_steps=2).train()

    listed = [s["file"] for s in seed_manifest(output_dir)["shards"]]
    assert listed == ["step-000001.parquet", "step-000002.parquet"]
    files = hub.files(repo_id)
    assert _hub_shards(hub, repo_id) == [f"data/{name}" for name in listed]
    assert files["data/step-000002.parquet"] == (output_dir / "seeds" / "step-000002.parquet").read_bytes()
    moved = {path.rsplit("/", 1)[1]: data for path, data in files.items() if path.startswith("superseded/")}
    assert moved == earlier and len(earlier) == 3
    assert any("step-000003.parquet" in r.getMessage() and "superseded/" in r.getMessage() for r in caplog.records)


def test_an_unreachable_hub_at_start_does_not_stop_the_run_and_the_next_start_pushes(
    hub, make_trainer, tmp_path, caplog, monkeypatch
):
    import functools
    import socket

    from huggingface_hub import constants as hf_constants

    from ts_trl.store import seed_store
    from ts_trl.store.hub import ShardPusher

    monkeypatch.setattr(seed_store, "ShardPusher", functools.partial(ShardPusher, max_retries=1, backoff=0.05))
    with socket.socket() as probe:  # a port nothing listens on: connections are refused, as with the network down
        probe.bind(("127.0.0.1", 0))
        unreachable = f"http://127.0.0.1:{probe.getsockname()[1]}"
    output_dir, repo_id = tmp_path / "run", "org/seeds"
    settings = dict(dataset=tiny_prompts(2), save_steps=1)
    make_trainer(**settings, max_steps=2).train()  # without pushing: the Hub has none of its shards

    monkeypatch.setattr(hf_constants, "ENDPOINT", unreachable)
    pushing = dict(push_seeds_to_hub=True, hub_seed_dataset_id=repo_id)
    offline = make_trainer(**settings, **pushing, max_steps=3)
    offline.train(resume_from_checkpoint=str(output_dir / "checkpoint-2"))
    assert offline.state.global_step == 3 and (output_dir / "checkpoint-3").is_dir()
    lines = [r.getMessage() for r in caplog.records if "Could not compare" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "2 seed shard(s)" in lines[0] and repo_id in lines[0] and "next start" in lines[0]
    assert ("dataset", repo_id) not in hub.repos
    assert any("could not be compared" in r.getMessage() for r in caplog.records)  # said again by the end's report

    caplog.clear()
    monkeypatch.setattr(hf_constants, "ENDPOINT", hub.endpoint)
    online = make_trainer(**settings, **pushing, max_steps=4)
    online.train(resume_from_checkpoint=str(output_dir / "checkpoint-3"))
    listed = [s["file"] for s in seed_manifest(output_dir)["shards"]]
    assert len(listed) == 4 and _hub_shards(hub, repo_id) == [f"data/{name}" for name in listed]
    files = hub.files(repo_id)
    assert all(files[f"data/{name}"] == (output_dir / "seeds" / name).read_bytes() for name in listed)
    assert any("Pushing 3 seed shard(s)" in r.getMessage() for r in caplog.records)


def test_a_resume_never_pushes_a_shard_it_found_damaged(hub, make_trainer, tmp_path, caplog):
    output_dir, repo_id = tmp_path / "run", "org/seeds"
    make_trainer(dataset=tiny_prompts(2), max_steps=2, save_steps=1).train()  # without pushing
    damaged = output_dir / "seeds" / "step-000001.parquet"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))  # the .arrow copy is whole: the bank is rebuilt from it
    resumed = make_trainer(
        dataset=tiny_prompts(2), max_steps=3, save_steps=1, push_seeds_to_hub=True, hub_seed_dataset_id=repo_id
    )
    resumed.train(resume_from_checkpoint=str(output_dir / "checkpoint-2"))
    assert _hub_shards(hub, repo_id) == ["data/step-000002.parquet", "data/step-000003.parquet"]
    (line,) = [r.getMessage() for r in caplog.records if "does not hold yet" in r.getMessage()]
    assert "Pushing 1 seed shard(s)" in line and "step-000002.parquet" in line and "step-000001" not in line
