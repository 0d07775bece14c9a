"""The shared-prefix forward: rows of a micro-batch with the same prompt compute it and their common start once.

TRL scores a micro-batch as `B` padded rows `[prompt | completion]`, each through the whole model. The rows of a
prompt group share their prompt, and in a seeded group also the seed prefix that leads every completion, so the
forward computes the same tokens `G` times. Here the micro-batch is packed into a few sequences instead: per group of
rows with identical prompt ids, its shared part (the prompt and the longest common start of the completions) once, then
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

A packed sequence's attention runs over every pair of its tokens, most of them masked, so one sequence for a whole
micro-batch costs the square of all its tokens. A group therefore stays in one sequence and groups share one only as
far as a cost estimate from the model's sizes (`forward_cost`: dense FLOPs a token, attention FLOPs a pair) finds it
cheapest. Sequences of about the same length run as one batch, padded to the longest; one much shorter (a seeded
group's beside a plain one's: its rows continue from a shared prefix) runs in a call of its own instead of as padding
(`_calls`). Where even that costs more than the padded rows (a small model with large groups, or short prompts before
long completions), that micro-batch takes TRL's path.

The forward goes through TRL's fused LM head (`model(..., shift_labels=, fused_lm_head=True)`), with a 4D additive
mask and explicit position ids. A distributed model (DDP, DeepSpeed) is called once a micro-batch under gradient, as
TRL calls it: each rank lays out its own micro-batch, and DDP's forward is a collective (it broadcasts the module's
buffers), so ranks that split differently would wait on each other; reentrant checkpointing would also fire DDP's
gradient hooks again at each call. Where packing cannot be exact (vision inputs, MoE aux loss, attention kernels that
ignore a 4D mask, sliding windows, rows padded otherwise than TRL pads them), saves nothing or costs more, TRL's own
forward runs, with one warning per reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from accelerate.utils import DistributedType

logger = logging.getLogger(__name__)

EXACT_ATTENTION = ("eager", "sdpa")  # the kernels that apply an arbitrary 4D additive mask


@dataclass
class ForwardCost:
    """A forward's floating-point operations as estimated from the model config (`forward_cost`): per token through
    the dense layers, and per (query, key) pair of a sequence in attention, which runs over every pair whatever the
    mask. The LM head is left out: both paths score the same labels."""

    per_token: float
    per_pair: float

    def of(self, sequences: int, length: int) -> float:
        """`sequences` sequences of `length` tokens (padding counted: it is computed too)."""
        return sequences * length * (self.per_token + length * self.per_pair)

    def of_calls(self, calls: list[tuple[int, int, int]]) -> float:
        """Model calls `(first sequence, end, length)`, as `PackedRows.calls`."""
        return sum(self.of(end - first, length) for first, end, length in calls)


CALL_FILL = 0.75  # a sequence shorter than this share of its call's longest runs in a call of its own


def _calls(lengths: list[int], split: bool) -> list[tuple[int, int, int]]:
    """Sequences of `lengths` (longest first) as model calls `(first sequence, end, length)`: consecutive ones share a
    call, padded to its first, until one is shorter than `CALL_FILL` of it (padding it would waste over a quarter of
    its tokens and almost half its attention square). A call costs a little besides its FLOPs, so sequences of nearly
    one length stay together. `split` False: all in one call."""
    calls, first = [], 0
    for s in range(1, len(lengths) + 1):
        if s == len(lengths) or (split and lengths[s] < CALL_FILL * lengths[first]):
            calls.append((first, s, lengths[first]))
            first = s
    return calls


def forward_cost(config) -> ForwardCost | None:
    """The cost model of a decoder from its config (a gated MLP, grouped-query attention), or None if the config does
    not say its sizes. The training pass's backward scales both terms alike, so the forward decides."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden, layers = getattr(text, "hidden_size", None), getattr(text, "num_hidden_layers", None)
    heads = getattr(text, "num_attention_heads", None)
    if not (hidden and layers and heads):
        return None
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    mlp = 3 * hidden * (getattr(text, "intermediate_size", None) or 4 * hidden)
    mlp *= getattr(text, "num_experts_per_tok", None) or 1
    projections = hidden * head_dim * 2 * (heads + kv_heads)
    return ForwardCost(per_token=2 * layers * (projections + mlp), per_pair=2 * layers * 2 * heads * head_dim)


@dataclass
class PackedRows:
    """A micro-batch packed for the shared forward (`pack_rows`): `S` packed sequences of `L` tokens (longest first,
    the shorter ones padded at the end), `B` rows, `C` completion columns; the model sees them in `calls`."""

    input_ids: torch.Tensor  # (S, L)
    position_ids: torch.Tensor  # (S, L): each token's column in its padded row
    visible: torch.Tensor  # (S, L, L) bool: query i attends key j
    shift_labels: torch.Tensor  # (S, L): the token each packed token predicts, -100 where TRL scores nothing
    source: torch.Tensor  # (B, C): the flat index (s * L + i) of the packed token predicting completion token (b, c);
    # S * L where none
    packed_tokens: int  # the tokens packed, padding not counted
    unshared_tokens: int  # what TRL's path computes: B x padded width
    calls: list[tuple[int, int, int]]  # (first sequence, end, length): sequences [first, end) cut to `length` tokens

    @property
    def tokens(self) -> int:
        """The tokens the packed forward computes, padding counted."""
        return sum((end - first) * length for first, end, length in self.calls)


@dataclass
class _Group:
    """One group's packed tokens (`_pack_group`), before they are placed in a sequence."""

    tokens: list[int]
    positions: list[int]
    labels: list[int]
    own: list[int]  # the row a token belongs to, -1 for the shared part
    copy: list[bool]
    source: dict[tuple[int, int], int]  # (row, completion column) -> index in this group


def _pack_group(ids: list, mask: list, rows: list[int], P: int) -> _Group:
    """The shared part of `rows` (same prompt) once, then each row's own tokens after a copy of the last shared one.

    Long: the layout, the labels and the map back to the rows are built in one pass, and read best beside each other
    (each packed token's label and the completion position it serves are set where it is added).
    """
    width = len(ids[0])
    C = width - P
    group = _Group([], [], [], [], [], {})

    def add(row: int, column: int, own_row: int, is_copy: bool, scored: bool) -> int:
        nxt = column + 1
        group.tokens.append(ids[row][column])
        group.positions.append(column)
        group.labels.append(ids[row][nxt] if scored and P <= nxt < width and mask[row][nxt] else -100)
        group.own.append(own_row)
        group.copy.append(is_copy)
        return len(group.tokens) - 1

    first = rows[0]
    pairs = [list(zip(ids[r][P:], mask[r][P:])) for r in rows]
    common = 0
    while common < C and all(p[common] == pairs[0][common] for p in pairs):
        common += 1
    end = P + common  # columns [0, end) are shared
    branches = len(rows) > 1 and common < C
    at = {}
    for column in range(end):
        if mask[first][column]:
            last = branches and column == end - 1
            at[column] = add(first, column, -1, False, scored=not last)
    for row in rows:
        for column in range(P - 1, end if not branches else end - 1):
            if column in at and column + 1 - P < C:
                group.source[row, column + 1 - P] = at[column]
    if branches:
        for row in rows:
            # `end - 1` is real: the rows differ after it, and a masked column is followed by masked ones only
            group.source[row, end - P] = add(row, end - 1, row, True, scored=True)
            for column in range(end, width):
                if mask[row][column]:
                    index = add(row, column, row, False, scored=True)
                    if column + 1 < width:
                        group.source[row, column + 1 - P] = index
    return group


def _bins(lengths: list[int], max_tokens: int | None, cost: ForwardCost | None, split: bool) -> list[list[int]]:
    """Groups (by their packed lengths) placed in sequences, first fit by decreasing length: up to `max_tokens` each
    (a longer group alone), or, given a cost model, under the budget whose sequences cost least in their model calls
    (`_calls`), or all in one."""
    total = sum(lengths)
    if max_tokens is None and cost is None:
        return [list(range(len(lengths)))]
    order = sorted(range(len(lengths)), key=lambda g: -lengths[g])

    def first_fit(budget: int) -> list[list[int]]:
        bins, loads = [], []
        for g in order:
            fit = next((b for b, load in enumerate(loads) if load + lengths[g] <= budget), None)
            if fit is None:
                bins.append([g])
                loads.append(lengths[g])
            else:
                bins[fit].append(g)
                loads[fit] += lengths[g]
        return bins

    if max_tokens is not None:
        return first_fit(max_tokens)
    budgets, budget = {total}, max(lengths)
    while budget < total:
        budgets.add(budget)
        budget *= 2
    layouts = [first_fit(b) for b in sorted(budgets)]

    def layout_cost(bins: list[list[int]]) -> float:
        loads = sorted((sum(lengths[g] for g in b) for b in bins), reverse=True)
        return cost.of_calls(_calls(loads, split))

    return min(layouts, key=layout_cost)


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    cost: ForwardCost | None = None,
    max_tokens: int | None = None,
    split_calls: bool = True,
) -> PackedRows | str:
    """Packs `B` padded rows `[prompt | completion]` (the last `logits_to_keep` columns are the completion) into
    sequences with a block mask, or returns why they cannot be packed exactly.

    Rows are grouped by identical prompt ids and mask; a group's shared part is its prompt plus the longest common
    start of its completions (ids and mask). A group stays in one sequence; groups share a sequence up to
    `max_tokens` packed tokens (0: one sequence a group), or as `cost` estimates cheapest, or all in one. The sequences
    run in one model call, or with `split_calls` a much shorter one in a call of its own (`_calls`). Needs TRL's
    layout: prompts left-padded (the last prompt column real) and completions right-padded (no real token after a
    masked one).
    """
    ids, mask = input_ids.tolist(), attention_mask.tolist()
    B, width = input_ids.shape
    P = width - logits_to_keep
    if P < 1 or any(m[P - 1] == 0 for m in mask):
        return "prompts are not left-padded to a real last token"
    if any(any(a < b for a, b in zip(m[P:], m[P + 1 :])) for m in mask):
        return "a completion has a real token after a masked one"
    by_prompt: dict[tuple, list[int]] = {}
    for row in range(B):
        by_prompt.setdefault((tuple(ids[row][:P]), tuple(mask[row][:P])), []).append(row)
    groups = [_pack_group(ids, mask, rows, P) for rows in by_prompt.values()]
    bins = _bins([len(g.tokens) for g in groups], max_tokens, cost, split_calls)
    return _lay_out(groups, bins, input_ids, logits_to_keep, split_calls)


def _lay_out(
    groups: list[_Group], bins: list[list[int]], input_ids: torch.Tensor, logits_to_keep: int, split_calls: bool
) -> PackedRows:
    """The packed groups placed in their sequences (`bins`), longest first, padded at the end to the longest, with
    the block mask."""
    B, width = input_ids.shape
    load = lambda b: sum(len(groups[g].tokens) for g in b)  # noqa: E731
    bins = sorted(bins, key=load, reverse=True)
    S, L = len(bins), load(bins[0])
    grid = lambda fill: [[fill] * L for _ in range(S)]  # noqa: E731
    tokens, positions, labels, group_of, own, copy = grid(0), grid(0), grid(-100), grid(-1), grid(-1), grid(False)
    source = [[S * L] * logits_to_keep for _ in range(B)]
    for s, members in enumerate(bins):
        offset = 0
        for g in members:
            group, n = groups[g], len(groups[g].tokens)
            tokens[s][offset : offset + n] = group.tokens
            positions[s][offset : offset + n] = group.positions
            labels[s][offset : offset + n] = group.labels
            group_of[s][offset : offset + n] = [g] * n
            own[s][offset : offset + n] = group.own
            copy[s][offset : offset + n] = group.copy
            for (row, column), index in group.source.items():
                source[row][column] = s * L + offset + index
            offset += n

    as_tensor = lambda values: torch.tensor(values, device=input_ids.device)  # noqa: E731
    group_t, own_t, copy_t, pos = as_tensor(group_of), as_tensor(own), as_tensor(copy), as_tensor(positions)
    # padding (group -1) sees only padding, so no query is left without a key
    visible = (
        (group_t[:, :, None] == group_t[:, None, :])
        & (pos[:, None, :] <= pos[:, :, None])
        & ~copy_t[:, None, :]
        & ((own_t[:, None, :] == -1) | (own_t[:, None, :] == own_t[:, :, None]))
    )
    return PackedRows(
        input_ids=as_tensor(tokens).to(input_ids.dtype),
        position_ids=pos,
        visible=visible,
        shift_labels=as_tensor(labels),
        source=as_tensor(source),
        packed_tokens=sum(len(g.tokens) for g in groups),
        unshared_tokens=B * width,
        calls=_calls([load(b) for b in bins], split_calls),
    )


def unpack(values: torch.Tensor | list[torch.Tensor], packed: PackedRows) -> torch.Tensor:
    """Per-token values of the packed sequences `(S, L)`, or of each call `(sequences, length)`, laid out as the
    `(B, C)` completions, 0 where none."""
    if isinstance(values, list):  # the calls' outputs, each padded back to `L` (`source` indexes the full layout)
        L = packed.input_ids.shape[1]
        values = torch.cat([torch.nn.functional.pad(v, (0, L - v.shape[1])) for v in values])
    flat = torch.cat([values.reshape(-1), values.new_zeros(1)])
    return flat[packed.source]


def attention_mask_for(visible: torch.Tensor, attention: str, dtype: torch.dtype) -> torch.Tensor:
    """The `(S, 1, L, L)` mask as the kernel takes it: SDPA a boolean one (True where visible); eager attention adds it
    to its scores, so 0 where visible and the dtype's minimum elsewhere (a masked key gets weight exactly 0)."""
    if attention == "sdpa":
        return visible[:, None]
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[:, None]


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
    calls this method, and gets TRL's own path wherever packing does not apply or would cost more.
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
        if why is not None:
            self._warn_unshared(why)
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **inputs,
            )  # fmt: skip
        batch_size = batch_size or input_ids.size(0)
        cost = forward_cost(self.accelerator.unwrap_model(model).config)
        # a distributed model: one call a micro-batch under gradient, the same on every rank (module docstring)
        split = not torch.is_grad_enabled() or self.accelerator.distributed_type == DistributedType.NO
        logps, entropies, computed, packed_any = [], [], 0, False
        for start in range(0, input_ids.size(0), batch_size):
            ids, mask = input_ids[start : start + batch_size], attention_mask[start : start + batch_size]
            packed = pack_rows(
                ids, mask, logits_to_keep, cost=cost, max_tokens=0 if cost is None else None, split_calls=split
            )
            why = self._packing_refusal(packed, ids, cost)
            if why is None:
                chunk_logps, chunk_entropies = self._shared_forward(model, packed, compute_entropy)
                computed, packed_any = computed + packed.tokens, True
            else:  # this micro-batch only: the others may still share
                self._warn_unshared(why)
                chunk_logps, chunk_entropies, _ = super()._get_per_token_logps_and_entropies(
                    model, ids, mask, logits_to_keep, None, compute_entropy, compute_aux_loss
                )
                computed += ids.numel()
            logps.append(chunk_logps)
            entropies.append(chunk_entropies)
        if packed_any and torch.is_grad_enabled():  # the loss forward: one value per micro-batch, as TRL's metrics
            metrics = self._metrics["train" if model.training else "eval"]
            metrics["shared_prefix/token_share"].append(computed / input_ids.numel())
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    def _shared_prefix_refusal(self, model, compute_aux_loss, inputs) -> str | None:
        if not getattr(self.args, "shared_prefix", False):
            return "off"
        if compute_aux_loss:
            return "a mixture-of-experts router loss (counted per packed token, not per row)"
        if any(value is not None for value in inputs.values()):
            return "vision or token-type inputs"
        return unsupported(model, self.accelerator.unwrap_model(model).config)

    @staticmethod
    def _packing_refusal(packed: PackedRows | str, ids: torch.Tensor, cost: ForwardCost | None) -> str | None:
        if isinstance(packed, str):
            return packed
        if packed.packed_tokens >= packed.unshared_tokens:
            return "no tokens are shared in the micro-batch"
        if cost is not None and cost.of_calls(packed.calls) >= cost.of(*ids.shape):
            return (
                "the cost estimate from the model's sizes: attention over the packed sequences would cost more than "
                "the shared tokens save (a small model with many rows a group, or short prompts and long completions)"
            )
        return None

    def _shared_forward(self, model, packed: PackedRows, compute_entropy: bool):
        config = self.accelerator.unwrap_model(model).config
        attention, dtype = config._attn_implementation, self.accelerator.unwrap_model(model).dtype
        logps, entropies = [], []
        for first, end, length in packed.calls:
            with self.accelerator.autocast():
                outputs = model(
                    input_ids=packed.input_ids[first:end, :length],
                    attention_mask=attention_mask_for(packed.visible[first:end, :length, :length], attention, dtype),
                    position_ids=packed.position_ids[first:end, :length],
                    shift_labels=packed.shift_labels[first:end, :length],
                    fused_lm_head=True,
                )
            logps.append(outputs.log_probs)
            entropies.append(outputs.entropy)
        return unpack(logps, packed), unpack(entropies, packed) if compute_entropy else None

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
