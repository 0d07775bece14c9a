"""The seed bank: every rollout the run has produced, as fixed-size NumPy metadata plus variable-length payload rows.

Each rollout costs 40 bytes of metadata (payload address, step, reward, prompt, rollout-id address, and its places in
the prompt and rollout-id indexes) and no Python object. The payload (token ids, behaviour log-probs, the rollout id's
text) lives in a few contiguous chunks. Rows loaded from an Arrow table (`add_table`) are not copied: the chunks are
views of the table's buffers, so a bank filled from memory-mapped Arrow IPC files shares its token ids with every
other process on the node that maps them, through the page cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ..method.selection import EXTERNAL_STEP, Seed, draw_seeds
from .schema import BANK_COLUMNS, Rollout, string_buffers

TOKEN_LENGTH_BITS = 24  # a payload address is start << 24 | length: rollouts up to 16M tokens, 2^39 tokens in all
ID_LENGTH_BITS = 16  # rollout ids up to 64 KB of UTF-8
_HASH_TAIL = 4096  # rollout-id hashes kept unsorted before they are merged into the sorted index


class _Payload:
    """Variable-length rows of one or more aligned dtypes in a few chunks; a row is addressed by one int64.

    Addresses are `global_start << length_bits | length`, where chunk `c` covers global positions
    `[firsts[c], firsts[c] + len(chunk))`. Small appends are copied into a growing chunk (doubling up to `max_chunk`
    elements: NumPy asks for huge pages on large arrays, so the cap bounds the resident slack to one chunk); an append
    of `max_chunk` elements or more becomes a chunk of its own, and with `copy=False` every append is kept as a view.
    """

    def __init__(self, dtypes, length_bits: int, first_chunk: int = 1 << 16, max_chunk: int = 1 << 20):
        self.dtypes = [np.dtype(d) for d in dtypes]
        self.length_bits = length_bits
        self.chunks: list[tuple[np.ndarray, ...]] = []
        self.firsts = np.zeros(0, dtype=np.int64)
        self.end = 0  # global position past the last chunk
        self.used = 0  # elements used in the last chunk, when it is a growing one
        self.growing = False
        self.next_size, self.max_chunk = first_chunk, max_chunk

    def _add_chunk(self, arrays: tuple[np.ndarray, ...], growing: bool) -> None:
        self.chunks.append(arrays)
        self.firsts = np.append(self.firsts, self.end)
        self.end += len(arrays[0])
        self.growing, self.used = growing, 0

    def extend(self, columns: Sequence[np.ndarray], offsets: np.ndarray, copy: bool = True) -> np.ndarray:
        """Stores rows `columns[:, offsets[i]:offsets[i + 1]]` and returns their addresses."""
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.diff(offsets)
        if len(lengths) and lengths.max() >= 1 << self.length_bits:
            raise ValueError(
                f"A seed-bank row holds {lengths.max()} elements; the limit is {(1 << self.length_bits) - 1}."
            )
        low, high = int(offsets[0]), int(offsets[-1])
        columns = [np.asarray(c[low:high], dtype=d) for c, d in zip(columns, self.dtypes)]
        total = high - low
        if not copy or total >= self.max_chunk:
            self._add_chunk(tuple(np.array(c) if copy else c for c in columns), growing=False)
            base = int(self.firsts[-1])
        else:
            if not self.growing or self.used + total > len(self.chunks[-1][0]):
                size = max(self.next_size, total)
                self._add_chunk(tuple(np.empty(size, dtype=d) for d in self.dtypes), growing=True)
                self.next_size = min(self.next_size * 2, self.max_chunk)
            for chunk, values in zip(self.chunks[-1], columns):
                chunk[self.used : self.used + total] = values
            base = int(self.firsts[-1]) + self.used
            self.used += total
        return ((base + offsets[:-1] - low) << self.length_bits) | lengths

    def rows(self, addresses: np.ndarray) -> list[tuple[np.ndarray, ...]]:
        """The rows at `addresses`, as views into the chunks."""
        addresses = np.asarray(addresses, dtype=np.int64)
        starts, lengths = addresses >> self.length_bits, addresses & ((1 << self.length_bits) - 1)
        chunk_of = np.searchsorted(self.firsts, starts, side="right") - 1
        local = starts - self.firsts[chunk_of]
        return [
            tuple(a[s : s + n] for a in self.chunks[c])
            for c, s, n in zip(chunk_of.tolist(), local.tolist(), lengths.tolist())
        ]

    def release_unused(self, addresses: np.ndarray) -> None:
        """Drops the chunks no address points into (their rows moved elsewhere); views handed out keep theirs alive."""
        if not self.chunks:
            return
        starts = np.asarray(addresses, dtype=np.int64) >> self.length_bits
        used = np.bincount(np.searchsorted(self.firsts, starts, side="right") - 1, minlength=len(self.chunks)) > 0
        if not used[-1]:
            self.growing = False  # the next small append starts a fresh chunk
        self.chunks = [c for c, keep in zip(self.chunks, used) if keep]
        self.firsts = self.firsts[used]

    @property
    def nbytes(self) -> int:
        """Bytes of the chunks; a zero-stride chunk (text seeds' NaN log-probs) holds no buffer of its length."""
        return sum(a.nbytes for arrays in self.chunks for a in arrays if a.strides != (0,))


class _Column:
    """A NumPy column with amortised appends (capacity doubles; pages past `size` are never touched)."""

    __slots__ = ("data", "size")

    def __init__(self, dtype, capacity: int = 1024):
        self.data = np.empty(capacity, dtype=dtype)
        self.size = 0

    def extend(self, values) -> None:
        values = np.asarray(values, dtype=self.data.dtype)
        needed = self.size + len(values)
        if needed > len(self.data):
            grown = np.empty(max(needed, 2 * len(self.data)), dtype=self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : needed] = values
        self.size = needed

    @property
    def values(self) -> np.ndarray:
        return self.data[: self.size]


def _hash_strings(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """FNV-1a (32 bit) of each UTF-8 string `data[offsets[i]:offsets[i + 1]]`, vectorised over the strings."""
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    hashes = np.full(len(lengths), 2166136261, dtype=np.uint32)
    if not len(lengths):
        return hashes
    if len(lengths) <= 8:  # a few ids (single adds): plain Python beats the vectorised passes
        for i in range(len(lengths)):
            h = 2166136261
            for byte in data[offsets[i] : offsets[i + 1]].tobytes():
                h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
            hashes[i] = h
        return hashes
    # One row of bytes per string (zero-padded), transposed so that each pass reads one contiguous column.
    width = int(lengths.max())
    if (lengths == width).all():
        matrix = data[offsets[0] : offsets[-1]].reshape(-1, width).T.copy()
    else:
        matrix = np.zeros((width, len(lengths)), dtype=np.uint8)
        row = np.repeat(np.arange(len(lengths)), lengths)
        column = np.arange(len(row)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        matrix[column, row] = data[offsets[0] : offsets[-1]]
    prime = np.uint32(16777619)
    for j in range(width):
        mixed = (hashes ^ matrix[j]) * prime
        hashes = mixed if (lengths > j).all() else np.where(lengths > j, mixed, hashes)
    return hashes


def _member(sorted_values: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Whether each of `values` is in `sorted_values`."""
    if not len(sorted_values):
        return np.zeros(len(values), dtype=bool)
    position = np.searchsorted(sorted_values, values).clip(0, len(sorted_values) - 1)
    return sorted_values[position] == values


def _utf8(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [s.encode() for s in strings]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets


def _flat_logprobs(column: pa.ListArray, offsets: np.ndarray, num_tokens: int) -> np.ndarray:
    """The log-probs of a batch of table rows, aligned with its token ids (`offsets` into `num_tokens` of them).

    A column of nulls (text seeds, which no policy of this run sampled) reads as NaN for every token: one NaN seen
    through a zero-stride view, not a buffer of them (a trace's NaNs cost as much memory as its token ids).
    """
    if column.null_count == len(column):
        return np.broadcast_to(np.float32(np.nan), (num_tokens,))
    if not np.array_equal(offsets, column.offsets.to_numpy()):
        raise ValueError("The seed dataset's `logprobs` do not align with its `completion_ids` (different lengths).")
    return column.values.to_numpy(zero_copy_only=False)


class SeedBank:
    """Stores rollouts and hands out seeds: earlier rollouts of a prompt that the current policy may restart from.

    A rollout is eligible as a seed at step `t` when it was generated at a step `<= t - min_age`, has at least two
    tokens (one to keep as prefix, one to cut away), and, with `snapshot_only`, is already part of a written snapshot.
    Rollouts loaded from another run's seed dataset are always old enough.
    """

    def __init__(self, success_reward: str | None = None, success_threshold: float = 0.0):
        # A rollout succeeded when its `success_reward` (a reward function's name; None: the weighted total) is
        # above `success_threshold`; the bank keeps that reward as each rollout's `reward`.
        self.success_reward, self.success_threshold = success_reward, success_threshold
        self._tokens = _Payload((np.int32, np.float32), TOKEN_LENGTH_BITS)  # token ids and behaviour log-probs
        self._id_text = _Payload((np.uint8,), ID_LENGTH_BITS)
        self._token_address = _Column(np.int64)
        self._id_address = _Column(np.int64)
        self._step = _Column(np.int32)  # EXTERNAL_STEP for rollouts of another run
        self._reward = _Column(np.float32)
        self._prompt = _Column(np.int32)
        # Prompts, one entry each (not per rollout), and the rollouts grouped by prompt: `_by_prompt[_starts[p]:
        # _starts[p + 1]]` are the indices of prompt p's rollouts, so `sample` can draw one of them in O(1) and costs
        # time in the asked prompts, not in the bank's size. Rollouts added since the last `_index_prompts` are
        # appended on demand.
        self._prompt_code: dict[str, int] = {}
        self._prompt_names: list[str] = []
        self._by_prompt = np.zeros(0, dtype=np.int32)
        self._starts = np.zeros(1, dtype=np.int64)
        self._prompt_indexed = 0
        # Rollout ids by 32-bit hash, sorted (collisions are told apart by the text), plus a short unsorted tail.
        self._hash_sorted = np.zeros(0, dtype=np.uint32)
        self._hash_order = np.zeros(0, dtype=np.int32)
        self._hash_tail = _Column(np.uint32, capacity=_HASH_TAIL)
        self.num_snapshotted = 0  # rollouts [0, num_snapshotted) are in a written snapshot (or external)
        # Multi-turn rollouts only (tools, environments): index -> (tool mask, JSON of the completion's messages).
        self._turns: dict[int, tuple[np.ndarray, str]] = {}

    def __len__(self) -> int:
        return self._step.size

    def __contains__(self, rollout_id: str) -> bool:
        return self._find(rollout_id) is not None

    # ----------------------------------------------------------------------------------------------------------------
    # Adding rollouts

    def add_rollouts(self, rollouts: Sequence[Rollout]) -> None:
        """Stores a batch of rollouts in one columnar append (no per-rollout work beyond reading their fields)."""
        if not rollouts:
            return
        ids = [np.asarray(r.completion_ids, dtype=np.int32) for r in rollouts]
        logps = [np.asarray(r.logprobs, dtype=np.float32) for r in rollouts]
        for r, i, lp in zip(rollouts, ids, logps):
            if i.shape != lp.shape:
                raise ValueError(
                    f"Rollout {r.rollout_id!r} has {len(i)} token ids but {len(lp)} log-probs; they must align."
                )
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum([len(i) for i in ids], out=offsets[1:])
        names, codes = np.unique([r.prompt_id for r in rollouts], return_inverse=True)
        first = len(self)
        self._extend(
            *_utf8([r.rollout_id for r in rollouts]),
            names.tolist(),
            codes,
            np.concatenate(ids),
            np.concatenate(logps),
            offsets,
            [np.nan if reward is None else reward for reward in map(self._success_value, rollouts)],
            [r.step for r in rollouts],
            external=False,
        )
        for index, r in enumerate(rollouts, start=first):
            if r.tool_mask is not None:
                self._turns[index] = (np.asarray(r.tool_mask, dtype=np.int8), r.completion)

    def _success_value(self, rollout: Rollout) -> float | None:
        return rollout.rewards.get(self.success_reward, rollout.reward) if self.success_reward else rollout.reward

    def add_table(self, table: pa.Table, external: bool = False) -> None:
        """Stores every row of a seed-dataset table, column by column; token ids and log-probs are not copied.

        The bank keeps views of the table's buffers: a table read from memory-mapped Arrow IPC files keeps its token
        ids in the page cache, shared by every process that maps the same files. A `logprobs` column of nulls (text
        seeds: no behaviour policy) gives NaN log-probs (`_flat_logprobs`).
        """
        if table is None or table.num_rows == 0:
            return
        first = len(self)
        for batch in table.select(list(BANK_COLUMNS)).to_batches():
            if batch.num_rows == 0:
                continue
            ids_column = batch.column("completion_ids")
            offsets, flat_ids = ids_column.offsets.to_numpy(), ids_column.values.to_numpy(zero_copy_only=False)
            prompts = batch.column("prompt_id").cast(pa.string()).dictionary_encode()
            self._extend(
                *string_buffers(batch.column("rollout_id")),
                prompts.dictionary.to_pylist(),
                prompts.indices.to_numpy(zero_copy_only=False),
                flat_ids,
                _flat_logprobs(batch.column("logprobs"), offsets, len(flat_ids)),
                offsets,
                batch.column("reward").to_numpy(zero_copy_only=False),
                batch.column("step").to_numpy(zero_copy_only=False),
                external,
                copy=False,
            )
        if "tool_mask" in table.column_names and "completion" in table.column_names:
            masks, completions = table.column("tool_mask").to_pylist(), table.column("completion").to_pylist()
            for index, (mask, completion) in enumerate(zip(masks, completions), start=first):
                if mask is not None:
                    self._turns[index] = (np.asarray(mask, dtype=np.int8), completion)
        self._index_prompts()  # part of loading: the first `sample` after a resume pays nothing extra

    def attach_snapshot(self, table: pa.Table) -> None:
        """Moves the payload of the rollouts since the last snapshot onto `table`, that snapshot as written, and marks
        them snapshotted. With `table` memory-mapped from a file every rank on the node maps, the bank's own copies of
        those token ids are freed and every rank reads the one copy in the page cache.
        """
        first = self.num_snapshotted
        if table.column("rollout_id").to_pylist() != self._rollout_ids(first):  # the new rows only: O(snapshot)
            raise ValueError(
                f"The snapshot holds {table.num_rows} rollouts that are not the {len(self) - first} this bank added since "
                "its last snapshot; it belongs to another run or step."
            )
        token_addresses, id_addresses = [], []
        for batch in table.select(["rollout_id", "completion_ids", "logprobs"]).to_batches():
            ids_column, logps_column = batch.column("completion_ids"), batch.column("logprobs")
            columns = (
                ids_column.values.to_numpy(zero_copy_only=False),
                logps_column.values.to_numpy(zero_copy_only=False),
            )
            token_addresses.append(self._tokens.extend(columns, ids_column.offsets.to_numpy(), copy=False))
            id_bytes, id_offsets = string_buffers(batch.column("rollout_id"))
            id_addresses.append(self._id_text.extend((id_bytes,), id_offsets, copy=False))
        if token_addresses:
            self._token_address.values[first:] = np.concatenate(token_addresses)
            self._id_address.values[first:] = np.concatenate(id_addresses)
        self._tokens.release_unused(self._token_address.values)
        self._id_text.release_unused(self._id_address.values)
        self.num_snapshotted = len(self)

    def _extend(
        self,
        id_bytes: np.ndarray,
        id_offsets: np.ndarray,
        prompt_names: Sequence[str],
        prompt_codes: np.ndarray,
        flat_ids: np.ndarray,
        flat_logps: np.ndarray,
        offsets: np.ndarray,
        rewards,
        steps,
        external: bool,
        copy: bool = True,
    ) -> None:
        """The one place rollouts enter the bank: checks the batch, then appends every column."""
        n = len(offsets) - 1
        if external and len(self) != self.num_snapshotted:
            raise ValueError("Rollouts of another run must be loaded before this run's own rollouts.")
        hashes = self._check_new_ids(id_bytes, id_offsets)
        codes = np.array([self._prompt_code.setdefault(p, len(self._prompt_code)) for p in prompt_names], np.int32)
        self._prompt_names.extend(list(self._prompt_code)[len(self._prompt_names) :])
        self._token_address.extend(self._tokens.extend((flat_ids, flat_logps), offsets, copy=copy))
        self._id_address.extend(self._id_text.extend((id_bytes,), id_offsets, copy=copy))
        self._prompt.extend(codes[np.asarray(prompt_codes, dtype=np.int64)] if n else codes[:0])
        self._reward.extend(np.asarray(rewards, dtype=np.float32))
        self._step.extend(np.full(n, EXTERNAL_STEP, np.int32) if external else np.asarray(steps, np.int32))
        self._hash_tail.extend(hashes)
        if self._hash_tail.size >= _HASH_TAIL:
            self._index_hashes()
        if external:
            self.num_snapshotted = len(self)

    # ----------------------------------------------------------------------------------------------------------------
    # Rollout ids: a 32-bit hash index, the text decides

    def _check_new_ids(self, id_bytes: np.ndarray, id_offsets: np.ndarray) -> np.ndarray:
        """The hashes of a batch of new rollout ids; refuses an id already in the bank or twice in the batch."""
        hashes = _hash_strings(id_bytes, id_offsets)
        suspect = _member(self._hash_sorted, hashes) | _member(np.sort(self._hash_tail.values), hashes)
        if len(hashes) > 1:
            order = np.argsort(hashes, kind="stable")
            repeated = np.flatnonzero(np.diff(hashes[order]) == 0)
            suspect[order[repeated]] = suspect[order[repeated + 1]] = True
        seen: set[str] = set()
        for i in np.flatnonzero(suspect).tolist():  # rare: equal 32-bit hashes, so the text decides
            text = id_bytes[id_offsets[i] : id_offsets[i + 1]].tobytes().decode()
            if text in seen or self._find(text, int(hashes[i])) is not None:
                raise ValueError(f"Rollout {text!r} is already in the seed bank.")
            seen.add(text)
        return hashes

    def _index_hashes(self) -> None:
        """Merges the unsorted tail of rollout-id hashes into the sorted index.

        Only the tail is sorted; the merge is one linear pass (`np.insert` at the tail's sorted positions), so loading
        a bank batch by batch costs O(n) per batch, not a sort of the whole index at every batch.
        """
        tail = self._hash_tail.values
        if not len(tail):
            return
        first = len(self._hash_sorted)  # the bank index of the tail's first rollout
        sort = np.argsort(tail, kind="stable")
        positions = np.searchsorted(self._hash_sorted, tail[sort], side="right")
        self._hash_sorted = np.insert(self._hash_sorted, positions, tail[sort])
        self._hash_order = np.insert(self._hash_order, positions, (first + sort).astype(np.int32))
        self._hash_tail = _Column(np.uint32, capacity=_HASH_TAIL)

    def _find(self, rollout_id: str, hashed: int | None = None) -> int | None:
        if hashed is None:
            hashed = int(_hash_strings(*_utf8([rollout_id]))[0])
        low, high = np.searchsorted(self._hash_sorted, [hashed, hashed + 1])
        candidates = self._hash_order[low:high].tolist()
        first_tail = len(self._hash_sorted)
        candidates += (first_tail + np.flatnonzero(self._hash_tail.values == hashed)).tolist()
        for index in candidates:
            if self._rollout_id(index) == rollout_id:
                return index
        return None

    def _rollout_id(self, index: int) -> str:
        return self._id_text.rows(self._id_address.values[[index]])[0][0].tobytes().decode()

    @property
    def rollout_ids(self) -> list[str]:
        """Every rollout id, in bank order (built on demand: the bank itself keeps no per-rollout strings)."""
        return self._rollout_ids(0)

    def _rollout_ids(self, first: int) -> list[str]:
        """The ids of rollouts `first` onwards, decoded."""
        return [row[0].tobytes().decode() for row in self._id_text.rows(self._id_address.values[first:])]

    # ----------------------------------------------------------------------------------------------------------------
    # Reading and sampling

    def mark_snapshotted(self) -> None:
        """Records that every rollout stored so far is part of a written snapshot."""
        self.num_snapshotted = len(self)

    def get(self, index: int) -> Seed:
        return self._get_many(np.array([index]))[0]

    def _index_prompts(self) -> None:
        """Files the rollouts added since the last call under their prompts (one O(bank) merge per batch of adds)."""
        first, last = self._prompt_indexed, len(self)
        num_prompts = len(self._prompt_names)
        if len(self._starts) < num_prompts + 1:
            self._starts = np.concatenate(
                [self._starts, np.full(num_prompts + 1 - len(self._starts), self._starts[-1], np.int64)]
            )
        if first == last:
            return
        codes = self._prompt.values[first:last]
        sort = np.argsort((codes.astype(np.int64) << 32) | np.arange(last - first))  # by prompt, then by index
        new = (first + sort).astype(np.int32)
        self._by_prompt = np.insert(self._by_prompt, self._starts[codes[sort] + 1], new)
        self._starts[1:] += np.cumsum(np.bincount(codes, minlength=num_prompts))
        self._prompt_indexed = last

    def sample(
        self, prompt_ids: Sequence[str], step: int, rng: np.random.Generator, *policy, **settings
    ) -> list[Seed | None]:
        """One seed per prompt (None where the prompt has no eligible seed). The policy and its settings (`selection`,
        `min_age`, ...) are `ts_trl.method.selection.draw_seeds`'s; this class only stores."""
        chosen = draw_seeds(self, prompt_ids, step, rng, *policy, **settings)
        seeds: list[Seed | None] = [None] * len(prompt_ids)
        found = np.flatnonzero(chosen >= 0)
        for position, seed in zip(found.tolist(), self._get_many(chosen[found])):
            seeds[position] = seed
        return seeds

    # ----------------------------------------------------------------------------------------------------------------
    # What the selection policy reads

    def prompt_ranges(self, prompt_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Where each prompt's rollouts start in the by-prompt index, and how many there are (0 for an unknown one)."""
        self._index_prompts()
        codes = np.array([self._prompt_code.get(p, -1) for p in prompt_ids], dtype=np.int64)
        known = codes >= 0
        if not known.any():
            return np.zeros(len(codes), dtype=np.int64), np.zeros(len(codes), dtype=np.int64)
        starts = np.where(known, self._starts[codes.clip(0)], 0)
        counts = np.where(known, self._starts[codes.clip(0) + 1] - starts, 0)
        return starts, counts

    def by_prompt(self, positions: np.ndarray) -> np.ndarray:
        """The rollout indices at `positions` of the by-prompt index (positions come from `prompt_ranges`)."""
        return self._by_prompt[positions].astype(np.int64)

    def steps(self, indices: np.ndarray) -> np.ndarray:
        return self._step.values[indices]

    def rewards(self, indices: np.ndarray) -> np.ndarray:
        return self._reward.values[indices]

    def lengths(self, indices: np.ndarray) -> np.ndarray:
        return self._token_address.values[indices] & ((1 << TOKEN_LENGTH_BITS) - 1)

    def _get_many(self, indices: np.ndarray) -> list[Seed]:
        """The seeds at `indices` (their token arrays are views into the bank's chunks)."""
        indices = np.asarray(indices, dtype=np.int64)
        tokens = self._tokens.rows(self._token_address.values[indices])
        texts = self._id_text.rows(self._id_address.values[indices])
        prompts, rewards, steps = (c.values[indices].tolist() for c in (self._prompt, self._reward, self._step))
        return [
            Seed(
                index=index,
                rollout_id=text[0].tobytes().decode(),
                prompt_id=self._prompt_names[prompt],
                completion_ids=ids,
                logprobs=logps,
                reward=reward,
                step=step,
                tool_mask=self._turns[index][0] if index in self._turns else None,
                messages=self._turns[index][1] if index in self._turns else None,
            )
            for index, text, (ids, logps), prompt, reward, step in zip(
                indices.tolist(), texts, tokens, prompts, rewards, steps
            )
        ]

    @property
    def metadata_bytes_per_rollout(self) -> float:
        """Bytes of per-rollout metadata in use (payload excluded: token ids, log-probs and rollout-id text)."""
        columns = (self._token_address, self._id_address, self._step, self._reward, self._prompt)
        used = sum(c.size * c.data.itemsize for c in columns) + self._by_prompt.nbytes
        used += self._hash_sorted.nbytes + self._hash_order.nbytes + self._hash_tail.size * 4
        return used / max(len(self), 1)

    @property
    def nbytes(self) -> int:
        """Bytes held by the bank's arrays: payload chunks, metadata columns (allocated capacity) and indexes."""
        columns = (self._token_address, self._id_address, self._step, self._reward, self._prompt, self._hash_tail)
        indexes = (self._by_prompt, self._starts, self._hash_sorted, self._hash_order)
        return (
            self._tokens.nbytes
            + self._id_text.nbytes
            + sum(c.data.nbytes for c in columns)
            + sum(a.nbytes for a in indexes)
        )
