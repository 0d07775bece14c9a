"""Equivalents of TRL's GRPO tests with `tools` or `environment_factory`, run with SeedGRPOTrainer and seeding on.

TRL's own test files are not run here: they are not installed with TRL 1.16, and each loads Hub models and datasets
(`trl-internal-testing/...`), which this offline CPU suite cannot download. Each case below restates what one TRL
test checks (from TRL's `tests/test_grpo_trainer.py`), on the offline scripted agent of `agent_fixtures`, and adds
what seeding must also get right: that seeds were drawn, and that a seeded rollout's state is the right one.

TRL test                                               -> here
test_train_with_tools[multiply_tool]                   -> TRAINING["sync_tool"]
test_train_with_tools[async_multiply_tool]             -> TRAINING["async_tool"]
  (its failing call)                                   -> TRAINING["failing_tool"]
test_train_with_malformed_tool_calls                   -> TRAINING["malformed_tool_call"]
test_train_with_environment_factory                    -> TRAINING["environment"]; without a dataset (TRL's
                                                          placeholder prompt) -> TRAINING["environment_no_dataset"]
test_environment_owned_reward_coexists_with_reward_funcs -> TRAINING["environment"] (names, weights, reward)
test_train_with_environment_owned_reward               -> TRAINING["environment_owned_reward"]
test_train_with_multiple_environments                  -> TRAINING["environment_dict"]; its routing-only dataset
                                                          (reset() makes each prompt) -> TRAINING["routing_only"]
test_environment_owned_reward_mixed_environments       -> TRAINING["environment_dict"] (one class owns its reward)
test_train_with_environment_owned_data                 -> TRAINING["owned_data"] (no dataset, reset() makes the
                                                          prompt); from a task column -> TRAINING["environment_owned_
                                                          prompt"]; a fresh task at each reset (prompts that never
                                                          come back) -> test_prompts_reset_never_makes_again_never_seed
test_train_with_unknown_environment_raises             -> test_unknown_environment_raises_at_train
test_dataset_required_without_environment,
test_environment_owned_data_requires_max_steps,
test_multiple_environments_without_dataset_raises      -> TRL_RAISES (TRL's own error comes first)
test_train_with_tools_multimodal_response              -> test_multimodal_tools_are_refused
"""

import json

import pytest
import torch
from datasets import Dataset

from tests.support import agent_fixtures as af
from tests.trainer.test_agentic import agent_config
from ts_trl import SeedGRPOTrainer
from ts_trl.store.schema import prompt_id_of


class LoggedCounter(af.Counter):
    """`af.Counter` that keeps the calls made since its last reset (the replayed ones included)."""

    def reset(self, **row):
        assert "environment" not in row  # TRL's routing field is not for reset
        super().reset(**row)
        self.calls = []

    def add(self, a: int, b: int) -> int:
        """Adds two numbers to the running total.

        Args:
            a: The first number.
            b: The second number.
        """
        self.calls.append({"a": a, "b": b})
        return super().add(a, b)


class Hundreds:
    """A second environment for routing: its `add` answers 100 more than a counter's, and it owns no reward."""

    def reset(self, **row):
        assert "environment" not in row
        self.total, self.calls = 0, []

    def add(self, a: int, b: int) -> int:
        """Adds two numbers, plus one hundred.

        Args:
            a: The first number.
            b: The second number.
        """
        self.calls.append({"a": a, "b": b})
        self.total = a + b + 100
        return self.total


class Tasked(LoggedCounter):
    """Owns its prompt: `reset(**row)` returns the task of the row (TRL appends it to an empty user message)."""

    def reset(self, task: int, **row):
        super().reset(**row)
        return f"Add {task} and {task + 1}."


class CountingTask(LoggedCounter):
    """TRL's routing test's counter: the row holds only `environment`, and `reset()` returns the prompt."""

    def reset(self, **row):
        super().reset(**row)
        return "Add 1 and 2."


class HundredsTask(Hundreds):
    """The routing test's other environment, whose `reset()` returns another prompt."""

    def reset(self, **row):
        super().reset(**row)
        return "Add 3 and 4."


class OwnedTask(LoggedCounter):
    """TRL's environment-owned data: no dataset at all (TRL's placeholder row), and `reset()` returns the prompt."""

    def reset(self, **row):
        super().reset(**row)
        return "Add 5 and 6."


class FreshTask(LoggedCounter):
    """Draws a new task at every reset, as a procedurally generated environment does: no prompt ever comes back."""

    draws = 0

    def reset(self, **row):
        super().reset(**row)
        FreshTask.draws += 1
        return f"Add {FreshTask.draws} and {FreshTask.draws + 1}."


class Unsteady(LoggedCounter):
    """Returns its prompt at TRL's reset but another one when reset again within a generation batch (the undo of a
    replay), and starts each batch's total at the batch's number, so that no replay answers as recorded."""

    batch = 0  # generation batches scored so far (`counting_batches` counts them)

    def reset(self, **row):
        again = getattr(self, "reset_in", None) == Unsteady.batch
        super().reset(**row)
        self.reset_in = self.total = Unsteady.batch
        return "Add 9 and 9." if again else "Add 1 and 2."


def counting_batches(completions, **kwargs):
    """`last_digits_even`, counting the generation batches it scores (once each) for `Unsteady`."""
    Unsteady.batch += 1
    return af.last_digits_even(completions, **kwargs)


def malformed(turn: str) -> str:
    """The scripted tool call without its tool name: TRL's parser finds no call in it."""
    return turn.replace('"name": "add", ', "")


# Each case: the trainer's arguments, the dataset, the config overrides, and the call turn the scripted agent makes.
TRAINING = {
    "sync_tool": dict(tools=[af.add]),
    "async_tool": dict(tools=[af.async_add], tool="async_add"),
    "failing_tool": dict(tools=[af.failing_add], tool="failing_add"),
    "malformed_tool_call": dict(tools=[af.add], call_turn=malformed),
    # Environments: cuts at turn boundaries only, so every seed is cut after its call and replays it.
    "environment": dict(environment_factory=LoggedCounter, config=dict(reward_weights=[0.5]), turns_only=True),
    "environment_owned_reward": dict(environment_factory=LoggedCounter, reward_funcs=None, turns_only=True),
    "environment_dict": dict(environment_factory={"counter": LoggedCounter, "hundreds": Hundreds}, turns_only=True),
    "environment_owned_prompt": dict(environment_factory=Tasked, data="tasks", turns_only=True, made="Add 3 and 4."),
    # reset() makes the prompt with no prompt column at all: seeds are keyed by the prompt it made.
    "environment_no_dataset": dict(environment_factory=LoggedCounter, data="none", turns_only=True),
    "owned_data": dict(environment_factory=OwnedTask, data="none", turns_only=True, made="Add 5 and 6."),
    "routing_only": dict(
        environment_factory={"counter": CountingTask, "hundreds": HundredsTask}, data="routing", turns_only=True
    ),
}
MADE_BY = {CountingTask: "Add 1 and 2.", HundredsTask: "Add 3 and 4."}  # routing_only: each class's prompt


def dataset_for(case: str) -> Dataset | None:
    data = TRAINING[case].get("data")
    if data == "tasks":  # no prompt column: the environment makes the prompt from the row
        return Dataset.from_list([{"task": 3}])
    if data == "none":  # TRL builds a placeholder dataset of empty prompts; max_steps sets the length
        return None
    if data == "routing":  # TRL's routing-only dataset: each row names its environment, reset() makes the prompt
        return Dataset.from_list([{"environment": e} for e in ("counter", "hundreds")])
    if isinstance(TRAINING[case].get("environment_factory"), dict):
        rows = [("counter", "Add 1 and 2."), ("hundreds", "Add 3 and 4.")]
        return Dataset.from_list([{"prompt": [{"role": "user", "content": c}], "environment": e} for e, c in rows])
    return af.agent_prompts(1)


def recorded_training(trainer) -> list[dict]:
    """Trains, keeping each generation batch's plan, prefix turns, completions, rewards and environment states."""
    batches, record = [], trainer._record_rollouts

    def spy(inputs, output, batch):
        batches.append(
            {
                "plan": batch.plan,
                "turns": dict(batch.turns or {}),
                "inputs": list(inputs),
                "messages": batch.generation.completions,
                "rewards": batch.generation.rewards_per_func.tolist(),
                "prompts": trainer.processing_class.batch_decode(output["prompt_ids"], skip_special_tokens=True),
                "made": list(getattr(batch, "prompts", None) or []),
                "keys": list(getattr(batch, "keys", None) or []),
                "environments": [
                    (type(e), getattr(e, "total", None), list(getattr(e, "calls", [])))
                    for e in trainer.environments or []
                ],
            }
        )
        return record(inputs, output, batch)

    trainer._record_rollouts = spy
    trainer.train()
    return batches


def calls_in(messages: list[dict]) -> list[dict]:
    """The arguments of every tool call in a rollout's messages, in order."""
    calls = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            arguments = call["function"]["arguments"]
            calls.append(json.loads(arguments) if isinstance(arguments, str) else arguments)
    return calls


def check_environments(trainer, batches: list[dict], factory) -> None:
    """Each rollout ran in an environment of its row's class, which saw exactly the rollout's calls (a seeded row's
    replayed prefix calls first); an environment-owned reward is that environment's, so it sees the replayed state."""
    class_of = factory if isinstance(factory, dict) else {None: factory}
    owned = [n for n in trainer.reward_func_names if n in {c.__name__ for c in class_of.values()}]
    replayed = set()  # the classes some seeded rollout replayed its prefix's calls in
    for batch in batches:
        for i, (kind, total, calls) in enumerate(batch["environments"]):
            assert kind is class_of[batch["inputs"][i].get("environment")]
            messages = batch["messages"][i]
            assert calls == calls_in(messages)
            results = [m["content"] for m in messages if m["role"] == "tool"]
            assert str(total) == (results[-1] if results else "0")  # the state is the transcript's last result
            prefix = batch["turns"].get(i, af.NO_TURNS)
            if prefix.observations:
                replayed.add(kind)
            for name in owned:
                reward = batch["rewards"][i][trainer.reward_func_names.index(name)]
                if kind.__name__ == name:
                    assert reward == float(total % 2 == 0)
                else:
                    assert reward != reward  # NaN: another class's reward does not score this rollout
    assert replayed == set(class_of.values()), (
        f"no seeded rollout replayed a call in {set(class_of.values()) - replayed}"
    )


@pytest.mark.parametrize("case", list(TRAINING))
def test_trl_multi_turn_training_with_seeding(case, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    options = dict(TRAINING[case])
    tool, call_turn, config = options.pop("tool", "add"), options.pop("call_turn", None), options.pop("config", {})
    if options.pop("turns_only", False):
        config = {**config, "agent_cut_points": "turns"}
    options.pop("data", None), options.pop("made", None)
    turn = af.CALL_TURN.replace('"add"', f'"{tool}"')
    monkeypatch.setattr(af, "CALL_TURN", call_turn(turn) if call_turn else turn)
    tokenizer = af.build_agent_tokenizer()
    dataset = dataset_for(case)
    prompts = len(dataset) if dataset is not None else 1
    trainer = SeedGRPOTrainer(
        af.scripted_agent(tokenizer, calls=1),
        options.pop("reward_funcs", af.last_digits_even),
        args=agent_config(tmp_path, learning_rate=0.1, per_device_train_batch_size=4 * prompts, max_steps=2, **config),
        train_dataset=dataset,
        processing_class=tokenizer,
        **options,
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    af.CALLS.clear()
    batches = recorded_training(trainer)

    history = trainer.state.log_history
    assert history[-1]["train_loss"] is not None
    assert max(h.get("seeds/seeded_group_share", 0) for h in history) > 0
    unchanged = [n for n, p in trainer.model.named_parameters() if torch.equal(p, before[n])]
    assert not unchanged, f"parameters not updated: {unchanged}"
    calls = [h["tools/call_frequency"] for h in history if "tools/call_frequency" in h]
    failures = [h["tools/failure_frequency"] for h in history if "tools/failure_frequency" in h]
    if case == "malformed_tool_call":  # no call parsed, so no second generation and no tool run
        assert max(calls, default=0) == 0
        assert all(m["role"] == "assistant" for b in batches for row in b["messages"] for m in row)
        return
    assert max(calls) > 0
    assert max(failures) == (1.0 if case == "failing_tool" else 0.0)
    if case == "sync_tool":  # the tool ran for the calls made after each prefix, never again for a prefix's own
        made = [m["role"] == "tool" for b in batches for row in b["messages"] for m in row]
        restored = [len(p.observations) for b in batches for p in b["turns"].values()]
        assert sum(restored) > 0 and len(af.CALLS) == sum(made) - sum(restored)
    if "environment_factory" not in TRAINING[case]:
        return
    if case == "environment":  # an environment-owned reward comes after the trainer's, with weight 1
        assert trainer.reward_func_names == ["last_digits_even", "LoggedCounter"]
        assert trainer.reward_weights.tolist() == [0.5, 1.0]
    if case == "environment_owned_reward":
        assert trainer.reward_func_names == ["LoggedCounter"]
    if case == "environment_dict":  # one column for the class that owns a reward; the other's rows are NaN there
        assert trainer.reward_func_names == ["last_digits_even", "LoggedCounter"]
        assert [t.__name__ for t in trainer._env_tools["hundreds"]] == ["add"]
    assert [h["seeds/replay_mismatch_share"] for h in history if "seeds/replay_mismatch_share" in h] == [0.0]
    check_environments(trainer, batches, TRAINING[case]["environment_factory"])
    check_made_prompts(case, batches)


def check_made_prompts(case: str, batches: list[dict]) -> None:
    """Every rollout, seeded or not, was generated from the prompt its reset made, and was keyed by that prompt: a
    seeded row's seed was banked under it. Where reset returns nothing, TRL's placeholder prompt is the row's."""
    factory = TRAINING[case]["environment_factory"]
    for batch in batches:
        assert len(batch["keys"]) == len(batch["environments"])
        for i, (kind, _, _) in enumerate(batch["environments"]):
            made = TRAINING[case].get("made") or MADE_BY.get(kind)
            if made is None:
                continue
            assert made in batch["prompts"][i]
            assert batch["keys"][i] == prompt_id_of([{"role": "user", "content": made}])
            seed = batch["plan"].seeds[i]
            assert seed is None or seed.prompt_id == batch["keys"][i]
    if TRAINING[case].get("data") == "none" and not TRAINING[case].get("made"):  # the placeholder is the prompt
        assert all(batch["keys"] == [prompt_id_of([{"role": "user", "content": ""}])] * 4 for batch in batches)
    if isinstance(factory, dict) and TRAINING[case].get("data") == "routing":  # two prompts, each seeded from its own
        assert len({key for batch in batches for key in batch["keys"]}) == 2


def construct(tmp_path, dataset, reward_funcs=af.last_digits_even, processing_class=None, model=None, **kwargs):
    tokenizer = af.build_agent_tokenizer()
    return SeedGRPOTrainer(
        model or af.scripted_agent(tokenizer, calls=1),
        reward_funcs,
        args=agent_config(tmp_path, **kwargs.pop("config", {})),
        train_dataset=dataset,
        processing_class=processing_class or tokenizer,
        **kwargs,
    )


# TRL's own construction errors come first, seeding on or not.
TRL_RAISES = {
    "dataset_required_without_environment": (dict(), "`train_dataset` is required"),
    "environment_owned_data_requires_max_steps": (
        dict(environment_factory=LoggedCounter, config=dict(max_steps=-1)),
        "max_steps",
    ),
    "multiple_environments_without_dataset": (
        dict(environment_factory={"counter": LoggedCounter, "hundreds": Hundreds}),
        "requires a `train_dataset`",
    ),
}


@pytest.mark.parametrize("case", list(TRL_RAISES))
def test_trl_construction_errors_come_first(case, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    options, message = TRL_RAISES[case]
    with pytest.raises(ValueError, match=message):
        construct(tmp_path, None, **options)


# A seed dataset is matched to the training prompts at construction, before reset() has made any: refused with one
# line where reset() makes them, and plain runs still build.
REFUSED = {
    "seed_dataset_without_prompts": (Dataset.from_list([{"task": 1}, {"task": 2}]), Tasked),
    "seed_dataset_without_dataset": (None, OwnedTask),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_seed_dataset_with_prompts_reset_makes_is_refused(case, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    dataset, factory = REFUSED[case]
    with pytest.raises(ValueError, match="matched to the training prompts") as refused:
        construct(tmp_path, dataset, environment_factory=factory, config=dict(seed_dataset="org/traces"))
    assert "\n" not in str(refused.value)
    construct(tmp_path, dataset, environment_factory=factory, config=dict(seed_method="none"))


def test_prompts_reset_never_makes_again_never_seed(tmp_path, monkeypatch, caplog):
    """An environment that draws a fresh task at every reset (TRL's environment-owned data, procedurally generated):
    the run is not refused and trains, no prompt comes back so nothing is seeded, and the log says why, once."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = construct(tmp_path, None, environment_factory=FreshTask, config=dict(max_steps=3, learning_rate=0.1))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with caplog.at_level("WARNING"):
        batches = recorded_training(trainer)
    history = trainer.state.log_history
    assert history[-1]["train_loss"] is not None
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    assert len(batches) == 3 and all(seed is None for b in batches for seed in b["plan"].seeds)
    assert max(h.get("seeds/seeded_group_share", 0) for h in history) == 0
    assert max(h.get("seeds/eligible_group_share", 0) for h in history) == 0
    made = [prompt for b in batches for prompt in b["made"]]
    assert len({json.dumps(p) for p in made}) == len(made) == 3 * 8  # each of the 8 rollouts a step: its own prompt
    told = [r for r in caplog.records if "made another prompt" in r.getMessage()]
    assert len(told) == 1 and "never seeded" in told[0].getMessage()


def test_unknown_environment_raises_at_train(tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    rows = [{"prompt": [{"role": "user", "content": "Add 1 and 2."}], "environment": "unknown"}] * 2
    trainer = construct(tmp_path, Dataset.from_list(rows), environment_factory={"counter": LoggedCounter})
    with pytest.raises(ValueError, match="not among the environments"):
        trainer.train()


# A chat template for the tiny vision-language model: text or content parts, and Qwen-style tool calls.
VLM_TEMPLATE = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
    "{%- if m.content is string -%}{{ m.content }}{%- else -%}{%- for p in m.content -%}"
    "{%- if p.type == 'text' -%}{{ p.text }}{%- else -%}<image>{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- for c in m.tool_calls or [] -%}<tool_call>\n{{ c.function | tojson }}\n</tool_call>{%- endfor -%}"
    "<|im_end|>\n{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


def tiny_vision_language_model():
    """A one-layer Llava and its processor, built offline on the character tokenizer."""
    import transformers
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration
    from trl.chat_template_utils import add_response_schema

    tokenizer = af.build_agent_tokenizer()
    add_response_schema(tokenizer)  # Qwen's tool-call parsing; the processor's own template is VLM_TEMPLATE
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<image>"]})
    images = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
    processor = transformers.LlavaProcessor(
        image_processor=images(), tokenizer=tokenizer, patch_size=14, chat_template=VLM_TEMPLATE, image_token="<image>"
    )
    small = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(image_size=28, patch_size=14, **small),
        text_config=LlamaConfig(vocab_size=len(tokenizer), num_key_value_heads=1, **small),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
    )
    return LlavaForConditionalGeneration(config), processor


def test_multimodal_tools_are_refused(tmp_path):
    """A tool may answer a vision-language model with images (TRL's multimodal tool responses); a seed keeps token
    ids, not images, so seeding refuses tools on such a model at construction, and plain GRPO still builds."""
    model, processor = tiny_vision_language_model()
    with pytest.raises(ValueError, match="vision-language model") as refused:
        construct(tmp_path, af.agent_prompts(2), model=model, processing_class=processor, tools=[af.add])
    assert "\n" not in str(refused.value)
    plain = construct(
        tmp_path,
        af.agent_prompts(2),
        model=model,
        processing_class=processor,
        tools=[af.add],
        config=dict(seed_method="none"),
    )
    assert plain._is_vlm


def test_undoing_a_replay_whose_reset_makes_another_prompt_is_said_once(tmp_path, monkeypatch, caplog):
    """A replay that answers otherwise than recorded is undone by resetting the environment with its row again; where
    that reset makes another prompt than the row is generated from, the log says so once, and training goes on."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    monkeypatch.setattr(Unsteady, "batch", 0)
    trainer = construct(
        tmp_path,
        None,
        reward_funcs=counting_batches,
        environment_factory=Unsteady,
        config=dict(max_steps=3, agent_cut_points="turns"),
    )
    with caplog.at_level("WARNING"):
        trainer.train()
    history = trainer.state.log_history
    assert history[-1]["train_loss"] is not None
    assert max(h.get("seeds/replay_mismatch_share", 0) for h in history) > 0
    told = [r for r in caplog.records if "called again to undo a replay" in r.getMessage()]
    assert len(told) == 1
    assert not [r for r in caplog.records if "made another prompt for a row" in r.getMessage()]
