"""The seeding metrics of one generation batch (`seeds/*`), and TRL's length metrics measured on generated tokens.

Both take the batch's plan and tensors and return plain numbers; `gather` is the accelerator's, so that every rank
runs the same collectives whether it holds seeded rows or not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..method.planning import GroupPlan

# TRL's length metrics of a batch, which `_generate` appends and the trainer overwrites with `generated_length_metrics`.
LENGTH_METRICS = (
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
)


def seed_metrics(
    plan: GroupPlan,
    total_rewards: torch.Tensor,
    completion_mask: torch.Tensor,
    num_generations: int,
    bank_size: int,
    replay: bool,
    gather: Callable[[torch.Tensor], torch.Tensor],
    model_masks: Sequence[Sequence[int]] | None = None,
) -> dict[str, float]:
    """`seeds/*` of one batch: shares of seeded, eligible and refused groups, rewards by kind of row, token counts.

    `total_rewards` holds one value per global row; `completion_mask` this rank's rows. `model_masks` (multi-turn
    rollouts: 1 on model tokens, 0 on tool results, per local row) keeps tool results out of the generated tokens.
    """
    values: dict[str, float] = {}
    seeded = torch.as_tensor(plan.global_seeded, device=total_rewards.device)
    num_seeded_groups = int(seeded.sum().item()) // num_generations
    values["seeds/seeded_group_share"] = num_seeded_groups / max(plan.num_groups, 1)
    values["seeds/eligible_group_share"] = plan.num_eligible_groups / max(plan.num_groups, 1)
    if num_seeded_groups or plan.num_refused_cuts:
        values["seeds/refused_cut_share"] = plan.num_refused_cuts / (num_seeded_groups + plan.num_refused_cuts)
    values["seeds/bank_size"] = bank_size
    if num_seeded_groups:
        values["seeds/prefix_len_mean"] = float(plan.global_prefix_len[plan.global_seeded].mean())
        values["seeds/reward_seeded"] = torch.nanmean(total_rewards[seeded]).item()
        values["seeds/external_share"] = plan.num_external_groups / num_seeded_groups  # seeds from seed_dataset
        if plan.global_seed_age:
            values["seeds/seed_age_mean"] = float(np.mean(plan.global_seed_age))
    replayed = torch.as_tensor(plan.global_replayed, device=total_rewards.device)
    if replay:
        values["seeds/replayed_rows"] = int(replayed.sum().item())
        if replayed.any():
            values["seeds/reward_replayed"] = torch.nanmean(total_rewards[replayed]).item()
    plain = ~(seeded | replayed)
    if plain.any():
        values["seeds/reward_unseeded"] = torch.nanmean(total_rewards[plain]).item()
    prefix = torch.zeros_like(completion_mask)
    for i, cut in enumerate(plan.cuts):
        if cut is not None:
            prefix[i, : cut.k] = 1
    generated = completion_mask * (1 - prefix)
    if model_masks is not None:
        model = torch.zeros_like(completion_mask)
        for i, mask in enumerate(model_masks):
            width = min(len(mask), model.shape[1])
            model[i, :width] = torch.as_tensor(list(mask[:width]), dtype=model.dtype)
        generated = generated * model
    counts = torch.stack([generated.sum(), (completion_mask * prefix).sum()]).float()
    counts = gather(counts.reshape(1, 2)).sum(dim=0)
    values["seeds/generated_tokens"] = counts[0].item()
    values["seeds/prefix_tokens"] = counts[1].item()
    return values


def generated_length_metrics(
    plan: GroupPlan,
    completion_ids: Sequence[Sequence[int]],
    truncated: Sequence[bool],
    device,
    gather: Callable[[torch.Tensor], torch.Tensor],
    model_masks: Sequence[Sequence[int]] | None = None,
) -> dict[str, float]:
    """TRL's `completions/*` length metrics of one batch, on what was generated.

    A row's length is its continuation (its prefix was not generated), replayed rows (nothing generated) are left
    out, and `clipped_ratio` keeps TRL's meaning (the response ran into `max_completion_length`). With `model_masks`
    (multi-turn rollouts), only the continuation's model tokens count, as TRL counts tool runs.
    """
    if model_masks is not None:
        generated = [sum(mask[c.k if c is not None else 0 :]) for mask, c in zip(model_masks, plan.cuts)]
    else:
        generated = [len(ids) - (c.k if c is not None else 0) for ids, c in zip(completion_ids, plan.cuts)]
    lengths = gather(torch.tensor(generated, device=device))
    clipped = gather(torch.tensor(list(truncated), device=device))
    kept = torch.as_tensor(~plan.global_replayed, device=device)
    lengths, clipped = lengths[kept].float(), clipped[kept]
    terminated = lengths[~clipped] if (~clipped).any() else torch.zeros(1, device=device)
    values = (lengths.mean(), lengths.min(), lengths.max(), clipped.float().mean())
    values += (terminated.mean(), terminated.min(), terminated.max())
    return {key: value.item() for key, value in zip(LENGTH_METRICS, values)}


def cut_metrics(plan: GroupPlan, passed: np.ndarray, target_pass_rate: float | None = None) -> dict[str, float]:
    """Where seeded groups were cut and how their continuations did, against `cut_selection="target"`'s target.

    `passed` holds one success per global row; `target_pass_rate` is the target of `cut_selection="target"` (None
    with another cut selection). Nothing for a batch without seeded groups; else the mean ratio `r` of the drawn cuts
    (`seeds/mean_cut_ratio`), the pass rate of seeded rows (`seeds/seeded_pass_rate`), and the target itself
    (`seeds/target_pass_rate`) where there is one.
    """
    ratios = [r for r in plan.group_cut_ratios if r is not None]
    if not ratios or not plan.global_seeded.any():
        return {}
    values = {
        "seeds/mean_cut_ratio": float(np.mean(ratios)),
        "seeds/seeded_pass_rate": float(np.asarray(passed, dtype=bool)[plan.global_seeded].mean()),
    }
    if target_pass_rate is not None:
        values["seeds/target_pass_rate"] = target_pass_rate
    return values
