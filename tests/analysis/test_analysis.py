"""Issue 18: `relay` and `positions` measure what the paper argues, recomputed by hand on a small run.

One short run feeds every test: chat prompts (as both real-model recipes use), sampled at temperature 0.7, training
seed 3 (so that a relay `--seed` that also picked the built-in task's split would pick the wrong one), seeded groups.
"""

import csv
import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import tests.conftest as c
from tests.conftest import TINY_SETTINGS, seed_rows
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
from ts_trl.__main__ import main
from ts_trl.embedded.task import EmbeddedTask, Problem

TEMPERATURE = 0.7
RUN_SEED = 3


def chat_prompt(problem: Problem) -> list[dict]:
    # The tiny chat template renders this as "Q: 7+15+9\nA:", the built-in task's own prompt.
    return [{"role": "user", "content": "+".join(map(str, problem.operands))}]


def digit_share_reward(completions, prompts, **kwargs):
    """A fractional reward with spread on the tiny model's random text: the share of digits among the characters.

    It asserts that chat prompts reach it as TRL passes them: messages, and the completion as one assistant message.
    """
    rewards = []
    for prompt, completion in zip(prompts, completions):
        assert isinstance(prompt, list) and prompt[0]["role"] == "user"
        assert isinstance(completion, list) and completion[-1]["role"] == "assistant"
        text = completion[-1]["content"]
        rewards.append(sum(ch.isdigit() for ch in text) / len(text) if text else 0.0)
    return rewards


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    """Four steps on the built-in task's training problems as chat prompts, at temperature 0.7, training seed 3."""
    output_dir = tmp_path_factory.mktemp("analysis") / "run"
    task = EmbeddedTask(seed=RUN_SEED)
    train, _ = task.make_splits(4, 1)
    from datasets import Dataset

    problems = [Problem.from_prompt(p) for p in train["prompt"]]
    dataset = Dataset.from_dict({"prompt": [chat_prompt(p) for p in problems], "answer": train["answer"]})
    tokenizer = c.build_tokenizer()
    settings = {
        **TINY_SETTINGS,
        "output_dir": str(output_dir),
        "seed": RUN_SEED,
        "max_steps": 4,  # checkpoints 2 and 4: a generating checkpoint and a later one
        "temperature": TEMPERATURE,
        "seed_fraction": 0.5,  # seeded and plain groups in the same steps
        "bf16": False,  # as train.py on CPU: bf16 autocast would blur the stored log-probs by ~1e-3
    }
    args = SeedGRPOConfig(**settings)
    trainer = SeedGRPOTrainer(
        model=c.build_tiny_model(tokenizer),
        reward_funcs=digit_share_reward,  # spread on random text, so the policy moves between checkpoints
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    return output_dir


def _rows(run, step: int | None = None) -> list[dict]:
    return [r for r in seed_rows(run) if step is None or r["step"] == step]


def _subset(run, folder, keep) -> None:
    """Writes the rows for which `keep(row)` holds as one shard, keeping the shards' metadata (sampling settings)."""
    import pyarrow as pa

    shards = sorted((run / "seeds").glob("step-*.parquet"))
    table = pa.concat_tables([pq.read_table(s) for s in shards])
    mask = [bool(keep(r)) for r in table.to_pylist()]
    folder.mkdir()
    metadata = pq.read_schema(shards[0]).metadata
    pq.write_table(table.filter(mask).replace_schema_metadata(metadata), folder / "step-000004.parquet")


def _positions(seeds, checkpoint, out, *extra) -> tuple[list[dict], list[dict]]:
    argv = ["positions", "--seeds", str(seeds), "--checkpoint", str(checkpoint), "--output-dir", str(out), *extra]
    assert main(argv) == 0
    read = lambda name: [  # noqa: E731
        {k: float(v) for k, v in row.items()} for row in csv.DictReader(open(out / name))
    ]
    return read("positions.csv"), read("positions_by_age.csv")


def _hand_logprobs(checkpoint, rows, temperature) -> list[np.ndarray]:
    """Log-probs of each row's generated tokens after prompt + copied prefix: one plain forward pass per row."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    tokenizer = c.build_tokenizer()
    result = []
    for row in rows:
        messages = json.loads(row["prompt"])
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        k = row["prefix_len"] or 0
        context = tokenizer(prompt)["input_ids"] + row["completion_ids"][:k]
        generated = row["completion_ids"][k:]
        with torch.no_grad():
            logits = model(torch.tensor([context + generated])).logits[0, len(context) - 1 : -1] / temperature
        result.append(torch.log_softmax(logits, -1).gather(1, torch.tensor(generated)[:, None])[:, 0].numpy())
    return result


def test_the_run_records_its_sampling_in_the_seed_shards(chat_run):
    metadata = json.loads(pq.read_schema(chat_run / "seeds" / "step-000002.parquet").metadata[b"ts_trl.sampling"])
    assert metadata["temperature"] == TEMPERATURE and metadata["seed"] == RUN_SEED
    assert metadata["max_completion_length"] == TINY_SETTINGS["max_completion_length"]
    assert metadata["logprobs"] == "policy"  # HF generate: the training forward's log-probs


def test_positions_on_the_generating_checkpoint_finds_no_divergence(chat_run, tmp_path):
    """Rollouts of step 2 were sampled by checkpoint-2 at T = 0.7: read at the run's temperature, p = q exactly."""
    _subset(chat_run, tmp_path / "step2", lambda r: r["step"] == 2)
    buckets, by_age = _positions(tmp_path / "step2", chat_run / "checkpoint-2", tmp_path / "out", "--buckets", "3")
    for b in buckets:
        assert abs(b["mean_log_ratio"]) < 1e-4 and b["kl_k3"] < 1e-6 and b["cum_kl_k3"] < 1e-5, b
        assert b["coverage"] == pytest.approx(1.0, abs=1e-4) and b["share_ratio_ge_c"] == 1.0
    assert [a["age"] for a in by_age] == [0]
    # Before the fix the logits were not divided by the temperature; that reading shows a divergence from nothing.
    plain, _ = _positions(
        tmp_path / "step2", chat_run / "checkpoint-2", tmp_path / "t1", "--buckets", "3", "--temperature", "1"
    )
    assert min(b["kl_k3"] for b in plain) > 1e-3 and plain[-1]["coverage"] < 0.99, plain


def test_positions_scores_seeded_rows_on_their_generated_tokens_only(chat_run, tmp_path):
    rows = _rows(chat_run, step=2)
    seeded = [r for r in rows if r["prefix_len"]]
    assert seeded and len(seeded) < len(rows)  # both kinds, so the test is not vacuous
    _subset(chat_run, tmp_path / "seeded", lambda r: r["step"] == 2 and r["prefix_len"])
    buckets, _ = _positions(tmp_path / "seeded", chat_run / "checkpoint-4", tmp_path / "out", "--buckets", "1")
    generated = sum(len(r["completion_ids"]) - r["prefix_len"] for r in seeded)
    assert buckets[0]["tokens"] == generated < sum(len(r["completion_ids"]) for r in seeded)
    current = _hand_logprobs(chat_run / "checkpoint-4", seeded, TEMPERATURE)
    d = np.concatenate([p - np.array(r["logprobs"][r["prefix_len"] :]) for p, r in zip(current, seeded)])
    assert buckets[0]["mean_log_ratio"] == pytest.approx(d.mean(), abs=1e-5)
    assert buckets[0]["kl_k3"] == pytest.approx((np.exp(d) - 1 - d).mean(), abs=1e-5)
    assert abs(d.mean()) > 1e-3  # checkpoint-4 has moved: the comparison is not between equal numbers


def test_coverage_is_the_prefix_overlap_and_falls_as_the_policy_moves_away(chat_run, tmp_path):
    """Checkpoint-2's own rollouts, scored by checkpoint-2 with its output layer pushed further and further away."""
    from transformers import AutoModelForCausalLM

    _subset(chat_run, tmp_path / "step2", lambda r: r["step"] == 2)
    rows = _rows(chat_run, step=2)
    coverages = []
    for scale in (0.0, 0.5, 2.0):
        model = AutoModelForCausalLM.from_pretrained(chat_run / "checkpoint-2")
        with torch.no_grad():
            generator = torch.Generator().manual_seed(0)
            weight = model.lm_head.weight
            weight += scale * weight.std() * torch.randn(weight.shape, generator=generator)
        folder = tmp_path / f"moved-{scale}"
        model.save_pretrained(folder)
        c.build_tokenizer().save_pretrained(folder)
        buckets, by_age = _positions(tmp_path / "step2", folder, tmp_path / f"out-{scale}", "--buckets", "2")
        coverages.append([b["coverage"] for b in buckets])
        # by hand: E_q[min(1, p/q)] over each rollout's generated part, cut at the bucket's end
        current = _hand_logprobs(folder, rows, TEMPERATURE)
        for b, bucket in enumerate(buckets):
            ratios = []
            for p, r in zip(current, rows):
                q = np.array(r["logprobs"][r["prefix_len"] or 0 :])
                end = math.ceil((b + 1) * len(q) / 2)
                ratios.append(min(1.0, math.exp(p[:end].sum() - q[:end].sum())))
            assert bucket["coverage"] == pytest.approx(np.mean(ratios), abs=1e-4)
    assert coverages[0] == pytest.approx([1.0, 1.0], abs=1e-4)
    for b in range(2):
        assert coverages[0][b] > coverages[1][b] > coverages[2][b]
    assert coverages[1][1] < coverages[1][0]  # deeper prefixes, more accumulated divergence: less coverage


def test_positions_warns_about_rollouts_newer_than_the_checkpoint_and_reports_by_age(chat_run, tmp_path, capsys):
    _, by_age = _positions(chat_run, chat_run / "checkpoint-2", tmp_path / "out")
    err = capsys.readouterr().err
    scored = [r for r in _rows(chat_run) if len(r["completion_ids"]) - (r["prefix_len"] or 0) >= 2]  # --min-length
    newer = sum(r["step"] > 2 for r in scored)
    assert newer and f"warning: {newer} of {len(scored)} rollouts" in err and "newer than" in err
    ages = sorted({2 - r["step"] for r in scored})
    assert [a["age"] for a in by_age] == ages == [-1, 0, 1, 2]
    assert [a["rollouts"] for a in by_age] == [sum(2 - r["step"] == age for r in scored) for age in ages]
    assert by_age[1]["kl_k3"] < 1e-6  # age 0: checkpoint-2's own rollouts


def test_positions_without_recorded_sampling_asks_for_the_temperature(chat_run, tmp_path, capsys):
    (tmp_path / "old").mkdir()
    table = pq.read_table(chat_run / "seeds" / "step-000002.parquet").replace_schema_metadata(None)
    pq.write_table(table, tmp_path / "old" / "step-000002.parquet")
    assert main(["positions", "--seeds", str(tmp_path / "old"), "--checkpoint", str(chat_run / "checkpoint-2")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ts_trl positions: error: ") and "--temperature" in err and "\n" not in err


def _relay(run, out, *extra) -> list[dict]:
    argv = [
        "relay", "--checkpoint-a", str(run / "checkpoint-2"), "--checkpoint-b", str(run / "checkpoint-4"),
        "--output-dir", str(out), *extra,
    ]  # fmt: skip
    assert main(argv) == 0
    return list(csv.DictReader(open(out / "relay_samples.csv")))


@pytest.mark.parametrize("seed", [0, 2])
def test_relay_on_the_builtin_task_holds_out_the_runs_training_and_warmup_problems(chat_run, tmp_path, seed):
    samples = _relay(
        chat_run, tmp_path, "--seed", str(seed), "--num-prompts", "16", "--samples", "1", "--ratios", "0",
        "--max-new-tokens", "4",  # only the prompts matter here
    )  # fmt: skip
    task = EmbeddedTask(seed=RUN_SEED)
    problems = {Problem.from_prompt(s["prompt"]) for s in samples}
    assert len(problems) == 16
    # the run's held-out pool: the warm-up and the training set draw only from the other pool
    assert all(task.is_held_out(p) for p in problems)
    trained = {tuple(sorted(map(int, json.loads(r["prompt"])[0]["content"].split("+")))) for r in _rows(chat_run)}
    assert not trained & {tuple(sorted(p.operands)) for p in problems}
    assert problems == {Problem.from_prompt(p) for p in task.make_splits(1, 16)[1]["prompt"]}


def test_relay_runs_chat_prompts_with_the_runs_sampling_and_paired_statistics(chat_run, tmp_path, capsys):
    from ts_trl.analysis.common import paired_bootstrap

    task = EmbeddedTask(seed=RUN_SEED)
    held_out = task.make_splits(1, 6)[1]
    prompts = tmp_path / "chat.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": chat_prompt(Problem.from_prompt(p)), "answer": a}) + "\n"
            for p, a in zip(held_out["prompt"], held_out["answer"])
        )
    )
    samples = _relay(
        chat_run, tmp_path / "out", "--prompts", str(prompts), "--samples", "3", "--ratios", "0", "0.5",
        "--reward", "embedded", "tests.analysis.test_analysis:digit_share_reward",
        "--success_reward", "digit_share_reward", "--success_threshold", "0.3",
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "temperature 0.7, 12 tokens" in printed  # the run's sampling, not the old defaults (T = 1, 64 tokens)
    a_alone = {(s["prompt_id"], s["sample"]): s for s in samples if s["condition"] == "a_alone"}
    for s in samples:
        assert int(s["response_tokens"]) <= TINY_SETTINGS["max_completion_length"]
        text = s["response"]
        share = sum(ch.isdigit() for ch in text) / len(text) if text else 0.0
        assert float(s["reward"]) == pytest.approx(share) and int(s["passed"]) == (share > 0.3)
        assert float(s["reward_embedded_reward"]) in (0.0, 1.0)
        if s["condition"] == "b_from_a":
            k = int(s["prefix_tokens"])
            assert s["response_ids"].split()[:k] == a_alone[(s["prompt_id"], s["sample"])]["response_ids"].split()[:k]
    assert all(json.loads(s["prompt"])[0]["role"] == "user" for s in samples)

    summary = list(csv.DictReader(open(tmp_path / "out" / "relay.csv")))
    for row in summary:
        if row["condition"] not in ("b_from_a_minus_a_alone", "b_from_a_minus_b_alone"):
            continue
        baseline = row["condition"].removeprefix("b_from_a_minus_")
        alone = {(s["prompt_id"], s["sample"]): int(s["passed"]) for s in samples if s["condition"] == baseline}
        relayed = [s for s in samples if s["condition"] == "b_from_a" and float(s["ratio"]) == float(row["ratio"])]
        per_prompt = {}
        for s in relayed:
            per_prompt.setdefault(s["prompt_id"], []).append(int(s["passed"]) - alone[(s["prompt_id"], s["sample"])])
        assert int(row["n"]) == len(relayed) == 18
        mean, low, high = paired_bootstrap(list(per_prompt.values()))
        assert (
            float(row["pass_rate"])
            == pytest.approx(mean)
            == pytest.approx(np.mean([d for v in per_prompt.values() for d in v]))
        )
        assert (float(row["ci_low"]), float(row["ci_high"])) == pytest.approx((low, high))
        assert low <= mean <= high


def test_relay_rejects_an_unknown_success_reward(chat_run, tmp_path, capsys):
    argv = [
        "relay",
        "--checkpoint-a",
        str(chat_run / "checkpoint-2"),
        "--checkpoint-b",
        str(chat_run / "checkpoint-4"),
    ]
    assert main([*argv, "--success_reward", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ts_trl relay: error: --success_reward 'nope' is none of the rewards") and "\n" not in err


def test_paired_bootstrap_resamples_prompts_not_samples():
    """Two prompts, one always +1 and one always 0: the samples are not independent, the interval spans both."""
    from ts_trl.analysis.common import paired_bootstrap

    mean, low, high = paired_bootstrap([[1.0] * 20, [0.0] * 20])
    assert mean == 0.5 and low == 0.0 and high == 1.0
    assert paired_bootstrap([[0.25, 0.25], [0.25]]) == (0.25, 0.25, 0.25)
    assert all(math.isnan(x) for x in paired_bootstrap([[], []]))


def test_scoring_truncates_like_the_sampler_only_when_the_sampler_wrote_the_log_probs(tokenizer, tiny_model):
    from ts_trl.analysis.common import Sampling, token_logprobs

    context, completion = tokenizer("Q: 1+2\nA:")["input_ids"], tokenizer(" 3")["input_ids"]
    with torch.no_grad():
        logits = tiny_model(torch.tensor([context + completion])).logits[0, len(context) - 1 : -1] / 0.5
    picked = torch.arange(len(completion)), torch.tensor(completion)
    policy = Sampling(temperature=0.5, top_k=5, logprobs="policy")  # HF generate: full softmax of logits / T
    expected = torch.log_softmax(logits, -1)[picked].tolist()
    assert token_logprobs(tiny_model, [context], [completion], sampling=policy)[0] == pytest.approx(expected, abs=1e-5)
    sampler = Sampling(temperature=0.5, top_k=5, logprobs="sampler")  # vLLM: renormalised over the top 5
    kept = logits.masked_fill(logits < logits.topk(5, -1).values[:, -1:], -math.inf)
    expected = torch.log_softmax(kept, -1)[picked].tolist()
    assert token_logprobs(tiny_model, [context], [completion], sampling=sampler)[0] == pytest.approx(
        expected, abs=1e-5
    )


def test_chat_prompts_without_a_chat_template_fail_in_one_line(tokenizer):
    from ts_trl.analysis.common import InputError, prompt_token_ids

    assert prompt_token_ids(tokenizer, '[{"role": "user", "content": "1+2"}]') == tokenizer("Q: 1+2\nA:")["input_ids"]
    tokenizer.chat_template = None
    with pytest.raises(InputError, match="chat template"):
        prompt_token_ids(tokenizer, [{"role": "user", "content": "1+2"}])


def test_relay_cuts_snap_to_line_ends_as_the_trainer_cuts(tokenizer):
    from ts_trl.analysis.relay import relay_cut
    from ts_trl.method.cutting import boundary_token_ids

    text = tokenizer("1+2=3\n3+4=7\n#### 7")["input_ids"]  # line ends after positions 5 and 11
    boundaries = boundary_token_ids(tokenizer)
    assert [relay_cut(text, r, None) for r in (0, 0.3, 0.5)] == [0, 5, 9]
    assert [relay_cut(text, r, boundaries) for r in (0, 0.3, 0.5, 0.7)] == [0, 6, 6, 12]


def _by_sample(samples, condition, ratio=None) -> dict:
    return {
        (s["prompt_id"], s["sample"]): s["response_ids"]
        for s in samples
        if s["condition"] == condition and (ratio is None or float(s["ratio"]) == ratio)
    }


def test_relay_gives_identical_conditions_identical_figures(chat_run, tmp_path):
    """Common random numbers: B continuing an empty prefix of A's is "B alone", sample for sample; and with A = B,
    B from A's prefix at any r is A's own solution. Both flag spellings are accepted."""
    argv = [
        "relay", "--checkpoint_a", str(chat_run / "checkpoint-2"), "--checkpoint-b", str(chat_run / "checkpoint-4"),
        "--output_dir", str(tmp_path / "ab"), "--num_prompts", "8", "--samples", "3", "--ratios", "0", "0.5",
        "--batch-size", "5",  # batches that mix conditions and ratios differently in each call
    ]  # fmt: skip
    assert main(argv) == 0
    samples = list(csv.DictReader(open(tmp_path / "ab" / "relay_samples.csv")))
    assert _by_sample(samples, "b_from_a", 0.0) == _by_sample(samples, "b_alone")
    assert _by_sample(samples, "b_from_a", 0.5) != _by_sample(samples, "b_alone")  # a different condition
    summary = {(float(r["ratio"]), r["condition"]): r for r in csv.DictReader(open(tmp_path / "ab" / "relay.csv"))}
    assert summary[(0.0, "b_from_a")]["pass_rate"] == summary[(0.0, "b_alone")]["pass_rate"]
    difference = summary[(0.0, "b_from_a_minus_b_alone")]
    assert float(difference["pass_rate"]) == float(difference["ci_low"]) == float(difference["ci_high"]) == 0.0

    same = list(argv)
    same[2] = str(chat_run / "checkpoint-4")  # A = B
    same[same.index("--output_dir") + 1] = str(tmp_path / "bb")
    assert main(same) == 0
    samples = list(csv.DictReader(open(tmp_path / "bb" / "relay_samples.csv")))
    a_alone = _by_sample(samples, "a_alone")
    assert a_alone == _by_sample(samples, "b_alone") == _by_sample(samples, "b_from_a", 0.0)
    assert a_alone == _by_sample(samples, "b_from_a", 0.5)
