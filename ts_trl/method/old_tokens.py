"""Pure tensor functions for the trained tokens an earlier policy sampled: seed prefixes in "action" mode, replays.

Such tokens get an advantage of their own and their stored behaviour log-probs when the batch is scored
(`old_token_inputs`), and a truncated importance weight in the loss (`weight_old_tokens`). Nothing here reads trainer
state, so tests/test_old_tokens.py checks both with hand-computed numbers as well as through `trainer.train()`.
"""

from __future__ import annotations

import numpy as np
import torch

from .cutting import prefix_importance_weights
from .planning import GroupPlan


def old_token_inputs(
    advantages: torch.Tensor, shape: torch.Size, plan: GroupPlan, state_advantage: np.ndarray, first_row: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token advantages, behaviour log-probs and old-token mask of this rank's rows (`shape`: the completions').

    Prefix tokens of a seeded group get `state_advantage` (one value per global row, see
    `planning.state_advantages`): the group's own advantages are centred on the group mean, so they sum to zero over
    the shared prefix and would cancel. A replayed rollout keeps its row advantage on every token: its tokens are its
    own, not shared with the group. Other tokens keep the row advantage and are not old tokens.
    """
    device = advantages.device
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    advantages = advantages.expand(shape).clone()
    behaviour = torch.zeros(shape, device=device)
    old_tokens = torch.zeros(shape, dtype=torch.long, device=device)
    for i, (seed, cut) in enumerate(zip(plan.seeds, plan.cuts)):
        if cut is None:
            continue
        # A copy: banked log-probs may be a read-only memory map, which torch warns about.
        behaviour[i, : cut.k] = torch.as_tensor(np.array(seed.logprobs[: cut.k], np.float32), device=device)
        old_tokens[i, : cut.k] = 1
        if not plan.replayed[i]:
            advantages[i, : cut.k] = float(state_advantage[first_row + i])
    return advantages, behaviour, old_tokens


def weight_old_tokens(
    advantages: torch.Tensor,
    behaviour: torch.Tensor,
    old_tokens: torch.Tensor,
    reference: torch.Tensor,
    completion_mask: torch.Tensor,
    clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales the advantage of old tokens by `min(pi_ref / pi_behaviour, clip)`; returns it and the weights' stats.

    `reference` is the pre-update policy's log-probs (TRL's ratio `pi_theta / pi_ref` supplies the rest of
    `pi_theta / pi_behaviour`). Old tokens whose behaviour log-prob is unknown (NaN: vLLM gives none for a prefix, or
    a rollout that never reached the loss) get weight 0, i.e. no policy gradient. The stats, over trained positions:
    the sum of the weights of known old tokens, their count, and the count of unknown ones.
    """
    old_tokens = old_tokens.bool()
    known = torch.isfinite(behaviour)
    weights = prefix_importance_weights(reference, torch.where(known, behaviour, reference), old_tokens & known, clip)
    weights = torch.where(old_tokens & ~known, torch.zeros_like(weights), weights)
    mask = completion_mask.bool()
    weighted = old_tokens & known & mask
    stats = torch.stack([weights[weighted].sum(), weighted.sum(), (old_tokens & ~known & mask).sum()]).float()
    return advantages * weights, stats
