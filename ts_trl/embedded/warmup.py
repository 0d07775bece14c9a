"""A short supervised warm-up of the tiny model on worked solutions, cached on disk so later runs skip it."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm.auto import tqdm

from ts_trl.embedded.cpu import torch_threads
from ts_trl.embedded.task import EmbeddedTask
from ts_trl.resources import cache_root
from ts_trl.tiny import build_tiny_model, build_tokenizer, describe_tiny_model, save_model_from_this_rank

DEFAULT_MODEL_KWARGS = {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "max_positions": 256, "seed": 0}
WEIGHTS = "model.safetensors"  # a cache folder without it is not a cache (see `_save_atomically`)
CACHE_VERSION = 1  # bump when the training loop changes, so old caches stop matching


def default_cache_dir() -> Path:
    return cache_root() / "warmup"


def warm_up(
    model,
    tokenizer,
    task: EmbeddedTask,
    steps: int = 600,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    warmup_ratio: float = 0.1,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
    progress: bool = True,
    num_threads: int | None = 1,
):
    """Trains `model` with next-token loss on "prompt + solution + <eos>" for `steps` AdamW steps and returns it.

    Every step draws fresh train-pool problems, each with a uniformly random solution path, so the model starts RL
    spread over the paths. The loss covers the solution and EOS only: the prompt's numbers are random, and fitting
    them would spend the small model's capacity on noise. The defaults leave sampled held-out pass@1 well below 1 so
    that RL has room to improve: with the default task and model, 600 steps took 86 s on 2 busy shared cores and gave
    held-out pass@1 0.245 sampled at temperature 1 (pass@8 0.885) and 0.425 greedy.

    The result is cached under `cache_dir` (default `$TS_TRL_CACHE/warmup`, `TS_TRL_CACHE` defaulting to
    `~/.cache/ts_trl`) in a folder named by a hash of every setting and of the initial weights; a later call with the
    same inputs loads it into `model` instead of training. `num_threads` is torch's thread count while training
    (`None`: leave it); it is not part of the cache key.

    Long: the cache's read, check, train and atomic write, in the order a run needs them.
    """
    settings = {
        "version": CACHE_VERSION,
        "model_config": model.config.to_dict(),
        "initial_weights": _weights_digest(model),
        # The text each id stands for, not the token spellings: the same character vocabulary keys the same cache
        # however its tokens are spelled (byte-level `Ġ` or a plain space).
        "vocab": sorted(
            (tokenizer.convert_tokens_to_string([token]), id) for token, id in tokenizer.get_vocab().items()
        ),
        "task": vars(task),
        "steps": steps,
        "batch_size": batch_size,
        "learning_rate": learning_rate,
        "warmup_ratio": warmup_ratio,
        "seed": seed,
    }
    key = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = Path(cache_dir if cache_dir is not None else default_cache_dir()) / key
    if use_cache and (path / WEIGHTS).is_file():
        _load_weights(model, path)
        return model.eval()  # the same mode as a model fresh from `_train`

    with torch_threads(num_threads):
        _train(model, tokenizer, task, steps, batch_size, learning_rate, warmup_ratio, seed, progress)
    if use_cache:
        _save_atomically(model, tokenizer, path, settings)
    return model


def build_warm_model(
    task: EmbeddedTask | None = None, model_kwargs: dict | None = None, tokenizer=None, **warm_up_kwargs
):
    """The embedded default's starting point: the character tokenizer (or `tokenizer`, e.g. the agent tasks' with
    tool markup) and a tiny model (default-sized unless `model_kwargs` says otherwise), warmed up."""
    tokenizer = tokenizer or build_tokenizer()
    model = build_tiny_model(tokenizer, **(DEFAULT_MODEL_KWARGS if model_kwargs is None else model_kwargs))
    model = warm_up(model, tokenizer, task or EmbeddedTask(), **warm_up_kwargs)
    model.ts_trl_description = describe_tiny_model(model, "warmed up on the built-in task")
    return model, tokenizer


def _train(model, tokenizer, task, steps, batch_size, learning_rate, warmup_ratio, seed, progress):
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    warmup_steps = max(1, int(warmup_ratio * steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup_steps, max(0.0, (steps - step) / max(1, steps - warmup_steps)))
    )
    model.train()
    with torch.random.fork_rng():  # dropout-free, but keep the caller's RNG untouched anyway
        torch.manual_seed(seed)
        for _ in (bar := tqdm(range(steps), desc="warm-up", disable=not progress)):
            loss = model(**_batch(tokenizer, task, rng, batch_size)).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    model.eval()


def _batch(tokenizer, task: EmbeddedTask, rng: random.Random, batch_size: int) -> dict[str, torch.Tensor]:
    """Right-padded "prompt + solution + <eos>" sequences with labels on what the task trains (`warm_up_example`:
    the solution and EOS; an agent task's model turns only)."""
    sequences = [task.warm_up_example(tokenizer, task.sample_problem(rng), rng) for _ in range(batch_size)]
    length = max(len(prompt) + len(solution) for prompt, solution, _ in sequences)
    input_ids = torch.full((batch_size, length), tokenizer.pad_token_id)
    labels = torch.full((batch_size, length), -100)
    attention_mask = torch.zeros((batch_size, length), dtype=torch.long)
    for row, (prompt, solution, targets) in enumerate(sequences):
        ids = prompt + solution
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, len(prompt) : len(ids)] = torch.tensor(targets)
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _weights_digest(model) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _load_weights(model, path: Path) -> None:
    """Loads the cached weights into `model` from the file itself, not through `from_pretrained`: under DeepSpeed
    ZeRO-3 (`zero3_init_flag`) that would build a partitioned copy whose state dict holds empty tensors."""

    missing, unexpected = model.load_state_dict(load_file(path / WEIGHTS), strict=False)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()  # not saved: it is the embedding
    if unexpected or set(missing) - tied:
        raise RuntimeError(
            f"The warm-up cache {path} does not match the model (missing {sorted(set(missing) - tied)}, unexpected "
            f"{sorted(unexpected)}); delete that folder to rebuild it."
        )
    if tied:
        model.tie_weights()


def _save_atomically(model, tokenizer, path: Path, settings: dict) -> None:
    """Writes into a temporary sibling folder and renames it, so a crash never leaves a half-written cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        save_model_from_this_rank(model, temporary)  # not `save_pretrained`: it skips the weights on ranks > 0
        tokenizer.save_pretrained(temporary)
        (temporary / "warmup_settings.json").write_text(json.dumps(settings, indent=2, default=str))
        if path.is_dir() and not (path / WEIGHTS).is_file():
            # Left by multi-process runs before this check: a rank > 0 renamed its folder, without weights, into place.
            shutil.rmtree(path, ignore_errors=True)
        os.rename(temporary, path)
    except OSError:
        # A concurrent run (another rank) that won the rename left an equivalent cache; any other failure is real.
        if not (path / WEIGHTS).is_file():
            raise
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
