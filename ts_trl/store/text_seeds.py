"""Text seeds: traces matched to the training prompts, re-tokenised with this run's tokenizer, and cut only where
their text has a boundary this tokenizer keeps (see `external_seeds.py` for where the traces come from).

A trace is matched to a training row by `prompt_id`, else by normalised prompt text; a position `k` of its ids is a
cut when the text before it ends next to whitespace (or after a newline) and this tokenizer, given that text alone,
returns exactly `ids[:k]`. With `seed_filter="success"` the traces are scored by the function the trainer passes in
(the run's success reward, called as TRL calls it): the store never calls a reward function itself.
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .agent_traces import TurnTemplate, turn_text_cuts
from .local_cuts import LocalCuts
from .schema import prompt_id_of, string_buffers

logger = logging.getLogger(__name__)

CUT_POSITIONS = "cut_positions"  # the cached table's column: where each text seed may be cut
MAX_CUT_CANDIDATES = 64  # text boundaries checked per trace (evenly spread): enough for any cut ratio
RETOKENISE_BATCH = 64  # traces re-tokenised together (larger batches ran slower: their lists outgrow the caches)


@dataclass
class ExternalSeeds:
    """Seeds from `seed_dataset`: the bank's columns, the cut positions of text seeds, and where they came from.

    Defined beside the text seeds that build it; `external_seeds.py` returns it for a seed dataset of this tokenizer
    too (no cut positions)."""

    table: pa.Table
    provenance: dict
    text_cuts: Mapping[str, np.ndarray] = field(default_factory=dict)  # rollout id -> allowed cuts (`TextCuts`)


def normalised(prompt) -> list[str]:
    """The keys a prompt is matched by: its whole text and its last user turn, NFKC with whitespace collapsed.

    A conversational prompt may come as messages or as their JSON text (a ts_trl seed dataset's `prompt` column).
    """
    if isinstance(prompt, str) and prompt.lstrip().startswith("[{"):
        try:
            prompt = json.loads(prompt)
        except ValueError:
            pass
    if isinstance(prompt, list):
        turns = [m for m in prompt if isinstance(m, dict) and m.get("role") != "assistant"]
        users = [str(m.get("content", "")) for m in turns if m.get("role") == "user"]
        texts = ["\n".join(str(m.get("content", "")) for m in turns), *users[-1:]]
    else:
        texts = [str(prompt)]
    keys = [" ".join(unicodedata.normalize("NFKC", text).split()) for text in texts]
    return [key for key in dict.fromkeys(keys) if key]


def same_prompt(one, other) -> bool:
    """Whether two prompts (text, messages or their JSON) are one, up to Unicode form and whitespace."""
    return bool(set(normalised(one)) & set(normalised(other))) or not normalised(one) or not normalised(other)


def check_prompt_texts(prompt_ids, prompts, train_dataset, source: str, ours: dict | None = None) -> None:
    """Refuses, in one line, a seed whose `prompt_id` names another prompt in this training set: its rollout would
    be continued as the answer to a prompt it never saw. `ours` (the training prompts by id, `training_prompts`)
    saves rebuilding them at every batch of a streamed file."""
    if not hasattr(train_dataset, "__len__"):
        return
    ours = training_prompts(train_dataset) if ours is None else ours
    checked = set()
    for prompt_id, prompt in zip(list(prompt_ids), list(prompts)):
        prompt_id = None if prompt_id is None else str(prompt_id)
        if prompt_id not in ours or prompt is None or (prompt_id, str(prompt)) in checked:
            continue
        checked.add((prompt_id, str(prompt)))
        if not same_prompt(prompt, ours[prompt_id]):
            raise ValueError(
                f"{source}: prompt_id {prompt_id!r} is the prompt {str(prompt)[:60]!r} there, but "
                f"{str(ours[prompt_id])[:60]!r} in this training set, so its seeds would continue another prompt. "
                "Seed from a dataset of this training set, or give the training prompts ids that mean the same prompts."
            )


def training_prompts(train_dataset) -> dict:
    """The training prompts by prompt id, as `check_prompt_texts` compares them."""
    return dict(zip(_prompt_ids(train_dataset), train_dataset["prompt"]))


def match_prompts(traces: list, train_dataset, source: str) -> list[int | None]:
    """The training row each trace's (`traces.Trace`) prompt is, by `prompt_id`, else by normalised text; None where
    none matches.

    Refuses, in one line, a training set it cannot index and traces none of which match.
    """
    rows = PromptIndex(train_dataset, source).rows(traces)
    report_matches(sum(row is not None for row in rows), len(traces), traces[0].prompt if traces else None, source)
    return rows


class PromptIndex:
    """The training rows traces are matched to, by `prompt_id`, else by normalised prompt text (`match_prompts`)."""

    def __init__(self, train_dataset, source: str):
        if train_dataset is None or not hasattr(train_dataset, "__len__"):
            raise ValueError(
                f"{source} holds text seeds, which are matched to the training prompts, but the training set cannot "
                "be indexed (an iterable dataset). Pass a map-style Dataset, or a seed dataset written by this "
                "tokenizer."
            )
        prompts = train_dataset["prompt"]
        ids = train_dataset["prompt_id"] if "prompt_id" in train_dataset.column_names else [None] * len(prompts)
        self.by_id, self.by_text = {}, {}
        for row, (prompt, prompt_id) in enumerate(zip(prompts, ids)):
            self.by_id.setdefault(str(prompt_id) if prompt_id is not None else prompt_id_of(prompt), row)
            for key in normalised(prompt):
                self.by_text.setdefault(key, row)
        self.train_dataset, self.source = train_dataset, source
        self.prompts = training_prompts(train_dataset)  # once, not at every batch of a streamed file

    def rows(self, traces: list) -> list[int | None]:
        """Each trace's training row, None where none matches; a `prompt_id` naming another prompt is refused."""
        prompt_ids, prompts = [t.prompt_id for t in traces], [t.prompt for t in traces]
        check_prompt_texts(prompt_ids, prompts, self.train_dataset, self.source, self.prompts)
        rows = []
        for trace in traces:
            row = self.by_id.get(trace.prompt_id) if trace.prompt_id is not None else None
            if row is None:
                row = next((self.by_text[key] for key in normalised(trace.prompt) if key in self.by_text), None)
            rows.append(row)
        return rows


def report_matches(matched: int, total: int, first_prompt, source: str) -> None:
    """Logs how many traces match a training prompt; refuses, in one line, traces none of which match."""
    if not matched:
        example = normalised(first_prompt)[:1] if total else []
        raise ValueError(
            f"{source}: none of its {total} traces' prompts matches a training prompt (by prompt_id or by "
            f"normalised text; e.g. {example[0][:60] if example else ''!r}). Seed from traces of this training set, or "
            "name the prompt's column with seed_prompt_column."
        )
    report = logger.info if matched == total else logger.warning  # unmatched traces are left out
    report(f"{source}: {matched} of {total} traces match a training prompt; only those seed this run.")


def _prompt_ids(train_dataset) -> list[str]:
    """Each training row's prompt id, as the trainer keys it (`seed_batch.prompt_key`)."""
    if "prompt_id" in train_dataset.column_names:
        ids = train_dataset["prompt_id"]
        return [str(i) if i is not None else prompt_id_of(p) for i, p in zip(ids, train_dataset["prompt"])]
    return [prompt_id_of(prompt) for prompt in train_dataset["prompt"]]


def retokenise(tokenizer, text: str, newline_only: bool = False) -> tuple[list[int], np.ndarray]:
    """This tokenizer's ids of `text`, and the positions `k` the seed may be cut at.

    `k` is allowed where the text before it ends at a text boundary (next to whitespace; with `newline_only`, right
    after a newline) and this tokenizer, given that text alone, returns exactly `ids[:k]` and decodes them back to it:
    the cut never falls inside a token it would split differently. At most `MAX_CUT_CANDIDATES` boundaries, evenly
    spread over the text, are checked, which bounds the cost at that many tokenisations of a prefix per trace.
    """
    ids, cuts = retokenise_many(tokenizer, [text], newline_only)[0]
    return [int(i) for i in ids], cuts


@dataclass
class TextCodec:
    """How `retokenise_many` tokenises: `encode` and `decode` of lists (`_fast_codec`), and, for a byte-level BPE
    tokenizer proven local, the cuts from one encoding of each trace (`local_cuts.py`; None: every prefix encoded)."""

    encode: object
    decode: object
    local: LocalCuts | None = None

    @classmethod
    def of(cls, tokenizer) -> TextCodec:
        encode, decode, backend = _fast_codec(tokenizer)
        return cls(encode, decode, LocalCuts.of(backend) if backend is not None else None)


def retokenise_many(
    tokenizer, texts: list[str], newline_only: bool = False, codec: TextCodec | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """`retokenise` of each text (its ids as int32), the same cuts found with less work.

    A trace the codec's `local` cuts serve is encoded once; the others with one tokenizer call for all their
    prefixes and one for all their decodings. `codec`: `TextCodec.of(tokenizer)`, built once for many calls.
    """
    codec = codec or TextCodec.of(tokenizer)
    ends = [_boundaries(text, newline_only) for text in texts]
    done = [codec.local.cuts(text, found) if codec.local else None for text, found in zip(texts, ends)]
    rest = [t for t, result in enumerate(done) if result is None]
    for t, result in zip(rest, _encoded_cuts(codec, [texts[t] for t in rest], [ends[t] for t in rest])):
        done[t] = result
    return done


def _encoded_cuts(codec: TextCodec, texts: list[str], ends: list[list[int]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """`retokenise` by its definition: every candidate prefix encoded, and decoded where its ids begin the trace's."""
    if not texts:
        return []
    encoded = codec.encode([*texts, *(text[:p] for text, found in zip(texts, ends) for p in found)])
    whole, encoded = encoded[: len(texts)], iter(encoded[len(texts) :])
    candidates = []  # (trace, p, ids of text[:p]) where those ids are the trace's first ids
    for t, (ids, found) in enumerate(zip(whole, ends)):
        for p, e in zip(found, encoded):
            if 0 < len(e) < len(ids) and ids[: len(e)] == e:
                candidates.append((t, p, e))
    decoded = codec.decode([e for _, _, e in candidates]) if candidates else []
    cuts: list[set[int]] = [set() for _ in texts]
    for (t, p, e), back in zip(candidates, decoded):
        if back == texts[t][:p]:
            cuts[t].add(len(e))
    return [(np.asarray(ids, np.int32), np.array(sorted(found), np.int32)) for ids, found in zip(whole, cuts)]


_SPACE = re.compile(r"\s")  # CPython's `\s` on str is `str.isspace` (both `Py_UNICODE_ISSPACE`)


def _boundaries(text: str, newline_only: bool) -> list[int]:
    """The text boundaries a cut is checked at (at most `MAX_CUT_CANDIDATES`, evenly spread): positions `p` with
    `0 < p < len(text)` right after a newline (`newline_only`), else next to whitespace."""
    if newline_only:
        ends = [m.end() for m in re.finditer("\n", text) if m.end() < len(text)]
    else:
        spaces = [m.start() for m in _SPACE.finditer(text)]
        ends = sorted({p for i in spaces for p in (i, i + 1) if 0 < p < len(text)})
    if len(ends) > MAX_CUT_CANDIDATES:  # each check tokenises a prefix: O(length) per candidate
        ends = [ends[i] for i in np.unique(np.linspace(0, len(ends) - 1, MAX_CUT_CANDIDATES).round().astype(int))]
    return ends


def _fast_codec(tokenizer):
    """(encode, decode, backend) of lists: exactly `tokenizer(texts, add_special_tokens=False)["input_ids"]` and
    `tokenizer.batch_decode(ids, skip_special_tokens=False)`.

    For a `transformers` fast tokenizer that overrides none of the methods these go through, with no truncation,
    padding or clean-up of spaces, they are the Rust backend's `encode` and `decode_batch` (transformers' own calls
    convert every id through Python, which made re-tokenising 10^5 traces take minutes), and the backend; otherwise the
    tokenizer's own methods and None.
    """

    def encode(texts):
        return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []

    def decode(ids):
        return tokenizer.batch_decode(ids, skip_special_tokens=False)

    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase  # lazy: private modules, may move
        from transformers.tokenization_utils_tokenizers import TokenizersBackend  # lazy: as above
    except ImportError:  # another transformers: its own methods
        return encode, decode, None
    kind = type(tokenizer)
    plain = isinstance(tokenizer, TokenizersBackend) and all(
        getattr(kind, name, None) is getattr(base, name, None)
        for base, names in (
            (PreTrainedTokenizerBase, ("__call__", "batch_decode", "_get_padding_truncation_strategies")),
            (TokenizersBackend, ("_encode_plus", "set_truncation_and_padding", "decode", "_decode")),
        )
        for name in names
    )
    if not plain:
        return encode, decode, None
    encode(["a"])  # transformers' own call sets the backend's truncation, padding and special-token splitting
    backend = tokenizer.backend_tokenizer
    if backend.truncation is not None or backend.padding is not None or tokenizer.clean_up_tokenization_spaces:
        return encode, decode, None
    if backend.encode_special_tokens != bool(tokenizer.split_special_tokens):
        return encode, decode, None

    def fast_encode(texts):  # one text at a time: the batch call's worker threads cost more CPU than they save
        return [backend.encode(text, add_special_tokens=False).ids for text in texts]

    def fast_decode(ids):
        return backend.decode_batch(ids, skip_special_tokens=False)

    return fast_encode, fast_decode, backend


def text_seeds(settings, tokenizer, traces, train_dataset, success, source: str, template=None) -> ExternalSeeds:
    """`stream_text_seeds` of one list of traces."""
    return stream_text_seeds(settings, tokenizer, [traces], train_dataset, success, source, template)


@dataclass
class _Tally:
    """What `stream_text_seeds` counts over every batch for its refusals, which name the whole dataset's numbers."""

    rows: int = 0
    matched: int = 0
    successful: int = 0
    first_prompt: object = None
    over_characters: list[int] = field(default_factory=list)  # non-blank characters of traces that cannot fit
    over_budget: list[int] = field(default_factory=list)  # tokens of traces over max_completion_length
    character_limit: int = 0  # `_character_limit` of this tokenizer and budget


def stream_text_seeds(
    settings, tokenizer, batches, train_dataset, success, source: str, template=None
) -> ExternalSeeds:
    """The bank rows of re-tokenised traces that match a training prompt, fit the budget and (with the filter) passed.

    `batches`: the traces, a list at a time (`trace_batches`); of a batch only its seeds' Arrow columns are kept (as
    the result's chunks, never concatenated), so no more than a batch of texts is ever held. The refusals wait for the
    last batch and count every trace, as if all had been read at once; a trace that cannot fit by its length alone is
    never tokenised or scored.
    `success`: (the scoring function, the success reward's name), for `seed_filter="success"`: the function, the
    trainer's (`trainer/trace_scores.py`), takes (traces, their training rows, `source`) and gives each trace's score.
    `template`: a multi-turn run's `TurnTemplate`; each trace's turns are then rendered (`render_trajectory`).

    Long: one pass over each batch: match, check, score, re-tokenise, cut points; the refusals after the last.
    """
    index, prompt_ids = PromptIndex(train_dataset, source), _prompt_ids(train_dataset)
    limit = _character_limit(tokenizer, settings.max_completion_length)
    codec = TextCodec.of(tokenizer) if template is None else None
    tally, tables = _Tally(character_limit=limit), []
    for traces in batches:
        first, tally.rows = tally.rows, tally.rows + len(traces)
        if first == 0 and traces:
            tally.first_prompt = traces[0].prompt
        rows = index.rows(traces)
        kept = [i for i, row in enumerate(rows) if row is not None]
        tally.matched += len(kept)
        over = {i: _non_blank(traces[i].text) for i in kept if len(traces[i].text) > limit}
        tally.over_characters += [n for n in over.values() if n > limit]
        kept = [i for i in kept if over.get(i, 0) <= limit]
        rewards = {i: traces[i].reward for i in kept}
        if settings.seed_filter == "success" and kept:
            scores = _scored(success, [traces[i] for i in kept], [rows[i] for i in kept], source)
            rewards = dict(zip(kept, scores.tolist()))
            kept = [i for i in kept if rewards[i] > settings.success_threshold]
        tally.successful += len(kept)
        ids = [traces[i].rollout_id or f"trace-{first + i}" for i in kept]
        turns = None
        if template is not None:
            rendered = {i: render_trajectory(template, traces[i].turns, settings.cut_at_newline, source) for i in kept}
            tokenised = {i: rendered[i][:2] for i in kept}
            turns = [(rendered[i][2], json.dumps(traces[i].turns)) for i in kept]
        else:
            tokenised = {}
            for start in range(0, len(kept), RETOKENISE_BATCH):
                batch = kept[start : start + RETOKENISE_BATCH]
                texts = [traces[i].text for i in batch]
                tokenised.update(zip(batch, retokenise_many(tokenizer, texts, settings.cut_at_newline, codec)))
        tally.over_budget += [n for n in (len(tokenised[i][0]) for i in kept) if n > settings.max_completion_length]
        columns = ([prompt_ids[rows[i]] for i in kept], [tokenised[i] for i in kept], [rewards[i] for i in kept])
        tables.append(seed_rows_table(ids, *columns, turns))
    return ExternalSeeds(*_refusals_or_table(tally, tables, settings, success, source))


def _scored(success, traces: list, rows: list[int], source: str) -> np.ndarray:
    """Each trace's success score, from the scoring function the trainer passed in (`success`: function, name)."""
    score = success[0] if success else None
    if score is None:
        raise ValueError(
            f"{source}: seed_filter='success' keeps the traces its success reward scores as successful, and no "
            "scoring function was passed to score them. Pass one (a SeedGRPOTrainer does), or leave seed_filter unset."
        )
    return np.asarray(score(traces, rows, source), np.float32)


def _refusals_or_table(tally: _Tally, tables: list[pa.Table], settings, success, source: str):
    """(the seeds' table, their provenance) of every batch, or the first refusal `text_seeds` makes, in one line."""
    report_matches(tally.matched, tally.rows, tally.first_prompt, source)
    if tally.over_characters:
        raise ValueError(
            f"{source}: {len(tally.over_characters)} of its {tally.matched} traces are over {tally.character_limit} "
            "characters (the "
            f"longest: {max(tally.over_characters)}), more than max_completion_length={settings.max_completion_length} "
            "tokens of this tokenizer can hold. Raise max_completion_length, or drop the long traces from the dataset."
        )
    provenance = {"matched": tally.matched}
    if settings.seed_filter == "success":
        provenance.update(filter="success", success_reward=success[1], successful=tally.successful)
        if not tally.successful:
            raise ValueError(
                f"{source}: none of its {tally.matched} matched traces scores above success_threshold="
                f"{settings.success_threshold} with the reward function {success[1]!r}; seed_filter='success' keeps "
                "none. Check the traces' answers, or leave seed_filter unset."
            )
    table = pa.concat_tables(tables)  # the batches' own buffers, as chunks: no copy of every seed
    twice = _first_repeated(table.column("rollout_id"))
    if twice is not None:
        raise ValueError(
            f"{source}: rollout_id {twice!r} names two traces (several files numbering their rows alike?); a "
            "seed's id must be unique. Make the ids unique across files (e.g. prefix each with its file's name), or "
            "drop the rollout_id column."
        )
    if tally.over_budget:
        raise ValueError(
            f"{source}: {len(tally.over_budget)} of its {tally.successful} traces are longer than "
            f"max_completion_length={settings.max_completion_length} tokens once tokenised with this tokenizer (the "
            f"longest: {max(tally.over_budget)}). Raise max_completion_length, or drop the long traces from the "
            "dataset."
        )
    provenance["kept"] = table.num_rows
    return table, provenance, TextCuts(table)


def _first_repeated(rollout_ids: pa.ChunkedArray) -> str | None:
    """The first rollout id that an earlier row has too, or None: Arrow's hash of the ids, not a set of their strings
    (100 bytes a seed), and the ids in Python only when one repeats."""
    if len(pc.unique(rollout_ids)) == len(rollout_ids):
        return None
    seen = set()
    return next(rollout_id for rollout_id in rollout_ids.to_pylist() if rollout_id in seen or seen.add(rollout_id))


def _character_limit(tokenizer, budget: int) -> int:
    """The most characters a trace of `budget` tokens may have, whatever its tokens.

    No token decodes to more characters than the longest vocabulary entry (byte-level entries spell a character with
    one or more), so a trace with more non-blank characters than `budget` such tokens (twice, for normalisers that
    merge characters) is over the budget whatever its tokens; tokenising 200,000 characters would take seconds each.
    """
    longest_token = max((len(token) for token in tokenizer.get_vocab()), default=1)
    return 2 * budget * max(longest_token, 1)


def _non_blank(text: str) -> int:
    return len("".join(text.split()))


def render_trajectory(template: TurnTemplate, turns: list[dict], newline_only: bool, source: str):
    """(ids, where they may be cut, tool mask) of an agent trajectory rendered with this run's template."""
    ids, mask = template.trajectory_ids(turns, source)
    tokenizer = template.tokenizer
    cuts = turn_text_cuts(tokenizer, ids, mask, lambda text: retokenise(tokenizer, text, newline_only))
    return ids, cuts, mask


def seed_rows_table(rollout_ids, prompt_ids, tokenised, rewards, turns=None) -> pa.Table:
    """Text seeds as bank rows: this tokenizer's ids, null log-probs (no behaviour policy sampled them; the bank reads
    NaN), and where each may be cut; each list column is one int32 buffer and its offsets.

    `turns` (multi-turn text seeds): per row, its tool mask and the JSON of its messages in TRL's form, which the bank
    reads from the `tool_mask` and `completion` columns as it reads a multi-turn shard's.
    """
    extra = {}
    if turns is not None:
        extra = {
            "tool_mask": pa.array([mask for mask, _ in turns], pa.list_(pa.int8())),
            "completion": pa.array([messages for _, messages in turns], pa.string()),
        }
    return pa.table(
        {
            "rollout_id": pa.array(rollout_ids, pa.string()),
            "prompt_id": pa.array(prompt_ids, pa.string()),
            "completion_ids": _int32_lists([pair[0] for pair in tokenised]),
            "logprobs": pa.nulls(len(tokenised), pa.list_(pa.float32())),
            "reward": pa.array(rewards, pa.float32()),
            "step": pa.array(np.zeros(len(tokenised), np.int32)),
            CUT_POSITIONS: _int32_lists([pair[1] for pair in tokenised]),
            **extra,
        }
    )


def _int32_lists(rows: list) -> pa.ListArray:
    """Rows of integers (arrays or lists) as list<int32> of one values buffer, sized exactly, without a Python int
    per value."""
    offsets = np.zeros(len(rows) + 1, np.int32)
    np.cumsum([len(row) for row in rows], out=offsets[1:])
    values = np.concatenate(rows).astype(np.int32, copy=False) if rows else np.zeros(0, np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values), type=pa.list_(pa.int32()))


class TextCuts(Mapping):
    """Rollout id -> the positions its text seed may be cut at (int32), read from the seeds' table in place.

    No Python object per seed (a dict of 10^6 ids and arrays took 250 MB): an id is found by its `hash` among the ids'
    hashes, sorted (8 bytes a seed; equal hashes are told apart by the text), and its cuts are a view of the column.
    Python salts `hash` per process, so a pickled `TextCuts` is rebuilt from its table where it is unpickled.
    """

    def __init__(self, table: pa.Table):
        self._table = table.select(["rollout_id", CUT_POSITIONS])
        batches = [batch for batch in self._table.to_batches() if batch.num_rows]
        self._ids = [string_buffers(batch.column(0)) for batch in batches]  # bytes and offsets
        cuts = [batch.column(1) for batch in batches]
        self._cuts = [(c.values.to_numpy(zero_copy_only=False), c.offsets.to_numpy()) for c in cuts]  # views
        self._firsts = np.cumsum([0] + [batch.num_rows for batch in batches])  # each batch's first row
        hashes = np.fromiter((hash(i) for b in batches for i in b.column(0).to_pylist()), np.int64, len(self))
        self._order = np.argsort(hashes, kind="stable")
        self._hashes = hashes[self._order]

    def __reduce__(self):
        return TextCuts, (self._table,)

    def __getitem__(self, rollout_id: str) -> np.ndarray:
        hashed, text = hash(rollout_id), rollout_id.encode()
        position = int(self._hashes.searchsorted(hashed))
        while position < len(self._hashes) and self._hashes[position] == hashed:
            row = int(self._order[position])
            batch = int(self._firsts.searchsorted(row, side="right")) - 1
            i = row - int(self._firsts[batch])
            data, offsets = self._ids[batch]
            if data[offsets[i] : offsets[i + 1]].tobytes() == text:
                values, offsets = self._cuts[batch]
                return values[offsets[i] : offsets[i + 1]]
            position += 1
        raise KeyError(rollout_id)

    def __iter__(self) -> Iterator[str]:
        for batch in self._table.to_batches():
            yield from batch.column(0).to_pylist()

    def __len__(self) -> int:
        return int(self._firsts[-1])
