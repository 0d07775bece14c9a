"""Fails loudly when a GRPOTrainer hook that SeedGRPOTrainer overrides disappears or changes its signature."""

import inspect

import pytest
from trl import GRPOTrainer

from ts_trl.trainer import TRL_HOOKS

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
}


@pytest.mark.parametrize("hook", sorted(set(TRL_HOOKS) | set(EXPECTED)))
def test_hook_exists_with_expected_signature(hook):
    assert hasattr(GRPOTrainer, hook), (
        f"trl.GRPOTrainer.{hook} is gone; SeedGRPOTrainer overrides it. Pin trl to the range in pyproject.toml or "
        "port ts_trl/trainer.py to the new hook."
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


def test_tool_mask_still_masks_the_loss():
    """The prefix mask rides in TRL's tool_mask slot: check that the loss still multiplies it in."""
    assert 'completion_mask * inputs["tool_mask"]' in inspect.getsource(GRPOTrainer._compute_loss)
