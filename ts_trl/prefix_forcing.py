"""Static HF `generate` with seeded rows: the prefix beyond the batch's common part is forced token by token.

Static batching decodes every row as many steps as the longest row needs. Splicing each row's whole prefix into its
prompt makes the batch as long as the plain rows' full budget anyway (`max_completion_length` decode steps), and left
padding widens every row by the longest prefix. Instead, every row gets the same `m` prefix tokens spliced into its
prompt (`m`: the shortest prefix of the global batch, 0 when a row is plain), and row `i` is made to emit its remaining
`k_i - m` prefix tokens as its first generated tokens. Every row then needs exactly `max_completion_length - m` decode
steps, the least any row of the batch needs, and no row is padded for another's prefix.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import LogitsProcessor


class ForcedPrefix(LogitsProcessor):
    """Makes row `i` of a `generate` call emit `forced[i]` as its first new tokens, then sample as usual.

    Custom processors run before the sampling warpers (temperature, top-k, top-p), which keep a lone finite logit, so
    a forced token is drawn with probability one; repetition penalties scale the 0 logit to 0.
    """

    def __init__(self, forced: Sequence[Sequence[int]]):
        width = max((len(f) for f in forced), default=0)
        self.tokens = torch.full((len(forced), width), -1, dtype=torch.long)
        for row, tokens in enumerate(forced):
            self.tokens[row, : len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.long)
        self.prompt_width: int | None = None  # set at the first call: the padded prompt's width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[0] != self.tokens.shape[0]:
            raise ValueError(
                f"generate() scored {scores.shape[0]} sequences for {self.tokens.shape[0]} rows; seeding with HF "
                "generate needs one sequence per row. Remove num_beams / num_return_sequences from generation_kwargs."
            )
        if self.prompt_width is None:
            self.prompt_width = input_ids.shape[1]
            self.tokens = self.tokens.to(scores.device)
        position = input_ids.shape[1] - self.prompt_width
        if position < self.tokens.shape[1]:
            token = self.tokens[:, position]
            rows = torch.nonzero(token >= 0).squeeze(1)
            if len(rows):
                scores[rows] = float("-inf")
                scores[rows, token[rows]] = 0.0
        return scores


def strip_forced(generated: Sequence[int], forced: Sequence[int]) -> list[int]:
    """The row's own continuation: what `generate` returned after the forced tokens, which must lead it."""
    generated = list(generated)
    if generated[: len(forced)] != list(forced):
        raise RuntimeError(
            "HF generate did not emit the forced seed prefix (a generation path that ignores `logits_processor`?). "
            "Set use_vllm=True or use_transformers_continuous_batching=True, or report this with your TRL version."
        )
    return generated[len(forced) :]
