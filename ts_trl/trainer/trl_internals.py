"""Every TRL and transformers internal `SeedGRPOTrainer` relies on, registered here; tests/test_trl_hooks.py checks each.

`TRL_HOOKS` are the `GRPOTrainer` methods the trainer overrides or calls (their signatures are pinned by the tests).
`TRL_INTERNALS` are the other things it reads, writes or patches; a test fails when any of them moves, so that a
TRL or transformers release that breaks one is caught before training. The two patches of transformers' `Trainer`
made around TRL's constructor and the Hub pushes live here too.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import MutableMapping
from types import SimpleNamespace

import transformers.trainer as hf_trainer

from ..store.format import SEEDS_DIR
from ..store.lock import LOCK_FILE, RUNNING_FILE
from ..tiny import save_model_from_this_rank

TRL_HOOKS = (
    "_generate_and_score_completions",
    "_generate_single_turn",
    "_generate",
    "_tool_call_loop",
    "_calculate_rewards",
    "_get_per_token_logps_and_entropies",
    "_compute_loss",
    "_tokenize_prompts",
    "_save_checkpoint",
    "_push_from_checkpoint",
    "init_hf_repo",
    "push_to_hub",
    "create_model_card",
    "_issue_warnings_after_load",
)

TRL_INTERNALS = {
    "tool_mask": "GRPOTrainer._compute_loss multiplies inputs['tool_mask'] into the loss mask: the prefix mask rides "
    "in that slot of `_generate`'s result",
    "length_metrics": "GRPOTrainer._generate appends one value per batch to _metrics[mode]['completions/*'], which the "
    "trainer overwrites in place with the lengths of generated tokens",
    "mask_truncated_completions": "GRPOTrainer.mask_truncated_completions, read when the batch is scored; set to False "
    "for a seeded batch while the trainer applies it through the loss mask",
    "max_new_tokens": "GRPOTrainer.generation_config.max_new_tokens and generation_kwargs['max_new_tokens'], which "
    "HF generate reads; lowered for a seeded batch",
    "model_generate": "HF generate is `accelerator.unwrap_model(model_wrapped).generate(**inputs, generation_config=)`, "
    "which the trainer wraps to force prefix tokens",
    "vllm_backend": "VLLMGeneration.llm.generate (colocate) and .vllm_client.generate (server), wrapped for per-request "
    "budgets; vLLM's llm_engine.model_config.max_model_len and the server info's model_config.max_model_len",
    "hf_api": "transformers.trainer.hf_api(), the client Trainer.push_to_hub and _push_from_checkpoint upload with, "
    "replaced so that seeds/ stays out of the model repo",
    "push_from_checkpoint": "Trainer._push_from_checkpoint(checkpoint_folder), called at each save with push_to_hub",
    "tool_loop": "GRPOTrainer._tool_call_loop reads each row's calls from completions[i][0], concatenates prompt ids, "
    "completion ids and tool-result ids, and runs tools from _sync_tool_dicts/_async_tool_dicts; "
    "_generate_and_score_completions resets `environments` (from _environment_pool, _multi_environment) before "
    "`_generate`; `_env_tools`, `_batch_environments` and `trl.chat_template_utils.parse_response` parse a turn",
    "fused_lm_head": "GRPOTrainer._get_per_token_logps_and_entropies scores through TRL's fused LM head "
    "(`model(..., fused_lm_head=True)`, `.log_probs`, `.entropy`), which takes pre-shifted `shift_labels` and passes "
    "the attention mask and position ids to the backbone: the shared-prefix forward packs its rows for it",
    "tool_suffix": "GRPOTrainer._get_tool_suffix_ids(tool_messages) gives the ids of a run of tool results (and the next "
    "assistant header) as the loop appends them, and `chat_template`/`chat_template_kwargs` are what it renders "
    "with: agent-trace text seeds are rendered through them",
}


@contextlib.contextmanager
def loadable_by_path(model, needed: bool):
    """Gives a model built in memory a folder to be loaded from while TRL's constructor runs.

    With `beta != 0`, TRL builds the KL reference model by loading the policy's `config._name_or_path` again. A model
    built in memory (the embedded default's warm tiny model, or one a user made from a config) has an empty one, and
    TRL would stop on an invalid repo id ''. Such a model is saved to a temporary folder for the constructor's time;
    its empty name is restored afterwards, so model cards and seed datasets do not name a folder that is gone.
    """
    if (
        not needed
        or isinstance(model, str)
        or getattr(model.config, "_name_or_path", "")
        or hasattr(model, "peft_config")
    ):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="ts_trl-reference-") as folder:
        save_model_from_this_rank(model, folder)  # every rank loads its own reference copy
        model.config._name_or_path = folder
        try:
            yield
        finally:
            model.config._name_or_path = ""


class _ModelRepoApi:
    """The Trainer's `HfApi`, with `seeds/` added to what `upload_folder` leaves out of the model repo."""

    def __init__(self, api):
        self._api = api

    def __getattr__(self, name):
        return getattr(self._api, name)

    def upload_folder(self, *args, ignore_patterns=None, **kwargs):
        patterns = [ignore_patterns] if isinstance(ignore_patterns, str) else list(ignore_patterns or [])
        return self._api.upload_folder(
            *args, ignore_patterns=[*patterns, f"{SEEDS_DIR}/*", LOCK_FILE, RUNNING_FILE], **kwargs
        )


@contextlib.contextmanager
def replaced(owner, name: str, replacement):
    """Sets `owner.<name>` (or `owner[name]` for a mapping) to `replacement` for the duration, then puts back exactly
    what was there: the same object, or nothing when `owner` itself did not hold one (a class attribute stays)."""
    if isinstance(owner, MutableMapping):
        had, saved = name in owner, owner.get(name)
        owner[name] = replacement
        try:
            yield
        finally:
            if had:
                owner[name] = saved
            else:
                del owner[name]
        return
    own = vars(owner)
    had, saved = name in own, own.get(name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        if had:
            setattr(owner, name, saved)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def seeds_kept_out_of_model_repo():
    """While the Trainer pushes `output_dir`, its uploads skip `seeds/`: the rollouts (training prompts and the model's
    outputs) belong in the seed dataset repo, with its own visibility, not in the model repo.

    `Trainer.push_to_hub` and `_push_from_checkpoint` hard-code their ignore patterns and fetch the client through
    `transformers.trainer.hf_api()`, the one place a pattern can be added (`TRL_INTERNALS["hf_api"]`).
    """

    original = hf_trainer.hf_api
    with replaced(hf_trainer, "hf_api", lambda: _ModelRepoApi(original())):
        yield


def without_tied_keys(model, load_result):
    """`load_result` without the missing keys that are ties of loaded ones, which `model` ties again.

    A checkpoint of a model with tied weights (the tiny model, Qwen2.5-0.5B) does not store the tied copy (the LM
    head), so transformers warns on every resume that `lm_head.weight` is missing, though loading the embedding loaded
    it. Only a missing key that is not the tie of a loaded one is worth the warning (`_issue_warnings_after_load`).
    """
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    missing = set(load_result.missing_keys)
    untied = [key for key in load_result.missing_keys if tied.get(key) is None or tied[key] in missing]
    if len(untied) == len(missing):
        return load_result
    model.tie_weights()
    return SimpleNamespace(missing_keys=untied, unexpected_keys=load_result.unexpected_keys)
