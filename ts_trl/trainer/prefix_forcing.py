"""Static HF `generate` with seeded rows: the prefix beyond the batch's common part is forced token by token.

Static batching decodes every row as many steps as the longest row needs. Splicing each row's whole prefix into its
prompt makes the batch as long as the plain rows' full budget anyway (`max_completion_length` decode steps), and left
padding widens every row by the longest prefix. Instead, every row gets the same `m` prefix tokens spliced into its
prompt (`m`: the shortest prefix of the global batch, 0 when a row is plain), and row `i` is made to emit its remaining
`k_i - m` prefix tokens as its first generated tokens. Every row then needs exactly `max_completion_length - m` decode
steps, the least any row of the batch needs, and no row is padded for another's prefix.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np
import torch
from transformers import LogitsProcessor


class ForcedPrefix(LogitsProcessor):
    """Makes row `i` of a `generate` call emit `forced[i]` as its first new tokens, then sample as usual.

    Custom processors run before the sampling warpers (temperature, top-k, top-p), which keep a lone finite logit, so
    a forced token is drawn with probability one; repetition penalties scale the 0 logit to 0.
    """

    def __init__(self, forced: Sequence[Sequence[int]]):
        self.forced = [[int(token) for token in tokens] for tokens in forced]  # per row, as given
        width = max((len(f) for f in self.forced), default=0)
        table = np.full((width, len(self.forced)), -1, dtype=np.int64)  # table[position, row]: the token forced there
        for row, tokens in enumerate(self.forced):
            table[: len(tokens), row] = tokens
        table = torch.from_numpy(table)
        positions, rows = torch.nonzero(table >= 0, as_tuple=True)  # sorted by position
        per_position = torch.bincount(positions, minlength=width).tolist()
        # Per position: which rows are forced there and to which token, built once so a decode step costs two ops.
        self.steps = list(zip(rows.split(per_position), table[positions, rows].split(per_position)))
        self.prompt_width: int | None = None  # set at the first call: the padded prompt's width
        self.zero: torch.Tensor | None = None  # set at the first call: 0 in the scores' dtype and device

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prompt_width is None:
            if scores.shape[0] != len(self.forced):
                raise ValueError(
                    f"generate() scored {scores.shape[0]} sequences for {len(self.forced)} rows; seeding with HF generate "
                    "needs one sequence per row. Remove num_beams / num_return_sequences from generation_kwargs."
                )
            self.prompt_width = input_ids.shape[1]
            self.steps = [(rows.to(scores.device), tokens.to(scores.device)) for rows, tokens in self.steps]
            self.zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
        position = input_ids.shape[1] - self.prompt_width
        if position < len(self.steps):
            rows, tokens = self.steps[position]
            scores.index_fill_(0, rows, float("-inf"))
            scores.index_put_((rows, tokens), self.zero)
        return scores

    # `LogitsProcessorList` reads every processor's signature at every decode step; a stored one costs a third as much.
    __call__.__signature__ = inspect.signature(__call__)


def strip_forced(generated: Sequence[int], forced: Sequence[int]) -> list[int]:
    """The row's own continuation: what `generate` returned after the forced tokens, which must lead it."""
    generated = list(generated)
    if generated[: len(forced)] != list(forced):
        raise RuntimeError(
            "HF generate did not emit the forced seed prefix (a generation path that ignores `logits_processor`?). "
            "Set use_vllm=True or use_transformers_continuous_batching=True, or report this with your TRL version."
        )
    return generated[len(forced) :]
