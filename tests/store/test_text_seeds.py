"""Seeds from elsewhere: another tokenizer's seed dataset and plain trace files, re-tokenised from their text."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import csv

from tests.conftest import build_word_tokenizer, logged, seed_by_id, seed_manifest, seed_rows
from ts_trl.embedded import EmbeddedTask, embedded_reward
from ts_trl.store.external_seeds import CACHE_DIR, read_any
from ts_trl.store.schema import tokenizer_fingerprint
from ts_trl.store.text_seeds import retokenise
from ts_trl.store.traces import read_traces
from ts_trl.tiny import build_tokenizer

REPO_ID = "org/seeds"


def ends_at_text_boundary(text: str, prefix: str) -> bool:
    n = len(prefix)
    return text.startswith(prefix) and 0 < n < len(text) and (text[n - 1].isspace() or text[n].isspace())


@pytest.mark.parametrize("build", [build_word_tokenizer, build_tokenizer])
def test_cuts_land_on_text_boundaries_this_tokenizer_would_make(build):
    tokenizer = build()
    texts = [" 7+15=22\n22+9=31\n#### 31", "Let x be 12 and y 7:\nx + y = 19\n\n####  19 ", "nospace"]
    for text in texts:
        ids, cuts = retokenise(tokenizer, text)
        assert tokenizer.decode(ids) == text
        for k in cuts.tolist():
            prefix = tokenizer.decode(ids[:k])
            assert ends_at_text_boundary(text, prefix), (text, k, prefix)
            assert tokenizer(prefix, add_special_tokens=False)["input_ids"] == ids[:k]  # no token split differently
    word = build_word_tokenizer()
    ids, cuts = retokenise(word, "#### 31")  # "####", " 31": after the space would split " 31" differently
    assert cuts.tolist() == [1]
    assert retokenise(word, " 7+15=22\n22+9=31\n#### 31", newline_only=True)[1].tolist() == [6, 12]
    assert retokenise(word, "nospace")[1].size == 0


def test_chat_messages_and_named_columns_are_read():
    rows = [
        {"messages": [{"role": "user", "content": "Q: 1+2"}, {"role": "assistant", "content": " 1+2=3"}], "q": "x"},
    ]
    traces, columns = read_traces(pa.Table.from_pylist(rows), None, None, "s")
    assert traces[0].prompt == [{"role": "user", "content": "Q: 1+2"}] and traces[0].text == " 1+2=3"
    assert columns == ("messages (messages)", "messages")
    traces, _ = read_traces(pa.Table.from_pylist(rows), "q", "messages", "s")
    assert traces[0].prompt == "x"


@pytest.mark.parametrize("kind", ["parquet", "csv", "json", "jsonl"])
def test_trace_files_of_every_format_are_read(tmp_path, kind):
    rows = [{"question": "Q: 1+2\nA:", "solution": " 1+2=3\n#### 3"}, {"question": "Q: 2+2\nA:", "solution": " 4"}]
    path = tmp_path / f"traces.{kind}"
    if kind == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif kind == "json":
        path.write_text(json.dumps(rows))
    else:
        table = pa.Table.from_pylist(rows)
        pq.write_table(table, path) if kind == "parquet" else csv.write_csv(table, path)
    table = read_any(tmp_path, "s")  # the folder: its one file of traces
    traces, _ = read_traces(table, "question", "solution", "s")
    assert [(t.prompt, t.text) for t in traces] == [(r["question"], r["solution"]) for r in rows]


def test_a_trace_dataset_on_the_hub_is_read_at_a_recorded_commit(hub, make_trainer, tmp_path):
    from huggingface_hub import HfApi

    dataset = EmbeddedTask().make_splits(4, 1)[0]
    right, lines = write_traces(tmp_path / "traces.jsonl", dataset)
    api = HfApi(endpoint=hub.endpoint)
    api.create_repo("org/traces", repo_type="dataset")
    api.upload_file(
        path_or_fileobj=str(tmp_path / "traces.jsonl"),
        path_in_repo="train/traces.jsonl",
        repo_id="org/traces",
        repo_type="dataset",
    )
    trainer = make_trainer(
        dataset=dataset,
        reward=embedded_reward,
        seed_dataset="org/traces",
        seed_filter="success",
        max_completion_length=32,
    )
    assert sorted(trainer.seed_bank.rollout_ids) == sorted(right)
    external = trainer.seed_store.external_provenance
    assert external["revision"] == api.dataset_info("org/traces").sha and external["kind"] == "traces"
    assert external["successful"] == len(right) and external["model"] is None


def test_seeds_of_another_tokenizer_from_the_hub(hub, make_trainer, tmp_path):
    """Run A (word-level BPE tokenizer) publishes its seeds; run B (character tokenizer) seeds from them and trains."""
    word = build_word_tokenizer()
    first = make_trainer(
        processing_class=word,
        output_dir=str(tmp_path / "a"),
        push_seeds_to_hub=True,
        hub_seed_dataset_id=REPO_ID,
        max_steps=2,
        max_completion_length=6,
    )
    first.train()
    texts = {row["rollout_id"]: row["completion"] for row in seed_rows(tmp_path / "a")}

    second = make_trainer(output_dir=str(tmp_path / "b"), seed_dataset=REPO_ID, max_steps=2, max_completion_length=40)
    second.train()
    char = build_tokenizer()
    seeded = [r for r in seed_rows(tmp_path / "b") if r["seed_origin"] in texts]
    assert seeded and any(r["step"] == 0 for r in seeded)  # eligible from the first step
    for row in seeded:
        prefix = char.decode(row["completion_ids"][: row["prefix_len"]])
        assert ends_at_text_boundary(texts[row["seed_origin"]], prefix), (row, texts[row["seed_origin"]])
    assert logged(second, "seeds/external_share")[0] == 1.0
    external = seed_manifest(tmp_path / "b")["external"]
    assert external["dataset"] == REPO_ID and len(external["revision"]) == 40
    assert external["tokenizer"] == tokenizer_fingerprint(word) != tokenizer_fingerprint(char)
    assert external["kind"] == "seed dataset of another tokenizer" and external["model"].startswith("ts_trl's tiny")
    link = f"[{REPO_ID}](https://huggingface.co/datasets/{REPO_ID}) at revision `{external['revision']}`"
    assert link in (tmp_path / "b" / "seeds" / "README.md").read_text()  # the dataset card
    assert link in (tmp_path / "b" / "README.md").read_text()  # the model card


def write_traces(path, dataset, wrong_every=2, extra=()):
    """The embedded task's worked solutions as a JSONL of traces, one wrong answer for every `wrong_every`-th."""
    task, lines, right = EmbeddedTask(), [], set()
    for i, row in enumerate(dataset):
        solution = task.solutions(row["prompt"])[0]
        lines.append({"prompt": row["prompt"], "completion": solution})
        right.add(f"trace-{len(lines) - 1}")
        if i % wrong_every == 0:
            lines.append({"prompt": row["prompt"], "completion": solution.replace("####", "#### 1")})
    lines += list(extra)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return right, lines


@pytest.mark.parametrize("seed_filter", [None, "success"])
def test_seeds_from_a_jsonl_of_traces(make_trainer, tmp_path, seed_filter, monkeypatch, caplog):
    dataset = EmbeddedTask().make_splits(4, 1)[0]
    unmatched = {"prompt": "Q: 1+2+3\nA: never trained on", "completion": " 6\n#### 6"}
    right, lines = write_traces(tmp_path / "traces.jsonl", dataset, extra=[unmatched])
    settings = dict(
        dataset=dataset,
        reward=embedded_reward,
        seed_dataset=str(tmp_path / "traces.jsonl"),
        seed_filter=seed_filter,
        max_completion_length=32,
        max_steps=2,
        save_steps=2,
    )
    trainer = make_trainer(**settings)
    matched = len(lines) - 1
    assert f"{matched} of {len(lines)} traces match a training prompt" in caplog.text
    assert len(trainer.seed_bank) == (len(right) if seed_filter else matched)
    trainer.train()
    texts = {f"trace-{i}": line["completion"] for i, line in enumerate(lines)}
    seeded = [r for r in seed_rows(trainer.args.output_dir) if r["seed_origin"]]
    assert seeded
    for row in seeded:
        origin = texts[row["seed_origin"]]
        assert ends_at_text_boundary(origin, build_tokenizer().decode(row["completion_ids"][: row["prefix_len"]]))
        assert row["seed_origin"] in right or not seed_filter
    external = seed_manifest(trainer.args.output_dir)["external"]
    assert external["kind"] == "traces" and external["rows"] == len(lines) and external["matched"] == matched
    assert external["kept"] == (len(right) if seed_filter else matched) and external.get("filter") == seed_filter
    if seed_filter:  # a resume reads the scored seeds back from the cache: nothing is scored again
        monkeypatch.setattr("ts_trl.trainer.trace_scores.success_scores", lambda *a, **k: pytest.fail("scored again"))
        again = make_trainer(**{**settings, "max_steps": 3})
        assert (tmp_path / "run" / CACHE_DIR / "seeds.parquet").is_file()
        assert again.seed_bank.rollout_ids[: len(right)] == trainer.seed_bank.rollout_ids[: len(right)]
        again.train(resume_from_checkpoint=True)
        assert again.state.global_step == 3


def test_a_damaged_or_outdated_cache_is_said_and_the_traces_read_again(make_trainer, tmp_path, caplog):
    """The cache is input too: a flipped bit in its table, or a trace file that changed since, is named in a warning
    and the seeds are computed again from the traces (the same seeds, for the same traces)."""
    dataset = EmbeddedTask().make_splits(4, 1)[0]
    write_traces(tmp_path / "traces.jsonl", dataset)
    settings = dict(
        dataset=dataset,
        reward=embedded_reward,
        seed_dataset=str(tmp_path / "traces.jsonl"),
        seed_filter="success",
        max_completion_length=32,
    )
    first = make_trainer(**settings)
    table = tmp_path / "run" / CACHE_DIR / "seeds.parquet"
    data = bytearray(table.read_bytes())
    data[len(data) // 2] ^= 0x01
    table.write_bytes(bytes(data))
    caplog.clear()
    again = make_trainer(**settings)
    assert f"{table} does not match its checksum" in caplog.text
    assert again.seed_bank.rollout_ids == first.seed_bank.rollout_ids
    assert [again.seed_bank.get(i).completion_ids.tolist() for i in range(len(again.seed_bank))] == [
        first.seed_bank.get(i).completion_ids.tolist() for i in range(len(first.seed_bank))
    ]

    write_traces(tmp_path / "traces.jsonl", dataset, extra=[{"prompt": "Q: 1+1\nA:", "completion": " 2\n#### 2"}])
    caplog.clear()
    make_trainer(**settings)
    assert "holds text seeds of other settings or of another version" in caplog.text


def test_text_seeds_refuse_bad_input_in_one_line(make_trainer, tmp_path):
    dataset = EmbeddedTask().make_splits(4, 1)[0]
    write_traces(tmp_path / "traces.jsonl", dataset)
    traces = str(tmp_path / "traces.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    refusals = [
        (dict(prefix_mode="action"), "no behaviour log-probs"),
        (dict(seed_method="replay"), "no behaviour log-probs"),
        (dict(seed_completion_column="answer_text"), "no column 'answer_text' \\(seed_completion_column\\)"),
        (dict(dataset=EmbeddedTask(seed=9).make_splits(4, 1)[0]), "none of its 6 traces' prompts matches"),
        (dict(max_completion_length=10), "longer than max_completion_length=10"),
        (dict(seed_dataset=str(empty)), "holds no rows"),
    ]
    for overrides, message in refusals:
        settings = dict(dataset=dataset, reward=embedded_reward, seed_dataset=traces, max_completion_length=32)
        with pytest.raises(ValueError, match=message) as caught:
            make_trainer(**{**settings, **overrides})
        assert "\n" not in str(caught.value)


def test_a_rollout_id_that_names_two_traces_is_refused_by_name(make_trainer, tmp_path):
    dataset = EmbeddedTask().make_splits(4, 1)[0]
    _, lines = write_traces(tmp_path / "traces.jsonl", dataset)
    lines = [{**line, "rollout_id": f"row-{min(i, 2)}"} for i, line in enumerate(lines)]  # rows 2, 3, ... share one id
    (tmp_path / "traces.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(ValueError, match="rollout_id 'row-2' names two traces") as caught:
        make_trainer(dataset=dataset, reward=embedded_reward, seed_dataset=str(tmp_path / "traces.jsonl"))
    assert "\n" not in str(caught.value)


def test_character_seeds_in_a_word_level_run_are_cut_where_its_tokens_agree(make_trainer, tmp_path):
    """The other direction, without a Hub: the character run's seeds, matched by prompt_id, in a BPE run."""
    from ts_trl.store.format import write_shard
    from ts_trl.store.schema import Rollout, rollouts_to_table

    char, word = build_tokenizer(), build_word_tokenizer()
    dataset = EmbeddedTask().make_splits(4, 1)[0]
    task, rollouts = EmbeddedTask(), []
    for i, row in enumerate(dataset):
        text = task.solutions(row["prompt"])[1]
        ids = char(text)["input_ids"]
        # The prompt as the other run stored it (whitespace aside, it must be this row's: issue 40 item 9)
        stored = " ".join(row["prompt"].split())
        rollouts.append(Rollout(f"char-{i}", row["prompt_id"], stored, text, ids, [-0.5] * len(ids), 1.0, 7))
    (tmp_path / "char").mkdir()
    table = rollouts_to_table(rollouts, "checkpoint-7", "char model", tokenizer_fingerprint(char), [])
    write_shard(table, tmp_path / "char" / "step-000007.parquet")

    trainer = make_trainer(
        processing_class=word,
        dataset=dataset,
        reward=embedded_reward,
        seed_dataset=str(tmp_path / "char"),
        max_completion_length=32,
        max_steps=1,
    )
    texts = {r.rollout_id: r.completion for r in rollouts}
    for rollout_id, cuts in trainer.seed_store.text_cuts.items():
        ids = word(texts[rollout_id])["input_ids"]
        assert ids == seed_by_id(trainer.seed_bank, rollout_id).completion_ids.tolist() and cuts.size
        for k in cuts.tolist():  # each prefix is the text up to a boundary, as this tokenizer tokenises that text
            prefix = word.decode(ids[:k])
            assert ends_at_text_boundary(texts[rollout_id], prefix) and word(prefix)["input_ids"] == ids[:k]
    trainer.train()
    seeded = [r for r in seed_rows(trainer.args.output_dir) if r["seed_origin"]]
    assert seeded
    for row in seeded:
        prefix = word.decode(row["completion_ids"][: row["prefix_len"]])
        assert ends_at_text_boundary(texts[row["seed_origin"]], prefix)
    assert trainer.seed_store.external_provenance["model"] == "char model"
