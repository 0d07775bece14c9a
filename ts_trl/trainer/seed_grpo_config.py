"""`SeedGRPOConfig`: TRL's `GRPOConfig` plus the fields that control Thinking Seeds, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.utils import is_torch_bf16_gpu_available
from trl import GRPOConfig

from ..method.settings import (  # noqa: F401 (the allowed values, re-exported where the fields are)
    AGENT_CUT_POINTS,
    CUT_SELECTIONS,
    PREFIX_MODES,
    RULE_FIELDS,
    SEED_FILTERS,
    SEED_METHODS,
    SEED_SELECTIONS,
    SEED_TRIGGERS,
    seeding_problems,
)
from .notices import trl_notices_hidden

# The seeding fields' choices and the rules between them are `method.settings`' (which `ts_trl train` also applies
# before TRL is imported); the layers below receive values validated here.


def _choice(default: str, choices: tuple[str, ...], help: str):
    """A string field that the command line restricts to `choices`."""
    return field(default=default, metadata={"help": help, "choices": list(choices)})


@dataclass
class SeedGRPOConfig(GRPOConfig):
    r"""
    Configuration for [`SeedGRPOTrainer`]: every [`~trl.GRPOConfig`] field, plus the ones below.

    Parameters:
        > Parameters that control seeding

        seed_method (`str`, *optional*, defaults to `"seeds"`):
            `"none"`: plain on-policy GRPO. `"seeds"`: Thinking Seeds, continue earlier rollouts cut at a length
            ratio. `"replay"`: whole earlier rollouts join their prompt's group, trained with a truncated importance
            ratio (the off-policy baseline).
        seed_fraction (`float`, *optional*, defaults to `0.5`):
            Share of prompt groups in a generation batch that are seeded, among those with an eligible seed.
        cut_ratio_min (`float`, *optional*, defaults to `0.1`):
            Lower bound of the length ratio `r`; the seed is cut at `k = floor(r * len(seed))`.
        cut_ratio_max (`float`, *optional*, defaults to `0.9`):
            Upper bound of the length ratio `r ~ U[cut_ratio_min, cut_ratio_max]`.
        cut_selection (`str`, *optional*, defaults to `"ratio"`):
            `"ratio"`: `r ~ U[cut_ratio_min, cut_ratio_max]` (the method). `"target"` (an extension, see
            research/target-cuts.md): per seeded group, the ratio bin whose estimated continuation pass rate is closest to
            `target_pass_rate`, from the run's earlier continuations of that prompt and seed outcome; uniform where
            nothing is known yet.
        target_pass_rate (`float`, *optional*, defaults to `0.5`):
            The pass rate of a continuation that `cut_selection="target"` aims at, strictly between 0 and 1.
        seed_trigger (`str`, *optional*, defaults to `"fraction"`):
            `"fraction"`: each group is seeded with probability `seed_fraction` (the method). `"zero_std"` (an
            extension): only groups whose prompt's last plain group was all-equal are, each with probability
            `seed_fraction`, from a successful seed for an all-failed prompt and a failed one for an all-passed
            prompt where the bank has one (else as `seed_selection` says, else any eligible seed).
        cut_at_newline (`bool`, *optional*, defaults to `False`):
            Snap the cut to the nearest step boundary (the position after a token containing a newline). With `tools`
            or `environment_factory`: cut at turn boundaries and after newlines inside model text only (docs/agentic.md).
        agent_cut_points (`str`, *optional*, defaults to `"any"`):
            With `tools` or `environment_factory`: `"any"` cuts a multi-turn seed at a turn boundary (after a tool
            result) or inside a model text span before its tool call; `"turns"` only at turn boundaries. The cut
            ratio is over the seed's model tokens. Never inside a tool result or a tool-call markup.
        prefix_mode (`str`, *optional*, defaults to `"state"`):
            `"state"`: the prefix is context only, masked out of the loss (the method). `"action"`: prefix tokens
            are trained too, with a truncated token-level importance ratio against their behaviour log-probs.
        prefix_is_clip (`float`, *optional*, defaults to `2.0`):
            Truncation of the prefix importance ratio in `"action"` mode (and of replayed rollouts' ratio).
        seed_selection (`str`, *optional*, defaults to `"uniform"`):
            Which eligible rollout of a prompt seeds its group: `"uniform"`, `"oldest"`, `"success"` (see
            `success_reward`), `"failure"` or `"passrate"` (successful seeds for prompts the policy mostly fails,
            failing seeds for prompts it mostly solves).
        seed_min_age (`int`, *optional*, defaults to `1`):
            A seed must have been generated at least this many optimizer steps before the step that uses it.
        seed_snapshot_only (`bool`, *optional*, defaults to `True`):
            Seed only from rollouts already written to a snapshot, i.e. from an earlier checkpoint.
        seed_snapshot_steps (`int`, *optional*):
            Also write a seed shard every this many steps, independent of checkpoints. Every checkpoint, whatever
            the `save_strategy`, writes its shard first; with `save_strategy="no"` and `seed_snapshot_only=True`
            this (or a `seed_dataset`) is required, since otherwise no rollout could ever become a seed.
        seed_dataset (`str`, *optional*):
            Seeds to start from: the output directory of an earlier run, its `seeds/` folder or Parquet shards, a Hub
            dataset id, or any dataset of reasoning traces (a Parquet, JSON, JSONL or CSV file or folder, or a Hub
            dataset). A `ts_trl` seed dataset of the same tokenizer is read with its token ids and log-probs; one of
            another tokenizer, and any trace dataset, is re-tokenised from its text (text seeds: `prefix_mode="state"`
            and `seed_method="seeds"` only, cut on text boundaries). See docs/seed-dataset.md.
        seed_dataset_revision (`str`, *optional*):
            Branch, tag or commit of a Hub `seed_dataset`; defaults to the newest. The commit read is recorded.
        seed_prompt_column (`str`, *optional*):
            Column of a trace dataset holding the prompt (text or chat messages); defaults to `prompt`, else the
            messages before the last assistant message of `messages`.
        seed_completion_column (`str`, *optional*):
            Column of a trace dataset holding the trace (text, or chat messages whose last assistant message is the
            trace); defaults to `completion`, else `messages`.
        seed_filter (`str`, *optional*):
            `"success"`: keep only the text seeds that this run's `success_reward` function scores above
            `success_threshold`, computed once at construction and cached in `<output_dir>/external_seeds/`.
        seed_dataset_same_tokenizer (`bool`, *optional*, defaults to `False`):
            Accept `seed_dataset` rows that carry no tokenizer fingerprint, as made by this run's tokenizer. Without it
            such rows are refused: another tokenizer's ids would be trained on as other text.
        replay_per_group (`int`, *optional*, defaults to `1`):
            With `seed_method="replay"`: how many of a group's `num_generations` slots are filled by old rollouts.
        success_reward (`str`, *optional*):
            The reward function (its name, as in the `rewards/<name>/mean` metric) whose value decides whether a
            rollout succeeded, for `seed_selection` `"success"`, `"failure"` and `"passrate"`. Defaults to the first
            reward function, so a format bonus from a later one never turns a wrong answer into a success.
        success_threshold (`float`, *optional*, defaults to `0.0`):
            A rollout succeeded when its `success_reward` is strictly greater than this.

        > Parameters that control the training forward

        shared_prefix (`bool`, *optional*, defaults to `True`):
            Rows of a micro-batch with the same prompt compute the prompt and their common start (the seed prefix of
            a seeded group) once, in packed sequences with a block mask; the log-probs, entropies and gradients are
            the unshared path's up to float rounding (docs/performance.md). `False`: TRL's row-by-row forward. Where
            packing cannot be exact (vision inputs, MoE router loss, flash/flex attention, sliding windows), or an
            estimate from the model's sizes says it costs more than the padded rows, TRL's path runs, with one
            warning.

        > Parameters that control the seed dataset on the Hub

        push_seeds_to_hub (`bool`, *optional*, defaults to `False`):
            Upload every checkpoint's seed shard to a Hub dataset repo, in the background.
        hub_seed_dataset_id (`str`, *optional*):
            The dataset repo (`"org/name"`) for the seeds; defaults to `<hub_model_id>-seeds`.
        hub_seeds_private (`bool`, *optional*):
            Visibility of the seed dataset repo when it is created; `None` follows `hub_private_repo`. The rollouts
            hold the training prompts and the model's outputs: a private run refuses to push into an existing public
            repo unless this is set to `False` explicitly. An existing repo's visibility is never changed.
        card_license (`str`, *optional*, defaults to `"other"`):
            License in the model card and the seed dataset card (a Hub license id such as `apache-2.0`); `other`
            means the base model's and the training data's terms apply.

        > Parameters that control the colocated vLLM engine

        vllm_engine_kwargs (`dict` or `str`, *optional*):
            Further keyword arguments for the `vllm.LLM` that TRL builds in `vllm_mode="colocate"` (a dict, or its
            JSON on the command line), e.g. `{"enforce_eager": true}`: on CPU, vLLM compiles the model for minutes
            without it (docs/vllm-cpu.md). A vLLM server takes its settings on its own command line.
    """

    _VALID_DICT_FIELDS = GRPOConfig._VALID_DICT_FIELDS + ["vllm_engine_kwargs"]  # JSON strings parsed into dicts

    seed_method: str = _choice(
        "seeds", SEED_METHODS, "'none' (plain GRPO), 'seeds' (Thinking Seeds), 'replay' (off-policy baseline)."
    )
    seed_fraction: float = field(
        default=0.5, metadata={"help": "Share of prompt groups seeded in a batch, among those with an eligible seed."}
    )
    cut_ratio_min: float = field(default=0.1, metadata={"help": "Lower bound of the cut length ratio r."})
    cut_ratio_max: float = field(default=0.9, metadata={"help": "Upper bound of the cut length ratio r."})
    cut_selection: str = _choice(
        "ratio", CUT_SELECTIONS, "'ratio': uniform cut ratio (the method); 'target': bin nearest target_pass_rate."
    )
    target_pass_rate: float = field(
        default=0.5, metadata={"help": "cut_selection='target': the continuation pass rate aimed at, in (0, 1)."}
    )
    seed_trigger: str = _choice(
        "fraction", SEED_TRIGGERS, "'fraction': any group; 'zero_std': those whose last plain group was all-equal."
    )
    cut_at_newline: bool = field(default=False, metadata={"help": "Snap the cut to the nearest newline boundary."})
    agent_cut_points: str = _choice(
        "any",
        AGENT_CUT_POINTS,
        "With tools or environments: 'any' cuts at turn boundaries and inside model text (before a tool call); "
        "'turns' cuts only after a tool result.",
    )
    prefix_mode: str = _choice(
        "state", PREFIX_MODES, "'state': prefix masked from the loss; 'action': prefix trained, IS-corrected."
    )
    prefix_is_clip: float = field(default=2.0, metadata={"help": "Truncation of the prefix importance ratio."})
    seed_selection: str = _choice(
        "uniform", SEED_SELECTIONS, "How a seed is picked among a prompt's eligible rollouts."
    )
    seed_min_age: int = field(default=1, metadata={"help": "Minimum age (optimizer steps) of a seed."})
    seed_snapshot_only: bool = field(
        default=True, metadata={"help": "Seed only from rollouts already in a written snapshot (earlier checkpoint)."}
    )
    seed_snapshot_steps: int | None = field(
        default=None, metadata={"help": "Also write a seed shard every this many steps, independent of checkpoints."}
    )
    seed_dataset: str | None = field(
        default=None, metadata={"help": "Seed dataset to start from: a run's output_dir, its seeds/ folder or shards."}
    )
    seed_dataset_revision: str | None = field(
        default=None, metadata={"help": "Branch, tag or commit of a Hub seed_dataset (default: the newest)."}
    )
    seed_prompt_column: str | None = field(
        default=None, metadata={"help": "Prompt column of a trace seed_dataset (default: prompt, else messages)."}
    )
    seed_completion_column: str | None = field(
        default=None, metadata={"help": "Trace column of a trace seed_dataset (default: completion, else messages)."}
    )
    seed_filter: str | None = field(
        default=None,
        metadata={"help": "'success': keep only text seeds this run's success reward scores as successful."},
    )
    seed_dataset_same_tokenizer: bool = field(
        default=False,
        metadata={"help": "Accept seed_dataset rows without a tokenizer fingerprint as this tokenizer's token ids."},
    )
    replay_per_group: int = field(
        default=1, metadata={"help": "seed_method='replay': group slots filled by old rollouts."}
    )
    success_reward: str | None = field(
        default=None,
        metadata={"help": "Reward function whose value decides success (default: the first reward function)."},
    )
    success_threshold: float = field(
        default=0.0, metadata={"help": "A rollout succeeded when its success_reward is strictly above this."}
    )

    shared_prefix: bool = field(
        default=True, metadata={"help": "Compute a group's shared prompt and seed prefix once in the training pass."}
    )
    push_seeds_to_hub: bool = field(
        default=False,
        metadata={"help": "Upload each checkpoint's seed shard to a Hub dataset repo, in the background."},
    )
    hub_seed_dataset_id: str | None = field(
        default=None, metadata={"help": "Dataset repo ('org/name') for the seeds; defaults to '<hub_model_id>-seeds'."}
    )
    hub_seeds_private: bool | None = field(
        default=None,
        metadata={
            "help": "Seed repo visibility; None follows hub_private_repo, False publishes a private run's seeds."
        },
    )
    card_license: str = field(
        default="other", metadata={"help": "License id of the model and seed dataset cards ('other': the base's)."}
    )

    vllm_engine_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Further keyword arguments (JSON) for the vllm.LLM of vllm_mode='colocate', e.g. "
            "'{\"enforce_eager\": true}' (on CPU: no minutes of compilation)."
        },
    )

    def __post_init__(self):
        # The seeding fields first: a bad one is then reported as itself, not hidden behind whatever TRL or
        # transformers find wrong with the rest of the setup (e.g. bf16 requested on a CPU-only machine).
        self._validate_seeding()
        with trl_notices_hidden():  # GRPOConfig sets transformers' renamed `gradient_checkpointing` field
            super().__post_init__()
        if (
            self.seed_method != "none"
            and self.seed_fraction > 0
            and self.save_strategy == "no"
            and self.seed_snapshot_only
            and self.seed_snapshot_steps is None
            and self.seed_dataset is None
        ):
            raise ValueError(
                "save_strategy='no' writes no checkpoint, hence no seed shard, and seed_snapshot_only=True seeds only "
                "from written shards: nothing would ever be seeded. Set seed_snapshot_steps=N (a shard every N "
                "steps), or seed_snapshot_only=False."
            )
        if self.push_seeds_to_hub and self.hub_seed_dataset_id is None:
            if self.hub_model_id is None:
                raise ValueError(
                    "push_seeds_to_hub=True needs a dataset repo: set hub_seed_dataset_id='org/name' (or hub_model_id, "
                    "whose '<hub_model_id>-seeds' is then used)."
                )
            self.hub_seed_dataset_id = f"{self.hub_model_id}-seeds"
        if self.vllm_engine_kwargs and self.use_vllm and self.vllm_mode != "colocate":
            raise ValueError(
                f"vllm_engine_kwargs={self.vllm_engine_kwargs} applies to the engine TRL builds in vllm_mode='colocate'; "
                f"in vllm_mode={self.vllm_mode!r} pass those settings on the vLLM server's command line instead."
            )

    def _validate_seeding(self) -> None:
        """Checks the fields this class adds, using only values the user set (nothing TRL derives later), by the rules
        of `method.settings.seeding_problems`: every one broken, in one message."""
        problems = seeding_problems({name: getattr(self, name) for name in RULE_FIELDS})
        if problems:
            raise ValueError(" ".join(problems))


def default_config(model) -> SeedGRPOConfig:
    """The config of a trainer given no `args`: GRPOTrainer's drop-in defaults, in `<model name>-ThinkingSeeds`.

    GRPOConfig's bf16 default needs an accelerator; on a machine without one the defaults train on CPU in float32 (as
    `ts_trl train` does) rather than fail where the user chose nothing.
    """
    name = model if isinstance(model, str) else model.config._name_or_path or "model"
    on_cpu = {} if torch.cuda.is_available() or is_torch_bf16_gpu_available() else {"use_cpu": True, "bf16": False}
    return SeedGRPOConfig(f"{str(name).split('/')[-1]}-ThinkingSeeds", **on_cpu)
