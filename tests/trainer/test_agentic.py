"""Multi-turn Thinking Seeds through `trainer.train()`: tools and environments, with the scripted tiny agent."""

import json

import pytest

from tests.support import agent_fixtures as af
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer

MAX_COMPLETION = 200


def agent_config(output_dir, **overrides):
    settings = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=MAX_COMPLETION,
        max_steps=3,
        save_steps=1,
        logging_steps=1,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        seed=0,
        seed_fraction=1.0,
        disable_tqdm=True,
    )
    settings.update(overrides)
    return SeedGRPOConfig(**settings)


def tools_trainer(model, tokenizer, args) -> SeedGRPOTrainer:
    """The scripted agent's run with the `add` tool, rewarded by `last_digits_even`, on two prompts."""
    return SeedGRPOTrainer(
        model,
        af.last_digits_even,
        args=args,
        train_dataset=af.agent_prompts(2),
        processing_class=tokenizer,
        tools=[af.add],
    )


def recorded_run(trainer):
    """Trains `trainer`, keeping every generation batch's plan, responses, messages and loss mask."""
    batches = []
    record = trainer._record_rollouts

    def spy(inputs, output, batch):
        batches.append(
            {
                "plan": batch.plan,
                "ids": [list(map(int, ids)) for ids in batch.generation.completion_ids],
                "messages": batch.generation.completions,
                "tool_masks": batch.generation.tool_masks,
                "loss_mask": (output["completion_mask"] * output.get("tool_mask", 1)).tolist(),
                "turns": dict(batch.turns or {}),
            }
        )
        return record(inputs, output, batch)

    trainer._record_rollouts = spy
    trainer.train()
    return batches


def seeded_rows(batches):
    for batch in batches:
        plan = batch["plan"]
        for i, (seed, cut) in enumerate(zip(plan.seeds, plan.cuts)):
            if cut is not None:
                yield batch, i, seed, cut


@pytest.fixture(scope="module")
def tools_run(tmp_path_factory):
    tokenizer = af.build_agent_tokenizer()
    model = af.scripted_agent(tokenizer, calls=1)
    args = agent_config(tmp_path_factory.mktemp("tools"))
    trainer = tools_trainer(model, tokenizer, args)
    af.CALLS.clear()
    batches = recorded_run(trainer)
    return {
        "trainer": trainer,
        "batches": batches,
        "tokenizer": tokenizer,
        "calls": list(af.CALLS),
        "output_dir": args.output_dir,
    }


def test_tools_run_seeds_groups(tools_run):
    shares = [
        h["seeds/seeded_group_share"]
        for h in tools_run["trainer"].state.log_history
        if "seeds/seeded_group_share" in h
    ]
    assert max(shares) > 0
    assert list(seeded_rows(tools_run["batches"]))


def test_seeded_prefix_is_its_origin_and_out_of_the_loss(tools_run):
    tokenizer = tools_run["tokenizer"]
    for batch, i, seed, cut in seeded_rows(tools_run["batches"]):
        ids = batch["ids"][i]
        origin = [int(t) for t in seed.completion_ids[: cut.k]]
        assert ids[: cut.k] == origin
        assert tokenizer.decode(ids[: cut.k]) == tokenizer.decode(origin)
        assert not any(batch["loss_mask"][i][: cut.k])  # state mode: no prefix token is trained
        assert any(batch["loss_mask"][i][cut.k : len(ids)])
        assert len(ids) <= MAX_COMPLETION  # the continuation's budget is what the prefix leaves
        # the bank keeps the whole trajectory's tool mask: the prefix part is the origin's
        assert batch["tool_masks"][i][: cut.k] == [int(x) for x in seed.tool_mask[: cut.k]]


def test_cuts_fall_at_admissible_points(tools_run):
    tokenizer = tools_run["tokenizer"]
    for _, _, seed, cut in seeded_rows(tools_run["batches"]):
        mask = seed.tool_mask
        assert mask[cut.k] == 1  # the next token is the model's: never inside a tool result
        if mask[cut.k - 1] == 1:  # inside a model turn: before its tool-call markup
            before = tokenizer.decode([int(t) for t in seed.completion_ids[: cut.k]], skip_special_tokens=False)
            turn = before.rsplit("<|im_start|>assistant\n", 1)[-1]
            assert "<" not in turn, turn


def test_seeded_rows_keep_their_prefix_turns_and_do_not_run_them_again(tools_run):
    found = 0
    for batch, i, seed, _ in seeded_rows(tools_run["batches"]):
        turns = batch["turns"][i]
        messages = batch["messages"][i]
        recorded = json.loads(seed.messages)
        assert messages[: len(turns.messages)] == recorded[: len(turns.messages)]
        found += bool(turns.tool_calls)
    assert found, "no seed was cut after a tool result"
    # The tool ran once per call the rollouts made after their prefixes, never for a prefix's recorded call.
    made = sum(
        sum(m["role"] == "tool" for m in b["messages"][i]) - len(b["turns"].get(i, af.NO_TURNS).observations)
        for b in tools_run["batches"]
        for i in range(len(b["messages"]))
    )
    assert made == len(tools_run["calls"])


def environment_run(tmp_path, factory, **overrides):
    tokenizer = af.build_agent_tokenizer()
    model = af.scripted_agent(tokenizer, calls=1)
    args = agent_config(tmp_path, **overrides)
    trainer = SeedGRPOTrainer(
        model, args=args, train_dataset=af.agent_prompts(2), processing_class=tokenizer, environment_factory=factory
    )
    return trainer, recorded_run(trainer)


@pytest.fixture(scope="module")
def counter_run(tmp_path_factory):
    return environment_run(tmp_path_factory.mktemp("env"), af.Counter)


def test_environment_run_replays_prefix_calls_and_seeds(counter_run):
    trainer, batches = counter_run
    history = trainer.state.log_history
    assert max(h.get("seeds/seeded_group_share", 0) for h in history) > 0
    assert [h["seeds/replay_mismatch_share"] for h in history if "seeds/replay_mismatch_share" in h] == [0.0] * len(
        [h for h in history if "seeds/replay_mismatch_share" in h]
    )
    assert max(h.get("seeds/replayed_tool_calls_mean", 0) for h in history) > 0
    replayed = 0
    for batch, i, seed, cut in seeded_rows(batches):
        turns = batch["turns"][i]
        replayed += len(turns.tool_calls)
        assert batch["ids"][i][: cut.k] == [int(t) for t in seed.completion_ids[: cut.k]]
        assert not any(batch["loss_mask"][i][: cut.k])
    assert replayed, "no seed was cut after a tool call"


def test_replay_mismatch_drops_the_seed_and_is_counted(tmp_path):
    trainer, batches = environment_run(tmp_path, af.Drifting)
    shares = [
        h["seeds/replay_mismatch_share"] for h in trainer.state.log_history if "seeds/replay_mismatch_share" in h
    ]
    # Only seeds cut after a call can mismatch; every one that was is dropped, and those groups run plain.
    assert shares and max(shares) > 0
    for batch, i, _, _ in seeded_rows(batches):  # no group kept a prefix whose calls were answered otherwise
        assert not batch["turns"][i].tool_calls


def test_replayed_calls_are_counted_per_row_still_seeded(tmp_path):
    """`seeds/replayed_tool_calls_mean` is the calls replayed per seeded row: rows whose group mismatched and ran
    plain are in neither the calls nor the rows. With a drifting environment every seed cut after a call mismatches,
    so the rows still seeded replayed nothing."""
    trainer, batches = environment_run(tmp_path, af.Drifting)
    history = trainer.state.log_history
    assert max(h.get("seeds/replay_mismatch_share", 0) for h in history) > 0  # calls were replayed, and mismatched
    means = [h["seeds/replayed_tool_calls_mean"] for h in history if "seeds/replayed_tool_calls_mean" in h]
    assert means and means == [0.0] * len(means)


def test_an_environment_that_cannot_replay_is_refused(tmp_path):
    tokenizer = af.build_agent_tokenizer()
    with pytest.raises(ValueError, match="replayable=False"):
        SeedGRPOTrainer(
            af.scripted_agent(tokenizer, calls=1),
            args=agent_config(tmp_path),
            train_dataset=af.agent_prompts(2),
            processing_class=tokenizer,
            environment_factory=af.Opaque,
        )
    plain = SeedGRPOTrainer(
        af.scripted_agent(tokenizer, calls=1),
        args=agent_config(tmp_path, seed_method="none"),
        train_dataset=af.agent_prompts(2),
        processing_class=tokenizer,
        environment_factory=af.Opaque,
    )
    assert plain.args.seed_method == "none"


def test_rollout_func_and_replay_with_tools_stay_refused(tmp_path):
    tokenizer = af.build_agent_tokenizer()
    model = af.scripted_agent(tokenizer, calls=1)
    with pytest.raises(ValueError, match="rollout_func"):
        SeedGRPOTrainer(
            model,
            af.last_digits_even,
            args=agent_config(tmp_path),
            train_dataset=af.agent_prompts(2),
            processing_class=tokenizer,
            rollout_func=lambda prompts, trainer: {},
        )
    with pytest.raises(ValueError, match="seed_method='replay'"):
        tools_trainer(model, tokenizer, agent_config(tmp_path, seed_method="replay"))


def test_action_mode_trains_prefix_model_tokens_with_their_weight_and_masks_tool_results(tmp_path):
    tokenizer = af.build_agent_tokenizer()
    trainer = tools_trainer(
        af.scripted_agent(tokenizer, calls=1), tokenizer, agent_config(tmp_path, prefix_mode="action")
    )
    batches = recorded_run(trainer)
    tool_tokens_in_prefixes = 0
    for batch, i, seed, cut in seeded_rows(batches):
        origin_mask = [int(x) for x in seed.tool_mask[: cut.k]]
        assert batch["loss_mask"][i][: cut.k] == origin_mask  # model tokens trained, tool results never
        tool_tokens_in_prefixes += origin_mask.count(0)
    assert tool_tokens_in_prefixes, "no prefix held a tool result"
    ratios = [h["seeds/prefix_is_ratio_mean"] for h in trainer.state.log_history if "seeds/prefix_is_ratio_mean" in h]
    assert ratios and all(0 < r <= trainer.args.prefix_is_clip for r in ratios)


def test_seed_shards_hold_openai_messages_and_resume_rebuilds_the_turns(tools_run, tmp_path):
    from pathlib import Path

    from datasets import load_dataset

    output_dir = Path(tools_run["output_dir"])
    shards = sorted(str(p) for p in (output_dir / "seeds").glob("step-*.parquet"))
    rows = load_dataset("parquet", data_files=shards, split="train")
    assert {"tool_mask", "messages"} <= set(rows.column_names)
    row = next(r for r in rows if any(m["role"] == "tool" for m in r["messages"]))
    call = next(m for m in row["messages"] if m["tool_calls"])["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "add"
    assert set(json.loads(call["function"]["arguments"])) == {"a", "b"}
    assert len(row["tool_mask"]) == len(row["completion_ids"]) and 0 in row["tool_mask"]

    original = tools_run["trainer"].seed_bank
    tokenizer = tools_run["tokenizer"]
    resumed = tools_trainer(af.scripted_agent(tokenizer, calls=1), tokenizer, agent_config(output_dir))
    resumed.seed_store.start(str(output_dir / "checkpoint-2"))
    bank = resumed.seed_bank
    assert len(bank) > 0
    for index in range(len(bank)):
        seed = bank.get(index)
        before = original.get(next(i for i in range(len(original)) if original.get(i).rollout_id == seed.rollout_id))
        assert seed.tool_mask is not None and seed.tool_mask.tolist() == before.tool_mask.tolist()
        assert json.loads(seed.messages) == json.loads(before.messages)
        assert seed.completion_ids.tolist() == before.completion_ids.tolist()


# A fake engine: the default suite has no vLLM, and the scripted agent makes every turn known. The real engine's tool
# run is tests/trainer/test_vllm_real.py's.
@pytest.mark.parametrize("prefix_mode", ["state", "action"])
def test_colocate_vllm_seeds_tool_runs(tmp_path, monkeypatch, prefix_mode):
    """TRL's colocate vLLM backend (a scripted stand-in for `LLM`): tool runs seed, the first turn's budget is what
    the prefix leaves, and a seeded request's prompt ends with its prefix's turns."""
    import os

    import trl.generation.vllm_generation as generation

    from tests.support.vllm_server import pretend_vllm_is_installed

    pretend_vllm_is_installed(monkeypatch.setattr)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # TRL's colocate set-up sets them
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.setenv(name, "")
            monkeypatch.delenv(name)
    tokenizer = af.build_agent_tokenizer()
    engine = af.scripted_fake_llm(tokenizer)
    monkeypatch.setattr(generation, "LLM", engine)
    args = agent_config(
        tmp_path, use_vllm=True, vllm_mode="colocate", vllm_max_model_length=4096, prefix_mode=prefix_mode
    )
    trainer = tools_trainer(af.scripted_agent(tokenizer, calls=1), tokenizer, args)
    batches = recorded_run(trainer)
    rows = list(seeded_rows(batches))
    assert rows
    llm = engine.instances[-1]
    requests = {tuple(r["prompt_token_ids"]): r["max_tokens"] for r in llm.requests}
    for batch, i, seed, cut in rows:
        origin = [int(t) for t in seed.completion_ids[: cut.k]]
        assert batch["ids"][i][: cut.k] == origin
        expected = [int(x) for x in seed.tool_mask[: cut.k]] if prefix_mode == "action" else [0] * cut.k
        assert batch["loss_mask"][i][: cut.k] == expected
        sent = [p for p in requests if list(p[-cut.k :]) == origin]
        assert sent and all(requests[p] == MAX_COMPLETION - cut.k for p in sent)


# A fake server: TRL's weight transfer to a server is NCCL only, so no CPU server could take the weight sync.
def test_server_vllm_seeds_tool_runs(tmp_path, monkeypatch):
    """TRL's server vLLM backend against the local stand-in, answering with the script: tool runs seed, and each
    seeded group's request asks for the budget its prefix leaves."""
    import tests.support.vllm_server as stand_in

    tokenizer = af.build_agent_tokenizer()
    monkeypatch.setattr(stand_in, "sample_completion", af.scripted_sampler(tokenizer))
    server = stand_in.LocalVLLMServer(range(len(tokenizer)), tokenizer.eos_token_id, 4096).start()
    try:
        stand_in.pretend_vllm_is_installed(monkeypatch.setattr, stand_in.FakeWeightReceiver(server.received_weights))
        args = agent_config(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_base_url=server.endpoint)
        trainer = tools_trainer(af.scripted_agent(tokenizer, calls=1), tokenizer, args)
        batches = recorded_run(trainer)
    finally:
        server.stop()
    assert server.refused == []
    rows = list(seeded_rows(batches))
    assert rows
    asked = {}
    for completion in server.completions:
        for prompt in completion["prompt"]:
            asked.setdefault(tuple(prompt), set()).add(completion["max_tokens"])
    for batch, i, seed, cut in rows:
        origin = [int(t) for t in seed.completion_ids[: cut.k]]
        assert batch["ids"][i][: cut.k] == origin
        assert not any(batch["loss_mask"][i][: cut.k])
        # (the origin's own tool-loop request may end the same way, asked with TRL's whole budget, at an earlier step)
        sent = [p for p in asked if list(p[-cut.k :]) == origin]
        assert sent and any(MAX_COMPLETION - cut.k in asked[p] for p in sent)


def test_generated_token_counts_leave_out_prefixes_and_tool_results(tools_run):
    history = [h for h in tools_run["trainer"].state.log_history if "seeds/generated_tokens" in h]
    assert len(history) == len(tools_run["batches"])
    for logged, batch in zip(history, tools_run["batches"]):
        cuts = batch["plan"].cuts
        expected = sum(sum(mask[c.k if c is not None else 0 :]) for mask, c in zip(batch["tool_masks"], cuts))
        assert logged["seeds/generated_tokens"] == expected
        lengths = [sum(mask[c.k if c is not None else 0 :]) for mask, c in zip(batch["tool_masks"], cuts)]
        assert logged["completions/mean_length"] == pytest.approx(sum(lengths) / len(lengths))


def test_continuous_batching_seeds_tool_runs(tmp_path):
    """`use_transformers_continuous_batching`, which TRL runs the tool loop with as with `generate`: a seeded row's
    prefix, tool results included, reaches `generate_batch` as prompt ids (nothing forced), and it stays in budget.
    The engine is a stand-in (`agent_fixtures.scripted_generate_batch`); tests/trainer/test_trl_settings.py runs the real one."""
    tokenizer = af.build_agent_tokenizer()
    model = af.scripted_agent(tokenizer, calls=1)
    requests = af.scripted_generate_batch(model, tokenizer)
    trainer = tools_trainer(model, tokenizer, agent_config(tmp_path, use_transformers_continuous_batching=True))
    batches = recorded_run(trainer)
    rows = list(seeded_rows(batches))
    assert rows and any(0 in seed.tool_mask[: cut.k] for _, _, seed, cut in rows)
    for batch, i, seed, cut in rows:
        origin = [int(t) for t in seed.completion_ids[: cut.k]]
        assert batch["ids"][i][: cut.k] == origin
        assert not any(batch["loss_mask"][i][: cut.k]) and any(batch["loss_mask"][i][cut.k :])
        assert len(batch["ids"][i]) <= MAX_COMPLETION
        sent = [r for r in requests if r["prompt_ids"][-cut.k :] == origin]
        # (the origin's own tool-loop request may end the same way, asked with the whole budget, at an earlier step)
        assert sent and any(r["max_new_tokens"] < MAX_COMPLETION for r in sent)  # a seeded batch's budget
