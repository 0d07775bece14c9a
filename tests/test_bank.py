"""The seed bank: eligibility rules, selection strategies, compact storage."""

import numpy as np
import pytest

from ts_trl import SeedBank


def _bank():
    bank = SeedBank()
    bank.add("a0", "p", [1, 2, 3], [-0.1, -0.2, -0.3], reward=1.0, step=0)
    bank.add("a1", "p", [4, 5, 6, 7], [-0.4] * 4, reward=0.0, step=2)
    bank.add("a2", "p", [8], [-0.8], reward=1.0, step=0)  # one token: never a seed
    bank.add("b0", "q", [9, 9], [-0.9, -0.9], reward=0.0, step=3)
    return bank


def test_eligibility_respects_age_length_and_snapshot():
    bank = _bank()
    assert list(bank.eligible("p", step=3, min_age=1)) == []  # nothing snapshotted yet
    bank.mark_snapshotted()
    assert list(bank.eligible("p", step=3, min_age=1)) == [0, 1]
    assert list(bank.eligible("p", step=2, min_age=1)) == [0]  # a1 (step 2) is too young at step 2
    assert list(bank.eligible("p", step=2, min_age=0)) == [0, 1]
    assert list(bank.eligible("q", step=10, min_age=1, snapshot_only=False)) == [3]
    assert list(bank.eligible("unknown", step=10, min_age=0)) == []


def test_selection_strategies():
    bank = _bank()
    bank.mark_snapshotted()
    rng = np.random.default_rng(0)
    assert bank.sample(["p"], 5, rng, "oldest")[0].rollout_id == "a0"
    assert bank.sample(["p"], 5, rng, "success")[0].rollout_id == "a0"
    assert bank.sample(["p"], 5, rng, "failure")[0].rollout_id == "a1"
    assert bank.sample(["p"], 5, rng, "passrate", pass_rates={"p": 0.0})[0].rollout_id == "a0"
    assert bank.sample(["p"], 5, rng, "passrate", pass_rates={"p": 1.0})[0].rollout_id == "a1"
    assert bank.sample(["q", "none"], 5, rng, "success") == [None, None]
    drawn = {bank.sample(["p"], 5, rng, "uniform")[0].rollout_id for _ in range(50)}
    assert drawn == {"a0", "a1"}


def test_seed_holds_ids_and_logprobs():
    seed = _bank().lookup("a1")
    assert seed.completion_ids.tolist() == [4, 5, 6, 7]
    assert seed.logprobs.tolist() == pytest.approx([-0.4] * 4)
    assert seed.step == 2 and seed.reward == 0.0


def test_bad_rollouts_are_refused():
    bank = _bank()
    with pytest.raises(ValueError, match="align"):
        bank.add("x", "p", [1, 2], [-0.1], reward=0.0, step=0)
    with pytest.raises(ValueError, match="already"):
        bank.add("a0", "p", [1, 2], [-0.1, -0.2], reward=0.0, step=0)
    with pytest.raises(ValueError, match="seed_selection"):
        bank.sample(["p"], 1, np.random.default_rng(0), "best")


def test_external_seeds_are_always_old_enough():
    bank = SeedBank()
    bank.add("x0", "p", [1, 2, 3], [0.0] * 3, reward=0.0, step=500, external=True)
    assert bank.num_snapshotted == 1
    assert list(bank.eligible("p", step=0, min_age=1)) == [0]


def test_bank_of_100k_rollouts_of_512_tokens_is_compact():
    bank = SeedBank()
    ids = np.arange(512, dtype=np.int32)
    logps = np.full(512, -1.0, dtype=np.float32)
    for i in range(100_000):
        bank.add(f"r{i}", f"p{i % 1000}", ids, logps, reward=0.0, step=i // 1000)
    raw = 100_000 * 512 * 8  # int32 ids + float32 log-probs
    assert bank.nbytes < 1.3 * raw < 1e9
    assert bank.lookup("r99999").completion_ids[-1] == 511
