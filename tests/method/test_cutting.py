"""Unit tests of the pure cut / splice / weight functions, with hand-computed numbers."""

import math

import numpy as np
import pytest
import torch

from ts_trl import Cut, SeedSplicer
from ts_trl.method.cutting import (
    admissible_ratios,
    boundary_token_ids,
    choose_cut,
    continuation_budget,
    draw_cut,
    max_cut,
    prefix_importance_weights,
)

EOS = 1


def test_cut_is_floor_of_ratio_times_length():
    seed = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    assert choose_cut(seed, 0.35, {EOS}, budget=64).k == 3  # floor(3.5)
    assert choose_cut(seed, 0.99, {EOS}, budget=64).k == 9  # floor(9.9) = 9 = len - 1
    assert choose_cut(seed, 0.01, {EOS}, budget=64).k == 1  # floor(0.1) = 0, clipped up to 1


def test_cut_never_puts_eos_in_the_prefix():
    seed = [10, 11, 12, EOS]
    assert max_cut(seed, {EOS}, budget=64) == 3
    assert choose_cut(seed, 0.9, {EOS}, budget=64).k == 3  # floor(3.6) = 3: prefix [10, 11, 12], EOS cut away
    early = [10, EOS, 12, 13, 14, 15]  # an EOS in the middle (e.g. an external seed) bounds the cut
    assert choose_cut(early, 0.9, {EOS}, budget=64).k == 1
    assert choose_cut([EOS, 10, 11], 0.5, {EOS}, budget=64) is None
    assert choose_cut([10], 0.5, {EOS}, budget=64) is None  # a one-token seed has nothing to cut away


def test_cut_leaves_budget_for_the_continuation():
    seed = list(range(10, 30))  # 20 tokens
    assert choose_cut(seed, 0.9, {EOS}, budget=8).k == 7  # floor(18) clipped to budget - 1


def test_cut_snaps_to_nearest_newline_boundary():
    NL = 99
    seed = [10, 11, NL, 12, 13, 14, 15, NL, 16, 17]
    # floor(0.5 * 10) = 5; boundaries (positions after a newline) are 3 and 8: 3 is nearer
    assert choose_cut(seed, 0.5, {EOS}, budget=64, boundary_token_ids={NL}).k == 3
    assert choose_cut(seed, 0.7, {EOS}, budget=64, boundary_token_ids={NL}).k == 8
    assert choose_cut([10, 11, 12, 13], 0.5, {EOS}, budget=64, boundary_token_ids={NL}).k == 2  # none: unchanged


def test_collator_splices_prefix_after_prompt():
    splice = SeedSplicer("state")([1000, 1001], [5, 6, 7, 8], Cut(k=2, ratio=0.5))
    assert splice.prompt_ids == [1000, 1001, 5, 6]
    assert splice.prefix_ids == [5, 6]
    assert splice.prefix_mask == [0, 0]
    assert SeedSplicer("action")([1000], [5, 6, 7], Cut(k=2, ratio=0.7)).prefix_mask == [1, 1]


def test_collator_response_joins_and_truncates_to_budget():
    splice = SeedSplicer("state")([1000], [5, 6, 7, 8], Cut(k=3, ratio=0.8))
    ids, mask = SeedSplicer.response(splice, [20, 21, 22, 23], budget=5)
    assert ids == [5, 6, 7, 20, 21]  # 3 prefix tokens + the 2 the budget leaves
    assert mask == [0, 0, 0, 1, 1]


def test_collator_rejects_bad_cuts_and_modes():
    with pytest.raises(ValueError, match="1 <= k"):
        SeedSplicer("state")([1], [5, 6], Cut(k=2, ratio=0.9))
    with pytest.raises(ValueError, match="prefix_mode"):
        SeedSplicer("prefix")


def test_prefix_importance_weights_are_truncated_ratios_on_prefix_only():
    current = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    behaviour = torch.tensor([[-2.0, -1.0, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    weights = prefix_importance_weights(current, behaviour, mask, clip=2.0)
    expected = [min(math.exp(1.0), 2.0), math.exp(-1.0), 1.0, 1.0]  # the last token is not a prefix token
    assert weights[0].tolist() == pytest.approx(expected)


def test_boundary_ids_of_char_tokenizer(tokenizer):
    ids = boundary_token_ids(tokenizer)
    assert ids == set(tokenizer("\n", add_special_tokens=False)["input_ids"])


def test_saved_tiny_tokenizer_loads_back_exactly(tokenizer, tmp_path):
    """Beside a qwen2 config.json, AutoTokenizer would swap in Qwen2Tokenizer and drop spaces; load_tokenizer must not."""
    from ts_trl.tiny import build_tiny_model, load_tokenizer

    build_tiny_model(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    text = "Q: 7+15+9\nA: 7+15=22"
    assert load_tokenizer(tmp_path)(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_ratio_is_drawn_over_the_admissible_range_only():
    seed = list(range(10, 50))  # 40 tokens against a budget of 12: only k <= 11, i.e. r < 12 / 40, fits
    assert admissible_ratios(seed, {EOS}, budget=12, low=0.1, high=0.9) == pytest.approx((0.1, 0.3))
    rng = np.random.default_rng(0)
    ks = [draw_cut(seed, rng, 0.1, 0.9, {EOS}, budget=12).k for _ in range(2000)]
    assert min(ks) == 4 and max(ks) == 11  # floor(0.1 * 40) .. budget - 1
    counts = np.bincount(ks)[4:]
    assert counts.max() < 1.5 * counts.mean()  # about uniform over 4..11, not piled at 11 as clipping did
    short = [10, 11, 12, EOS]  # r below 1/4 would give k = 0: the range starts at 1/4
    assert admissible_ratios(short, {EOS}, budget=64, low=0.1, high=0.9) == pytest.approx((0.25, 0.9))


def test_seeds_that_cannot_be_cut_as_asked_are_refused():
    long = list(range(10, 210))  # 200 tokens: even r = 0.1 gives k = 20 > budget - 1
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    assert admissible_ratios(long, {EOS}, budget=12, low=0.1, high=0.9) is None
    assert draw_cut(long, rng, 0.1, 0.9, {EOS}, budget=12) is None
    assert rng.bit_generator.state == state  # nothing drawn for a refused seed
    assert admissible_ratios([10, EOS], {EOS}, budget=64, low=0.3, high=0.3) is None  # floor(0.6) = 0
    assert admissible_ratios(list(range(10, 20)), {EOS}, budget=64, low=0.3, high=0.3) == (0.3, 0.3)


def test_splice_of_a_banked_seed_holds_plain_ints():
    splice = SeedSplicer()([5, 6], np.array([10, 11, 12], dtype=np.int32), Cut(k=2, ratio=0.5))
    assert splice.prompt_ids == [5, 6, 10, 11] and splice.prefix_ids == [10, 11]
    assert all(type(t) is int for t in splice.prompt_ids)


def test_continuation_budget_is_what_the_prefix_and_the_context_leave():
    assert continuation_budget(0, 7, max_completion_length=12) == 12
    assert continuation_budget(4, 11, max_completion_length=12) == 8  # the prefix's tokens count against the budget
    assert continuation_budget(4, 11, max_completion_length=12, max_model_len=19) == 8  # 11 + 8 = 19 fits exactly
    assert continuation_budget(4, 15, max_completion_length=12, max_model_len=19) == 4  # a long prompt: the context
    with pytest.raises(ValueError, match="max_model_len=19. Raise vllm_max_model_length"):
        continuation_budget(2, 19, max_completion_length=12, max_model_len=19)


def test_a_text_seed_is_cut_only_at_its_allowed_positions():
    seed = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    allowed = np.array([2, 7], np.int32)
    assert choose_cut(seed, 0.4, {EOS}, budget=64, allowed=allowed).k == 2  # floor(4.0) = 4: 2 is nearer than 7
    assert choose_cut(seed, 0.5, {EOS}, budget=64, allowed=allowed).k == 7  # 5: 7 is nearer
    assert choose_cut(seed, 0.45, {EOS}, budget=64, allowed=np.array([3, 5])).k == 3  # a tie goes to the shorter
    assert choose_cut(seed, 0.9, {EOS}, budget=6, allowed=allowed).k == 2  # 7 leaves no budget: max_cut is 5
    assert choose_cut(seed, 0.5, {EOS}, budget=64, allowed=np.array([], np.int32)) is None  # no boundary: no cut
    assert choose_cut(seed, 0.5, {EOS}, budget=3, allowed=np.array([5])) is None
