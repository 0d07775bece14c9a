"""Prefix forcing for static HF generate: forced rows emit their tokens first, the others sample untouched."""

import pytest
import torch

from ts_trl.trainer.prefix_forcing import ForcedPrefix, strip_forced


def test_forced_rows_emit_their_tokens_then_sample_freely():
    processor = ForcedPrefix([[7, 8], [], [9]])
    prompt = torch.zeros(3, 5, dtype=torch.long)
    scores = torch.randn(3, 12)
    first = processor(prompt, scores.clone())
    assert first[0].argmax() == 7 and first[2].argmax() == 9
    assert torch.isinf(first[0]).sum() == 11 and torch.equal(first[1], scores[1])  # the plain row is untouched
    second = processor(torch.zeros(3, 6, dtype=torch.long), scores.clone())
    assert second[0].argmax() == 8 and torch.equal(second[2], scores[2])  # row 2's prefix is done
    assert torch.equal(processor(torch.zeros(3, 7, dtype=torch.long), scores.clone()), scores)
    with pytest.raises(ValueError, match="one sequence per row"):
        ForcedPrefix([[1]])(prompt, scores)


def test_every_row_emits_exactly_its_own_prefix_whatever_the_lengths():
    generator = torch.Generator().manual_seed(0)
    forced = [torch.randint(0, 50, (int(n),), generator=generator).tolist() for n in torch.randint(0, 12, (9,))]
    forced[4] = []  # a plain row among seeded ones
    processor = ForcedPrefix(forced)
    emitted = [[] for _ in forced]
    for position in range(14):
        scores = torch.randn(len(forced), 50, generator=generator)
        out = processor(torch.zeros(len(forced), 3 + position, dtype=torch.long), scores.clone())
        for row, tokens in enumerate(forced):
            if position < len(tokens):  # one finite logit: sampling can only draw the forced token
                assert torch.isfinite(out[row]).sum() == 1
                emitted[row].append(int(out[row].argmax()))
            else:
                assert torch.equal(out[row], scores[row])
    assert emitted == forced


def test_strip_forced_refuses_a_generation_that_ignored_the_processor():
    assert strip_forced([7, 8, 3, 4], [7, 8]) == [3, 4]
    with pytest.raises(RuntimeError, match="did not emit the forced seed prefix"):
        strip_forced([7, 3], [7, 8])
