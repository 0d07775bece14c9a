"""The seed bank: eligibility rules, selection strategies, compact storage."""

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import seed_by_id
from ts_trl import SeedBank
from ts_trl.store.format import map_bank_file, write_bank_file
from ts_trl.store.schema import Rollout, rollouts_to_table


def _add(bank, rollout_id, prompt_id, ids, logprobs, reward, step):
    bank.add_rollouts([Rollout(rollout_id, prompt_id, "", "", ids, logprobs, reward, step)])


def _bank():
    bank = SeedBank()
    _add(bank, "a0", "p", [1, 2, 3], [-0.1, -0.2, -0.3], reward=1.0, step=0)
    _add(bank, "a1", "p", [4, 5, 6, 7], [-0.4] * 4, reward=0.0, step=2)
    _add(bank, "a2", "p", [8], [-0.8], reward=1.0, step=0)  # one token: never a seed
    _add(bank, "b0", "q", [9, 9], [-0.9, -0.9], reward=0.0, step=3)
    return bank


def _eligible(bank, prompt_id, step, min_age, snapshot_only=True) -> list[int]:
    """The bank indices `sample` draws for `prompt_id`: 200 uniform draws miss one of a few eligible ones never."""
    rng = np.random.default_rng(0)
    seeds = bank.sample([prompt_id] * 200, step, rng, min_age=min_age, snapshot_only=snapshot_only)
    return sorted({seed.index for seed in seeds if seed is not None})


def test_eligibility_respects_age_length_and_snapshot():
    bank = _bank()
    assert _eligible(bank, "p", step=3, min_age=1) == []  # nothing snapshotted yet
    bank.mark_snapshotted()
    assert _eligible(bank, "p", step=3, min_age=1) == [0, 1]
    assert _eligible(bank, "p", step=2, min_age=1) == [0]  # a1 (step 2) is too young at step 2
    assert _eligible(bank, "p", step=2, min_age=0) == [0, 1]
    assert _eligible(bank, "q", step=10, min_age=1, snapshot_only=False) == [3]
    assert _eligible(bank, "unknown", step=10, min_age=0) == []


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
    assert SeedBank().sample(["p", "q"], 5, rng) == [None, None]
    drawn = {bank.sample(["p"], 5, rng, "uniform")[0].rollout_id for _ in range(50)}
    assert drawn == {"a0", "a1"}


def test_draws_are_uniform_over_the_eligible_rollouts_however_few_they_are():
    """`sample` draws by rejection first and looks at every candidate only when that fails: both paths together must
    still give each eligible rollout the same chance, and never an ineligible one."""
    bank = SeedBank()
    for i in range(200):  # prompt "rare": 3 eligible of 200 (rejection mostly fails; the exhaustive path decides)
        _add(bank, f"r{i}", "rare", [1, 2, 3], [-0.1] * 3, reward=float(i % 2), step=0 if i % 67 == 0 else 9)
    for i in range(4):  # prompt "common": all 4 eligible (rejection always succeeds); two succeeded
        _add(bank, f"c{i}", "common", [1, 2], [-0.1] * 2, reward=float(i < 2), step=0)
    bank.mark_snapshotted()
    rng = np.random.default_rng(0)
    counts = {}
    for _ in range(1200):
        for seed in bank.sample(["rare", "common", "unknown"], 5, rng):
            if seed is not None:
                counts[seed.rollout_id] = counts.get(seed.rollout_id, 0) + 1
    assert set(counts) == {"r0", "r67", "r134", "c0", "c1", "c2", "c3"}
    for names, expected in ((("r0", "r67", "r134"), 400), (("c0", "c1", "c2", "c3"), 300)):
        for name in names:  # binomial sd is about 17; 5 sd
            assert abs(counts[name] - expected) < 85, (name, counts[name])
    successes = {bank.sample(["common"], 5, rng, "success")[0].rollout_id for _ in range(100)}
    assert successes == {"c0", "c1"}
    failures = {bank.sample(["rare"], 5, rng, "failure")[0].rollout_id for _ in range(100)}
    assert failures == {"r0", "r134"}  # the eligible rollouts of "rare" with reward 0 (r67's is 1)


def test_seed_holds_ids_and_logprobs():
    seed = seed_by_id(_bank(), "a1")
    assert seed.completion_ids.tolist() == [4, 5, 6, 7]
    assert seed.logprobs.tolist() == pytest.approx([-0.4] * 4)
    assert seed.step == 2 and seed.reward == 0.0


def test_bad_rollouts_are_refused():
    bank = _bank()
    with pytest.raises(ValueError, match="align"):
        _add(bank, "x", "p", [1, 2], [-0.1], reward=0.0, step=0)
    with pytest.raises(ValueError, match="already"):
        _add(bank, "a0", "p", [1, 2], [-0.1, -0.2], reward=0.0, step=0)
    with pytest.raises(ValueError, match="seed_selection"):
        bank.sample(["p"], 1, np.random.default_rng(0), "best")


def test_external_seeds_are_always_old_enough():
    bank = SeedBank()
    bank.add_table(_table([Rollout("x0", "p", "", "", [1, 2, 3], [0.0] * 3, 0.0, 500)]), external=True)
    assert bank.num_snapshotted == 1
    assert _eligible(bank, "p", step=0, min_age=1) == [0]


def test_bank_of_100k_rollouts_of_512_tokens_is_compact():
    ids = np.arange(512, dtype=np.int32)
    logps = np.full(512, -1.0, dtype=np.float32)
    bank = SeedBank()
    for first in range(0, 100_000, 1000):  # the trainer adds one batch of rollouts per step
        batch = [
            Rollout(f"r{i}", f"p{i % 1000}", "", "", ids, logps, 0.0, i // 1000) for i in range(first, first + 1000)
        ]
        bank.add_rollouts(batch)
    raw = 100_000 * 512 * 8  # int32 ids + float32 log-probs
    assert bank.nbytes < 1.3 * raw < 1e9
    assert bank.metadata_bytes_per_rollout <= 40  # no per-rollout Python objects
    assert bank.get(99_999).rollout_id == "r99999" and bank.get(99_999).completion_ids[-1] == 511
    assert "r100000" not in bank and "r5" in bank


def test_every_rollout_id_is_found_after_the_index_merges():
    """Rollout ids enter an unsorted tail, merged into the sorted hash index once it holds 4096 or more."""
    bank = SeedBank()
    for first in range(0, 15_000, 1_500):
        bank.add_rollouts(
            [Rollout(f"m{i}", f"p{i % 7}", "", "", [1, 2], [-0.1, -0.2], 0.0, 0) for i in range(first, first + 1_500)]
        )
    assert len(bank._hash_sorted) == 13_500 and bank._hash_tail.size == 1_500  # three merges, and a tail
    assert np.all(np.diff(bank._hash_sorted.astype(np.int64)) >= 0)
    assert [bank._find(f"m{i}") for i in range(15_000)] == list(range(15_000))
    for merged_or_tail in ("m0", "m4499", "m13499", "m13500", "m14999"):
        with pytest.raises(ValueError, match="already in the seed bank"):
            bank.add_rollouts([Rollout(merged_or_tail, "p0", "", "", [1, 2], [0.0, 0.0], 0.0, 1)])
    assert len(bank) == 15_000


def _table(rollouts):
    return rollouts_to_table(rollouts, "checkpoint-1", "tiny", "fp", [])


def test_columnar_fill_matches_row_by_row_and_does_not_copy_tokens(tmp_path):
    rollouts = [
        Rollout(f"id-{i}", f"p{i % 3}", "", "", list(range(i % 5 + 1)), [-0.5] * (i % 5 + 1), float(i % 2), i // 4)
        for i in range(40)
    ]
    by_rows, by_columns = SeedBank(), SeedBank()
    for r in rollouts:
        by_rows.add_rollouts([r])
    path = tmp_path / "shard.arrow"
    with pa.ipc.new_file(path, _table(rollouts).schema) as writer:
        writer.write_table(_table(rollouts))
    mapped = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    by_columns.add_table(mapped)
    assert by_columns.rollout_ids == by_rows.rollout_ids == [r.rollout_id for r in rollouts]
    for bank in (by_rows, by_columns):
        bank.mark_snapshotted()
    for prompt in ("p0", "p1", "p2"):
        assert _eligible(by_columns, prompt, 10, 1) == _eligible(by_rows, prompt, 10, 1)
    seed = seed_by_id(by_columns, "id-13")
    assert seed.completion_ids.tolist() == [0, 1, 2, 3] and seed.step == 3 and seed.prompt_id == "p1"
    flat = mapped.column("completion_ids").chunk(0).values.to_numpy()
    assert np.shares_memory(seed.completion_ids, flat)  # a view of the memory-mapped file, not a copy
    assert by_columns.sample(["p1"], 10, np.random.default_rng(0))[0].rollout_id in by_rows.rollout_ids


def test_duplicate_rollout_ids_are_refused_in_every_path():
    bank = _bank()
    twice = [Rollout("n", "p", "", "", [1, 2], [0.0, 0.0], 0.0, 1)] * 2
    with pytest.raises(ValueError, match="'n' is already"):
        bank.add_rollouts(twice)
    with pytest.raises(ValueError, match="'a1' is already"):
        bank.add_table(_table([Rollout("a1", "p", "", "", [1, 2], [0.0, 0.0], 0.0, 1)]))
    assert len(bank) == 4


def test_attaching_a_snapshot_moves_the_payload_onto_the_mapped_file(tmp_path):
    bank = SeedBank()
    fresh = [Rollout(f"n{i}", "p", "", "", [5, 6, 7], [-0.7] * 3, 1.0, 4) for i in range(3)]
    bank.add_rollouts(fresh)
    with pytest.raises(ValueError, match="another run or step"):
        bank.attach_snapshot(_table(fresh[:2]))
    write_bank_file(_table(fresh), tmp_path / "bank.arrow")
    mapped = map_bank_file(tmp_path / "bank.arrow")
    bank.attach_snapshot(mapped)
    assert bank.num_snapshotted == len(bank) == 3
    seed = seed_by_id(bank, "n2")
    assert seed.completion_ids.tolist() == [5, 6, 7] and seed.logprobs.tolist() == pytest.approx([-0.7] * 3)
    flat = mapped.column("completion_ids").chunk(0).values.to_numpy()
    assert np.shares_memory(seed.completion_ids, flat)  # read from the mapped file
    assert len(bank._tokens.chunks) == 1  # the bank's own copy of those rows was released
    _add(bank, "after", "p", [1, 2], [0.0, 0.0], 0.0, 5)  # appending keeps working after the release
    assert seed_by_id(bank, "after").completion_ids.tolist() == [1, 2] and seed_by_id(bank, "n0").step == 4


def test_a_table_of_null_log_probs_gives_nan_log_probs_without_a_buffer_of_them():
    """Text seeds carry no log-probs (a null `logprobs` column): every token reads NaN, and the bank holds no array of
    their length, so their memory is that of their token ids alone."""
    ids = [[3, 4, 5], [6, 7]]
    table = pa.table(
        {
            "rollout_id": ["t0", "t1"],
            "prompt_id": ["p", "q"],
            "completion_ids": pa.array(ids, pa.list_(pa.int32())),
            "logprobs": pa.nulls(2, pa.list_(pa.float32())),
            "reward": pa.array([1.0, 0.0], pa.float32()),
            "step": pa.array([0, 0], pa.int32()),
        }
    )
    bank = SeedBank()
    bank.add_table(table, external=True)
    for rollout_id, want in zip(["t0", "t1"], ids):
        seed = seed_by_id(bank, rollout_id)
        assert seed.completion_ids.tolist() == want
        assert len(seed.logprobs) == len(want) and np.isnan(seed.logprobs).all()
    assert bank._tokens.nbytes == table.column("completion_ids").chunk(0).values.nbytes  # token ids only
    misaligned = table.set_column(3, "logprobs", pa.array([[0.0], [0.0, 0.0]], pa.list_(pa.float32())))
    with pytest.raises(ValueError, match="do not align"):
        SeedBank().add_table(misaligned)
