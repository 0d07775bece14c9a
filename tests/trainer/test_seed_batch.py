"""Unit tests of the pure per-batch functions, with hand-built plans and hand-computed numbers (no trainer)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ts_trl.method.cutting import Cut, SeedSplicer
from ts_trl.method.old_tokens import old_token_inputs, weight_old_tokens
from ts_trl.method.planning import GroupPlan, state_advantages
from ts_trl.store.bank import Seed
from ts_trl.trainer.backends import requests_per_budget
from ts_trl.trainer.seed_batch import assemble_responses, generation_request
from ts_trl.trainer.trl_internals import replaced

G = 2


def _seed(ids, logprobs=None):
    ids = np.asarray(ids, np.int32)
    logprobs = np.asarray(logprobs if logprobs is not None else [-1.0] * len(ids), np.float32)
    return Seed(index=0, rollout_id="s", prompt_id="p", completion_ids=ids, logprobs=logprobs, reward=1.0, step=0)


def _plan(cuts, seeds, replayed=None, keys=None, seeded=None):
    """A plan of one rank holding the whole global batch; groups of G rows."""
    replayed = replayed or [False] * len(cuts)
    prefix = np.array([c.k if c is not None else 0 for c in cuts])
    if seeded is None:
        seeded = [c is not None and not r for c, r in zip(cuts, replayed)]
    return GroupPlan(
        seeds=seeds,
        cuts=cuts,
        step=3,
        count=0,
        global_seeded=np.array(seeded),
        global_prefix_len=prefix,
        replayed=replayed,
        global_replayed=np.array(replayed),
        group_keys=keys or [f"g{i}" for i in range(len(cuts) // G)],
        num_groups=len(cuts) // G,
    )


def test_state_advantages_are_the_state_value_against_the_prompt_baseline():
    # Groups: "a" seeded (rewards 1, 0.5), "a" plain (0, 0.5), "b" seeded with no plain group of "b" in the batch.
    plan = _plan(
        [Cut(2, 0.5)] * 2 + [None] * 2 + [Cut(3, 0.5)] * 2,
        [_seed([5, 6, 7, 8])] * 2 + [None] * 2 + [_seed([5, 6, 7, 8])] * 2,
        keys=["a", "a", "b"],
    )
    rewards = np.array([1.0, 0.5, 0.0, 0.5, 0.2, np.nan])
    planner = SimpleNamespace(reward_means={"b": 0.6})
    advantages = state_advantages(rewards, plan, G, planner)
    # a: V = 0.75, b = mean of its plain rows 0.25; b: V = nanmean(0.2, nan) = 0.2, b = moving mean 0.6
    assert advantages.tolist() == pytest.approx([0.5, 0.5, 0.0, 0.0, -0.4, -0.4])
    # With no baseline at all, a seeded group's prefix actions are not trained this batch.
    assert state_advantages(rewards, plan, G, SimpleNamespace(reward_means={}))[4:].tolist() == [0.0, 0.0]


def test_requests_per_budget_sends_one_request_per_budget_and_reassembles_in_prompt_order():
    sent = []

    def generate(prompts, features=None, n=1, max_tokens=None, **params):
        sent.append((list(map(tuple, prompts)), max_tokens, n))
        return {
            "prompt_ids": [list(p) for p in prompts],
            "completion_ids": [[max_tokens, i] for p in prompts for i in range(n)],
            "logprobs": [[-0.1, -0.2] for _ in prompts for _ in range(n)],
            "logprob_token_ids": None,
        }

    prompts = [[1, 2], [1, 2, 9, 9], [3], [3, 9]]  # prefix lengths 0, 2, 0, 1
    wrapped = requests_per_budget(generate, [0, 2, 0, 1], max_completion_length=10, max_model_len=11)
    answer = wrapped(prompts, n=2)
    budgets = sorted(budget for _, budget, _ in sent)
    # Budgets: min(10 - k, 11 - len(prompt)) = 9, 7, 10, 9; one request per distinct budget, prompts grouped.
    assert budgets == [7, 9, 10] and sorted(len(p) for p, _, _ in sent) == [1, 1, 2]
    assert answer["prompt_ids"] == prompts
    assert answer["completion_ids"] == [[9, 0], [9, 1], [7, 0], [7, 1], [10, 0], [10, 1], [9, 0], [9, 1]]
    assert answer["logprob_token_ids"] is None  # None from the server stays None
    with pytest.raises(ValueError, match="leaves nothing to generate"):
        requests_per_budget(generate, [0], max_completion_length=10, max_model_len=4)([[1, 2, 3, 4]])


def test_generation_request_forces_what_prefixes_do_not_share_and_assembly_puts_rows_back():
    seed = _seed([5, 6, 7, 8, 9])
    plan = _plan([Cut(2, 0.5), Cut(2, 0.5), Cut(3, 0.5), Cut(3, 0.5)], [seed] * 4)
    prompts = [[1], [1], [2], [2]]
    request = generation_request(prompts, plan, SeedSplicer("state"), 6, forces_prefixes=True, any_rows=True)
    assert request.budget == 6 - 2  # every row shares 2 prefix tokens: that many fewer decode steps
    assert request.prompts == [[1, 5, 6], [1, 5, 6], [2, 5, 6], [2, 5, 6]]
    assert request.forced == [[], [], [7], [7]] and request.prefix_lens == [2, 2, 3, 3]
    continuations = [[40, 41], [42], [7, 43, 44, 45], [7]]
    ids, masks, logprobs = assemble_responses(plan, request, continuations, None, 6)
    assert ids == [[5, 6, 40, 41], [5, 6, 42], [5, 6, 7, 43, 44, 45], [5, 6, 7]]
    assert masks == [[0, 0, 1, 1], [0, 0, 1], [0, 0, 0, 1, 1, 1], [0, 0, 0]] and logprobs is None
    with pytest.raises(RuntimeError, match="forced seed prefix"):
        assemble_responses(plan, request, [[40], [42], [43], [7]], None, 6)


def test_replayed_rows_are_left_out_and_filled_with_the_stored_rollout():
    old = _seed([20, 21, 22])
    plan = _plan([None, Cut(3, 1.0)], [None, old], replayed=[False, True])
    request = generation_request([[1], [1]], plan, SeedSplicer("state"), 6, forces_prefixes=False, any_rows=True)
    assert request.rows == [0] and request.sent(request.prompts) == [[1]]
    ids, masks, logprobs = assemble_responses(plan, request, [[30, 31]], [[-0.5, -0.6]], 6)
    assert ids == [[30, 31], [20, 21, 22]] and masks == [[1, 1], [1, 1, 1]]
    assert logprobs == [[-0.5, -0.6], [None, None, None]]  # no sampling log-prob for tokens not sampled now
    whole = generation_request([[1], [1]], plan, SeedSplicer("state"), 6, forces_prefixes=False, any_rows=False)
    assert whole.rows == [0, 1]  # a backend that takes whole batches generates the row too (and it is discarded)


def test_old_token_inputs_and_weights_by_hand():
    seed = _seed([5, 6, 7], [-1.0, -2.0, float("nan")])
    plan = _plan(
        [Cut(3, 0.9), None, Cut(2, 0.5), None], [seed, None, seed, None], replayed=[False, False, True, False]
    )
    advantages, behaviour, old = old_token_inputs(torch.tensor([1.0, 2.0, 3.0, 4.0]), (4, 4), plan, [0.7] * 4, 0)
    expected = [[0.7, 0.7, 0.7, 1.0], [2.0] * 4, [3.0] * 4, [4.0] * 4]  # a replay keeps its own advantage
    assert advantages.flatten().tolist() == pytest.approx(sum(expected, []))
    assert old.tolist() == [[1, 1, 1, 0], [0] * 4, [1, 1, 0, 0], [0] * 4]
    reference = torch.full((4, 4), -1.5)
    mask = torch.ones(4, 4)
    weighted, stats = weight_old_tokens(advantages, behaviour, old, reference, mask, clip=1.2)
    w = [min(math.exp(-1.5 + 1.0), 1.2), min(math.exp(-1.5 + 2.0), 1.2)]  # 0.607, 1.2 (clipped)
    assert weighted[0].tolist() == pytest.approx([0.7 * w[0], 0.7 * w[1], 0.0, 1.0])  # NaN behaviour: weight 0
    assert weighted[2].tolist() == pytest.approx([3.0 * w[0], 3.0 * w[1], 3.0, 3.0])
    assert stats.tolist() == pytest.approx([2 * (w[0] + w[1]), 4, 1])


def test_replaced_restores_exactly_what_was_there():
    owner = SimpleNamespace(kept=1)
    with replaced(owner, "kept", 2), replaced(owner, "added", 3):
        assert (owner.kept, owner.added) == (2, 3)
    assert vars(owner) == {"kept": 1}
    mapping = {"kept": 1}
    with replaced(mapping, "kept", 2), replaced(mapping, "added", 3):
        assert mapping == {"kept": 2, "added": 3}
    assert mapping == {"kept": 1}
