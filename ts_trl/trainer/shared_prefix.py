"""The shared-prefix forward: rows of a micro-batch with the same prompt compute it and their common start once.

TRL scores a micro-batch as `B` padded rows `[prompt | completion]`, each through the whole model. The rows of a
prompt group share their prompt, and in a seeded group also the seed prefix that leads every completion, so the
forward computes the same tokens `G` times. Here the micro-batch is packed into one sequence instead: per group of rows
with identical prompt ids, its shared part (the prompt and the longest common start of the completions) once, then
each row's own tokens; a block mask lets each row's tokens attend to its group's shared part and to its own earlier
tokens only, and every token keeps the position id it has in its padded row (`arange(width)`, pads counted, as
transformers computes them when no position ids are given). The hidden state of a token depends only on the tokens it
attends to and their positions, so every log-prob, entropy and gradient is the unshared path's up to float rounding.

One group in the packed sequence (prompt `p1 p2`, prefix `s1 s2`, rows continue `a..`, `b..`)::

    shared            row 0        row 1
    p1 p2 s1 s2   |   s2' a1 a2  | s2' b1 b2 b3
                      ^ a copy of s2 (same position, same keys) that carries the row's first label

The last shared token predicts a different first token in each row, and TRL's fused LM head scores one label per
position, so each row starts with a copy of it; the copy attends to what the original attends to and no token attends
to the copy. Tokens the padded rows mask (left pads, pads after the end) are not packed: TRL gives their positions
log-prob 0 and entropy 0, as here.

The forward goes through TRL's fused LM head (`model(..., shift_labels=, fused_lm_head=True)`), with a 4D additive
mask and explicit position ids, in one call of the (possibly DDP / DeepSpeed-wrapped) model. Where packing cannot be
exact (vision inputs, MoE aux loss, attention kernels that ignore a 4D mask, sliding windows, rows padded otherwise than
TRL pads them) or saves nothing, TRL's own forward runs, with one warning per reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

EXACT_ATTENTION = ("eager", "sdpa")  # the kernels that apply an arbitrary 4D additive mask


@dataclass
class PackedRows:
    """A micro-batch packed for the shared forward (`pack_rows`). `N` packed tokens, `B` rows, `C` completion columns."""

    input_ids: torch.Tensor  # (1, N)
    position_ids: torch.Tensor  # (1, N): each token's column in its padded row
    visible: torch.Tensor  # (N, N) bool: query i attends key j
    shift_labels: torch.Tensor  # (1, N): the token each packed token predicts, -100 where TRL scores nothing
    source: torch.Tensor  # (B, C): the packed token whose prediction is completion token (b, c); N where none
    unshared_tokens: int  # what TRL's path computes: B x padded width

    @property
    def tokens(self) -> int:
        return self.input_ids.shape[1]


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> PackedRows | str:
    """Packs `B` padded rows `[prompt | completion]` (the last `logits_to_keep` columns are the completion) into one
    sequence with a block mask, or returns why they cannot be packed exactly.

    Rows are grouped by identical prompt ids and mask; a group's shared part is its prompt plus the longest common
    start of its completions (ids and mask). Needs TRL's layout: prompts left-padded (the last prompt column real)
    and completions right-padded (no real token after a masked one).

    Long: the layout, the labels and the map back to the rows are built in one pass over each group, and read best
    beside each other (each packed token's label and the completion position it serves are set where it is added).
    """
    ids, mask = input_ids.tolist(), attention_mask.tolist()
    B, width = input_ids.shape
    P = width - logits_to_keep
    if P < 1 or any(m[P - 1] == 0 for m in mask):
        return "prompts are not left-padded to a real last token"
    if any(any(a < b for a, b in zip(m[P:], m[P + 1 :])) for m in mask):
        return "a completion has a real token after a masked one"
    groups: dict[tuple, list[int]] = {}
    for row in range(B):
        groups.setdefault((tuple(ids[row][:P]), tuple(mask[row][:P])), []).append(row)

    tokens, positions, labels, group_of, row_of, copy = [], [], [], [], [], []
    source = [[-1] * logits_to_keep for _ in range(B)]

    def label(row: int, column: int) -> int:
        nxt = column + 1
        return ids[row][nxt] if P <= nxt < width and mask[row][nxt] else -100

    def add(row: int, column: int, group: int, own_row: int, is_copy: bool, scored: bool) -> int:
        tokens.append(ids[row][column])
        positions.append(column)
        labels.append(label(row, column) if scored else -100)
        group_of.append(group)
        row_of.append(own_row)
        copy.append(is_copy)
        return len(tokens) - 1

    for g, rows in enumerate(groups.values()):
        first = rows[0]
        pairs = [list(zip(ids[r][P:], mask[r][P:])) for r in rows]
        common = 0
        while common < logits_to_keep and all(p[common] == pairs[0][common] for p in pairs):
            common += 1
        end = P + common  # columns [0, end) are shared
        branches = len(rows) > 1 and common < logits_to_keep
        at = {}
        for column in range(end):
            if mask[first][column]:
                last = branches and column == end - 1
                at[column] = add(first, column, g, -1, False, scored=not last)
        for row in rows:
            for column in range(P - 1, end if not branches else end - 1):
                if column in at and column + 1 - P < logits_to_keep:
                    source[row][column + 1 - P] = at[column]
        if not branches:
            continue
        for row in rows:
            # `end - 1` is real: the rows differ after it, and a masked column is followed by masked ones only
            source[row][end - P] = add(row, end - 1, g, row, True, scored=True)
            for column in range(end, width):
                if mask[row][column]:
                    index = add(row, column, g, row, False, scored=True)
                    if column + 1 < width:
                        source[row][column + 1 - P] = index

    n = len(tokens)
    device = input_ids.device
    as_tensor = lambda values: torch.tensor(values, device=device)  # noqa: E731
    group, own, is_copy, pos = as_tensor(group_of), as_tensor(row_of), as_tensor(copy), as_tensor(positions)
    visible = (
        (group[:, None] == group[None, :])
        & (pos[None, :] <= pos[:, None])
        & ~is_copy[None, :]
        & ((own[None, :] == -1) | (own[None, :] == own[:, None]))
    )
    source_t = as_tensor(source)
    source_t[source_t < 0] = n
    return PackedRows(
        input_ids=as_tensor(tokens)[None].to(input_ids.dtype),
        position_ids=pos[None],
        visible=visible,
        shift_labels=as_tensor(labels)[None],
        source=source_t,
        unshared_tokens=B * width,
    )


def unpack(values: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """Per-token values of the packed sequence `(1, N)` laid out as the `(B, C)` completions, 0 where none."""
    flat = torch.cat([values[0], values.new_zeros(1)])
    return flat[packed.source]


def attention_mask_for(visible: torch.Tensor, attention: str, dtype: torch.dtype) -> torch.Tensor:
    """The `(1, 1, N, N)` mask as the kernel takes it: SDPA a boolean one (True where visible); eager attention adds it
    to its scores, so 0 where visible and the dtype's minimum elsewhere (a masked key gets weight exactly 0)."""
    if attention == "sdpa":
        return visible[None, None]
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


def unsupported(model, config) -> str | None:
    """Why `model` cannot run the packed forward exactly, or None."""
    attention = getattr(config, "_attn_implementation", None)
    if attention not in EXACT_ATTENTION:
        return f"attention implementation {attention!r} (the packed mask needs one of {EXACT_ATTENTION})"
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config or getattr(config, "vision_config", None) is not None:
        return "a vision-language model"
    layer_types = getattr(text, "layer_types", None) or []
    uses_window = getattr(text, "use_sliding_window", True) and getattr(text, "sliding_window", None)
    if any(kind != "full_attention" for kind in layer_types) or (uses_window and not layer_types):
        return "sliding-window attention"
    if getattr(text, "output_router_logits", False):
        return "a mixture-of-experts model with a router loss"
    return None


class SharedPrefixForward:
    """The trainer's `_get_per_token_logps_and_entropies` with the shared-prefix forward (`SeedGRPOConfig.shared_prefix`).

    A mixin before `GRPOTrainer`: every training-side forward TRL makes (the loss, the old and reference log-probs)
    calls this method, and gets TRL's own path wherever packing does not apply.
    """

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **inputs,
    ):
        why = self._shared_prefix_refusal(model, compute_aux_loss, inputs)
        if why is None:
            batch_size = batch_size or input_ids.size(0)
            chunks = []
            for start in range(0, input_ids.size(0), batch_size):
                ids, mask = input_ids[start : start + batch_size], attention_mask[start : start + batch_size]
                packed = pack_rows(ids, mask, logits_to_keep)
                if isinstance(packed, str) or packed.tokens >= packed.unshared_tokens:
                    why = packed if isinstance(packed, str) else "no tokens are shared in the micro-batch"
                    break
                chunks.append((packed, start))
            else:
                return self._shared_forward(model, chunks, compute_entropy)
        self._warn_unshared(why)
        return super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, **inputs
        )

    def _shared_prefix_refusal(self, model, compute_aux_loss, inputs) -> str | None:
        if not getattr(self.args, "shared_prefix", False):
            return "off"
        if compute_aux_loss:
            return "a mixture-of-experts router loss (counted per packed token, not per row)"
        if any(value is not None for value in inputs.values()):
            return "vision or token-type inputs"
        return unsupported(model, self.accelerator.unwrap_model(model).config)

    def _shared_forward(self, model, chunks, compute_entropy):
        logps, entropies, computed, unshared = [], [], 0, 0
        config = self.accelerator.unwrap_model(model).config
        attention, dtype = config._attn_implementation, self.accelerator.unwrap_model(model).dtype
        for packed, _ in chunks:
            with self.accelerator.autocast():
                outputs = model(
                    input_ids=packed.input_ids,
                    attention_mask=attention_mask_for(packed.visible, attention, dtype),
                    position_ids=packed.position_ids,
                    shift_labels=packed.shift_labels,
                    fused_lm_head=True,
                )
            logps.append(unpack(outputs.log_probs, packed))
            if compute_entropy:
                entropies.append(unpack(outputs.entropy, packed))
            computed, unshared = computed + packed.tokens, unshared + packed.unshared_tokens
        if torch.is_grad_enabled():  # the loss forward: one value per micro-batch, like TRL's own metrics
            metrics = self._metrics["train" if model.training else "eval"]
            metrics["shared_prefix/token_share"].append(computed / unshared)
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    def _warn_unshared(self, why: str) -> None:
        warned = self.__dict__.setdefault("_shared_prefix_warned", set())
        if why == "off" or why in warned:
            return
        warned.add(why)
        logger.warning(
            "shared_prefix: this forward scores its rows one by one (TRL's path), because of %s. The results are the "
            "same; only the shared tokens are computed once per row instead of once per group.",
            why,
        )
