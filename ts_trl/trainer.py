"""`SeedGRPOTrainer`: GRPO that restarts a share of its prompt groups from cut rollouts of earlier checkpoints.

What differs from TRL's `GRPOTrainer`, hook by hook (nothing else is copied or changed):

- `_generate_and_score_completions`: before generation, plans one cut per seeded prompt group (the same on every
  rank); afterwards records every rollout with its behaviour log-probs and reward, logs the seeding metrics, and in
  `prefix_mode="action"` folds the truncated prefix importance ratio into per-token advantages.
- `_generate_single_turn`: splices `seed[:k]` after the prompt ids before the backend call (HF `generate`,
  continuous batching and vLLM all continue from it), then returns `seed[:k] + continuation` as the completion, so
  rewards and the loss see the whole response; vLLM is asked, per request, for the budget each prefix leaves
  (`backends.py`). With static HF `generate`, only the prefix length every row shares is spliced and each row emits
  the rest of its prefix as forced first tokens (`prefix_forcing.py`): no row decodes past its budget or is padded for
  another row's prefix. With `seed_method="replay"`, rows planned as replays are left out of the backend call and
  filled with a whole stored rollout (planned as a cut at its full length, trained as actions with the same truncated
  importance ratio, and not banked again).
- `_generate`: returns the prefix loss mask (0 on prefix tokens in `"state"` mode) through TRL's `tool_mask` slot.
- `_calculate_rewards`, `_get_per_token_logps_and_entropies`, `_compute_loss`: keep the gathered rewards, and the
  training forward's log-probs as behaviour log-probs when the backend returns none (no extra forward pass).
- `train`: rebuilds the seed bank from the checkpoint's snapshot on resume.
- `__init__`: with `beta != 0`, a model built in memory (no `_name_or_path`) is saved to a temporary folder while
  TRL's constructor loads the KL reference model from it (`_loadable_by_path`); under DeepSpeed, the process group
  accelerate started is handed to `deepspeed.comm` first (`_share_process_group_with_deepspeed`); a dataset smaller
  than one generation is refused instead of training 0 steps.

Everything else lives in its own module: which groups are seeded and where cut in `planning.py` (pure NumPy), cuts,
splices and importance weights in `cutting.py`, and the bank with everything it persists (run id, manifest, shards,
checkpoint pointers, Hub pushes) in `snapshots.SeedStore`, which the trainer owns and `SeedSnapshotCallback` drives.

Differences from the paper (which we know only by its abstract, see PAPER.md): the cut is a uniform length ratio
per group, seeds are drawn per prompt from the bank of this run (or a given seed dataset), and the restart baseline
is GRPO's group mean over the `num_generations` continuations of the same cut.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import gather_object
from transformers import LogitsProcessorList
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOTrainer

from .backends import per_prompt_sampling_params, replaced, requests_per_budget
from .bank import Rollout
from .cards import THINKING_SEEDS_CITATION, render_model_card
from .collectives import pause_backend_threads_at_exit
from .config import SeedGRPOConfig
from .cutting import SeedSplicer, boundary_token_ids, prefix_importance_weights
from .data import prompt_id_of
from .group_signal import log_zero_std_shares
from .planning import GroupPlan, GroupPlanner, state_advantages
from .prefix_forcing import ForcedPrefix, strip_forced
from .snapshots import (
    SEEDS_DIR,
    PendingRollout,
    SeedSnapshotCallback,
    SeedStore,
    load_seed_table,
    local_seed_dataset,
    sampling_settings,
    tokenizer_fingerprint,
)
from .tiny import save_model_from_this_rank

PROMPT_LENGTHS_KEPT = 1 << 16  # distinct prompts whose token counts a trainer remembers

# The GRPOTrainer hooks this trainer overrides or calls; tests/test_trl_hooks.py checks their signatures.
TRL_HOOKS = (
    "_generate_and_score_completions",
    "_generate_single_turn",
    "_generate",
    "_calculate_rewards",
    "_get_per_token_logps_and_entropies",
    "_compute_loss",
    "_tokenize_prompts",
    "_save_checkpoint",
)


class SeedGRPOTrainer(GRPOTrainer):
    """GRPO with Thinking Seeds: a share of prompt groups continue, with the current policy, from a cut earlier rollout.

    The only changes w.r.t. `GRPOTrainer` are the hooks listed in this module's docstring: the splice of a seed
    prefix before generation, the prefix loss mask (or its importance weights), and the seed bank with its snapshots.
    """

    _tag_names = ["trl", "grpo", "thinking-seeds"]
    _name = "Thinking Seeds"
    _paper = {
        "title": "Thinking Seeds: Restarting On-Policy RL from the Model's Own Past Reasoning States",
        "id": None,
        # docstyle-ignore
        "citation": THINKING_SEEDS_CITATION,
    }

    def __init__(self, model, reward_funcs=None, args: SeedGRPOConfig | None = None, train_dataset=None, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path or "model"
            args = SeedGRPOConfig(f"{str(name).split('/')[-1]}-ThinkingSeeds")
        if not isinstance(args, SeedGRPOConfig):
            raise TypeError(f"SeedGRPOTrainer needs a SeedGRPOConfig, got {type(args).__name__}.")
        _share_process_group_with_deepspeed()
        # TRL validates its own arguments first, so a real mistake (no train_dataset, no max_steps for an iterable
        # dataset) is reported as itself rather than hidden behind the refusal below.
        with _loadable_by_path(model, needed=args.beta != 0.0):
            super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        if args.seed_method != "none":
            for unsupported in ("tools", "rollout_func", "environment_factory"):
                if kwargs.get(unsupported):
                    raise ValueError(
                        f"seed_method={args.seed_method!r} cannot be combined with `{unsupported}`: seeds are spliced "
                        "into single-turn generations. Use seed_method='none' for multi-turn or custom rollouts."
                    )
        self.seed_splicer = SeedSplicer(args.prefix_mode)
        tokenizer_fp = tokenizer_fingerprint(self._tokenizer)
        external_seeds = None
        if args.seed_dataset is not None:
            source = local_seed_dataset(args.seed_dataset)
            external_seeds = load_seed_table(source, tokenizer_fp, len(self._tokenizer))
        if train_dataset is not None:
            self._check_one_generation_fits(train_dataset)
            if args.seed_method != "none":
                self._validate_dataset(train_dataset)
        if args.success_reward is not None and args.success_reward not in self.reward_func_names:
            raise ValueError(
                f"success_reward={args.success_reward!r} is not one of the reward functions {self.reward_func_names}; "
                "set it to one of those names, or leave it unset to use the first."
            )
        self._success_index = self.reward_func_names.index(args.success_reward or self.reward_func_names[0])
        self.planner = GroupPlanner(
            args,
            self.num_generations,
            self.max_completion_length,
            self.eos_token_ids,
            boundary_token_ids(self._tokenizer) if args.cut_at_newline else None,
            max_positions=getattr(self.model.config, "max_position_embeddings", None),
        )
        self.seed_store = SeedStore(
            args.output_dir,
            self.accelerator,
            model_name=getattr(self.model.config, "_name_or_path", "") or type(self.model).__name__,
            tokenizer_fp=tokenizer_fp,
            reward_names=self.reward_func_names,
            external_seeds=external_seeds,
            hub_dataset_id=args.hub_seed_dataset_id if args.push_seeds_to_hub else None,
            hub_token=args.hub_token,
            hub_private=args.hub_private_repo if args.hub_seeds_private is None else args.hub_seeds_private,
            metrics=self._metrics["train"],
            card_license=args.card_license,
            trained_model_id=args.hub_model_id if args.push_to_hub else None,
            success_reward=self.reward_func_names[self._success_index],
            success_threshold=args.success_threshold,
            snapshot_steps=args.seed_snapshot_steps,
            sampling=sampling_settings(args, self.use_vllm),
        )
        self.seed_store.checkpoint_state = self.planner.state
        if self.accelerator.num_processes > 1:
            pause_backend_threads_at_exit()  # the final snapshot's gather and barrier must not abort the exit
        self._plan: GroupPlan | None = None
        self._prompt_length_of: dict[str, int] = {}  # prompt key -> tokens, see `_prompt_lengths`
        self._unwrapped: tuple | None = None  # (model_wrapped, its unwrapped model), see `_generating_model`
        self._mask_truncated = False  # mask_truncated_completions, while TRL is told not to apply it
        self._vllm_max_model_len: int | None = None  # the vLLM server's, asked once at the first seeded step
        self._captured_logps: list[torch.Tensor] | None = None
        self._loss_inputs: dict | None = None  # the batch `_compute_loss` is working on, for the forward hook
        self._last_rewards_per_func: torch.Tensor | None = None
        if args.seed_method != "none":
            self.add_callback(SeedSnapshotCallback(self.seed_store))

    # ----------------------------------------------------------------------------------------------------------------
    # Validation and run set-up

    def _check_one_generation_fits(self, dataset) -> None:
        """TRL's sampler drops an incomplete generation batch, so a dataset smaller than one would train 0 steps."""
        if not hasattr(dataset, "__len__"):
            return
        prompts_per_generation = self.args.generation_batch_size // self.num_generations
        if len(dataset) < prompts_per_generation:
            raise ValueError(
                f"The training dataset has {len(dataset)} prompts, fewer than one generation takes "
                f"({prompts_per_generation} = generation_batch_size {self.args.generation_batch_size} / num_generations "
                f"{self.num_generations}), so training would stop after 0 steps. Add prompts, or lower "
                "per_device_train_batch_size, steps_per_generation or generation_batch_size."
            )

    def _validate_dataset(self, dataset) -> None:
        """Fails early, before any generation, on data that seeding cannot handle."""
        columns = getattr(dataset, "column_names", None)
        if columns is not None and "prompt" not in columns:
            raise ValueError(
                f"The training dataset has no 'prompt' column (found {columns}). Rename the prompt column to "
                "'prompt', e.g. dataset.rename_column('question', 'prompt')."
            )
        if not hasattr(dataset, "__len__"):
            return  # an IterableDataset is checked batch by batch
        prompts = list(dataset.select(range(min(len(dataset), 2000)))["prompt"]) if hasattr(dataset, "select") else []
        for index, prompt in enumerate(prompts):
            if not prompt or (isinstance(prompt, str) and not prompt.strip()):
                raise ValueError(f"Row {index} of the training dataset has an empty prompt; drop or fill it.")
        max_positions = getattr(self.model.config, "max_position_embeddings", None)
        texts = [p for p in prompts if isinstance(p, str)]
        lengths = [len(ids) for ids in self._tokenizer(texts)["input_ids"]] if texts else []
        chats = [p for p in prompts if not isinstance(p, str)]
        if chats and getattr(self._tokenizer, "chat_template", None):
            rendered = self._tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=True)
            lengths += [len(ids) for ids in (rendered if isinstance(rendered, list) else rendered["input_ids"])]
        longest = max(lengths, default=0)
        limit, fix = max_positions, "Shorten or filter the prompts, or lower max_completion_length."
        if self.use_vllm and self.vllm_mode == "colocate":  # the server's limit is checked at each request
            engine_len = self.vllm_generation.llm.llm_engine.model_config.max_model_len
            if limit is None or engine_len < limit:
                limit, fix = engine_len, f"{fix[:-1]}, or raise vllm_max_model_length."
        if limit is not None and longest + self.max_completion_length > limit:
            where = f"model's {limit} positions" if limit == max_positions else f"vLLM engine's max_model_len={limit}"
            raise ValueError(
                f"A prompt of {longest} tokens plus max_completion_length={self.max_completion_length} exceeds the "
                f"{where}. {fix}"
            )

    @property
    def seed_bank(self):
        return self.seed_store.bank

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        if self.args.seed_method != "none":
            checkpoint = resume_from_checkpoint
            if checkpoint is True:
                checkpoint = get_last_checkpoint(self.args.output_dir)
                if checkpoint is None:
                    raise ValueError(f"No checkpoint found in output_dir={self.args.output_dir!r} to resume from.")
            self.seed_store.start(checkpoint or None)
            self.planner.reset(self.seed_store.resumed_state.get("planner"))
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    # ----------------------------------------------------------------------------------------------------------------
    # Generation: plan the cuts, splice, record

    def _generate_and_score_completions(self, inputs):
        if not self.model.training or self.args.seed_method == "none":
            output = super()._generate_and_score_completions(inputs)
            if self.model.training:  # on-policy: every group is plain
                log_zero_std_shares(
                    self._metrics["train"], self._last_rewards_per_func, self.reward_weights, self.num_generations
                )
            return output
        self.seed_store.flush()
        self._plan = self._plan_groups(inputs)
        try:
            with self._truncation_in_loss_mask():
                output = super()._generate_and_score_completions(inputs)
            self._record_rollouts(inputs, output, self._plan)
        finally:
            self._plan = None
        return output

    @contextlib.contextmanager
    def _truncation_in_loss_mask(self):
        """Keeps truncated rows visible to the forward passes while `mask_truncated_completions` drops their loss.

        TRL zeroes `completion_mask` of truncated rows, which is also the attention mask of the forward passes whose
        log-probs become the bank's behaviour log-probs: those would then be scored without their own tokens. Here TRL
        is told not to, and `_generate` zeroes the rows in the `tool_mask` instead, which TRL multiplies into every
        loss, normaliser and metric mask, so the loss is TRL's own.
        """
        self._mask_truncated = self.mask_truncated_completions
        self.mask_truncated_completions = False
        try:
            yield
        finally:
            self.mask_truncated_completions, self._mask_truncated = self._mask_truncated, False

    def _plan_groups(self, inputs) -> GroupPlan:
        """Decides, identically on every rank, which prompt groups of the global batch are seeded and where cut."""
        keys = [_prompt_key(x) for x in inputs]
        local = list(zip(keys, self._prompt_lengths(inputs, keys)))
        rows = gather_object(local) if self.accelerator.num_processes > 1 else local
        keys, lengths = [key for key, _ in rows], [n for _, n in rows]
        first = self.accelerator.process_index * len(inputs)
        return self.planner.plan(self.seed_bank, keys, self.state.global_step, first, len(inputs), lengths)

    def _prompt_lengths(self, inputs, keys: list[str]) -> list[int | None]:
        """Prompt lengths in tokens, as the backend will see them; only needed to keep cuts within the positions.

        A prompt is tokenized once (a batch holds `num_generations` copies of each, and prompts come back every
        epoch); up to about `PROMPT_LENGTHS_KEPT` distinct prompts are remembered."""
        if self.planner.max_positions is None or self.args.seed_method != "seeds" or self.args.seed_fraction == 0:
            return [None] * len(inputs)
        known = self._prompt_length_of
        if len(known) >= PROMPT_LENGTHS_KEPT:
            known.clear()
        missing = {}
        for row, key in enumerate(keys):
            if key not in known:
                missing.setdefault(key, row)
        if missing:
            prompt_ids, _, _ = self._tokenize_prompts([inputs[row]["prompt"] for row in missing.values()])
            known.update((key, len(ids)) for key, ids in zip(missing, prompt_ids))
        return [known[key] for key in keys]

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        plan = self._plan
        if plan is None or not plan.any_seeded:
            # Other ranks' seeded rows may still reach the engine through this rank (vLLM server, TP colocate).
            with self._vllm_request_budgets(plan, [0] * len(prompt_ids)):
                return super()._generate_single_turn(
                    prompt_ids, images, multimodal_fields, num_generations, has_tool_images
                )
        plan.splices = [
            self.seed_splicer(ids, seed.completion_ids, cut) if cut is not None and not replayed else None
            for ids, seed, cut, replayed in zip(prompt_ids, plan.seeds, plan.cuts, plan.replayed)
        ]
        spliced = [s.prompt_ids if s is not None else list(ids) for ids, s in zip(prompt_ids, plan.splices)]
        # Replayed rows are left out of the backend call, unless the backend needs whole groups or aligned slices
        # (vLLM server, tensor-parallel colocate) or per-row multimodal inputs: then they are generated and discarded.
        generated = [i for i, replayed in enumerate(plan.replayed) if not replayed]
        if not generated or images is not None or multimodal_fields or not self._backend_takes_any_rows:
            generated = list(range(len(spliced)))
        forced = [[] for _ in spliced]  # per row: prefix tokens `generate` is made to emit (static HF generate only)
        budget = int(self.max_completion_length - plan.global_prefix_len.min())
        if self._forces_prefixes:
            generating = ~plan.global_replayed
            common = int(plan.global_prefix_len[generating].min()) if generating.any() else 0  # same on every rank
            budget = self.max_completion_length - common
            for i, splice in enumerate(plan.splices):
                if splice is not None:
                    spliced[i] = list(prompt_ids[i]) + list(splice.prefix_ids[:common])
                    forced[i] = list(splice.prefix_ids[common:])
        prefix_lens = [len(plan.splices[i].prefix_ids) if plan.splices[i] is not None else 0 for i in generated]
        with (
            self._generation_budget(budget),
            self._forcing([forced[i] for i in generated]),
            self._vllm_request_budgets(plan, prefix_lens),
        ):
            continuations, logprobs = super()._generate_single_turn(
                [spliced[i] for i in generated], images, multimodal_fields, num_generations, has_tool_images
            )
        row_continuations, row_logprobs = [None] * len(spliced), [None] * len(spliced)
        for j, i in enumerate(generated):
            row_continuations[i] = strip_forced(continuations[j], forced[i])
            row_logprobs[i] = logprobs[j] if logprobs is not None else None
        completion_ids, masks, sampling_logprobs = [], [], []
        for i, (splice, continuation) in enumerate(zip(plan.splices, row_continuations)):
            if plan.replayed[i]:  # the old rollout whole: every token trained (as action, IS-weighted), none generated
                response = [int(t) for t in plan.seeds[i].completion_ids[: plan.cuts[i].k]]
                mask, k, continuation = [1] * len(response), len(response), []
            elif splice is None:
                continuation = list(continuation)
                response, mask, k = continuation, [1] * len(continuation), 0
            else:  # the continuation only gets the budget the prefix leaves
                response, mask = self.seed_splicer.response(splice, list(continuation), self.max_completion_length)
                k = len(splice.prefix_ids)
            completion_ids.append(response)
            masks.append(mask)
            if logprobs is not None:
                # No sampling log-prob for prefix tokens: TRL treats None as "no correction" in its vLLM IS ratio.
                generated_logprobs = list(row_logprobs[i][: len(response) - k]) if k < len(response) else []
                sampling_logprobs.append([None] * k + generated_logprobs)
        plan.response_masks = masks
        return completion_ids, (sampling_logprobs if logprobs is not None else None)

    @contextlib.contextmanager
    def _generation_budget(self, budget: int):
        """Lowers `max_new_tokens` to `budget`, the most decode steps any row of the global batch needs.

        The bound is global, so every rank (ZeRO-3 generation steps in lockstep) generates the same number of steps.
        vLLM requests get their budgets from `_vllm_request_budgets`; the continuation is truncated to its budget
        afterwards in every case.
        """
        if self.use_vllm or budget >= self.max_completion_length:
            yield
            return
        saved = self.generation_config.max_new_tokens, self.generation_kwargs.get("max_new_tokens")
        self.generation_config.max_new_tokens = self.generation_kwargs["max_new_tokens"] = budget
        try:
            yield
        finally:
            self.generation_config.max_new_tokens, self.generation_kwargs["max_new_tokens"] = saved

    @contextlib.contextmanager
    def _vllm_request_budgets(self, plan: GroupPlan | None, prefix_lens: list[int]):
        """Asks vLLM, per prompt, for exactly the budget its prefix leaves (`max_completion_length - k`), within the
        engine's `max_model_len`; see `backends.py`. `prefix_lens`: the prefix length of each row this rank sends.
        """
        if not self.use_vllm or plan is None or not plan.global_seeded.any():
            yield
            return
        backend, budget = self.vllm_generation, self.max_completion_length
        # Per global row: the prefix its prompt ends with (replayed rows are generated, if at all, from the prompt).
        global_prefix_lens = np.where(plan.global_seeded, plan.global_prefix_len, 0)
        if self.vllm_mode == "colocate":
            tp = self.vllm_tensor_parallel_size
            if tp > 1:  # the engine sees the rows of the whole tensor-parallel group, rank after rank
                size = tp * len(prefix_lens)
                start = self.accelerator.process_index // tp * size
                prefix_lens = global_prefix_lens[start : start + size].tolist()
            max_model_len = backend.llm.llm_engine.model_config.max_model_len
            wrapped = per_prompt_sampling_params(backend.llm.generate, prefix_lens, budget, max_model_len)
            with replaced(backend.llm, "generate", wrapped):
                yield
        elif self.accelerator.is_main_process:  # server: the main process sends one prompt per group of all ranks
            if self._vllm_max_model_len is None:
                info = backend.vllm_client.get_server_info()
                self._vllm_max_model_len = int(info["model_config"]["max_model_len"])
            group_prefix_lens = global_prefix_lens[:: self.num_generations].tolist()
            client = backend.vllm_client
            wrapped = requests_per_budget(client.generate, group_prefix_lens, budget, self._vllm_max_model_len)
            with replaced(client, "generate", wrapped):
                yield
        else:
            yield

    @property
    def _forces_prefixes(self) -> bool:
        """Whether generation is static HF `generate`, where forcing prefixes saves decode steps and padding."""
        return not self.use_vllm and not self.use_transformers_continuous_batching

    @contextlib.contextmanager
    def _forcing(self, forced: list[list[int]]):
        """Hands `generate` a processor that makes each row emit its `forced` tokens first (see prefix_forcing.py)."""
        if not any(forced):
            yield
            return
        model = self._generating_model  # the object TRL calls `generate` on
        own = "generate" in vars(model)  # already wrapped on the instance (a user's or a test's spy)
        original = model.generate
        model.generate = functools.partial(original, logits_processor=LogitsProcessorList([ForcedPrefix(forced)]))
        try:
            yield
        finally:
            if own:
                model.generate = original
            else:
                del model.generate

    @property
    def _generating_model(self):
        """`accelerator.unwrap_model(self.model_wrapped)`, unwrapped again only when the wrapper changes (unwrapping
        walks every submodule, a few milliseconds a step on a small model)."""
        wrapped = self.model_wrapped
        if self._unwrapped is None or self._unwrapped[0] is not wrapped:
            self._unwrapped = (wrapped, self.accelerator.unwrap_model(wrapped))
        return self._unwrapped[1]

    @property
    def _backend_takes_any_rows(self) -> bool:
        """Whether the generation backend accepts any subset of the batch's rows (not whole groups, not TP slices)."""
        if not self.use_vllm:
            return True
        return self.vllm_mode == "colocate" and self.vllm_tensor_parallel_size == 1

    def _generate(self, prompts):
        result = super()._generate(prompts)
        plan = self._plan
        if plan is None:
            return result
        prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images = result
        plan.completion_ids, plan.completions, plan.sampling_logprobs = completion_ids, completions, logprobs
        if plan.any_seeded and self.args.prefix_mode == "state":
            tool_mask = plan.response_masks
        truncated = [ids[-1] not in self._eos_and_pad for ids in completion_ids]
        if self._mask_truncated and any(truncated):  # see `_truncation_in_loss_mask`
            tool_mask = [
                [0] * len(ids) if cut else (mask if mask is not None else [1] * len(ids))
                for ids, cut, mask in zip(completion_ids, truncated, tool_mask or [None] * len(completion_ids))
            ]
        if plan.global_prefix_len.any():  # the same on every rank: the correction gathers
            self._log_generated_lengths(plan, completion_ids, truncated)
        return prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images

    @property
    def _eos_and_pad(self) -> list[int]:
        return [*self.eos_token_ids, self._tokenizer.pad_token_id]

    def _log_generated_lengths(self, plan: GroupPlan, completion_ids, truncated: list[bool]) -> None:
        """Replaces TRL's `completions/*` length metrics of this batch by the lengths of what was generated.

        TRL measures them inside `_generate`, on the whole response, before the prefix mask exists: prefix tokens
        would count as generated. Here a row's length is its continuation, replayed rows (nothing generated) are left
        out, and `clipped_ratio` keeps TRL's meaning (the response ran into `max_completion_length`).
        """
        device = self.accelerator.device
        generated = [len(ids) - (c.k if c is not None else 0) for ids, c in zip(completion_ids, plan.cuts)]
        lengths = self.accelerator.gather(torch.tensor(generated, device=device))
        clipped = self.accelerator.gather(torch.tensor(truncated, device=device))
        kept = torch.as_tensor(~plan.global_replayed, device=device)
        lengths, clipped = lengths[kept].float(), clipped[kept]
        terminated = lengths[~clipped] if (~clipped).any() else torch.zeros(1, device=device)
        values = {
            "completions/mean_length": lengths.mean(),
            "completions/min_length": lengths.min(),
            "completions/max_length": lengths.max(),
            "completions/clipped_ratio": clipped.float().mean(),
            "completions/mean_terminated_length": terminated.mean(),
            "completions/min_terminated_length": terminated.min(),
            "completions/max_terminated_length": terminated.max(),
        }
        metrics = self._metrics["train"]
        for key, value in values.items():
            metrics[key][-1] = value.item()  # TRL appended this batch's value just before

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # gathered over all ranks, one row per global rollout
        return rewards_per_func

    def _record_rollouts(self, inputs, output, plan: GroupPlan) -> None:
        """Queues this batch's rollouts for the bank, logs the seeding metrics, and weights prefix actions."""
        device = self.accelerator.device
        weights = self.reward_weights.to(device)
        rewards_per_func = self._last_rewards_per_func
        total = (rewards_per_func * weights).nansum(dim=1)
        total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        first = self.accelerator.process_index * len(inputs)
        local_total = total[first : first + len(inputs)].tolist()
        local_per_func = rewards_per_func[first : first + len(inputs)].tolist()

        # Behaviour log-probs: the backend's (vLLM), else the pre-update policy's when TRL computed them, else the
        # training forward's, captured in `_compute_loss` (identical to TRL's own `old_per_token_logps` then).
        current_logps = output.get("old_per_token_logps")
        if self._trains_old_tokens:
            self._prepare_old_token_training(output, plan, total)
        success = (rewards_per_func[:, self._success_index] > self.args.success_threshold).cpu().numpy()
        self.planner.observe(plan, total.cpu().numpy(), success)

        step, count, run_id = plan.step, plan.count, self.seed_store.run_id
        pending_rows = []  # per local row: its index in the store's pending queue, -1 if replayed
        for i, row in enumerate(inputs):
            if plan.replayed[i]:  # already in the bank as the rollout it is; banking it again would duplicate it
                pending_rows.append(-1)
                continue
            seed, cut = plan.seeds[i], plan.cuts[i]
            response = plan.completion_ids[i]
            k = cut.k if cut is not None else 0
            completion = plan.completions[i]
            rollout = Rollout(
                rollout_id=f"{run_id}-{step:06d}-{count:02d}-{first + i:05d}",
                prompt_id=_prompt_key(row),
                prompt=row["prompt"] if isinstance(row["prompt"], str) else json.dumps(row["prompt"]),
                completion=completion if isinstance(completion, str) else json.dumps(completion),
                completion_ids=np.asarray(response, np.int32),  # compact from here to the shard
                logprobs=(),
                reward=local_total[i],
                step=step,
                prefix_len=k,
                seed_origin=seed.rollout_id if seed is not None else None,
                rewards=dict(zip(self.reward_func_names, local_per_func[i])),
            )
            pending = PendingRollout(rollout, prefix_logprobs=np.asarray(seed.logprobs[:k]) if k else np.zeros(0))
            if plan.sampling_logprobs is not None:
                pending.logprobs = np.array(
                    [np.nan if x is None else x for x in plan.sampling_logprobs[i]], np.float32
                )
            elif current_logps is not None:
                pending.logprobs = current_logps[i, : len(response)].float().cpu().numpy()
            pending_rows.append(self.seed_store.add_pending(pending))
        if plan.sampling_logprobs is None and current_logps is None:
            output["seed_rollout_row"] = torch.tensor(pending_rows, device=device)
        self._log_seed_metrics(plan, total, output)

    @property
    def _trains_old_tokens(self) -> bool:
        """Whether some trained tokens were sampled by an earlier policy: seed prefixes in "action" mode, replays."""
        return self.args.prefix_mode == "action" or self.args.seed_method == "replay"

    def _prepare_old_token_training(self, output, plan: GroupPlan, total_rewards: torch.Tensor) -> None:
        """Gives the tokens an earlier policy sampled their advantage and behaviour log-probs (weighted in the loss).

        Prefix tokens of a seeded group ("action" mode) get the state advantage of `planning.state_advantages`: the
        group's advantages are centred on the group mean, so they sum to zero over the shared prefix and would
        cancel. Replayed rollouts keep their row advantage: their tokens are their own, not shared with the group.
        Built on every rank, seeded or not, so that every rank runs the same collectives in the loss.
        """
        completion_ids = output["completion_ids"]
        device = completion_ids.device
        advantages = output["advantages"]
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        advantages = advantages.expand(completion_ids.shape).clone()
        behaviour = torch.zeros(completion_ids.shape, device=device)
        old_tokens = torch.zeros(completion_ids.shape, dtype=torch.long, device=device)
        state_advantage = state_advantages(total_rewards.cpu().numpy(), plan, self.num_generations, self.planner)
        if self.args.scale_rewards != "none":  # the same unit as TRL's advantages: reward standard deviations
            state_advantage = state_advantage / (float(np.nanstd(total_rewards.cpu().numpy())) + 1e-4)
        first = self.accelerator.process_index * len(plan.cuts)
        for i, (seed, cut) in enumerate(zip(plan.seeds, plan.cuts)):
            if cut is None:
                continue
            # A copy: banked log-probs may be a read-only memory map, which torch warns about.
            behaviour[i, : cut.k] = torch.as_tensor(np.array(seed.logprobs[: cut.k], np.float32), device=device)
            old_tokens[i, : cut.k] = 1
            if not plan.replayed[i]:
                advantages[i, : cut.k] = float(state_advantage[first + i])
        output["advantages"] = advantages
        output["seed_behaviour_logps"] = behaviour
        output["seed_old_tokens"] = old_tokens

    def _weight_old_tokens(self, inputs, current_logps: torch.Tensor) -> None:
        """Scales the advantage of old tokens by `min(pi_old / pi_behaviour, prefix_is_clip)`, in place in `inputs`.

        `pi_old` is TRL's `old_per_token_logps` when it computes them, else the training forward's own detached
        log-probs, so no extra forward pass is needed; TRL's ratio `pi_theta / pi_old` supplies the rest of
        `pi_theta / pi_behaviour`. Old tokens whose behaviour log-prob is unknown (NaN: vLLM gives none for a prefix,
        or a rollout that never reached the loss) get weight 0, i.e. no policy gradient, and are counted in
        `seeds/nan_behaviour_tokens`.
        """
        behaviour, old_tokens = inputs["seed_behaviour_logps"], inputs["seed_old_tokens"].bool()
        reference = inputs.get("old_per_token_logps")
        reference = current_logps if reference is None else reference
        known = torch.isfinite(behaviour)
        weights = prefix_importance_weights(
            reference, torch.where(known, behaviour, reference), old_tokens & known, self.args.prefix_is_clip
        )
        weights = torch.where(old_tokens & ~known, torch.zeros_like(weights), weights)
        inputs["advantages"] = inputs["advantages"] * weights
        mask = inputs["completion_mask"].bool()
        weighted = old_tokens & known & mask
        stats = torch.stack([weights[weighted].sum(), weighted.sum(), (old_tokens & ~known & mask).sum()]).float()
        stats = self.accelerator.gather(stats.reshape(1, 3)).sum(dim=0)  # every rank, every micro-batch
        metrics = self._metrics["train" if self.model.training else "eval"]
        if stats[1] > 0:
            metrics["seeds/prefix_is_ratio_mean"].append((stats[0] / stats[1]).item())
        metrics["seeds/nan_behaviour_tokens"].append(stats[2].item())

    def _log_seed_metrics(self, plan: GroupPlan, total_rewards: torch.Tensor, output) -> None:
        metrics = self._metrics["train"]
        seeded = torch.as_tensor(plan.global_seeded, device=total_rewards.device)
        num_seeded_groups = int(seeded.sum().item()) // self.num_generations
        metrics["seeds/seeded_group_share"].append(num_seeded_groups / max(plan.num_groups, 1))
        metrics["seeds/eligible_group_share"].append(plan.num_eligible_groups / max(plan.num_groups, 1))
        if num_seeded_groups or plan.num_refused_cuts:
            drawn = num_seeded_groups + plan.num_refused_cuts
            metrics["seeds/refused_cut_share"].append(plan.num_refused_cuts / drawn)
        metrics["seeds/bank_size"].append(len(self.seed_bank))
        if num_seeded_groups:
            metrics["seeds/prefix_len_mean"].append(float(plan.global_prefix_len[plan.global_seeded].mean()))
            metrics["seeds/reward_seeded"].append(torch.nanmean(total_rewards[seeded]).item())
            if plan.global_seed_age:
                metrics["seeds/seed_age_mean"].append(float(np.mean(plan.global_seed_age)))
        replayed = torch.as_tensor(plan.global_replayed, device=total_rewards.device)
        if self.args.seed_method == "replay":
            metrics["seeds/replayed_rows"].append(int(replayed.sum().item()))
            if replayed.any():
                metrics["seeds/reward_replayed"].append(torch.nanmean(total_rewards[replayed]).item())
        plain = ~(seeded | replayed)
        if plain.any():
            metrics["seeds/reward_unseeded"].append(torch.nanmean(total_rewards[plain]).item())
        log_zero_std_shares(  # TRL's frac_reward_zero_std mixes seeded and plain groups
            metrics, self._last_rewards_per_func, self.reward_weights, self.num_generations, plan.global_seeded,
            plan.global_replayed,
        )  # fmt: skip
        mask = output["completion_mask"]
        prefix = torch.zeros_like(mask)
        for i, cut in enumerate(plan.cuts):
            if cut is not None:
                prefix[i, : cut.k] = 1
        counts = torch.stack([(mask * (1 - prefix)).sum(), (mask * prefix).sum()]).float()
        counts = self.accelerator.gather(counts.reshape(1, 2)).sum(dim=0)
        metrics["seeds/generated_tokens"].append(counts[0].item())
        metrics["seeds/prefix_tokens"].append(counts[1].item())

    # ----------------------------------------------------------------------------------------------------------------
    # Behaviour log-probs from the training forward pass

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        logps, entropies, aux_loss = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        loss_inputs, self._loss_inputs = self._loss_inputs, None  # only the first call: the training forward
        if loss_inputs is not None:
            if self._captured_logps is not None:
                self._captured_logps.append(logps.detach())
            if "seed_old_tokens" in loss_inputs:  # TRL reads the advantages only after this forward pass
                self._weight_old_tokens(loss_inputs, logps.detach())
        return logps, entropies, aux_loss

    def _compute_loss(self, model, inputs):
        rows = inputs.get("seed_rollout_row")
        if rows is None and "seed_old_tokens" not in inputs:
            return super()._compute_loss(model, inputs)
        inputs = dict(inputs)  # the forward hook replaces its advantages; the batch TRL keeps stays as it was
        self._loss_inputs = inputs
        self._captured_logps = [] if rows is not None else None
        try:
            loss = super()._compute_loss(model, inputs)
            logps = self._captured_logps[0].float().cpu().numpy() if rows is not None else None
        finally:
            self._captured_logps, self._loss_inputs = None, None
        if rows is None:
            return loss
        for j, row in enumerate(rows.tolist()):
            if row < 0:  # a replayed row: its behaviour log-probs are the stored ones
                continue
            pending = self.seed_store.pending[row]
            pending.logprobs = logps[j, : len(pending.rollout.completion_ids)]
        return loss

    # ----------------------------------------------------------------------------------------------------------------
    # Checkpoints and the model card

    def _save_checkpoint(self, model, trial):
        # Every save strategy ("steps", "epoch", "best", a Ctrl-C save) passes here right before the checkpoint
        # folder is written, whenever transformers decided to save: the checkpoint's shard is written first.
        if self.args.seed_method != "none":
            self.seed_store.write_snapshot(self.state.global_step)
        return super()._save_checkpoint(model, trial)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, metrics=None):
        """Writes `README.md` from this package's template (TRL's own template lookup cannot see ours).

        The one writer of the model card: at every checkpoint (TRL calls it from `_save_checkpoint`), from
        `push_to_hub`, and at the end of `ts_trl train` with `metrics` (e.g. held-out pass@1) added to the run means.
        """
        if not self.is_world_process_zero():
            return
        name_or_path = getattr(self.model.config, "_name_or_path", None)
        card_metrics = {}
        for key in ("reward", "seeds/seeded_group_share", "seeds/reward_seeded", "seeds/reward_unseeded"):
            # TRL logs None for a window where every value was NaN (e.g. a reward that returned None for a whole
            # batch): such windows have no mean to contribute.
            values = [h[key] for h in self.state.log_history if isinstance(h.get(key), (int, float))]
            values = [value for value in values if not np.isnan(value)]
            if values:
                card_metrics[f"{key} (mean over training)"] = float(np.mean(values))
        card = render_model_card(
            base_model=name_or_path or None,
            model_name=model_name or Path(self.args.output_dir).name,
            hub_model_id=self.args.hub_model_id if self.args.push_to_hub else None,
            dataset_name=dataset_name,
            seed_dataset_id=self.args.hub_seed_dataset_id if self.args.push_seeds_to_hub else None,
            is_peft=hasattr(self.model, "peft_config"),
            seed_config={f.name: getattr(self.args, f.name) for f in dataclasses.fields(SeedGRPOConfig)},
            metrics={**card_metrics, **(metrics or {})},
            license=self.args.card_license,
            tags=[tags] if isinstance(tags, str) else (tags or []),
            tokenizer_class=_tokenizer_class_to_load(self._tokenizer),
        )
        card.save(os.path.join(self.args.output_dir, "README.md"))

    # ----------------------------------------------------------------------------------------------------------------
    # The model repo: the model, its card and tokenizer; the seeds go to their own dataset repo

    def push_to_hub(self, *args, **kwargs):
        with _seeds_kept_out_of_model_repo():
            return super().push_to_hub(*args, **kwargs)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        with _seeds_kept_out_of_model_repo():
            return super()._push_from_checkpoint(checkpoint_folder)


def _share_process_group_with_deepspeed() -> None:
    """Lets DeepSpeed see the process group accelerate started, before TRL builds a ZeRO-3 KL reference model.

    On GPUs accelerate starts the group through `deepspeed.comm`. With `use_cpu` it starts a plain gloo group, which
    DeepSpeed's own communication layer does not know of until the policy is prepared. TRL loads the reference model
    before that, under `deepspeed.zero.Init`, whose config then counts a world of 1 process and refuses the batch size
    ("train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size"). Wrapping the running
    group (DeepSpeed's `init_distributed` reuses it) makes ZeRO-3 on several CPU processes behave as on GPUs.
    """
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true" or not torch.distributed.is_initialized():
        return
    from deepspeed import comm

    if not comm.is_initialized():
        comm.init_distributed(dist_backend=torch.distributed.get_backend(), auto_mpi_discovery=False)


@contextlib.contextmanager
def _loadable_by_path(model, needed: bool):
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


def _tokenizer_class_to_load(tokenizer) -> str:
    """What a card's snippet should load the tokenizer with: `AutoTokenizer`, unless the tokenizer is of the generic
    fast class (e.g. `ts_trl.tiny`'s), which `AutoTokenizer` would swap for the class registered for the
    architecture (transformers 5 does so next to a Qwen2 `config.json`, dropping the character tokenizer's spaces)."""
    from transformers import PreTrainedTokenizerFast

    return "PreTrainedTokenizerFast" if type(tokenizer) is PreTrainedTokenizerFast else "AutoTokenizer"


class _ModelRepoApi:
    """The Trainer's `HfApi`, with `seeds/` added to what `upload_folder` leaves out of the model repo."""

    def __init__(self, api):
        self._api = api

    def __getattr__(self, name):
        return getattr(self._api, name)

    def upload_folder(self, *args, ignore_patterns=None, **kwargs):
        patterns = [ignore_patterns] if isinstance(ignore_patterns, str) else list(ignore_patterns or [])
        return self._api.upload_folder(*args, ignore_patterns=[*patterns, f"{SEEDS_DIR}/*"], **kwargs)


@contextlib.contextmanager
def _seeds_kept_out_of_model_repo():
    """While the Trainer pushes `output_dir`, its uploads skip `seeds/`: the rollouts (training prompts and the model's
    outputs) belong in the seed dataset repo, with its own visibility, not in the model repo.

    `Trainer.push_to_hub` and `_push_from_checkpoint` hard-code their ignore patterns and fetch the client through
    `transformers.trainer.hf_api()`, the one place a pattern can be added; tests/test_hub.py fails if that moves.
    """
    import transformers.trainer as hf_trainer

    original = hf_trainer.hf_api
    hf_trainer.hf_api = lambda: _ModelRepoApi(original())
    try:
        yield
    finally:
        hf_trainer.hf_api = original


def _prompt_key(row: dict) -> str:
    return str(row["prompt_id"]) if row.get("prompt_id") is not None else prompt_id_of(row["prompt"])
