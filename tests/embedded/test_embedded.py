"""The embedded default's task, warm-up cache and pass@k evaluation, on a few-step warm-up."""

import random

import pytest
import torch

from tests.conftest import free_port
from ts_trl.embedded import EmbeddedTask, Problem, embedded_reward, pass_at_1, pass_at_k, sample_rewards, warm_up
from ts_trl.embedded import warmup as warmup_module
from ts_trl.tiny import build_tiny_model


def operand_sets(dataset):
    return {tuple(sorted(Problem.from_prompt(prompt).operands)) for prompt in dataset["prompt"]}


def test_splits_are_deterministic_per_seed():
    train, held_out = EmbeddedTask(seed=3).make_splits(50, 20)
    again_train, again_held_out = EmbeddedTask(seed=3).make_splits(50, 20)
    other_train, _ = EmbeddedTask(seed=4).make_splits(50, 20)
    assert train.to_dict() == again_train.to_dict() and held_out.to_dict() == again_held_out.to_dict()
    assert train["prompt"] != other_train["prompt"]


def test_splits_are_disjoint_even_up_to_reordering_and_stable_in_size():
    task = EmbeddedTask()
    train, held_out = task.make_splits(2000, 300)
    assert set(train.column_names) == {"prompt", "answer", "prompt_id"}
    assert len(set(train["prompt"])) == 2000 and len(set(held_out["prompt"])) == 300
    assert not operand_sets(train) & operand_sets(held_out)
    assert len(set(train["prompt_id"]) | set(held_out["prompt_id"])) == 2300
    # A bigger held-out set extends the smaller one and leaves the train set as it was.
    bigger_train, bigger_held_out = task.make_splits(2000, 400)
    assert bigger_held_out["prompt"][:300] == held_out["prompt"] and bigger_train["prompt"] == train["prompt"]


def test_every_solution_is_rewarded_and_wrong_answers_are_not():
    task = EmbeddedTask()
    train, _ = task.make_splits(100, 0)
    assert embedded_reward.__name__ == "embedded_reward"
    for prompt, answer in zip(train["prompt"], train["answer"]):
        assert prompt.endswith("\nA:")
        solutions = task.solutions(prompt)
        assert all(solution.endswith(f"#### {answer}") for solution in solutions)
        assert embedded_reward(solutions, [answer] * len(solutions)) == [1.0] * len(solutions)
        wrong = solutions[0].replace(f"#### {answer}", f"#### {int(answer) + 1}")
        assert embedded_reward([wrong, "no answer here", ""], [answer] * 3) == [0.0, 0.0, 0.0]
    # Only the first final answer counts, and conversational completions are read from their last message.
    assert embedded_reward(["#### 5\n#### 6", "#### 6\n#### 5"], ["6", "6"]) == [0.0, 1.0]
    assert embedded_reward([[{"role": "assistant", "content": " 1+2=3\n#### 3"}]], ["3"]) == [1.0]


def test_several_paths_reach_different_early_states():
    task = EmbeddedTask()
    problem = Problem((7, 15, 9))
    solutions = task.solutions(problem)
    assert len(set(solutions)) == 6
    assert len({solution.split("\n")[0].split("=")[1] for solution in solutions}) == 3  # three first partial sums
    assert " 7+15=22\n22+9=31\n#### 31" in solutions
    rng = random.Random(0)
    assert {task.sample_solution(problem, rng) for _ in range(200)} == set(solutions)


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_difficulty_sets_the_number_of_operands_and_solution_length(difficulty):
    task = EmbeddedTask(difficulty=difficulty)
    train, _ = task.make_splits(50, 10)
    lengths = []
    for prompt in train["prompt"]:
        assert len(Problem.from_prompt(prompt).operands) == difficulty + 1
        lengths += [len(solution) for solution in task.solutions(prompt)]
    assert 10 <= min(lengths) and max(lengths) <= 80


def test_difficulty_changes_the_problems():
    easy, hard = (EmbeddedTask(difficulty=difficulty).make_splits(20, 0)[0] for difficulty in (2, 3))
    assert easy["prompt"] != hard["prompt"]
    with pytest.raises(ValueError):
        EmbeddedTask(difficulty=0)


def test_a_difficulty_mix_draws_every_level_and_keeps_the_split():
    task = EmbeddedTask(difficulty=3, min_difficulty=1)
    train, held_out = task.make_splits(600, 150)
    counts = {n: 0 for n in (2, 3, 4)}
    for prompt in train["prompt"]:
        counts[len(Problem.from_prompt(prompt).operands)] += 1
    # Levels are drawn equally often, but two numbers from 1-19 make only 171 problems, some of them held out or
    # repeated, so that level ends up a little short of its third.
    assert 120 <= counts[2] < 200 and all(180 <= counts[n] <= 260 for n in (3, 4)), counts
    assert not operand_sets(train) & operand_sets(held_out)
    # One level (the default) draws exactly the problems it always drew.
    assert (
        EmbeddedTask(difficulty=2, min_difficulty=2).make_splits(30, 5)[0]["prompt"]
        == (EmbeddedTask(difficulty=2).make_splits(30, 5)[0]["prompt"])
    )
    for bad in (0, 4):
        with pytest.raises(ValueError, match="min_difficulty"):
            EmbeddedTask(difficulty=3, min_difficulty=bad)


def test_learning_curve_is_written_through_train(tokenizer, tmp_path):
    """The embedded default's callback: held-out pass@1 at steps 0, 1, 2 and the training reward, as CSV and PNG."""
    import csv

    from tests.conftest import TINY_SETTINGS
    from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
    from ts_trl.embedded.curve import LearningCurve

    model = small_model(tokenizer)
    train, held_out = EmbeddedTask(difficulty=1).make_splits(8, 4)
    reference = pass_at_1(model, tokenizer, held_out, embedded_reward, max_new_tokens=12, num_samples=2, seed=3)
    config = SeedGRPOConfig(
        **{
            **TINY_SETTINGS,
            "output_dir": str(tmp_path),
            "max_steps": 2,
            "logging_steps": 1,
            "max_completion_length": 12,
        }
    )
    curve = LearningCurve(held_out, every=1, num_samples=2, max_new_tokens=12, temperature=1.0, seed=3)
    trainer = SeedGRPOTrainer(
        model=model, reward_funcs=embedded_reward, args=config, train_dataset=train, processing_class=tokenizer,
        callbacks=[curve],
    )  # fmt: skip
    trainer.train()
    rows = list(csv.DictReader(open(tmp_path / "learning_curve.csv")))
    held = {int(r["step"]): float(r["value"]) for r in rows if r["kind"] == "held_out_pass@1"}
    assert sorted(held) == [0, 1, 2] and held[0] == reference  # step 0 is the untrained model, same sampling seed
    assert held[2] == pass_at_1(model, tokenizer, held_out, embedded_reward, max_new_tokens=12, num_samples=2, seed=3)
    rewards = [float(r["value"]) for r in rows if r["kind"] == "train_reward"]
    logged = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert rewards == pytest.approx(logged) and len(rewards) == 2
    assert (tmp_path / "learning_curve.png").stat().st_size > 5_000


def small_model(tokenizer):
    # Smaller than the default so that the cache tests spend their time on the cache, not on training.
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, max_positions=64, seed=1)


def test_warm_up_trains_then_reuses_its_cache(tokenizer, tmp_path, monkeypatch):
    task = EmbeddedTask()
    model = small_model(tokenizer)
    initial = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    trained = warm_up(model, tokenizer, task, steps=3, batch_size=4, cache_dir=tmp_path, progress=False)
    assert trained is model
    assert any(not torch.equal(initial[name], tensor) for name, tensor in model.state_dict().items())
    (cache,) = tmp_path.iterdir()  # one finished folder, no temporary left behind
    assert (cache / "model.safetensors").is_file() and (cache / "tokenizer.json").is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("a cached warm-up must not train again")

    monkeypatch.setattr(warmup_module, "_train", no_training)
    reloaded = warm_up(small_model(tokenizer), tokenizer, task, steps=3, batch_size=4, cache_dir=tmp_path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name

    # Any other setting is a different cache entry.
    monkeypatch.setattr(warmup_module, "_train", lambda *args, **kwargs: None)
    warm_up(small_model(tokenizer), tokenizer, task, steps=4, batch_size=4, cache_dir=tmp_path, progress=False)
    assert len(list(tmp_path.iterdir())) == 2


def test_warm_up_cache_root_follows_the_environment(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path))
    monkeypatch.setattr(warmup_module, "_train", lambda *args, **kwargs: None)  # only where it writes matters
    warm_up(small_model(tokenizer), tokenizer, EmbeddedTask(), steps=1, batch_size=2, progress=False)
    assert len(list((tmp_path / "warmup").iterdir())) == 1


def test_a_failed_save_leaves_no_cache(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(warmup_module, "_train", lambda *args, **kwargs: None)
    monkeypatch.setattr(type(tokenizer), "save_pretrained", lambda *args, **kwargs: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        warm_up(small_model(tokenizer), tokenizer, EmbeddedTask(), steps=1, cache_dir=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def _warm_up_as_rank(rank: int, cache_root: str, address: str) -> None:
    """One rank of a 2-process gloo group, warming up into a cache folder of its own."""
    from ts_trl.tiny import build_tokenizer

    torch.distributed.init_process_group("gloo", init_method=address, rank=rank, world_size=2)
    try:
        tokenizer = build_tokenizer()
        model = small_model(tokenizer)
        warm_up(
            model, tokenizer, EmbeddedTask(), steps=1, batch_size=2, cache_dir=f"{cache_root}/{rank}", progress=False
        )
    finally:
        torch.distributed.destroy_process_group()


def test_every_rank_of_a_distributed_run_caches_the_weights(tmp_path):
    # Each rank of a multi-process run warms up and may win the rename into the shared cache. `save_pretrained` skips
    # the weights on ranks > 0 once torch.distributed is up, which left a cache without weights, and every later
    # run stopped on "No such file or directory: .../model.safetensors".
    address = f"tcp://127.0.0.1:{free_port()}"
    torch.multiprocessing.spawn(_warm_up_as_rank, args=(str(tmp_path), address), nprocs=2)
    for rank in ("0", "1"):
        (cache,) = (tmp_path / rank).iterdir()
        assert (cache / "model.safetensors").is_file(), f"rank {rank} cached no weights"


def test_a_cache_folder_without_weights_is_rebuilt(tokenizer, tmp_path):
    task = EmbeddedTask()
    warm_up(small_model(tokenizer), tokenizer, task, steps=1, batch_size=2, cache_dir=tmp_path, progress=False)
    (cache,) = tmp_path.iterdir()
    (cache / "model.safetensors").unlink()  # as earlier multi-process runs could leave it
    model = warm_up(small_model(tokenizer), tokenizer, task, steps=1, batch_size=2, cache_dir=tmp_path, progress=False)
    assert [path.name for path in tmp_path.iterdir()] == [cache.name] and (cache / "model.safetensors").is_file()
    reloaded = warm_up(small_model(tokenizer), tokenizer, task, steps=1, batch_size=2, cache_dir=tmp_path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def test_pass_at_1_is_deterministic_per_seed_and_supports_greedy(tokenizer):
    model = small_model(tokenizer)
    _, held_out = EmbeddedTask().make_splits(0, 6)

    # A random model never answers, so the scores come from a reward that looks only at the text itself.
    def first_digit_reward(completions, **kwargs):
        return [float(completion[:1] in "0123456789") for completion in completions]

    kwargs = dict(max_new_tokens=4, batch_size=4, num_samples=3)
    threads = torch.get_num_threads()
    first = sample_rewards(model, tokenizer, held_out, first_digit_reward, seed=7, **kwargs)
    assert first == sample_rewards(model, tokenizer, held_out, first_digit_reward, seed=7, **kwargs)
    assert len(first) == 6 and all(len(samples) == 3 for samples in first)
    assert tokenizer.padding_side == "right" and model.training and torch.get_num_threads() == threads  # restored

    greedy = sample_rewards(model, tokenizer, held_out, first_digit_reward, temperature=0, seed=1, **kwargs)
    assert all(len(set(samples)) == 1 for samples in greedy)  # greedy samples of one prompt are copies
    assert pass_at_1(model, tokenizer, held_out, embedded_reward, max_new_tokens=4, temperature=0) == 0.0


def test_pass_at_k_matches_hand_computed_estimates():
    rewards = [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    assert pass_at_k(rewards, 1) == pytest.approx((0.25 + 0 + 1) / 3)
    assert pass_at_k(rewards, 2) == pytest.approx((0.5 + 0 + 1) / 3)  # 1 - C(3,2)/C(4,2) = 1/2
    with pytest.raises(ValueError):
        pass_at_k(rewards, 5)
