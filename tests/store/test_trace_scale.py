"""Text seeds at dataset scale: re-tokenising traces in batches gives exactly the seeds of one trace at a time."""

import sys

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import build_word_tokenizer
from ts_trl.store import external_seeds, text_seeds
from ts_trl.store import traces as trace_files
from ts_trl.store.text_seeds import MAX_CUT_CANDIDATES, retokenise, retokenise_many
from ts_trl.tiny import build_tokenizer

TEXTS = [
    " 7+15=22\n22+9=31\n#### 31",
    "Let x be 12 and y 7:\nx + y = 19\n\n####  19 ",
    "nospace",
    "",
    " ",
    "a",
    "\n\n",
    "tabs\tand\x0bvertical\x1cseparators\u2028and\u00a0no-break\u3000spaces",
    "ünïcödé  ✓ and 漢字 outside the vocabulary\n#### 3",
    "<eos> special <pad> tokens as text <eos>",
    " ".join(f"step {i}: {i}+1={i + 1}" + "\n" * (i % 3) for i in range(60)),  # more boundaries than are checked
]


def reference(tokenizer, text: str, newline_only: bool):
    """`retokenise` as it was written first: one trace at a time, through the tokenizer's own methods."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if newline_only:
        ends = [p for p in range(1, len(text)) if text[p - 1] == "\n"]
    else:
        ends = [p for p in range(1, len(text)) if text[p - 1].isspace() or text[p].isspace()]
    if not ends:
        return ids, np.zeros(0, np.int32)
    if len(ends) > MAX_CUT_CANDIDATES:
        ends = [ends[i] for i in np.unique(np.linspace(0, len(ends) - 1, MAX_CUT_CANDIDATES).round().astype(int))]
    encoded = tokenizer([text[:p] for p in ends], add_special_tokens=False)["input_ids"]
    candidates = [(p, e) for p, e in zip(ends, encoded) if 0 < len(e) < len(ids) and ids[: len(e)] == e]
    decoded = tokenizer.batch_decode([e for _, e in candidates], skip_special_tokens=False)
    cuts = {len(e) for (p, e), back in zip(candidates, decoded) if back == text[:p]}
    return ids, np.array(sorted(cuts), np.int32)


@pytest.mark.parametrize("build", [build_tokenizer, build_word_tokenizer])
@pytest.mark.parametrize("newline_only", [False, True])
def test_batched_retokenising_gives_the_seeds_of_one_trace_at_a_time(build, newline_only):
    tokenizer = build()
    expected = [reference(tokenizer, text, newline_only) for text in TEXTS]
    assert any(len(cuts) for _, cuts in expected)
    for got, want in zip(retokenise_many(tokenizer, TEXTS, newline_only), expected):
        assert list(got[0]) == list(want[0]) and got[1].tolist() == want[1].tolist()
    for text, want in zip(TEXTS, expected):
        got = retokenise(tokenizer, text, newline_only)
        assert list(got[0]) == list(want[0]) and got[1].tolist() == want[1].tolist()


def test_the_backend_serves_a_plain_fast_tokenizer_and_the_tokenizer_itself_any_other(monkeypatch):
    """The tokenizer's own methods convert every id in Python (most of the cost at 10^5 traces): a plain fast
    tokenizer is re-tokenised through its Rust backend, and a tokenizer that changes a method keeps it."""
    import transformers.tokenization_utils_base as base

    tokenizer = build_tokenizer()
    expected = [reference(tokenizer, text, False) for text in TEXTS]
    monkeypatch.setattr(base, "to_py_obj", lambda *a, **k: pytest.fail("every id converted in Python"))
    assert [c.tolist() for _, c in retokenise_many(tokenizer, TEXTS)] == [c.tolist() for _, c in expected]

    class Lowered(type(build_tokenizer())):
        def batch_decode(self, sequences, **kwargs):
            return [text.lower() for text in super().batch_decode(sequences, **kwargs)]

    monkeypatch.undo()
    lowered = Lowered(tokenizer_object=build_tokenizer().backend_tokenizer)
    text = "Upper Case Words Only"
    assert retokenise_many(lowered, [text])[0][1].size == 0  # its decoding never gives the text back: no cut
    assert retokenise_many(build_tokenizer(), [text])[0][1].size > 0


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="the equivalence is CPython's")
def test_the_boundary_pattern_is_str_isspace():
    characters = "".join(map(chr, range(sys.maxunicode + 1)))
    by_pattern = {m.start() for m in text_seeds._SPACE.finditer(characters)}
    assert by_pattern == {i for i, c in enumerate(characters) if c.isspace()}


def test_a_parquet_file_of_traces_is_read_a_batch_at_a_time_and_gives_the_seeds_of_reading_it_whole(
    tmp_path, monkeypatch
):
    """`read_external_seeds` streams a Parquet file of traces (never `pq.read_table` of it, no batch over
    `STREAM_ROWS` rows) and keeps exactly the seeds of reading every trace at once, unmatched rows left out alike."""
    import pyarrow.parquet as pq
    from datasets import Dataset

    from benchmarks.trace_scale import _operands, _prompt, write_traces
    from ts_trl.store.external_seeds import ExternalSeedSettings, read_external_seeds
    from ts_trl.store.schema import tokenizer_fingerprint
    from ts_trl.store.traces import read_traces

    size = 3000  # a few thousand rows in batches of 512: six batches, the last one short
    path = tmp_path / "traces.parquet"
    num_prompts = write_traces(size, path)
    a, b, c = _operands(num_prompts)
    train = Dataset.from_dict({"prompt": [_prompt(p, a, b, c) for p in range(num_prompts - 5)]})  # 20 rows unmatched
    tokenizer = build_word_tokenizer()
    settings = ExternalSeedSettings(seed_dataset=str(path), max_completion_length=256, output_dir=str(tmp_path / "o"))
    whole, _ = read_traces(pq.read_table(path), None, None, "s")
    expected = text_seeds.text_seeds(settings, tokenizer, whole, train, (None, None), "s")

    sizes, read_whole = [], pq.read_table
    iter_batches = pq.ParquetFile.iter_batches

    def counted(self, *args, **kwargs):
        for batch in iter_batches(self, *args, **kwargs):
            sizes.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(trace_files, "STREAM_ROWS", 512)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted)
    monkeypatch.setattr(
        pq, "read_table", lambda source, *a, **k: pytest.fail("read whole") if source == path else read_whole(source)
    )
    seeds = read_external_seeds(settings, tokenizer, tokenizer_fingerprint(tokenizer), train)
    assert sizes and max(sizes) <= 512 and sum(sizes) >= size and len(sizes) >= size // 512
    assert seeds.table.drop_columns(["logprobs"]).equals(expected.table.drop_columns(["logprobs"]))  # NaN != NaN
    assert external_seeds.external_seeds_digest(seeds) == external_seeds.external_seeds_digest(expected)
    assert seeds.provenance["kept"] == expected.provenance["kept"] == size - 20
    assert seeds.text_cuts.keys() == expected.text_cuts.keys()
    assert all(np.array_equal(seeds.text_cuts[k], expected.text_cuts[k]) for k in seeds.text_cuts)


def test_text_seeds_hold_their_ids_and_cuts_once_and_no_log_probs(tmp_path, monkeypatch):
    """What grew by kilobytes a trace at 10^6: text seeds store no log-probs (a null column, which the bank reads as
    NaN), keep each batch's buffers as a chunk of the table (never concatenated into a second copy), and their cut
    positions are looked up in the table's own column, not copied into a dict of arrays."""
    import pickle

    import pyarrow.parquet as pq
    from datasets import Dataset

    from benchmarks.trace_scale import _operands, _prompt, write_traces
    from ts_trl import SeedBank
    from ts_trl.store.external_seeds import ExternalSeedSettings, read_external_seeds
    from ts_trl.store.schema import tokenizer_fingerprint
    from ts_trl.store.text_seeds import CUT_POSITIONS
    from ts_trl.store.traces import read_traces

    size = 1200  # three batches of 512 rows, the last one short
    path = tmp_path / "traces.parquet"
    num_prompts = write_traces(size, path)
    a, b, c = _operands(num_prompts)
    train = Dataset.from_dict({"prompt": [_prompt(p, a, b, c) for p in range(num_prompts)]})
    tokenizer = build_tokenizer()
    settings = ExternalSeedSettings(seed_dataset=str(path), max_completion_length=256, output_dir=str(tmp_path / "o"))
    monkeypatch.setattr(trace_files, "STREAM_ROWS", 512)
    seeds = read_external_seeds(settings, tokenizer, tokenizer_fingerprint(tokenizer), train)
    table = seeds.table
    assert table.num_rows == size and table.column("logprobs").null_count == size
    assert table.column("completion_ids").num_chunks == 3  # the batches' own buffers
    assert table.column("completion_ids").type == table.column(CUT_POSITIONS).type == pa.list_(pa.int32())

    traces, _ = read_traces(pq.read_table(path), None, None, "s")
    expected = {f"trace-{i}": retokenise(tokenizer, trace.text)[1] for i, trace in enumerate(traces)}
    assert len(seeds.text_cuts) == size and list(seeds.text_cuts) == list(expected)
    assert all(seeds.text_cuts[k].tolist() == v.tolist() for k, v in expected.items())
    assert seeds.text_cuts.get("trace-x") is None and "trace-x" not in seeds.text_cuts
    last = table.column(CUT_POSITIONS).chunk(2).values.to_numpy()
    assert np.shares_memory(seeds.text_cuts[f"trace-{size - 1}"], last)  # a view of the table's column
    again = pickle.loads(pickle.dumps(seeds.text_cuts))  # as ranks receive it: rebuilt, Python's `hash` is salted
    assert again[f"trace-{size - 1}"].tolist() == expected[f"trace-{size - 1}"].tolist()

    bank = SeedBank()
    bank.add_table(table, external=True)
    seed = bank.get(size - 1)
    assert len(seed.logprobs) == len(seed.completion_ids) and np.isnan(seed.logprobs).all()
    assert bank._tokens.nbytes == sum(chunk.values.nbytes for chunk in table.column("completion_ids").chunks)
