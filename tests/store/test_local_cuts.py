"""Cuts from one encoding of each trace (`local_cuts.py`) are exactly those of re-encoding every candidate prefix, on
real traces (GSM8K's worked answers), on them with multi-byte and odd whitespace mixed in, and on random text, with
the character tokenizer, a trained word tokenizer and SmolLM2's byte-level BPE."""

import json
import random

import numpy as np
import pytest
from tokenizers import normalizers

from tests.conftest import build_word_tokenizer
from tests.store.test_trace_scale import TEXTS, reference
from ts_trl.store.local_cuts import LocalCuts
from ts_trl.store.text_seeds import TextCodec, _boundaries, retokenise_many
from ts_trl.tiny import build_tokenizer

TRACES = 120  # GSM8K answers per check: the slow reference encodes up to 64 prefixes of each through transformers
ODD = ["é", "ï", "漢字", "🙂", "\u00a0", "\u2028", "\u3000", "\t", "  ", "\n\n", "’s", "'s", "'ll", "—", "\ufffd"]
SPECIAL_TEXT = ["<eos>", "<|im_end|>", "<pad>"]  # added tokens spelled in the text: those traces go the exact way


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from ts_trl import smollm2_135m_instruct

    try:
        return AutoTokenizer.from_pretrained(smollm2_135m_instruct())
    except Exception as error:  # noqa: BLE001 - any reason it cannot be had offline skips it, said below
        pytest.skip(f"SmolLM2's tokenizer is not available here ({type(error).__name__}: {error})")


BUILDERS = [build_tokenizer, build_word_tokenizer, smollm2_tokenizer]


def real_traces(gsm8k_path) -> list[str]:
    rows = [json.loads(line) for line in gsm8k_path.read_text().splitlines()[:TRACES]]
    return [row["answer"] for row in rows]


def mixed(texts: list[str], seed: int) -> list[str]:
    """Each text with odd characters, whitespace and special-token text put in at a few random places."""
    rng = random.Random(seed)
    out = []
    for text in texts:
        for _ in range(rng.randint(1, 4)):
            at = rng.randint(0, len(text))
            text = text[:at] + rng.choice(ODD + SPECIAL_TEXT[: rng.random() < 0.1]) + text[at:]
        out.append(text)
    return out


def random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = [*"ab Z09 \n\t.,'+=#-", *ODD, "####", " 12", "x", "'s", "  \n", "\n "]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(count)]


def assert_same_seeds(tokenizer, texts: list[str], newline_only: bool) -> int:
    """Asserts the new path's ids and cuts are the reference's for every text; returns how many took the local way."""
    codec = TextCodec.of(tokenizer)
    got = retokenise_many(tokenizer, texts, newline_only, codec)
    for text, (ids, cuts) in zip(texts, got):
        want_ids, want_cuts = reference(tokenizer, text, newline_only)
        assert ids.tolist() == list(want_ids), text
        assert cuts.tolist() == want_cuts.tolist(), text
    local = codec.local
    return sum(local is not None and local.cuts(t, _boundaries(t, newline_only)) is not None for t in texts)


@pytest.mark.parametrize("build", BUILDERS)
@pytest.mark.parametrize("newline_only", [False, True])
def test_local_cuts_are_the_reencoded_cuts_on_real_and_odd_traces(build, newline_only, gsm8k_path):
    tokenizer = build()
    real = real_traces(gsm8k_path)
    texts = [*real, *mixed(real, 1), *random_texts(200, 2), *TEXTS]
    local = assert_same_seeds(tokenizer, texts, newline_only)
    # not a vacuous pass: the traces the character tokenizer knows every character of, at least, take the local way
    assert local >= len(real) // 2


def test_a_tokenizer_the_proof_does_not_cover_is_reencoded():
    tokenizer = build_word_tokenizer()
    assert LocalCuts.of(tokenizer.backend_tokenizer) is not None
    tokenizer.backend_tokenizer.normalizer = normalizers.Lowercase()  # a normaliser: prefixes may normalise apart
    assert TextCodec.of(tokenizer).local is None
    assert_same_seeds(tokenizer, TEXTS, False)


def test_tails_are_encoded_once_and_the_memo_stays_bounded(monkeypatch):
    from ts_trl.store import local_cuts

    monkeypatch.setattr(local_cuts, "TAIL_MEMO", 8)
    codec = TextCodec.of(build_word_tokenizer())
    texts = random_texts(50, 3)
    for text in texts:
        codec.local.cuts(text, _boundaries(text, False))
    assert 0 < len(codec.local._tails) <= 8
    assert np.all([len(c) >= 0 for _, c in retokenise_many(None, texts, False, codec)])
