"""Prefix forcing for static HF generate: forced rows emit their tokens first, the others sample untouched."""

import pytest
import torch

from ts_trl.prefix_forcing import ForcedPrefix, strip_forced


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


def test_strip_forced_refuses_a_generation_that_ignored_the_processor():
    assert strip_forced([7, 8, 3, 4], [7, 8]) == [3, 4]
    with pytest.raises(RuntimeError, match="did not emit the forced seed prefix"):
        strip_forced([7, 3], [7, 8])
