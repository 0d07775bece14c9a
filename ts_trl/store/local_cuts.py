"""Where a text seed may be cut, from one encoding of the trace, for tokenizers that provably tokenise a prefix as the
trace up to its last piece (`external_seeds.retokenise_many` re-encodes each candidate prefix for every other one).

A byte-level BPE tokenizer without a normaliser splits a text into pieces with GPT-2's pattern and encodes each piece
alone. That pattern's pieces tile the text and it has no look-behind; its one look-ahead, `\\s+(?!\\S)`, changes a
piece only where whitespace reaches the prefix's end (the prefix's end lets it take the whole run). So a prefix
`text[:p]` has the whole text's pieces before `q`, the last piece start at or before the whitespace that ends the
prefix, then the pieces of `text[q:p]`: its tokens are the trace's tokens before `q` followed by the encoding of the
short tail `text[q:p]`, which is all that is encoded. Without the pattern (`use_regex=False`) and without merges
every byte is a token of its own, and a prefix's tokens are the trace's first tokens up to that byte. A trace that
spells an added (special) token, or whose tokens include an unknown token or do not spell its bytes exactly, goes the
exact way; in any other, tokens that equal the trace's first tokens spell the prefix's bytes, so they decode back to
it and the decode check of `retokenise` holds by construction.
"""

from __future__ import annotations

import bisect
import json
import re

import numpy as np

TAIL_MEMO = 1 << 16  # distinct tails whose encodings are kept (most are a space, a newline or a short word)


class LocalCuts:
    """The cut positions of texts under one byte-level BPE tokenizer backend; see the module docstring.

    Built by `LocalCuts.of(backend)`, which returns None for a tokenizer it cannot prove local.
    """

    def __init__(self, backend, pieces: bool, token_bytes: np.ndarray, added: re.Pattern | None):
        self.backend = backend
        self.pieces = pieces  # GPT-2's pattern splits the text; else every byte is a token
        self.token_bytes = token_bytes  # bytes each id spells; -1: an added or unknown token, or not byte-level
        self.added = added  # the added tokens' text: a trace spelling one goes the exact way
        self._tails: dict[str, list[int]] = {}

    @classmethod
    def of(cls, backend) -> LocalCuts | None:
        """This backend's `LocalCuts`, or None where its pipeline is not the one the module docstring proves local."""
        spec = json.loads(backend.to_str())
        model, split = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
        if spec.get("normalizer") is not None or (spec.get("decoder") or {}).get("type") != "ByteLevel":
            return None
        if model.get("type") != "BPE" or model.get("dropout") or model.get("continuing_subword_prefix"):
            return None
        if model.get("end_of_word_suffix") or split.get("type") != "ByteLevel" or split.get("add_prefix_space"):
            return None
        pieces = split.get("use_regex", True)
        if not pieces and (model.get("merges") or model.get("ignore_merges")):
            return None  # the whole text is one piece, merged across any boundary
        byte_chars = _byte_level_characters()
        added = {token.content for token in backend.get_added_tokens_decoder().values()}
        vocab = backend.get_vocab(with_added_tokens=True)
        token_bytes = np.full(max(vocab.values(), default=0) + 1, -1, np.int64)
        excluded = added | {model.get("unk_token")}
        for token, index in vocab.items():
            if token not in excluded and all(c in byte_chars for c in token):
                token_bytes[index] = len(token)
        added_text = re.compile("|".join(map(re.escape, sorted(added)))) if added else None
        return cls(backend, pieces, token_bytes, added_text)

    def cuts(self, text: str, ends: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """(the trace's ids, the positions `k` it may be cut at) for the text boundaries `ends`, exactly as
        `retokenise` finds them; None for a trace that must go the exact way."""
        if self.added is not None and self.added.search(text):
            return None
        encoding = self.backend.encode(text, add_special_tokens=False)
        ids = np.asarray(encoding.ids, np.int32)
        spelled = self.token_bytes[ids]
        if (spelled < 0).any() or int(spelled.sum()) != len(text.encode()):
            return None
        if not ends:
            return ids, np.zeros(0, np.int32)
        if not self.pieces:  # a token per byte: the prefix's tokens are the trace's up to its byte length
            if len(ids) != len(text.encode()):
                return None
            positions = np.asarray(ends)
            if not text.isascii():
                widths = _utf8_widths(text)
                positions = np.concatenate([[0], np.cumsum(widths)])[positions]
            return ids, np.unique(positions).astype(np.int32)
        cuts = self._piece_cuts(text, ids, encoding.word_ids, ends)
        return None if cuts is None else (ids, cuts)

    def _piece_cuts(self, text: str, ids: np.ndarray, word_ids: list, ends: list[int]) -> np.ndarray | None:
        """The cuts of a text split by GPT-2's pattern: the trace's tokens before the last piece boundary `q` not inside
        the whitespace that ends the prefix, then the encoding of `text[q:p]`, where that is what the trace has there.

        Whitespace that reaches the prefix's end is the one place its pieces differ from the whole text's: `\\s+(?!\\S)`
        takes all of it there, where the text's next character made it leave the last one to the piece after.
        """
        starts = [start for _, (start, _) in self.backend.pre_tokenizer.pre_tokenize_str(text)]
        if not word_ids or word_ids[-1] != len(starts) - 1:
            return None  # a piece without a token: not the tokenizer the module docstring describes
        before = np.searchsorted(np.asarray(word_ids), np.arange(len(starts)))  # tokens before each piece
        found = set()
        for p in ends:
            w = p
            while w > 0 and _may_be_space(text[w - 1]):
                w -= 1
            piece = bisect.bisect_right(starts, w) - 1
            j = int(before[piece])
            if starts[piece] == p:
                k = j
            else:
                tail = self._tail(text[starts[piece] : p])
                k = j + len(tail)
                if k >= len(ids) or ids[j:k].tolist() != tail:
                    continue
            if 0 < k < len(ids):
                found.add(k)
        return np.array(sorted(found), np.int32)

    def _tail(self, text: str) -> list[int]:
        tail = self._tails.get(text)
        if tail is None:
            if len(self._tails) >= TAIL_MEMO:
                self._tails.clear()
            tail = self._tails[text] = self.backend.encode(text, add_special_tokens=False).ids
        return tail


def _utf8_widths(text: str) -> np.ndarray:
    """The UTF-8 length of each character of `text`."""
    code = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    return 1 + (code >= 0x80) + (code >= 0x800) + (code >= 0x10000)


def _byte_level_characters() -> set[str]:
    """The 256 characters byte-level BPE spells bytes with (GPT-2's `bytes_to_unicode`): printable Latin-1 as itself,
    every other byte as the character 256 places after its rank among them."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b) for b in printable} | {chr(256 + n) for n in range(len(others))}


def _may_be_space(character: str) -> bool:
    """Whether the pattern's `\\s` may match `character`: Python's whitespace and the characters some Unicode versions
    counted as such (walking back over more than `\\s` only makes the encoded tail longer, never a cut wrong)."""
    return character.isspace() or character in "\u180e\u200b\u2060\ufeff"
