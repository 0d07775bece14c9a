"""`SeedGRPOTrainer`: GRPO that restarts a share of its prompt groups from cut rollouts of earlier checkpoints.

What differs from TRL's `GRPOTrainer`, hook by hook (nothing else is copied or changed):

- `_generate_and_score_completions`: before generation, plans one cut per seeded prompt group (the same on every
  rank; with environments at the start of `_generate`, keyed by the prompts TRL's `reset(**row)` made) into a
  `SeedBatch`, the one per-batch record the hooks below fill in; afterwards banks every rollout with its
  behaviour log-probs and reward, logs the seeding metrics, and gives tokens an earlier policy sampled (prefixes in
  `prefix_mode="action"`, replays) their advantages and behaviour log-probs.
- `_generate_single_turn`: splices `seed[:k]` after the prompt ids before the backend call, then returns
  `seed[:k] + continuation` as the completion, so rewards and the loss see the whole response; the backend is patched
  for the call (`backends.SeededBackend`: per-request vLLM budgets, HF `generate` forcing each row's remaining
  prefix). Replayed rows skip the backend and are filled with a whole stored rollout, trained as old actions.
- `_generate`: returns the prefix loss mask (0 on prefix tokens in `"state"` mode) through TRL's `tool_mask` slot
  (multiplied into the tool loop's own mask with tools),
  and corrects TRL's length metrics to count generated tokens only.
- `_generate` and `_tool_call_loop` with `tools`/`environment_factory`: one `agentic.ToolLoopSeeds` (docs/agentic.md)
  finds each seeded row's prefix turns and replays their calls in the row's environment (a mismatch makes the group
  plain); the loop continues the cut turn, and the prefix's messages lead the completion. Where a turn is a
  collective call (vLLM server, tensor-parallel colocate, ZeRO-3, FSDP) every rank takes part in every tool-loop
  turn (`_even_tool_turn`).
- `_calculate_rewards`: keeps the gathered rewards in the batch record.
- `_get_per_token_logps_and_entropies` (`shared_prefix.SharedPrefixForward`): a group's shared tokens computed once.
- `_compute_loss`: weights old tokens by a truncated importance ratio, and keeps the training forward's log-probs as
  behaviour log-probs when the backend returned none (no extra forward pass).
- `__init__`: refuses bad input before any generation (`checks.py`), and a run whose epochs could never seed
  (`schedule.py`, which also warns when seeding starts late); a model built in memory gets a folder for TRL
  to load its KL reference from (`trl_internals.loadable_by_path`), DeepSpeed gets accelerate's process group.
- `train`: rebuilds the seed bank from the checkpoint's snapshot on resume, on one torch thread on CPU unless the user
  set `OMP_NUM_THREADS`; `_save_checkpoint` writes the checkpoint's seed shard first.
- `_save`, `create_model_card` and the pushes (`model_repo.ModelRepo`): adapter configs and the card name the base
  model by Hub id; the pushes keep `seeds/` out of the model repo and fail in one line.

Everything else lives in its own module; `docs/architecture.md` maps them.

Differences from the paper (known only by its abstract): the cut is a uniform length ratio per group, seeds are drawn
per prompt from the bank of this run (or a given seed dataset), and the restart baseline is GRPO's group mean over
the `num_generations` continuations of the same cut.
"""

from __future__ import annotations

import numpy as np
import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from ..method.cutting import SeedSplicer, boundary_token_ids
from ..method.group_signal import log_zero_std_shares, zero_std_shares
from ..method.old_tokens import old_token_inputs, weight_old_tokens
from ..method.planning import GroupPlan, GroupPlanner, PlannerSettings, state_advantages
from ..store.agent_traces import TurnTemplate
from ..store.dataset_card import THINKING_SEEDS_CITATION
from ..store.external_seeds import ExternalSeedSettings, read_external_seeds_on_every_rank
from ..store.resume import resume_checkpoint_on_every_rank
from ..store.schema import tokenizer_fingerprint
from ..store.seed_store import SeedSnapshotCallback, SeedStore, StoreSettings
from ..tiny import save_base_for_adapter
from .agentic import ToolLoopSeeds, tool_call_markup_ids
from .backends import SeededBackend, colocated_engine_kwargs
from .checks import check_processes_joined, check_seeds_cuttable, check_success_reward, check_trainer_inputs
from .collectives import pause_backend_threads_at_exit, share_process_group_with_deepspeed
from .model_repo import ModelRepo
from .notices import trl_notices_hidden
from .schedule import SeedingWatch, check_seeding
from .seed_batch import (
    PromptLengths,
    ResetPrompts,
    SeedBatch,
    assemble_responses,
    generation_request,
    pending_rollouts,
    row_keys,
    without_truncated,
)
from .seed_grpo_config import SeedGRPOConfig, default_config
from .seed_metrics import cut_metrics, generated_length_metrics, seed_metrics
from .shared_prefix import SharedPrefixForward
from .threads import cpu_training_threads, torch_threads
from .trace_scores import success_scorer
from .trl_internals import loadable_by_path, replaced, without_tied_keys


class SeedGRPOTrainer(SharedPrefixForward, ModelRepo, GRPOTrainer):
    """GRPO with Thinking Seeds: a share of prompt groups continue, with the current policy, from a cut earlier rollout.

    The only changes w.r.t. `GRPOTrainer` are the hooks listed in this module's docstring: the splice of a seed
    prefix before generation, the prefix loss mask (or its importance weights), and the seed bank with its snapshots.
    """

    _tag_names = ["trl", "grpo", "thinking-seeds"]
    _in_tool_loop = False  # set while TRL's tool loop runs (`_tool_call_loop`)
    # The generation batch being made (None outside a training step). A class default too: a hook called on a trainer
    # built without `__init__` (as TRL's own dispatch tests build one) then does what GRPOTrainer's does.
    _seed_batch: SeedBatch | None = None
    _name = "Thinking Seeds"
    _paper = {
        "title": "Thinking Seeds: Restarting On-Policy RL from the Model's Own Past Reasoning States",
        "id": None,
        # docstyle-ignore
        "citation": THINKING_SEEDS_CITATION,
    }

    def __init__(self, model, reward_funcs=None, args: SeedGRPOConfig | None = None, train_dataset=None, **kwargs):
        chosen = args is not None  # without `args`, GRPOTrainer's drop-in defaults: warned about, never refused
        if args is None:
            args = default_config(model)
        if not isinstance(args, SeedGRPOConfig):
            raise TypeError(f"SeedGRPOTrainer needs a SeedGRPOConfig, got {type(args).__name__}.")
        check_processes_joined(args)  # before the run lock: ranks that trained alone would contend for it
        share_process_group_with_deepspeed()
        # An adapter of a model built in memory must name a base that can be loaded: it is saved in output_dir.
        save_base_for_adapter(model, kwargs.get("processing_class"), args.output_dir, kwargs.get("peft_config"))
        schedule = check_seeding(args, train_dataset, refuse=chosen)  # before any model work: no seeding, no run
        # TRL validates its own arguments first, so a real mistake (no train_dataset, no max_steps for an iterable
        # dataset) is reported as itself rather than hidden behind the refusals below.
        with loadable_by_path(model, needed=args.beta != 0.0), trl_notices_hidden(), colocated_engine_kwargs(args):
            super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        self.backend = SeededBackend(self)
        self.tool_loop = ToolLoopSeeds(self)
        check_trainer_inputs(self, train_dataset, kwargs)
        self._success_index = check_success_reward(args.success_reward, self.reward_func_names)
        self.seed_splicer = SeedSplicer(args.prefix_mode)
        self.seed_store = self._make_seed_store()  # reads `seed_dataset` (text seeds come with their cut positions)
        self.planner = GroupPlanner(
            PlannerSettings.of(args),
            self.num_generations,
            self.max_completion_length,
            self.eos_token_ids,
            boundary_token_ids(self._tokenizer) if args.cut_at_newline else None,
            max_positions=getattr(self.model.config, "max_position_embeddings", None),
            text_cuts=self.seed_store.text_cuts,
            agent_cuts=(tool_call_markup_ids(self._tokenizer), args.agent_cut_points) if self.tools else None,
        )
        self.seed_store.checkpoint_state = self.planner.state
        if args.seed_method != "none" and args.seed_dataset is not None:
            self._check_seed_dataset()
        if self.accelerator.num_processes > 1:
            pause_backend_threads_at_exit()  # the final snapshot's gather and barrier must not abort the exit
        self._prompt_length_of = PromptLengths(lambda prompts: self._tokenize_prompts(prompts)[0])
        seed_dataset = args.seed_dataset if args.seed_method != "none" else None
        self.reset_prompts = ResetPrompts(self.num_generations, self.accelerator.is_main_process, seed_dataset)
        if args.seed_method != "none":
            self.add_callback(SeedSnapshotCallback(self.seed_store))
            self.add_callback(SeedingWatch(schedule))

    def _check_seed_dataset(self) -> None:
        """Refuses a `seed_dataset` none of whose seeds admits a cut (`checks.check_seeds_cuttable`)."""
        store, planner = self.seed_store, self.planner
        check_seeds_cuttable(
            store.external_seeds,
            store.text_cuts,
            self.eos_token_ids,
            self.max_completion_length,
            f"seed_dataset={self.args.seed_dataset!r}",
            planner.turn_cuts if planner.agent_cuts is not None else None,
        )

    def _make_seed_store(self) -> SeedStore:
        """The run's seed store, with the seeds of `seed_dataset` read on every rank (`external_seeds.py`)."""
        success_reward, tokenizer = self.reward_func_names[self._success_index], self._tokenizer
        # With tools or environments, text seeds are rendered as agent trajectories, the way TRL renders turns.
        turns = TurnTemplate(tokenizer, self._get_tool_suffix_ids, self.chat_template, self.chat_template_kwargs)
        external = read_external_seeds_on_every_rank(
            ExternalSeedSettings.of(self.args),
            self.accelerator,
            tokenizer,
            tokenizer_fingerprint(tokenizer),
            self.train_dataset,
            success_scorer(self.reward_funcs, self.reward_func_names, success_reward, self.train_dataset),
            success_reward,
            template=turns if self.tools else None,
        )
        settings, metrics = StoreSettings.of(self.args, use_vllm=self.use_vllm), self._metrics["train"]
        names = self.reward_func_names
        return SeedStore(settings, self.accelerator, self.model, tokenizer, names, success_reward, metrics, external)

    @property
    def seed_bank(self):
        return self.seed_store.bank

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        # Checked on every rank at once (each loads the checkpoint from its own disk); True is the main process's
        # newest complete checkpoint: transformers would take the newest folder, even one a crash left empty.
        resume_from_checkpoint = resume_checkpoint_on_every_rank(
            resume_from_checkpoint, self.args.output_dir, self.accelerator
        )
        try:
            if self.args.seed_method != "none":
                self.seed_store.start(resume_from_checkpoint or None)
                self.planner.reset(self.seed_store.resumed_state.get("planner"))
            # One torch thread on CPU unless the user set OMP_NUM_THREADS (see threads.py); TRL's notices: its calls of
            # transformers' renamed checkpointing methods, at every step.
            with trl_notices_hidden(), torch_threads(cpu_training_threads(self.args.device)):
                return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        finally:
            self.seed_store.release()  # the output_dir is free for the next run (or this one's resume)

    # ----------------------------------------------------------------------------------------------------------------
    # Generation: plan the cuts, splice, record

    def _generate_and_score_completions(self, inputs):
        if not self.model.training or self.args.seed_method == "none":
            return super()._generate_and_score_completions(inputs)
        self.seed_store.flush()
        plan = None if self.environment_factories is not None else self._plan_groups(inputs)  # else in `_generate`
        self._seed_batch = batch = SeedBatch(plan, self.mask_truncated_completions)
        batch.inputs = inputs
        try:
            # TRL would zero `completion_mask` of truncated rows, which is also the attention mask of the forward
            # passes whose log-probs become the bank's behaviour log-probs: those would then be scored without their
            # own tokens. `_generate` zeroes such rows in the loss mask instead, so the loss is TRL's own.
            with replaced(self, "mask_truncated_completions", False):
                output = super()._generate_and_score_completions(inputs)
            self._record_rollouts(inputs, output, batch)
        finally:
            self._seed_batch = None
        return output

    def _plan_groups(self, inputs, prompts=None) -> GroupPlan:
        """Decides, identically on every rank, which prompt groups of the global batch are seeded and where cut. With
        environments (from `_generate`), rows are keyed by the prompts TRL rendered after `reset(**row)`."""
        keys = row_keys(inputs, prompts)
        local = list(zip(keys, self._prompt_lengths(inputs, [key for _, key in keys])))
        rows = gather_object(local) if self.accelerator.num_processes > 1 else local
        pairs, lengths = [key for key, _ in rows], [n for _, n in rows]  # (row's own key, seed key) per global row
        # An environment run: a group whose rows reset() gave different prompts trains plain (`ResetPrompts`).
        keys = self.reset_prompts.planned(pairs) if prompts is not None else [seed for _, seed in pairs]
        first = self.accelerator.process_index * len(inputs)
        return self.planner.plan(self.seed_bank, keys, self.state.global_step, first, len(inputs), lengths)

    def _prompt_lengths(self, inputs, keys: list[str]) -> list[int | None]:
        """Prompt lengths in tokens, as the backend will see them; only needed to keep cuts within the positions."""
        if self.planner.max_positions is None or self.args.seed_method != "seeds" or self.args.seed_fraction == 0:
            return [None] * len(inputs)
        if self.environment_factories is not None:  # prompts are rendered per environment, after its reset: unknown
            return [None] * len(inputs)  # here; the tool loop keeps every turn within the model's positions
        return self._prompt_length_of(inputs, keys)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self._in_tool_loop and self.backend.collective_calls:
            return self._even_tool_turn(prompt_ids, images, multimodal_fields, has_tool_images)
        batch = self._seed_batch
        generate = super()._generate_single_turn
        if batch is not None and batch.generation.first_turn_done:  # a tool-loop call: rows continue their own turns
            with self.backend.patched(None, [0] * len(prompt_ids), self.max_completion_length):
                return generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        if batch is not None:
            batch.generation.first_turn_done = True
        if batch is None or not batch.plan.any_seeded:
            # Other ranks' seeded rows may still reach the engine through this rank (vLLM server, TP colocate).
            lens = batch.global_prefix_lens if batch is not None else None
            with self.backend.patched(lens, [0] * len(prompt_ids), self.max_completion_length):
                return generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        plan = batch.plan
        any_rows = self.backend.takes_any_rows and images is None and not multimodal_fields
        # A multi-turn prefix holds end-of-turn tokens, at which `generate` would stop: it is spliced whole instead.
        forces = self.backend.forces_prefixes and not self.tools
        request = generation_request(prompt_ids, plan, self.seed_splicer, self.max_completion_length, forces, any_rows)
        patched = self.backend.patched(
            batch.global_prefix_lens, request.prefix_lens, request.budget, request.sent(request.forced)
        )
        with patched:
            continuations, logprobs = generate(
                request.sent(request.prompts), images, multimodal_fields, num_generations, has_tool_images
            )
        completion_ids, masks, sampling_logprobs = assemble_responses(
            plan, request, continuations, logprobs, self.max_completion_length
        )
        self.tool_loop.first_turn_masks(plan, masks)
        batch.generation.response_masks = masks
        return completion_ids, sampling_logprobs

    def _generate(self, prompts):
        batch = self._seed_batch
        if batch is not None and batch.plan is None:  # an environment run: TRL has just made its prompts with reset
            batch.plan, batch.prompts = self._plan_groups(batch.inputs, prompts), list(prompts)
            batch.keys = [key for _, key in row_keys(batch.inputs, prompts)]
        if batch is not None and self.tools:
            self._restore_states(batch)
        result = super()._generate(prompts)
        if batch is None:
            return result
        prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images = result
        plan, generation = batch.plan, batch.generation
        generation.completion_ids, generation.completions = completion_ids, completions
        generation.sampling_logprobs = logprobs
        if self.tools:
            tool_mask = self.tool_loop.loss_masks(batch, completion_ids, tool_mask)
        elif plan.any_seeded and self.args.prefix_mode == "state":
            tool_mask = generation.response_masks
        truncated = [ids[-1] not in (*self.eos_token_ids, self._tokenizer.pad_token_id) for ids in completion_ids]
        if batch.mask_truncated and any(truncated):  # TRL's `mask_truncated_completions`, in the loss mask
            tool_mask = without_truncated(completion_ids, truncated, tool_mask)
        if plan.global_prefix_len.any():  # the same on every rank: the correction gathers
            # TRL measured the lengths on whole responses, before the prefix mask existed: prefixes counted as
            # generated. It appended this batch's values just before; they are replaced in place.
            device, gather = self.accelerator.device, self.accelerator.gather
            lengths = generated_length_metrics(plan, completion_ids, truncated, device, gather, generation.tool_masks)
            for key, value in lengths.items():
                self._metrics["train"][key][-1] = value
        return prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images

    # ----------------------------------------------------------------------------------------------------------------
    # Multi-turn seeds in TRL's tool loop: each hook hands the work to `self.tool_loop` (`agentic.ToolLoopSeeds`)

    def _restore_states(self, batch: SeedBatch) -> None:
        self.tool_loop.restore(batch)

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        """TRL's loop, with each seeded row's history being its prefix's turns."""
        self.tool_loop.lead(self._seed_batch, prompts, prompt_ids, completion_ids, completions)
        with replaced(self, "_in_tool_loop", True):
            result = super()._tool_call_loop(
                prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields
            )
            if self.backend.collective_calls:  # this rank's loop is over: serve the turns other ranks still take
                while self._even_tool_turn([], None, {}, False) is not None:
                    pass
        self.tool_loop.close(self._seed_batch, result[1])
        return result

    def _even_tool_turn(self, prompt_ids, images, multimodal_fields, has_tool_images):
        generate = super()._generate_single_turn
        return self.tool_loop.even_turn(
            prompt_ids, images, lambda ids, images: generate(ids, images, multimodal_fields, 1, has_tool_images)
        )

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self._seed_batch is not None:
            self._seed_batch.generation.rewards_per_func = rewards_per_func  # gathered: one row per global rollout
        elif self.model.training:  # on-policy: every group is plain; TRL's frac_reward_zero_std is their share
            log_zero_std_shares(self._metrics["train"], rewards_per_func, self.reward_weights, self.num_generations)
        return rewards_per_func

    def _record_rollouts(self, inputs, output, batch: SeedBatch) -> None:
        """Banks this batch's rollouts, updates the planner's statistics, logs the seeding metrics, and prepares the
        tokens an earlier policy sampled for the loss."""
        plan, rewards_per_func = batch.plan, batch.generation.rewards_per_func
        total = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        if self.args.prefix_mode == "action" or self.args.seed_method == "replay":
            self._prepare_old_tokens(output, plan, total)
        success = (rewards_per_func[:, self._success_index] > self.args.success_threshold).cpu().numpy()
        self.planner.observe(plan, total.cpu().numpy(), success)

        # Behaviour log-probs: the backend's (vLLM), else the pre-update policy's when TRL computed them, else the
        # training forward's, filled in by `_compute_loss` (identical to TRL's own `old_per_token_logps` then).
        policy = output.get("old_per_token_logps")
        policy = policy.float().cpu().numpy() if policy is not None else None
        first = self.accelerator.process_index * len(inputs)
        pending = pending_rollouts(
            batch, inputs, first, self.seed_store.run_id, total.cpu().numpy(), self.reward_func_names, policy
        )
        rows = self.seed_store.queue(pending)
        if batch.generation.sampling_logprobs is None and policy is None:
            output["seed_rollout_row"] = torch.tensor(rows, device=self.accelerator.device)
        mask, G, replay = output["completion_mask"], self.num_generations, self.args.seed_method == "replay"
        tool_masks, gather = batch.generation.tool_masks, self.accelerator.gather
        values = seed_metrics(plan, total, mask, G, len(self.seed_bank), replay, gather, tool_masks)
        # TRL's frac_reward_zero_std mixes seeded and plain groups: their all-equal shares apart
        values.update(zero_std_shares(total.cpu().numpy(), G, plan.global_seeded, plan.global_replayed))
        target = self.args.target_pass_rate if self.args.cut_selection == "target" else None
        values.update(cut_metrics(plan, success, target))
        for key, value in values.items():
            self._metrics["train"][key].append(value)

    def _prepare_old_tokens(self, output, plan: GroupPlan, total_rewards: torch.Tensor) -> None:
        """Gives the tokens an earlier policy sampled their advantages and behaviour log-probs (`old_tokens.py`).

        Built on every rank, seeded or not, so that every rank runs the same collectives in the loss.
        """
        rewards = total_rewards.cpu().numpy()
        state_advantage = state_advantages(rewards, plan, self.num_generations, self.planner)
        if self.args.scale_rewards != "none":  # the same unit as TRL's advantages: reward standard deviations
            state_advantage = state_advantage / (float(np.nanstd(rewards)) + 1e-4)
        first = self.accelerator.process_index * len(plan.cuts)
        shape = output["completion_ids"].shape
        advantages, behaviour, old_tokens = old_token_inputs(output["advantages"], shape, plan, state_advantage, first)
        output["advantages"] = advantages
        output["seed_behaviour_logps"] = behaviour
        output["seed_old_tokens"] = old_tokens

    # ----------------------------------------------------------------------------------------------------------------
    # The loss: old-token weights and behaviour log-probs from the training forward pass

    def _compute_loss(self, model, inputs):
        rows = inputs.get("seed_rollout_row")
        if rows is None and "seed_old_tokens" not in inputs:
            return super()._compute_loss(model, inputs)
        inputs = dict(inputs)  # the advantages are replaced below; the batch TRL keeps stays as it was
        forward, captured = self._get_per_token_logps_and_entropies, []

        def training_forward(*args, **kwargs):
            logps, entropies, aux_loss = forward(*args, **kwargs)
            if not captured:  # the first call is the training forward; TRL reads the advantages only after it
                captured.append(logps.detach())
                if "seed_old_tokens" in inputs:
                    self._weight_old_tokens(inputs, logps.detach())
            return logps, entropies, aux_loss

        with replaced(self, "_get_per_token_logps_and_entropies", training_forward):
            loss = super()._compute_loss(model, inputs)
        if rows is not None:
            self.seed_store.fill_logprobs(rows.tolist(), captured[0].float().cpu().numpy())
        return loss

    def _weight_old_tokens(self, inputs, current_logps: torch.Tensor) -> None:
        """Scales the advantage of old tokens by `min(pi_old / pi_behaviour, prefix_is_clip)`, in place in `inputs`.

        `pi_old` is TRL's `old_per_token_logps` when it computes them, else the training forward's own detached
        log-probs, so no extra forward pass is needed. Old tokens of unknown behaviour log-prob are counted in
        `seeds/nan_behaviour_tokens`.
        """
        reference = inputs.get("old_per_token_logps")
        inputs["advantages"], stats = weight_old_tokens(
            inputs["advantages"],
            inputs["seed_behaviour_logps"],
            inputs["seed_old_tokens"],
            current_logps if reference is None else reference,
            inputs["completion_mask"],
            self.args.prefix_is_clip,
        )
        stats = self.accelerator.gather(stats.reshape(1, 3)).sum(dim=0)  # every rank, every micro-batch
        metrics = self._metrics["train" if self.model.training else "eval"]
        if stats[1] > 0:
            metrics["seeds/prefix_is_ratio_mean"].append((stats[0] / stats[1]).item())
        metrics["seeds/nan_behaviour_tokens"].append(stats[2].item())

    # ----------------------------------------------------------------------------------------------------------------
    # Checkpoints (the model card and the model repo: `model_repo.ModelRepo`)

    def _save_checkpoint(self, model, trial):
        # Every save strategy ("steps", "epoch", "best", a Ctrl-C save) passes here right before the checkpoint
        # folder is written, whenever transformers decided to save: the checkpoint's shard is written first.
        if self.args.seed_method != "none":
            self.seed_store.write_snapshot(self.state.global_step, at_checkpoint=True)
        return super()._save_checkpoint(model, trial)

    def _issue_warnings_after_load(self, load_result):
        load_result = without_tied_keys(self.accelerator.unwrap_model(self.model), load_result)
        return super()._issue_warnings_after_load(load_result)
