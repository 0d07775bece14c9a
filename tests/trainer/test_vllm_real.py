"""A real vLLM engine on CPU under `trainer.train()`: SmolLM2-135M-Instruct in TRL's colocate mode, seeded.

Runs only in the virtualenv `.ci/vllm-cpu-env` builds (`python -m pytest -m vllm` there; docs/vllm-cpu.md). The engine
is vLLM's own: its scheduler, sampler, log-probs, request validation and weight loading. One engine serves the whole
module (it takes seconds to start and a few hundred MB): every trainer built here gets it from TRL's `LLM(...)` call,
and TRL loads the trainer's weights into it at its first step, as it does at every step. What a CPU engine cannot
show (NCCL weight transfer, sleep mode, tensor parallelism) stays with the fakes of tests/trainer/test_vllm.py.
"""

from __future__ import annotations

import os
import shutil

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; without it vLLM asks for most of the machine's memory

import numpy as np
import pytest
import torch

from tests.conftest import seed_rows
from tests.test_real_model import BUDGET, chat_prompts, lines_reward, lora
from tests.test_real_model import config as real_model_config
from ts_trl import SeedGRPOTrainer, smollm2_135m_instruct

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm", reason="a real vLLM engine: run in the virtualenv of .ci/vllm-cpu-env")

# Eager: without it vLLM compiles the model for minutes on CPU. float32: on CPU faster than bf16, and the trainer's.
ENGINE = {"enforce_eager": True, "dtype": "float32"}
MAX_MODEL_LEN = 256  # the chat prompts (~40 tokens) and the budget, and little KV cache to reserve


class EngineRecord:
    """The requests the shared engine received and what it answered, one entry per prompt sent."""

    def __init__(self, llm):
        self.llm, self.entries = llm, []
        generate = llm.generate

        def recording_generate(prompts, sampling_params=None, **kwargs):
            outputs = generate(prompts, sampling_params=sampling_params, **kwargs)
            params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
            for prompt, param, output in zip(prompts, params, outputs):
                (completion,) = output.outputs  # TRL's colocate mode asks for n=1 per prompt
                logprobs = [entry[token].logprob for token, entry in zip(completion.token_ids, completion.logprobs)]
                self.entries.append(
                    {
                        "prompt": list(prompt["prompt_token_ids"]),
                        "max_tokens": param.max_tokens,
                        "completion": list(completion.token_ids),
                        "logprobs": logprobs,
                    }
                )
            return outputs

        llm.generate = recording_generate  # an instance attribute: the trainer's seeded patch wraps this one


@pytest.fixture(scope="module")
def smollm2():
    return smollm2_135m_instruct()


@pytest.fixture(scope="module")
def engines():
    """TRL's `LLM(...)` answered with one engine per distinct set of engine arguments, for the whole module."""
    from trl.generation import vllm_generation

    built = {}
    real_llm = vllm_generation.LLM

    def shared_llm(**kwargs):
        key = repr(sorted(kwargs.items()))
        if key not in built:
            built[key] = EngineRecord(real_llm(**kwargs))
        return built[key].llm

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm_generation, "LLM", shared_llm)
        yield built


def record_of(engines, trainer) -> EngineRecord:
    (record,) = [r for r in engines.values() if r.llm is trainer.vllm_generation.llm]
    record.entries.clear()
    return record


def vllm_config(output_dir, **overrides):
    settings = dict(
        # The trainer in float32, as the engine: under GRPOConfig's bf16 default it runs its forward under CPU bf16
        # autocast, whose log-probs differ from the float32 engine's by up to 0.17 nats (and would hide a bad sync).
        bf16=False,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_engine_kwargs=ENGINE,
        vllm_max_model_length=MAX_MODEL_LEN,
        vllm_importance_sampling_correction=True,
    )
    settings.update(overrides)
    return real_model_config(output_dir, **settings)


def train(smollm2, engines, args, peft=True, repeats=1, resume=None):
    """Builds the trainer (on the shared engine), trains it; returns it with the engine's record of the run."""
    trainer = SeedGRPOTrainer(
        model=smollm2,
        reward_funcs=lines_reward,
        args=args,
        train_dataset=chat_prompts(repeats),
        peft_config=lora() if peft else None,
    )
    record = record_of(engines, trainer)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, record


def check_requests_against_rollouts(record: EngineRecord, output_dir) -> list[dict]:
    """Every banked rollout came from one engine request: prompt + its first k ids, asked for exactly BUDGET - k new
    tokens; its continuation is what vLLM answered with vLLM's log-probs, and a seeded row's prefix equals its
    origin's ids and keeps the origin's stored behaviour log-probs. Returns the seeded rows."""
    rows = seed_rows(output_dir, by_id=True)
    for entry in record.entries:
        assert len(entry["completion"]) <= entry["max_tokens"], entry  # no request ran past its budget
    seeded = []
    for row in rows.values():
        ids, k = row["completion_ids"], row["prefix_len"]
        matches = [e for e in record.entries if e["completion"] == ids[k:] and (k == 0 or e["prompt"][-k:] == ids[:k])]
        assert matches, f"no engine request produced rollout {row['rollout_id']} (prefix {k})"
        assert {e["max_tokens"] for e in matches} == {BUDGET - k}, (k, [e["max_tokens"] for e in matches])
        np.testing.assert_allclose(row["logprobs"][k:], matches[0]["logprobs"], rtol=1e-5, atol=1e-6)
        if k:
            seeded.append(row)
            origin = rows[row["seed_origin"]]
            assert origin["completion_ids"][:k] == ids[:k]
            np.testing.assert_allclose(row["logprobs"][:k], origin["logprobs"][:k], rtol=1e-6)
    assert seeded, "no group was seeded: the run would show no per-request budget"
    assert len({e["max_tokens"] for e in record.entries}) > 1
    return seeded


def test_state_mode_sends_prompt_plus_prefix_with_the_budget_it_leaves(smollm2, engines, tmp_path):
    trainer, record = train(smollm2, engines, vllm_config(tmp_path))
    seeded = check_requests_against_rollouts(record, tmp_path)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 4 and all(np.isfinite(h["loss"]) for h in logs)
    assert any(h["seeds/seeded_group_share"] > 0 for h in logs)
    # TRL's importance-sampling correction ran on the engine's log-probs, and they are the trainer's up to float32
    # rounding (its logged vLLM/trainer difference): the engine generates with the weights being trained.
    assert all(h["sampling/sampling_logp_difference/max"] < 1e-3 for h in logs), logs
    assert len(seeded) >= 2


def test_action_mode_on_the_real_engine(smollm2, engines, tmp_path):
    _, record = train(smollm2, engines, vllm_config(tmp_path, prefix_mode="action", max_steps=3))
    check_requests_against_rollouts(record, tmp_path)


def engine_after_training(smollm2, engines, tmp_path, peft=True, steps=3):
    """Trains a few steps (LoRA, or all weights), syncs the weights as TRL does before a generation, and returns the
    engine's log-probs of a greedy reply with the trained model's and the base model's log-probs of the same tokens."""
    from transformers import AutoModelForCausalLM

    trainer, _ = train(smollm2, engines, vllm_config(tmp_path, max_steps=steps), peft=peft)
    before = {name: tensor.clone() for name, tensor in trainer.model.state_dict().items()}
    trainer.vllm_generation.sync_weights()  # what TRL does before the next step's generation
    # The sync merges the adapter into the base weights and unmerges it: the trainer's weights come back bit for bit.
    assert [n for n, t in trainer.model.state_dict().items() if not torch.equal(t, before[n])] == []
    tokenizer = trainer.processing_class
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name two colours."}], add_generation_prompt=True, tokenize=False
    )
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    params = vllm.SamplingParams(max_tokens=8, temperature=0.0, logprobs=0)
    (output,) = trainer.vllm_generation.llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    (completion,) = output.outputs
    tokens = list(completion.token_ids)
    engine = torch.tensor([entry[t].logprob for t, entry in zip(tokens, completion.logprobs)])

    def logprobs_of(model):
        ids = torch.tensor([prompt + tokens])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        return logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]

    trained = logprobs_of(trainer.model.eval())
    base = logprobs_of(AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval())
    return engine, trained, base


def test_the_trained_lora_weights_reach_the_engine(smollm2, engines, tmp_path):
    """After training, TRL's weight sync (through vLLM's reload on CPU) changes what the engine computes: its
    log-probs are no longer the base model's."""
    engine, trained, base = engine_after_training(smollm2, engines, tmp_path)
    assert not torch.allclose(engine, base, atol=1e-2), (engine, base)
    assert not torch.allclose(trained, base, atol=1e-2), (trained, base)  # training moved the adapter


def test_the_engine_generates_with_the_trained_lora_weights(smollm2, engines, tmp_path):
    engine, trained, _ = engine_after_training(smollm2, engines, tmp_path)
    assert torch.allclose(engine, trained, atol=2e-3), (engine, trained)


def test_the_engine_generates_with_fully_trained_weights(smollm2, engines, tmp_path):
    """Without LoRA every weight trains, the embedding too, which SmolLM2's LM head shares: the engine scores tokens
    with the trained head (its packed copy was the first load's until the sync rebuilt it)."""
    engine, trained, base = engine_after_training(smollm2, engines, tmp_path, peft=False, steps=2)
    assert not torch.allclose(trained, base, atol=1e-2), (trained, base)
    assert torch.allclose(engine, trained, atol=2e-3), (engine, trained)


LATE_KEYS = ("loss", "grad_norm", "reward", "seeds/seeded_group_share", "seeds/prefix_tokens", "num_tokens")


def late_steps(trainer, after: int = 0):
    return {
        h["step"]: [h[key] for key in LATE_KEYS]
        for h in trainer.state.log_history
        if "loss" in h and h["step"] > after
    }


def test_resume_on_the_real_engine_samples_alike(smollm2, engines, tmp_path):
    """Resumed from checkpoint-2, steps 3 and 4 sample and seed as the uninterrupted run did: vLLM's sampler draws
    from torch's generator, whose state the checkpoint restores, and TRL loads the resumed weights into the engine
    before its first generation."""
    trainer, _ = train(smollm2, engines, vllm_config(tmp_path / "run"), repeats=4)
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "run", resumed_dir, ignore=shutil.ignore_patterns("checkpoint-4", ".ts_trl.running"))
    resumed, _ = train(smollm2, engines, vllm_config(resumed_dir), repeats=4, resume=str(resumed_dir / "checkpoint-2"))
    first, second = late_steps(trainer, 2), late_steps(resumed, 2)
    assert len(first) == 2 and any(first[step][3] > 0 for step in (3, 4)), "the resumed steps should seed"
    # The same samples: rewards, seeding and tokens (vLLM's sampler draws from the restored torch generator).
    assert {s: v[2:] for s, v in second.items()} == {s: v[2:] for s, v in first.items()}


def test_resume_on_the_real_engine_trains_alike(smollm2, engines, tmp_path):
    trainer, _ = train(smollm2, engines, vllm_config(tmp_path / "run"), repeats=4)
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "run", resumed_dir, ignore=shutil.ignore_patterns("checkpoint-4", ".ts_trl.running"))
    resumed, _ = train(smollm2, engines, vllm_config(resumed_dir), repeats=4, resume=str(resumed_dir / "checkpoint-2"))
    assert late_steps(resumed, 2) == late_steps(trainer, 2)


def test_prefix_caching_on_and_off_train_alike(smollm2, engines, tmp_path):
    """vLLM caches the KV of a seeded group's shared prompt + prefix (on by default); an engine without the cache
    samples the same tokens, and the run logs the same losses."""
    uncached = {**ENGINE, "enable_prefix_caching": False}
    on, on_record = train(smollm2, engines, vllm_config(tmp_path / "on", max_steps=3))
    off, off_record = train(smollm2, engines, vllm_config(tmp_path / "off", max_steps=3, vllm_engine_kwargs=uncached))
    assert off.vllm_generation.llm is not on.vllm_generation.llm
    assert [e["completion"] for e in on_record.entries] == [e["completion"] for e in off_record.entries]
    assert [e["max_tokens"] for e in on_record.entries] == [e["max_tokens"] for e in off_record.entries]
    assert any(e["max_tokens"] < BUDGET for e in on_record.entries), "nothing was seeded"
    for a, b in zip(on_record.entries, off_record.entries):
        np.testing.assert_allclose(a["logprobs"], b["logprobs"], atol=1e-4)
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (on, off)]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4, atol=1e-6)


def test_tool_run_on_the_real_engine_seeds_prefixes_holding_a_tool_call(engines, tmp_path):
    """TRL's tool-call loop on the engine: the built-in calculator agent (the tiny model warmed up to call `add`, saved
    where vLLM loads it) trains with `tools`; seeded rows restart from a prefix that holds a model turn's tool call and
    the tool's result, sent to the engine as prompt + prefix, and the run trains the whole model through the sync."""
    from tests.trainer.test_agentic import recorded_run, seeded_rows
    from ts_trl.embedded.agent import AgentTask, add, agent_reward, build_agent_tokenizer
    from ts_trl.embedded.warmup import build_warm_model

    task = AgentTask(tool="calculator")
    model, tokenizer = build_warm_model(task, tokenizer=build_agent_tokenizer(), steps=200, progress=False)
    model.save_pretrained(tmp_path / "agent")
    tokenizer.save_pretrained(tmp_path / "agent")
    dataset, _ = task.make_splits(2, 1)

    def right_answer(completions, answer, **kwargs):
        return agent_reward(completions, answer)

    args = vllm_config(
        tmp_path / "run",
        max_steps=4,
        learning_rate=1e-4,
        max_completion_length=96,  # TRL counts tool results against it
        cut_at_newline=False,
        vllm_max_model_length=256,  # the tiny model's positions
    )
    trainer = SeedGRPOTrainer(
        model=str(tmp_path / "agent"),
        processing_class=tokenizer,
        reward_funcs=right_answer,
        tools=[add],
        args=args,
        train_dataset=dataset,
    )
    record = record_of(engines, trainer)
    batches = recorded_run(trainer)
    assert all(e["max_tokens"] > 0 and len(e["completion"]) <= e["max_tokens"] for e in record.entries)
    holding_call = 0
    for batch, i, seed, cut in seeded_rows(batches):
        prefix = [int(t) for t in seed.completion_ids[: cut.k]]
        assert batch["ids"][i][: cut.k] == prefix
        if 0 in batch["tool_masks"][i][: cut.k]:  # a tool result inside the prefix, after the turn that called it
            holding_call += 1
            assert "add" in tokenizer.decode(prefix)
            assert any(e["prompt"][-cut.k :] == prefix for e in record.entries), "the prefix never reached the engine"
    assert holding_call, "no seeded prefix held a tool call and its result"
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert all(h["sampling/sampling_logp_difference/max"] < 1e-3 for h in logs), logs
