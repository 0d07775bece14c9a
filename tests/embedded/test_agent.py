"""The built-in agent tasks: markup TRL parses, a replayable register, and training through TRL's tool loop."""

import json
import random

import pytest
from trl.chat_template_utils import is_chat_template_prefix_preserving, parse_response, supports_tool_calling

from tests.conftest import TINY_SETTINGS
from ts_trl import SeedGRPOConfig, SeedGRPOTrainer
from ts_trl.embedded.agent import (
    AgentTask,
    RegisterMachine,
    add,
    agent_reward,
    build_agent_tokenizer,
    sample_agent_rewards,
    tool_calls_made,
)
from ts_trl.embedded.warmup import DEFAULT_MODEL_KWARGS, warm_up
from ts_trl.tiny import build_tiny_model

WARM_UP_STEPS = 40  # enough for well-formed calls in most rollouts (not for right answers)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """One warm model per tool, built once per module (cached on disk under the test's temporary folder)."""
    cache, models = tmp_path_factory.mktemp("agent-warmup"), {}

    def get(tool):
        if tool not in models:
            tokenizer = build_agent_tokenizer()
            model = build_tiny_model(tokenizer, **DEFAULT_MODEL_KWARGS)
            warm_up(model, tokenizer, AgentTask(tool=tool), steps=WARM_UP_STEPS, cache_dir=cache, progress=False)
            models[tool] = tokenizer, model
        return models[tool]

    return get


def test_template_renders_and_parses_the_tool_markup():
    tokenizer = build_agent_tokenizer()
    assert supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)
    task = AgentTask(tool="calculator", seed=3)
    problem = task.sample_problem(random.Random(0))
    rng = random.Random(1)
    turns = task.turns(problem, random.Random(1))
    # The conversation TRL's loop builds renders to exactly the warm-up's text (plus the template's last newline).
    messages = [{"role": "user", "content": "+".join(map(str, problem.operands))}]
    for text, result in turns:
        parsed = parse_response(tokenizer, tokenizer(text + "<eos>")["input_ids"], prefix=[], tools=[add])
        messages.append(parsed)
        if result:
            call = parsed["tool_calls"][0]["function"]
            assert call["name"] == "add" and str(add(**call["arguments"])) == result  # typed ints, not strings
            messages.append({"role": "tool", "name": "add", "content": result})
    assert parsed == {"role": "assistant", "content": f"#### {problem.answer}"}
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, tools=[add])
    assert rendered == problem.prompt + task.sample_solution(problem, rng) + "\n"
    prompt = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False)
    assert prompt == problem.prompt


def test_warm_up_trains_model_turns_only():
    tokenizer, task = build_agent_tokenizer(), AgentTask(tool="register")
    problem = task.sample_problem(random.Random(0))
    _, ids, labels = task.warm_up_example(tokenizer, problem, random.Random(2))
    trained = tokenizer.decode([i for i, label in zip(ids, labels) if label != -100])
    assert "R:" not in trained and trained.endswith(f"#### {problem.answer}<eos>")
    assert trained.count("[add n=") == len(problem.operands)


def test_register_replays_its_observations_and_scores_the_calls():
    row = {"prompt": [{"role": "user", "content": "7+15+9"}], "answer": "31"}
    first, second = RegisterMachine(), RegisterMachine()
    first.reset(**row)
    observed = [first.add(15), first.add(7), first.read()]
    assert first.get_reward() == 0.0  # 9 not added yet
    assert first.add(9) == 31 and first.get_reward() == 1.0
    second.add(100)  # state from an earlier rollout is gone after reset
    second.reset(**row)
    assert [second.add(15), second.add(7), second.read()] == observed == [15, 22, 22]
    assert agent_reward([[{"role": "assistant", "content": "#### 31"}]], ["31"]) == [1.0]
    assert agent_reward([[{"role": "assistant", "content": "#### 30"}]], ["31"]) == [0.0]


@pytest.mark.parametrize("tool", ["calculator", "register"])
def test_trains_through_trls_tool_loop(tool, warm, tmp_path, capsys):
    """`trainer.train()` with plain TRL rollouts (seed_method="none"): the model calls tools in some rollouts."""
    tokenizer, model = warm(tool)
    task = AgentTask(tool=tool)
    train, held_out = task.make_splits(16, 8)
    rewards = sample_agent_rewards(
        model, tokenizer, held_out, task, task.max_completion_tokens, num_samples=2, progress=True
    )
    assert len(rewards) == 8 and all(len(r) == 2 for r in rewards)
    assert "held-out rollouts" in capsys.readouterr().err  # the held-out evaluation's bar
    calls, environments = [], []

    def counting_reward(completions, answer, **kwargs):
        calls.append(tool_calls_made(completions))
        return agent_reward(completions, answer)

    def factory():
        environments.append(RegisterMachine())
        return environments[-1]

    config = SeedGRPOConfig(
        **{
            **TINY_SETTINGS,
            "output_dir": str(tmp_path),
            "max_steps": 2,
            "save_steps": 10,
            "max_completion_length": task.max_completion_tokens,
        },
        seed_method="none",
    )
    trainer = SeedGRPOTrainer(
        model=model,
        reward_funcs=counting_reward,
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        tools=task.tools or None,
        environment_factory=factory if tool == "register" else None,
    )
    trainer.train()
    logged = [h for h in trainer.state.log_history if "tools/call_frequency" in h]
    assert len(calls) == 2 and sum(calls) > 0
    assert sum(h["tools/call_frequency"] for h in logged) > 0
    if tool == "register":
        assert "rewards/RegisterMachine/mean" in logged[0]
        assert any(env.added for env in environments)  # tool calls reached the environments' state


def test_ts_trl_train_runs_an_agent_task(tmp_path, monkeypatch):
    """`ts_trl train --task register` (plain rollouts until seeding supports tools): the environment reaches the
    trainer, the tool loop runs, and held-out pass@1 is sampled through the tool loop."""
    from ts_trl.cli.train import run

    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    argv = ["--task", "register", "--seed_method", "none", "--max_steps", "2", "--per_device_train_batch_size", "16"]
    argv += ["--embedded_warmup_steps", "30", "--embedded_eval_problems", "8", "--embedded_eval_samples", "2"]
    assert run(argv + ["--output_dir", str(out), "--logging_steps", "1", "--disable_tqdm", "true"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["held_out_pass@1_before"] is not None and report["held_out_pass@1_after"] is not None
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(row.get("tools/call_frequency", 0) for row in logged) > 0
    assert any("rewards/RegisterMachine/mean" in row for row in logged)


def test_compare_runs_on_an_agent_task(tmp_path, monkeypatch):
    """`ts_trl compare --task calculator`: warm-up, probe, held-out scoring and a plain run through the tool loop."""
    from ts_trl.analysis.compare import main

    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))
    argv = ["--task", "calculator", "--quick", "--methods", "none", "--num-seeds", "1", "--steps", "2"]
    argv += ["--warmup-steps", "30", "--n-eval", "8", "--eval-samples", "8", "--n-probe", "4", "--n-train", "16"]
    rows = main(argv + ["--jobs", "1", "--output-dir", str(tmp_path / "compare")])
    assert [row["method"] for row in rows] == ["none"] and rows[0]["steps"] == 2
    assert "Agent task calculator" in (tmp_path / "compare" / "compare.md").read_text()
    run = json.loads((tmp_path / "compare" / "runs" / "none-seed0" / "output.json").read_text())
    assert run["output"]["result"]["generated_tokens"] > 0


def test_single_turn_commands_refuse_the_agent_tasks():
    from ts_trl.analysis.common import InputError, load_prompts
    from ts_trl.analysis.probe_cuts import main as probe_cuts

    with pytest.raises(InputError, match="--task register: probe-cuts samples single-turn"):
        probe_cuts(["--task", "register"])
    with pytest.raises(InputError, match="--task calculator: relay and positions"):
        load_prompts("embedded", task="calculator")
    assert len(load_prompts("embedded", limit=4, task="add")) == 4  # the others still load
