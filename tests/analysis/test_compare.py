"""Issue 6: the replay baseline and pass-rate seed selection through `trainer.train()`, and the analysis commands."""

import csv
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import tests.conftest as c
from tests.conftest import TINY_SETTINGS, seed_rows
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
from ts_trl.analysis.compare_protocol import METHODS

G = 4  # num_generations of every run below


def _config(output_dir, **overrides):
    settings = {
        **TINY_SETTINGS,
        "output_dir": str(output_dir),
        "num_generations": G,
        "learning_rate": 1e-2,  # large, so the policy drifts from the replayed rollouts' behaviour policy in a few steps
    }
    settings.update(overrides)
    return SeedGRPOConfig(**settings)


class _Recorder(SeedGRPOTrainer):
    """Keeps, per generation, the plan, the training batch, and the policy's log-probs of every row at that time."""

    def _record_rollouts(self, inputs, output, batch):
        super()._record_rollouts(inputs, output, batch)
        plan = batch.plan
        prompt_ids = [self._tokenizer(x["prompt"])["input_ids"] for x in inputs]
        logps = []
        with torch.no_grad():  # an independent plain forward pass, one row at a time (no padding)
            for ids, row, mask in zip(prompt_ids, output["completion_ids"], output["completion_mask"]):
                completion = row[mask.bool()].tolist()
                logits = self.model(torch.tensor([ids + completion])).logits[0, len(ids) - 1 : -1]
                token_logps = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(completion)[:, None])[:, 0]
                logps.append(token_logps)
        self.records.append(
            {
                "step": self.state.global_step,
                "replayed": list(plan.replayed),
                "origins": [s.rollout_id if r else None for s, r in zip(plan.seeds, plan.replayed)],
                "completion_ids": output["completion_ids"].clone(),
                "completion_mask": output["completion_mask"].clone(),
                "tool_mask": output.get("tool_mask"),
                "advantages": output["advantages"].clone(),
                "logps": logps,
            }
        )

    def _weight_old_tokens(self, inputs, current_logps):
        before = inputs["advantages"].clone()
        super()._weight_old_tokens(inputs, current_logps)
        self.loss_records.append(
            {
                "before": before,
                "after": inputs["advantages"].clone(),
                "logps": current_logps.clone(),
                "behaviour": inputs["seed_behaviour_logps"].clone(),
                "old_tokens": inputs["seed_old_tokens"].bool().clone(),
                "completion_mask": inputs["completion_mask"].bool().clone(),
            }
        )


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("replay") / "run"
    tokenizer = c.build_tokenizer()
    model = c.build_tiny_model(tokenizer)
    generate_rows, rewards = [], []
    original_generate = model.generate

    def spy_generate(*args, **kwargs):
        generate_rows.append(len(kwargs["input_ids"]))
        return original_generate(*args, **kwargs)

    def spy_reward(completions, **kwargs):
        scores = c.count_reward(completions)
        rewards.append(scores)
        return scores

    model.generate = spy_generate
    args = _config(output_dir, seed_method="replay", replay_per_group=2, prefix_is_clip=1.05)
    trainer = _Recorder(
        model=model, reward_funcs=spy_reward, args=args, train_dataset=c.tiny_prompts(4), processing_class=tokenizer
    )
    trainer.records, trainer.loss_records = [], []
    trainer.train()
    return {
        "trainer": trainer,
        "records": trainer.records,
        "loss_records": trainer.loss_records,
        "rows": seed_rows(output_dir, by_id=True),
        "generate_rows": generate_rows,
        "rewards": rewards,
    }


def test_replay_fills_group_slots_with_stored_rollouts(replay_run):
    history = replay_run["trainer"].state.log_history
    replayed_metric = [h["seeds/replayed_rows"] for h in history if "seeds/replayed_rows" in h]
    assert replayed_metric[0] == 0  # nothing is old enough at step 0
    assert max(replayed_metric) == 4  # replay_per_group=2 slots of both groups
    rows = replay_run["rows"]
    checked = 0
    for record in replay_run["records"]:
        for i, origin in enumerate(record["origins"]):
            if origin is None:
                continue
            stored = rows[origin]  # read back from the seed dataset on disk
            assert stored["step"] <= record["step"] - 1  # seed_min_age = 1
            ids = record["completion_ids"][i][record["completion_mask"][i].bool()].tolist()
            assert ids == stored["completion_ids"]
            assert i % G >= G - 2  # the last replay_per_group rows of the group
            checked += 1
    assert checked >= 8


def test_replay_generates_fewer_rows_and_banks_no_duplicates(replay_run):
    records, rows = replay_run["records"], replay_run["rows"]
    assert replay_run["generate_rows"] == [8 - sum(r["replayed"]) for r in records]
    assert min(replay_run["generate_rows"]) == 4
    per_step = {}
    for row in rows.values():
        per_step[row["step"]] = per_step.get(row["step"], 0) + 1
    for record in records:  # replayed rows are not banked again
        assert per_step[record["step"]] == 8 - sum(record["replayed"])
    assert all(row["seed_origin"] is None and row["prefix_len"] == 0 for row in rows.values())
    history = [h for h in replay_run["trainer"].state.log_history if "seeds/generated_tokens" in h]
    for record, h in zip(records, history):
        replayed_tokens = sum(int(record["completion_mask"][i].sum()) for i, r in enumerate(record["replayed"]) if r)
        assert h["seeds/prefix_tokens"] == replayed_tokens  # replayed tokens are not counted as generated


def test_replayed_rows_are_weighted_by_the_truncated_ratio(replay_run):
    """Generation leaves every row GRPO's group advantage; the loss scales a replayed token's by
    min(exp(logp_old - logp_behaviour), clip), logp_old being the training forward's own (detached) log-prob."""
    clip = replay_run["trainer"].args.prefix_is_clip
    for record, scores in zip(replay_run["records"], replay_run["rewards"]):
        r = torch.tensor(scores).view(-1, G)  # recomputed group advantages, GRPO's formula
        group_advantage = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).flatten()
        advantages = record["advantages"]
        advantages = advantages[:, None] if advantages.dim() == 1 else advantages
        assert record["tool_mask"] is None or bool(record["tool_mask"].all())  # replayed tokens are all trained
        for i in range(len(record["origins"])):
            mask = record["completion_mask"][i].bool()
            row = advantages[i].expand_as(mask)[mask]
            assert row.tolist() == pytest.approx([group_advantage[i].item()] * int(mask.sum()), rel=1e-5, abs=1e-6)
    clipped = unclipped = old = 0
    for record in replay_run["loss_records"]:
        before = record["before"]
        before = (before[:, None] if before.dim() == 1 else before).expand_as(record["after"])
        ratio = torch.exp(record["logps"] - record["behaviour"])
        weights = torch.where(record["old_tokens"], ratio.clamp(max=clip), torch.ones_like(ratio))
        mask = record["completion_mask"]
        assert record["after"][mask].tolist() == pytest.approx((before * weights)[mask].tolist(), rel=1e-5, abs=1e-6)
        old_ratio = ratio[record["old_tokens"] & mask]
        old += old_ratio.numel()
        clipped += int((old_ratio > clip + 1e-3).sum())
        unclipped += int((old_ratio < clip - 1e-3).sum())
    assert old and clipped and unclipped  # replayed tokens reached the loss; the truncation acted on both sides


def test_replay_leaves_seeds_mode_untouched_when_off(make_trainer):
    """replay_per_group must stay below num_generations: at least one on-policy row per group."""
    with pytest.raises(ValueError, match="replay_per_group"):
        make_trainer(seed_method="replay", replay_per_group=4)


# ---------------------------------------------------------------------------------------------------------------------
# seed_selection="passrate"


def _first_char_reward(completions, prompts, **kwargs):
    """Rigged by prompt: even prompts pass when the response starts with a digit (rare), odd ones unless it does."""
    rewards = []
    for prompt, completion in zip(prompts, completions):
        starts_with_digit = bool(completion) and completion[0].isdigit()
        hard = int(prompt.split(":")[1].split("+")[0]) % 2 == 0
        rewards.append(float(starts_with_digit if hard else not starts_with_digit))
    return rewards


def test_passrate_selection_steers_groups_toward_half(tmp_path, tokenizer):
    from datasets import Dataset

    prompts = [f"Q: {i}+{i + 1}=" for i in range(4)]
    args = _config(
        tmp_path / "run",
        seed_selection="passrate",
        seed_fraction=0.5,  # plain groups keep measuring each prompt's pass rate from scratch
        max_steps=10,
        learning_rate=1e-3,
        per_device_train_batch_size=16,  # every prompt in every step: one pass-rate update per prompt per step
    )
    asked = []

    class Spy(SeedGRPOTrainer):
        def _plan_groups(self, inputs):
            asked.append(dict(self.planner.pass_rates))
            return super()._plan_groups(inputs)

    trainer = Spy(
        model=c.build_tiny_model(tokenizer),
        reward_funcs=_first_char_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
    )
    trainer.train()
    rows = seed_rows(args.output_dir, by_id=True)
    from ts_trl.store.schema import prompt_id_of

    hard = {prompt_id_of(p) for p in prompts[0::2]}
    easy = {prompt_id_of(p) for p in prompts[1::2]}
    # the pass rates the trainer tracked agree with the rig: hard prompts mostly fail, easy ones mostly pass
    final = trainer.planner.pass_rates
    assert all(final[p] < 0.5 for p in hard) and all(final[p] > 0.5 for p in easy)
    seeded = [r for r in rows.values() if r["seed_origin"] is not None]
    assert {r["prompt_id"] for r in seeded} == hard | easy
    for row in seeded:
        origin = rows[row["seed_origin"]]
        rates = asked[row["step"]]  # each step generates once here, so the plan of step t is asked[t]
        rate = rates[row["prompt_id"]]
        assert (origin["reward"] > 0) == (rate < 0.5)  # successful seeds where the policy fails, and vice versa
        assert (origin["reward"] > 0) == (row["prompt_id"] in hard)
    # the independent check: recompute the first measured pass rate of each prompt from its plain rollouts
    first_step = {}
    for row in rows.values():
        if row["seed_origin"] is None:
            first_step.setdefault((row["prompt_id"], row["step"]), []).append(row["reward"] > 0)
    for prompt_id in hard | easy:
        passes = first_step[(prompt_id, 0)]
        assert asked[1][prompt_id] == pytest.approx(np.mean(passes))


# ---------------------------------------------------------------------------------------------------------------------
# The analysis commands, run on the tiny model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two differently initialised tiny models saved as checkpoints A and B, and a small prompt set."""
    folder = tmp_path_factory.mktemp("checkpoints")
    tokenizer = c.build_tokenizer()
    for name, seed in (("A", 0), ("B", 1)):
        c.build_tiny_model(tokenizer, seed=seed).save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
    prompts = folder / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"Q: {i}+{i + 1}=", "answer": str(2 * i + 1)}) + "\n" for i in range(5))
    )
    return folder


def _printed_table(text: str, first_word: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_word))
    rows = []
    for line in lines[start + 1 :]:
        if not line[:1].isdigit():
            break
        rows.append(line.replace("[", " ").replace("]", " ").replace(",", " ").split())
    return rows


def test_relay_numbers_match_the_samples(checkpoints, tmp_path, capsys):
    import csv

    from ts_trl.__main__ import main

    out = tmp_path / "relay"
    status = main(
        [
            "relay",
            "--checkpoint-a", str(checkpoints / "A"),
            "--checkpoint-b", str(checkpoints / "B"),
            "--prompts", str(checkpoints / "prompts.jsonl"),
            "--reward", "tests.conftest:count_reward",  # a reward with spread on the random models' text
            "--ratios", "0", "0.5", "0.8",
            "--samples", "2",  # 10 solutions of A, each relayed at 3 ratios
            "--max-new-tokens", "10",
            "--output-dir", str(out),
        ]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0 and f"wrote {out / 'relay.csv'}" in printed
    assert (out / "relay.png").stat().st_size > 10_000
    samples = list(csv.DictReader(open(out / "relay_samples.csv")))
    tokenizer = c.build_tokenizer()
    a_alone = {(s["prompt_id"], s["sample"]): s for s in samples if s["condition"] == "a_alone"}
    for s in samples:
        # the reward of every response, recomputed; its length within budget
        assert float(s["reward"]) == c.count_reward([s["response"]])[0]
        assert int(s["response_tokens"]) <= 10
        if s["condition"] == "b_from_a":  # B continued A's own solution, cut at floor(r * len)
            a_ids = a_alone[(s["prompt_id"], s["sample"])]["response_ids"].split()
            length = len(a_ids) - (a_ids[-1] == str(tokenizer.eos_token_id))  # EOS is not part of the solution
            k = int(s["prefix_tokens"])
            assert k == int(float(s["ratio"]) * length)
            assert s["response_ids"].split()[:k] == a_ids[:k]
    table = _printed_table(printed, "ratio")
    assert [float(row[0]) for row in table] == [0.0, 0.5, 0.8]
    for row in table:
        ratio = float(row[0])
        for j, condition in enumerate(("b_from_a", "a_alone", "b_alone")):
            chosen = [s for s in samples if s["condition"] == condition]
            if condition == "b_from_a":
                chosen = [s for s in chosen if float(s["ratio"]) == ratio]
            assert len(chosen) == 10
            passes = sum(float(s["reward"]) > 0 for s in chosen)
            rate, low, high = (float(x) for x in row[1 + 3 * j : 4 + 3 * j])
            assert rate == pytest.approx(passes / 10, abs=5e-4)
            # Wilson interval by hand (z = 1.96)
            z, p = 1.959964, passes / 10
            centre = (p + z * z / 20) / (1 + z * z / 10)
            half = z * np.sqrt(p * (1 - p) / 10 + z * z / 400) / (1 + z * z / 10)
            assert (low, high) == pytest.approx((max(0, centre - half), min(1, centre + half)), abs=5e-4)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--checkpoint-a", "/nonexistent/A"], "checkpoint A '/nonexistent/A' does not exist"),
        (["--ratios", "0.5", "1.0"], "cut ratios must lie in [0, 1)"),
        (["--prompts", "/nonexistent.jsonl"], "prompt set '/nonexistent.jsonl' does not exist"),
    ],
)
def test_relay_rejects_bad_input_in_one_line(checkpoints, tmp_path, capsys, argv, message):
    from ts_trl.__main__ import main

    base = {"--checkpoint-a": str(checkpoints / "A"), "--checkpoint-b": str(checkpoints / "B")}
    base["--prompts"] = str(checkpoints / "prompts.jsonl")
    base["--output-dir"] = str(tmp_path)
    for flag, value in zip(argv[::2], argv[1::2]):
        base[flag] = value
    args = [x for flag, value in base.items() for x in (flag, value)]
    if "--ratios" in argv:
        args += ["--ratios", *argv[argv.index("--ratios") + 1 :]]
    assert main(["relay", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ts_trl relay: error: ") and message in err and "\n" not in err


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory):
    """A short seeded run: its seed dataset and checkpoints feed `positions`."""
    output_dir = tmp_path_factory.mktemp("positions") / "run"
    tokenizer = c.build_tokenizer()
    args = _config(output_dir, max_steps=4, save_steps=2, seed_fraction=0.5)
    trainer = SeedGRPOTrainer(
        model=c.build_tiny_model(tokenizer),
        reward_funcs=c.count_reward,
        args=args,
        train_dataset=c.tiny_prompts(4),
        processing_class=tokenizer,
    )
    trainer.train()
    return output_dir


def test_positions_log_ratios_match_a_hand_computation(seed_run, tmp_path, capsys, tokenizer):
    """On a seed dataset of one rollout, each bucket's numbers are that rollout's, recomputed here by hand."""
    from transformers import AutoModelForCausalLM

    from ts_trl.__main__ import main

    table = pq.read_table(seed_run / "seeds" / "step-000002.parquet")
    one = table.filter(
        pq.ParquetFile(seed_run / "seeds" / "step-000002.parquet").read().column("step").to_numpy() == 0
    )
    one = one.slice(0, 1)
    (tmp_path / "one").mkdir()
    pq.write_table(one, tmp_path / "one" / "step-000002.parquet")
    row = one.to_pylist()[0]
    n = len(row["completion_ids"])
    buckets = 3
    status = main(
        ["positions", "--seeds", str(tmp_path / "one"), "--checkpoint", str(seed_run / "checkpoint-4"),
         "--buckets", str(buckets), "--output-dir", str(tmp_path / "out")]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0 and (tmp_path / "out" / "positions.png").stat().st_size > 10_000

    model = AutoModelForCausalLM.from_pretrained(seed_run / "checkpoint-4").eval()
    prompt_ids = tokenizer(row["prompt"])["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + row["completion_ids"]])).logits[0, len(prompt_ids) - 1 : -1]
    current = torch.log_softmax(logits, -1).gather(1, torch.tensor(row["completion_ids"])[:, None])[:, 0].numpy()
    d = current - np.array(row["logprobs"])
    k3 = np.exp(d) - 1 - d
    import csv

    written = list(csv.DictReader(open(tmp_path / "out" / "positions.csv")))
    printed_rows = _printed_table(printed, "bucket")
    for b in range(buckets):
        positions = [t for t in range(n) if t * buckets // n == b]
        end = positions[-1] + 1
        expected = {
            "mean_log_ratio": d[positions].mean(),
            "kl_k3": k3[positions].mean(),
            "cum_kl_k3": k3[:end].sum(),
            "cum_log_ratio": d[:end].sum(),
            "coverage": min(1.0, np.exp(d[:end].sum())),  # E_q[min(1, p/q)] over one prefix
        }
        for key, value in expected.items():
            assert float(written[b][key]) == pytest.approx(value, abs=1e-4), (b, key)
        assert float(printed_rows[b][3]) == pytest.approx(expected["mean_log_ratio"], abs=1e-4)
        assert float(printed_rows[b][4]) == pytest.approx(expected["kl_k3"], abs=1e-4)
    assert d.std() > 0  # the checkpoint has moved away from the behaviour policy: the test is not vacuous


def test_positions_rejects_another_tokenizer_and_missing_checkpoint(seed_run, tmp_path, capsys):
    from ts_trl.__main__ import main
    from ts_trl.store.format import write_shard
    from ts_trl.store.schema import Rollout, rollouts_to_table

    (tmp_path / "other").mkdir()
    other = Rollout("o", "p", "Q: 1+2=", "c", [5, 6, 7], [-1.0] * 3, 0.0, 1)
    write_shard(rollouts_to_table([other], "c", "m", "0123456789abcdef", []), tmp_path / "other" / "s.parquet")
    assert main(["positions", "--seeds", str(tmp_path / "other"), "--checkpoint", str(seed_run / "checkpoint-4")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ts_trl positions: error: ") and "another vocabulary" in err and "\n" not in err
    assert main(["positions", "--seeds", str(seed_run), "--checkpoint", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_commands_dispatch_and_module_entry_points(capsys):
    import subprocess
    import sys

    from ts_trl.__main__ import ANALYSES, main

    assert main(["nonsense"]) == 2
    assert "unknown command" in capsys.readouterr().err
    assert set(ANALYSES) == {"relay", "positions", "compare", "probe-cuts"}
    # Each module run as `python -m <module> --help` does (runpy, as __main__), all in one fresh interpreter: the
    # libraries are imported once rather than four times (about 15 s).
    script = (
        "import contextlib, io, runpy, sys\n"
        "for module in sys.argv[1:]:\n"
        "    sys.argv, printed, status = [module, '--help'], io.StringIO(), 0\n"
        "    with contextlib.redirect_stdout(printed):\n"
        "        try:\n"
        "            runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
        "        except SystemExit as exit:\n"
        "            status = exit.code or 0\n"
        "    print(module, status, repr(printed.getvalue()))\n"
    )
    modules = [module for module, _ in ANALYSES.values()]
    done = subprocess.run([sys.executable, "-c", script, *modules], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    helps = {line.split(" ", 1)[0]: line.split(" ", 2)[1:] for line in done.stdout.splitlines()}
    for name, (module, _) in ANALYSES.items():
        status, printed = helps[module]
        assert status == "0" and f"ts_trl {name}" in printed, helps[module]


def test_compare_table_matches_its_runs(tmp_path, monkeypatch, capsys):
    """A shrunk `compare --quick` end to end: its printed tables are recomputed from the CSVs it wrote."""
    import csv

    from ts_trl.__main__ import main
    from ts_trl.analysis import compare_protocol, compare_report, compare_runs, compare_stats

    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))  # a fresh 2-step warm-up, not the user's cache
    out = tmp_path / "compare"
    argv = ["compare", "--quick", "--methods", "seeds-state", "--num-seeds", "2", "--steps", "3", "--n-train", "8",
            "--n-eval", "4", "--eval-samples", "8", "--eval-every", "1", "--n-probe", "4", "--warmup-steps", "2",
            "--prompts-per-step", "4", "--jobs", "1", "--output-dir", str(out)]  # fmt: skip
    status = main(argv)
    printed = capsys.readouterr().out
    assert status == 0 and f"{out / 'compare.md'}" in printed
    assert (out / "compare.png").stat().st_size > 10_000
    runs = list(csv.DictReader(open(out / "compare.csv")))
    # 'none' always runs: it is what the others are paired with. Two methods only: replay and seeds-action train
    # through the same code, tested above; CI time is short.
    assert sorted((r["method"], r["seed"]) for r in runs) == sorted(
        (m, s) for m in ("none", "seeds-state") for s in ("0", "1")
    )
    table = [line.split("|")[1:-1] for line in printed.splitlines() if line.startswith("| ") and "±" in line]
    table = [cells for cells in table if cells[0].strip() != "method"]
    assert len(table) == 2
    for cells in table:
        method = cells[0].strip()
        chosen = [r for r in runs if r["method"] == method]
        scores = np.array([float(r["pass_at_1"]) for r in chosen])
        mean, std = (float(x) for x in cells[1].split("±"))
        assert mean == pytest.approx(scores.mean(), abs=5e-4) and std == pytest.approx(scores.std(ddof=1), abs=5e-4)
        assert float(cells[3]) == pytest.approx(np.mean([float(r["pass_at_8"]) for r in chosen]), abs=5e-4)
        assert float(cells[4]) == pytest.approx(np.mean([float(r["coverage"]) for r in chosen]), abs=5e-4)
        tokens = np.mean([int(r["generated_tokens"]) for r in chosen])
        assert float(cells[5].replace(",", "")) == pytest.approx(tokens, abs=0.5)
        assert all(int(r["steps"]) == 3 for r in chosen)
    assert {r["method"]: int(r["reused_tokens"]) for r in runs}["none"] == 0

    # Per-prompt scores: every run at steps 0..3, and the final pass@1 / pass@8 of compare.csv recomputed from them.
    prompts = list(csv.DictReader(open(out / "prompts.csv")))
    for run in runs:
        rows = [p for p in prompts if (p["method"], p["seed"]) == (run["method"], run["seed"])]
        assert sorted({int(p["step"]) for p in rows}) == [0, 1, 2, 3]
        last = [p for p in rows if p["step"] == "3"]
        assert len(last) == 4 and all(p["samples"] == "8" for p in last)
        pass1 = np.mean([int(p["passes"]) / 8 for p in last])
        pass8 = np.mean([int(p["passes"]) > 0 for p in last])
        assert float(run["pass_at_1"]) == pytest.approx(pass1) and float(run["pass_at_8"]) == pytest.approx(pass8)
        assert float(last[0]["generated_tokens"]) == pytest.approx(int(run["generated_tokens"]), abs=0.5)
    # Step 0 is the same warm model for both methods at one seed: common random numbers.
    start = {(p["method"], p["seed"], p["prompt"]): p["passes"] for p in prompts if p["step"] == "0"}
    assert all(start[("none", s, j)] == start[("seeds-state", s, j)] for _, s, j in start)
    # The paired-difference lines are those of the statistics recomputed from prompts.csv.
    # The difference tables are those of the statistics recomputed from the CSVs, and differences.csv holds them.
    differences = compare_stats.all_differences(
        compare_stats.read_csv(out / "prompts.csv"), compare_stats.read_csv(out / "compare.csv")
    )
    assert {d["endpoint"] for d in differences} == {
        f"pass@{k} at equal {b}" for k in (1, 8) for b in ("steps", "tokens")
    } | {"coverage", compare_protocol.ZERO_STD_GAP}
    assert len(compare_stats.read_csv(out / "differences.csv")) == len(differences)
    for d in differences:
        start = f"| {d['method']} | {d['baseline']} | " + ("" if d["role"] == "primary" else f"{d['endpoint']} | ")
        line = next(line for line in printed.splitlines() if line.startswith(start))
        assert line == start + " | ".join(compare_report.difference_cells(d)) + " |"
    # Both runs logged the all-equal share of their plain groups, the seeded run that of its seeded groups too.
    shares = {r["method"]: r for r in runs}
    assert shares["none"]["zero_std_share_seeded"] == "nan" and float(shares["none"]["zero_std_share_plain"]) >= 0
    assert 0 <= float(shares["seeds-state"]["zero_std_share_seeded"]) <= 1
    coverage = [c for c in csv.DictReader(open(out / "curves.csv")) if c["kind"] == "coverage"]
    assert {c["step"] for c in coverage} == {"0", "1", "2", "3"} and all(0 < float(c["value"]) <= 1 for c in coverage)
    # At step 0 the policy is the warm model that sampled the reference states: p = q, full coverage.
    assert all(float(c["value"]) == pytest.approx(1.0, abs=1e-4) for c in coverage if c["step"] == "0")
    # every run banked its rollouts as a seed dataset that `positions` can read
    assert (out / "runs" / "seeds-state-seed0" / "seeds" / "manifest.json").exists()
    assert (out / "runs" / "none-seed0" / "final" / "config.json").exists()

    # Run again with the same settings: every finished run is reused (nothing trains), and the tables are the same.
    before = (out / "compare.csv").read_text()
    monkeypatch.setattr(
        compare_runs, "_train", lambda *args, **kwargs: pytest.fail("a finished run was trained again")
    )
    assert main(argv) == 0 and (out / "compare.csv").read_text() == before
    # A cut range or seed fraction plays no part in the warm start or in on-policy GRPO: their saved runs are reused
    # under other values (a later comparison of other arms shares them), a seeded run's are not.
    settings = json.loads((out / "runs" / "none-seed0" / "output.json").read_text())["settings"]
    for changed in ({"cut_ratio_max": 0.5}, {"cut_ratio_min": 0.05}, {"seed_fraction": 0.25}):
        jobs = {m: {"kind": k, "seed": 0, "method": m, "settings": {**settings, **changed}, "out": str(out)}
                for k, m in (("start", None), ("train", "none"), ("train", "seeds-state"))}  # fmt: skip
        assert (
            compare_runs.saved_output(jobs[None]) is not None and compare_runs.saved_output(jobs["none"]) is not None
        )
        assert compare_runs.saved_output(jobs["seeds-state"]) is None, changed
    assert compare_runs.saved_output({**jobs["none"], "settings": {**settings, "learning_rate": 1.0}}) is None
    # Runs pair only when they start from the same warm model, named by its weights' SHA-256: one trained elsewhere,
    # from a warm-up that came out different, is not reused.
    assert settings["warm_model"] == hashlib.sha256((out / "warm" / "model.safetensors").read_bytes()).hexdigest()
    assert compare_runs.saved_output({**jobs["none"], "settings": {**settings, "warm_model": "0" * 64}}) is None


def test_compare_rejects_bad_budget(capsys):
    from ts_trl.__main__ import main

    assert main(["compare", "--steps", "0"]) == 2
    assert capsys.readouterr().err.strip() == "ts_trl compare: error: --steps must be positive, got 0."
    assert main(["compare", "--steps", "4", "--n-train", "256"]) == 2  # 4 x 32 prompts never come back: no seeds
    assert "never brings a training prompt back" in capsys.readouterr().err


def _compare(tmp_path, cache, *flags) -> tuple[subprocess.CompletedProcess, float, Path]:
    """`ts_trl compare --quick *flags` in a fresh interpreter; its result, minutes taken and output folder.

    The warm-up comes from `cache` (the session's `quick_warm_cache`: `$TS_TRL_CACHE` when set, which `.ci/run`
    fills, else built once for the session).
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TS_TRL_CACHE": str(cache)}
    out = tmp_path / "quick"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ts_trl", "compare", "--quick", *flags, "--output_dir", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done, (time.monotonic() - started) / 60, out


def _check_quick_comparison(done, out, steps: int) -> None:
    """Every method ran every RNG seed for `steps` steps, the seeded ones reused prefixes, and the tables are printed."""
    runs = list(csv.DictReader(open(out / "compare.csv")))
    methods = ("none", "replay", "seeds-action", "seeds-state")
    assert sorted((r["method"], r["seed"]) for r in runs) == sorted((m, s) for m in methods for s in ("0", "1"))
    assert all(int(r["steps"]) == steps for r in runs)
    seeded = [r for r in runs if r["method"].startswith("seeds")]
    assert all(int(r["reused_tokens"]) > 0 for r in seeded), "seeded runs reused no prefix tokens"
    assert "Primary endpoint, fixed in advance" in done.stdout and "Secondary endpoints, Holm-corrected" in done.stdout
    # the paper's claims without on-policy GRPO, paired directly
    assert "| seeds-state | seeds-action |" in done.stdout
    assert {"compare.md", "compare.png", "differences.csv", "curves.csv"} <= {p.name for p in out.iterdir()}


def test_the_quick_comparison_in_miniature(tmp_path, quick_warm_cache):
    """`ts_trl compare --quick` on its own code path, shrunk to 16 training prompts, 8 a step and 4 steps, so that
    prompts repeat from step 3 and the seeded and replay arms draw from the bank."""
    done, _, out = _compare(
        tmp_path, quick_warm_cache, "--steps", "4", "--n_train", "16", "--prompts_per_step", "8", "--n_eval", "16"
    )
    _check_quick_comparison(done, out, steps=4)


@pytest.mark.slow
def test_the_quick_comparison_as_the_readme_runs_it(tmp_path):
    """`ts_trl compare --quick` itself, unshrunk: 4 methods x 2 RNG seeds x 40 steps, within its 10-minute budget."""
    done, minutes, out = _compare(tmp_path, os.environ.get("TS_TRL_CACHE", tmp_path / "cache"))
    assert minutes <= 10, f"compare --quick took {minutes:.1f} min, over its 10-minute budget"
    _check_quick_comparison(done, out, steps=40)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_compare_method_is_a_valid_seed_config(method, tmp_path):
    """Each arm `compare` offers is a setting `SeedGRPOConfig` accepts, as `compare` passes it."""
    config = SeedGRPOConfig(
        output_dir=str(tmp_path), report_to=[], use_cpu=True, seed_snapshot_only=False, **METHODS[method]
    )
    for key, value in METHODS[method].items():
        assert getattr(config, key) == value


def test_saved_runs_are_reused_across_settings_that_play_no_part_in_them(tmp_path):
    """A seed fraction or cut range changes no on-policy run and no warm start; a cut range changes no replay run."""
    from ts_trl.analysis import compare_runs

    settings = {"budget": {"steps": 4, "num_seeds": 2}, "learning_rate": 1e-4, "seed_fraction": 0.5,
                "cut_ratio_min": 0.1, "cut_ratio_max": 0.3, "jobs": 2, "output_dir": "a", "num_seeds": 2}  # fmt: skip
    kinds = {None: "start", "none": "train", "replay": "train", "seeds-state": "train", "seeds-action": "train"}
    for method, kind in kinds.items():
        job = {"kind": kind, "seed": 0, "method": method, "out": str(tmp_path)}
        compare_runs._output_path(job).parent.mkdir(parents=True)
        compare_runs._output_path(job).write_text(json.dumps({"settings": settings, "output": {"method": method}}))

    def reused(**changed):
        jobs = [{"kind": k, "seed": 0, "method": m, "settings": {**settings, **changed}, "out": str(tmp_path)}
                for m, k in kinds.items()]  # fmt: skip
        return {job["method"] for job in jobs if compare_runs.saved_output(job) is not None}

    assert reused(jobs=1, output_dir="b", num_seeds=5) == set(kinds)
    assert reused(cut_ratio_max=0.9) == reused(cut_ratio_min=0.2) == {None, "none", "replay"}
    assert reused(seed_fraction=0.25) == {None, "none"}
    assert reused(learning_rate=2e-4) == set()
