"""Fails loudly when a GRPOTrainer hook that SeedGRPOTrainer overrides, or any other TRL / transformers internal it
reads, writes or patches (`ts_trl.trainer.trl_internals`), disappears, changes its signature or stops working as relied on."""

import inspect

import pytest
import torch
from trl import GRPOTrainer

from ts_trl.trainer.backends import SeededBackend
from ts_trl.trainer.seed_metrics import LENGTH_METRICS
from ts_trl.trainer.trl_internals import TRL_HOOKS, TRL_INTERNALS

# The parameters each hook had in the TRL release this package was written against (see pyproject's trl range).
EXPECTED = {
    "_generate_and_score_completions": ["self", "inputs"],
    "_generate_single_turn": [
        "self",
        "prompt_ids",
        "images",
        "multimodal_fields",
        "num_generations",
        "has_tool_images",
    ],
    "_generate": ["self", "prompts"],
    "_tool_call_loop": [
        "self",
        "prompts",
        "prompt_ids",
        "completion_ids",
        "completions",
        "logprobs",
        "images",
        "multimodal_fields",
    ],
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_get_per_token_logps_and_entropies": [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
    ],
    "_compute_loss": ["self", "model", "inputs"],
    "_tokenize_prompts": ["self", "prompts"],
    "create_model_card": ["self", "model_name", "dataset_name", "tags"],
    "_save_checkpoint": ["self", "model", "trial"],  # transformers' Trainer: where every save strategy saves
    "_push_from_checkpoint": ["self", "checkpoint_folder"],  # transformers' Trainer: the push at each save
    "init_hf_repo": ["self", "token", "private"],  # transformers' Trainer: creates the model repo with push_to_hub
    "push_to_hub": ["self", "commit_message"],  # transformers' Trainer: the final push, its arguments passed through
    "_issue_warnings_after_load": ["self", "load_result"],  # transformers' Trainer: its notices on a resume
}


@pytest.mark.parametrize("hook", sorted(set(TRL_HOOKS) | set(EXPECTED)))
def test_hook_exists_with_expected_signature(hook):
    assert hasattr(GRPOTrainer, hook), (
        f"trl.GRPOTrainer.{hook} is gone; SeedGRPOTrainer overrides it. Pin trl to the range in pyproject.toml or "
        "port ts_trl/trainer/seed_grpo_trainer.py to the new hook."
    )
    params = list(inspect.signature(getattr(GRPOTrainer, hook)).parameters)
    expected = EXPECTED[hook]
    assert params[: len(expected)] == expected, (
        f"trl.GRPOTrainer.{hook} changed its signature to {params}; SeedGRPOTrainer expects {expected}."
    )


def test_generate_returns_the_eight_fields_the_trainer_unpacks():
    source = inspect.getsource(GRPOTrainer._generate)
    assert (
        "return prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images"
        in (source)
    ), "GRPOTrainer._generate returns other fields now; update SeedGRPOTrainer._generate."


def test_generate_single_turn_returns_ids_and_logprobs():
    assert "return completion_ids, logprobs" in inspect.getsource(GRPOTrainer._generate_single_turn)


@pytest.fixture(scope="module")
def plain_trainer(tmp_path_factory):
    """A plain GRPOTrainer on the tiny model: the private attributes below are read from TRL itself, not from ours."""
    from trl import GRPOConfig

    from tests.conftest import count_reward, tiny_prompts
    from ts_trl.tiny import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("plain")),
        per_device_train_batch_size=4,
        num_generations=4,  # one group: the smallest batch TRL accepts
        max_completion_length=6,  # a few generated tokens are enough to fill every field of `_generate`
        report_to=[],
        use_cpu=True,
    )
    return GRPOTrainer(
        model=build_tiny_model(tokenizer),
        reward_funcs=count_reward,
        args=args,
        train_dataset=tiny_prompts(4),
        processing_class=tokenizer,
    )


def test_private_attributes_the_trainer_reads(plain_trainer):
    """SeedGRPOTrainer reads these GRPOTrainer attributes; a rename in TRL must fail here, not mid-training."""
    from transformers import GenerationConfig, PreTrainedTokenizerBase

    t = plain_trainer
    assert isinstance(t._metrics, dict) and set(t._metrics) >= {"train", "eval"}
    t._metrics["train"]["probe"].append(1.0)  # the trainer appends to keys it never declared: a defaultdict(list)
    del t._metrics["train"]["probe"]
    assert t.generation_kwargs["max_new_tokens"] == t.max_completion_length == 6
    assert isinstance(t.generation_config, GenerationConfig) and t.generation_config.max_new_tokens == 6
    assert t.vllm_mode in ("server", "colocate") and isinstance(t.vllm_tensor_parallel_size, int)
    assert t.use_vllm is False
    assert isinstance(t._tokenizer, PreTrainedTokenizerBase)
    assert list(t.eos_token_ids) and t.num_generations == 4
    assert t.reward_func_names == ["count_reward"] and t.reward_weights.tolist() == [1.0]
    assert t.mask_truncated_completions is False


def test_generate_returns_eight_fields_and_logs_the_length_metrics(plain_trainer):
    """`_generate` at run time: the 8-tuple the trainer unpacks, and the length metrics it corrects afterwards."""
    t = plain_trainer
    t.model.train()
    for values in t._metrics["train"].values():
        values.clear()
    result = t._generate(["Q: 1+2=", "Q: 1+2=", "Q: 1+2=", "Q: 1+2="])
    assert isinstance(result, tuple) and len(result) == 8
    prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images = result
    assert len(prompt_ids) == len(completion_ids) == len(completions) == 4
    assert all(isinstance(ids, list) and 1 <= len(ids) <= 6 for ids in completion_ids)
    assert tool_mask is None and logprobs is None and extra_fields == {}
    lengths = [len(ids) for ids in completion_ids]
    metrics = t._metrics["train"]
    assert metrics["completions/mean_length"][-1] == pytest.approx(sum(lengths) / 4)


# ---------------------------------------------------------------------------------------------------------------------
# One check per entry of TRL_INTERNALS: each fails when that internal moves.

PROMPTS = ["Q: 1+2="] * 4


def _tool_mask(t):
    """The prefix mask rides in TRL's tool_mask slot: the loss still multiplies it in."""
    assert 'completion_mask * inputs["tool_mask"]' in inspect.getsource(GRPOTrainer._compute_loss)


def _length_metrics(t):
    """`_generate` appends exactly one value to each length metric the trainer overwrites in place."""
    t.model.train()
    for values in t._metrics["train"].values():
        values.clear()
    t._generate(PROMPTS)
    assert {key: len(t._metrics["train"][key]) for key in LENGTH_METRICS} == dict.fromkeys(LENGTH_METRICS, 1)


def _mask_truncated_completions(t):
    """TRL reads the attribute (set from the config) when it scores the batch, so turning it off for a batch works."""
    assert t.mask_truncated_completions is t.args.mask_truncated_completions
    assert "self.mask_truncated_completions" in inspect.getsource(GRPOTrainer._generate_and_score_completions)


def _max_new_tokens(t):
    """Lowering `max_new_tokens` for a call bounds what HF generate returns, and the call leaves it as it was."""
    t.model.train()
    prompt_ids = [[int(i) for i in ids] for ids in t._tokenize_prompts(PROMPTS)[0]]
    with SeededBackend(t).patched(None, [0] * 4, budget=2):
        completions, _ = t._generate_single_turn(prompt_ids, None, {}, 4)
    assert all(len(ids) <= 2 for ids in completions) and max(map(len, completions)) == 2
    assert t.generation_config.max_new_tokens == t.generation_kwargs["max_new_tokens"] == t.max_completion_length


def _model_generate(t):
    """HF generate runs `generate` of `accelerator.unwrap_model(model_wrapped)`: the forcing wrapper is called."""
    t.model.train()
    prompt_ids = [[int(i) for i in ids] for ids in t._tokenize_prompts(PROMPTS)[0]]
    forced = [[7, 8], [8], [], [7]]
    with SeededBackend(t).patched(None, [0] * 4, t.max_completion_length, forced):
        completions, _ = t._generate_single_turn(prompt_ids, None, {}, 4)
    assert [ids[: len(f)] for ids, f in zip(completions, forced)] == forced
    assert "generate" not in vars(t.accelerator.unwrap_model(t.model_wrapped))


def _vllm_backend(t):
    """The two engine calls the budgets wrap, with the arguments the wrappers take, and where max_model_len is read."""
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    source = inspect.getsource(VLLMGeneration)
    assert "self.llm = LLM(" in source and "self.llm.generate(vllm_prompts, sampling_params=" in source
    assert "self.vllm_client.generate(" in source and "prompts=" in source
    params = list(inspect.signature(VLLMClient.generate).parameters)
    assert params[:4] == ["self", "prompts", "features", "n"] and "max_tokens" in params
    assert 'response.json()["vllm_config"]' in inspect.getsource(VLLMClient.get_server_info)


def _hf_api(t):
    """The Trainer uploads through `transformers.trainer.hf_api()`, looked up at call time in that module."""
    import transformers.trainer as hf_trainer

    assert callable(hf_trainer.hf_api)
    for method in (hf_trainer.Trainer.push_to_hub, hf_trainer.Trainer._push_from_checkpoint):
        assert "hf_api().upload_folder(" in inspect.getsource(method), method.__name__


def _push_from_checkpoint(t):
    """Each save with push_to_hub pushes through `_push_from_checkpoint(checkpoint_folder)`."""
    from transformers import Trainer

    assert list(inspect.signature(Trainer._push_from_checkpoint).parameters) == ["self", "checkpoint_folder"]
    assert "self._push_from_checkpoint(" in inspect.getsource(Trainer._save_checkpoint)


def _tool_loop(t):
    """What the multi-turn seeds rely on in TRL's tool loop and environment set-up (see `trainer/agentic.py`)."""
    from trl.chat_template_utils import parse_response  # noqa: F401 - the import itself is the check

    loop = inspect.getsource(GRPOTrainer._tool_call_loop)
    assert 'completion[0].get("tool_calls")' in loop
    assert "prompt_ids[idx_with_tool] + completion_ids[idx_with_tool] + suffix_ids" in loop
    assert "self._sync_tool_dicts[idx_with_tool]" in loop and "self._async_tool_dicts[idx_with_tool]" in loop
    score = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for name in ("self._environment_pool", "self._multi_environment", "environment.reset(**reset_kwargs)"):
        assert name in score
    assert score.index("environment.reset(**reset_kwargs)") < score.index("self._generate(")
    init = inspect.getsource(GRPOTrainer.__init__)
    assert "self._env_tools[name]" in init and "self._batch_environments" in inspect.getsource(GRPOTrainer._generate)


def _tool_suffix(t):
    """Agent-trace text seeds render tool results with TRL's own suffix and the template it renders prompts with."""
    assert list(inspect.signature(GRPOTrainer._get_tool_suffix_ids).parameters) == ["self", "tool_messages"]
    assert "suffix_ids = self._get_tool_suffix_ids(tool_messages)" in inspect.getsource(GRPOTrainer._tool_call_loop)
    assert hasattr(t, "chat_template") and isinstance(t.chat_template_kwargs, dict)


def _fused_lm_head(t):
    """TRL scores through its fused LM head, which takes pre-shifted `shift_labels` and passes the attention mask and
    position ids to the backbone: the shared-prefix forward scores its packed sequence that way."""
    source = inspect.getsource(GRPOTrainer._get_per_token_logps_and_entropies)
    assert "fused_lm_head=True" in source and "outputs.log_probs" in source and "outputs.entropy" in source
    ids = torch.tensor([[5, 6, 7, 8]])
    labels = torch.tensor([[6, -100, 8, 9]])
    with torch.no_grad():
        shifted = t.model(input_ids=ids, labels=ids, fused_lm_head=True).log_probs
        pre_shifted = t.model(
            input_ids=ids, shift_labels=labels, position_ids=torch.arange(4)[None], fused_lm_head=True
        )
    assert pre_shifted.log_probs.shape == (1, 4) and pre_shifted.log_probs[0, 1] == 0
    torch.testing.assert_close(pre_shifted.log_probs[0, 0], shifted[0, 0])


CHECKS = {
    "fused_lm_head": _fused_lm_head,
    "tool_suffix": _tool_suffix,
    "tool_loop": _tool_loop,
    "tool_mask": _tool_mask,
    "length_metrics": _length_metrics,
    "mask_truncated_completions": _mask_truncated_completions,
    "max_new_tokens": _max_new_tokens,
    "model_generate": _model_generate,
    "vllm_backend": _vllm_backend,
    "hf_api": _hf_api,
    "push_from_checkpoint": _push_from_checkpoint,
}


def test_every_registered_internal_has_a_check():
    assert set(CHECKS) == set(TRL_INTERNALS)


@pytest.mark.parametrize("internal", sorted(CHECKS))
def test_internal_still_works_as_relied_on(internal, plain_trainer):
    CHECKS[internal](plain_trainer)


def test_a_hook_called_outside_a_training_step_does_what_grpo_trainers_does(monkeypatch):
    """TRL's dispatch tests build a trainer without `__init__` and call `_generate`: the subclass hands it to TRL's,
    as `GRPOTrainer` would run it, rather than failing on state only a training step sets."""
    from ts_trl import SeedGRPOTrainer

    sentinel = object()
    monkeypatch.setattr(GRPOTrainer, "_generate", lambda self, prompts: sentinel)
    trainer = object.__new__(SeedGRPOTrainer)
    assert trainer._generate(["a prompt"]) is sentinel
