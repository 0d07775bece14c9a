"""Patches of TRL's generation backends for one seeded generation call, all made and undone through `replaced`.

A seeded row has only `max_completion_length - k` tokens left after its prefix of `k` tokens, and its prompt is `k`
tokens longer. TRL builds one request for the whole batch deep inside its generation methods; rather than copy them,
`SeededBackend.patched` replaces, for the duration of the call, the few objects they end in:

- static HF `generate`: `max_new_tokens` lowered to the most any row of the global batch needs (in the generation
  config and in `generation_kwargs`, which TRL copies into the model's), and `model.generate` handed a processor that
  makes each row emit the rest of its prefix first (`prefix_forcing.py`);
- vLLM colocate: `LLM.generate` gets one `SamplingParams` per prompt (vLLM pairs a list with the prompts one by one);
- vLLM server: `VLLMClient.generate` sends one `/v1/completions` request per distinct budget (the OpenAI API takes a
  single `max_tokens` per request), concurrently so that the server still batches them together, and reassembles
  the answers in prompt order.

The budget of each vLLM prompt is `cutting.continuation_budget`; vLLM itself is never imported here.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from transformers import LogitsProcessorList

from ..method.cutting import continuation_budget
from .prefix_forcing import ForcedPrefix
from .trl_internals import replaced

RESULT_KEYS = ("completion_ids", "logprobs", "logprob_token_ids")  # per completion, prompt-major, in client answers


def budgets_of(
    prompts: Sequence[Sequence[int]], prefix_lens: Sequence[int], max_completion_length: int, max_model_len: int
) -> list[int]:
    """The budget of each prompt (prompt + prefix ids) of a backend call, given the prefix length of each."""
    if len(prompts) != len(prefix_lens):
        raise RuntimeError(
            f"The vLLM backend was called with {len(prompts)} prompts where the seed plan has {len(prefix_lens)}; "
            "TRL's batching of vLLM requests changed. Please report this with your TRL version."
        )
    return [
        continuation_budget(int(k), len(ids), max_completion_length, max_model_len)
        for ids, k in zip(prompts, prefix_lens)
    ]


def per_prompt_sampling_params(generate: Callable, prefix_lens, max_completion_length: int, max_model_len: int):
    """Wraps `LLM.generate(prompts, sampling_params=...)` so that each prompt gets its own `max_tokens`."""

    def generate_with_budgets(prompts, sampling_params=None, **kwargs):
        ids = [prompt["prompt_token_ids"] for prompt in prompts]
        params = []
        for budget in budgets_of(ids, prefix_lens, max_completion_length, max_model_len):
            copy = sampling_params.clone()
            copy.max_tokens = budget
            params.append(copy)
        return generate(prompts, sampling_params=params, **kwargs)

    return generate_with_budgets


def requests_per_budget(generate: Callable, prefix_lens, max_completion_length: int, max_model_len: int):
    """Wraps `VLLMClient.generate(prompts, features, n=..., max_tokens=..., ...)`: one request per distinct budget."""

    def generate_with_budgets(prompts, features=None, **params):
        n = params.get("n", 1)
        groups: dict[int, list[int]] = {}
        for index, budget in enumerate(budgets_of(prompts, prefix_lens, max_completion_length, max_model_len)):
            groups.setdefault(budget, []).append(index)

        def send(item):
            budget, indices = item
            subset = None if features is None else [features[i] for i in indices]
            return generate([prompts[i] for i in indices], features=subset, **{**params, "max_tokens": budget})

        with ThreadPoolExecutor(max_workers=len(groups)) as executor:
            answers = list(executor.map(send, groups.items()))
        merged = {"prompt_ids": [None] * len(prompts)}
        merged.update({key: [None] * (len(prompts) * n) for key in RESULT_KEYS})
        for indices, answer in zip(groups.values(), answers):
            for j, i in enumerate(indices):
                merged["prompt_ids"][i] = answer["prompt_ids"][j]
                for key in RESULT_KEYS:
                    if answer.get(key) is not None:
                        merged[key][i * n : (i + 1) * n] = answer[key][j * n : (j + 1) * n]
        for key in RESULT_KEYS:  # the client answers None when the server returned no log-probs
            if any(answer.get(key) is None for answer in answers):
                merged[key] = None
        return merged

    return generate_with_budgets


@contextlib.contextmanager
def colocated_engine_kwargs(args):
    """While TRL builds its colocated `vllm.LLM`, hands it `args.vllm_engine_kwargs` too (TRL's `GRPOConfig` has no
    field for vLLM's other engine arguments, such as `enforce_eager`)."""
    kwargs = getattr(args, "vllm_engine_kwargs", None)
    if not (kwargs and args.use_vllm and args.vllm_mode == "colocate"):
        yield
        return
    from trl.generation import vllm_generation  # lazy: imports vLLM where TRL finds it installed

    if not hasattr(vllm_generation, "LLM"):
        raise ImportError("use_vllm=True needs vLLM: pip install vllm (on CPU: docs/vllm-cpu.md).")
    with replaced(vllm_generation, "LLM", functools.partial(vllm_generation.LLM, **kwargs)):
        yield


def vllm_on_cpu() -> bool:
    """Whether the installed vLLM is its CPU build (False without vLLM: the tests' stand-in engines)."""
    try:
        from vllm.platforms import current_platform  # lazy: vLLM only where installed
    except ImportError:
        return False
    return current_platform.is_cpu()


def weight_sync_by_reload(generation) -> Callable[[], None]:
    """TRL's colocated weight sync (`VLLMGeneration.sync_weights`) through vLLM's in-place `reload_weights`.

    TRL loads each parameter with the model's `load_weights`, into the layers as vLLM loaded them. vLLM's CPU backend
    repacks every linear layer's weight for its GEMM kernels after loading and drops the original (vLLM 0.31,
    `dispatch_cpu_unquantized_gemm`), so that load fails with "'Parameter' object has no attribute 'weight_loader'".
    `reload_weights` restores the layers' loading form, loads the same parameters (TRL's own iterator: the merged
    adapter under vLLM's names) and repacks them. Each tensor is copied: the reload keeps the tensors it was handed until
    their layer is complete, and TRL's iterator unmerges the adapter in place once it is exhausted, which left some
    layers with the base weights. The adapter's base weights are put back as they were after the sync: unmerging
    subtracts what merging added, which in floating point leaves the base weights a rounding off at every sync (a
    resumed run, whose base comes fresh from disk, then trained a little otherwise than the uninterrupted one). The
    reload repacks only the layers it loads: a tied LM head shares the embedding's weight but keeps its own packed copy,
    which `repack_tied_layers` rebuilds (else a full fine-tune's engine scored tokens with the first step's head).
    """

    def sync_weights():
        runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
        saved = [(tensor, tensor.detach().clone()) for tensor in adapter_base_weights(generation.model)]
        weights = ((name, tensor.clone()) for name, tensor in generation._iter_named_params())
        try:
            runner.reload_weights(weights_iterator=weights)
        finally:
            with torch.no_grad():
                for tensor, copy in saved:
                    tensor.copy_(copy)
        repack_tied_layers(runner.model)
        generation.llm.reset_prefix_cache()

    return sync_weights


def repack_tied_layers(model) -> None:
    """Rebuilds the CPU GEMM packing (`cpu_linear`) of every vLLM layer whose weight another layer shares: vLLM's
    reload repacks the layer it loads the tied weight into (the embedding) and places the updated tensor back in the
    other (the LM head), whose packed copy still holds the weight it was first loaded with."""
    sharing: dict[int, list] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.numel():
            sharing.setdefault(id(weight), []).append(module)
    for modules in sharing.values():
        for module in modules if len(modules) > 1 else ():
            if hasattr(module, "cpu_linear"):
                module.quant_method.process_weights_after_loading(module)


def adapter_base_weights(model) -> list[torch.Tensor]:
    """The parameters of the layers a PEFT adapter merges into (none for a model without adapters)."""
    from peft.tuners.tuners_utils import BaseTunerLayer  # lazy: a TRL dependency, needed only with vLLM here

    return [
        tensor
        for module in model.modules()
        if isinstance(module, BaseTunerLayer)
        for tensor in module.get_base_layer().parameters(recurse=False)
    ]


class SeededBackend:
    """The generation backend of one `GRPOTrainer`, as a seeded generation call sees it and patches it."""

    def __init__(self, trainer):
        self.trainer = trainer
        self._unwrapped: tuple | None = None  # (model_wrapped, its unwrapped model), see `generating_model`
        self._server_max_model_len: int | None = None  # the vLLM server's, asked once at the first seeded step
        if trainer.use_vllm and trainer.vllm_mode == "colocate" and vllm_on_cpu():
            trainer.vllm_generation.sync_weights = weight_sync_by_reload(trainer.vllm_generation)

    @property
    def forces_prefixes(self) -> bool:
        """Whether generation is static HF `generate`, where forcing prefixes saves decode steps and padding."""
        return not self.trainer.use_vllm and not self.trainer.use_transformers_continuous_batching

    @property
    def takes_any_rows(self) -> bool:
        """Whether the backend accepts any subset of the batch's rows (not whole groups, not TP slices)."""
        t = self.trainer
        return not t.use_vllm or (t.vllm_mode == "colocate" and t.vllm_tensor_parallel_size == 1)

    @property
    def collective_calls(self) -> bool:
        """Whether every generation call is a collective one, which every rank must make together. TRL 1.16 generates
        each turn with a collective call in vLLM server mode (one request for all ranks, whose answers it hands each
        rank at `rank * len(its prompts)`, huggingface/trl#6673), in tensor-parallel colocate mode (likewise within the
        group) and with HF `generate` under ZeRO-3 or FSDP (the parameters are gathered)."""
        t = self.trainer
        if t.accelerator.num_processes == 1:
            return False
        if t.use_vllm:  # a tensor-parallel colocated engine gathers its group's prompts, sliced as the server's
            return t.vllm_mode == "server" or t.vllm_tensor_parallel_size > 1
        plugin = getattr(t.accelerator.state, "deepspeed_plugin", None)
        return t.is_fsdp_enabled or (t.is_deepspeed_enabled and plugin is not None and plugin.zero_stage == 3)

    @property
    def colocated_max_model_len(self) -> int | None:
        """The colocated vLLM engine's `max_model_len` (None without one); the server's is asked at each request."""
        t = self.trainer
        if not (t.use_vllm and t.vllm_mode == "colocate"):
            return None
        return t.vllm_generation.llm.llm_engine.model_config.max_model_len

    @property
    def generating_model(self):
        """`accelerator.unwrap_model(model_wrapped)`, the object TRL calls `generate` on, unwrapped again only when the
        wrapper changes (unwrapping walks every submodule, a few milliseconds a step on a small model)."""
        wrapped = self.trainer.model_wrapped
        if self._unwrapped is None or self._unwrapped[0] is not wrapped:
            self._unwrapped = (wrapped, self.trainer.accelerator.unwrap_model(wrapped))
        return self._unwrapped[1]

    @contextlib.contextmanager
    def patched(
        self,
        global_prefix_lens: np.ndarray | None,
        prefix_lens: Sequence[int],
        budget: int,
        forced=(),
        samples: int | None = None,
    ):
        """Patches the backend for one call of `_generate_single_turn`, and restores it afterwards.

        `global_prefix_lens`: the prefix each global row's prompt ends with (None or all 0: nothing seeded);
        `prefix_lens`: the same for the rows this rank sends; `budget`: the most new tokens any row needs (the same on
        every rank, so that ZeRO-3 ranks decode in lockstep); `forced`: per row sent, prefix tokens to emit first;
        `samples`: the completions per prompt of the call (`num_generations` unless given; 1 in the tool loop).
        """
        with contextlib.ExitStack() as stack:
            for owner, name, value in self._patches(global_prefix_lens, prefix_lens, budget, forced, samples):
                stack.enter_context(replaced(owner, name, value))
            yield

    def _patches(self, global_prefix_lens, prefix_lens, budget, forced, samples=None) -> list[tuple]:
        t = self.trainer
        patches = []
        if not t.use_vllm and budget < t.max_completion_length:
            patches += [
                (t.generation_config, "max_new_tokens", budget),
                (t.generation_kwargs, "max_new_tokens", budget),
            ]
        if any(forced):
            model = self.generating_model
            processors = LogitsProcessorList([ForcedPrefix(forced)])
            patches.append((model, "generate", functools.partial(model.generate, logits_processor=processors)))
        if t.use_vllm and global_prefix_lens is not None and global_prefix_lens.any():
            patches += self._vllm_patches(global_prefix_lens, list(prefix_lens), samples or t.num_generations)
        return patches

    def _vllm_patches(self, global_prefix_lens: np.ndarray, prefix_lens: list[int], samples: int) -> list[tuple]:
        """Asks vLLM, per prompt, for exactly the budget its prefix leaves, within the engine's `max_model_len`."""
        t = self.trainer
        backend, budget = t.vllm_generation, t.max_completion_length
        if t.vllm_mode == "colocate":
            tp = t.vllm_tensor_parallel_size
            if tp > 1:  # the engine sees the rows of the whole tensor-parallel group, rank after rank
                size = tp * len(prefix_lens)
                start = t.accelerator.process_index // tp * size
                prefix_lens = global_prefix_lens[start : start + size].tolist()
            wrapped = per_prompt_sampling_params(
                backend.llm.generate, prefix_lens, budget, self.colocated_max_model_len
            )
            return [(backend.llm, "generate", wrapped)]
        if not t.accelerator.is_main_process:  # server: the main process sends one prompt per group of all ranks
            return []
        if self._server_max_model_len is None:
            self._server_max_model_len = int(backend.vllm_client.get_server_info()["model_config"]["max_model_len"])
        group_prefix_lens = global_prefix_lens[::samples].tolist()
        client = backend.vllm_client
        wrapped = requests_per_budget(client.generate, group_prefix_lens, budget, self._server_max_model_len)
        return [(client, "generate", wrapped)]
