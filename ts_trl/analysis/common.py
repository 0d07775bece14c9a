"""What the analysis commands share: input checks with one-line errors, prompt sets, sampling from token ids, Wilson CIs."""

from __future__ import annotations

import csv
import importlib
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

DEFAULT_REWARD = "ts_trl.embedded.task:embedded_reward"


class InputError(ValueError):
    """Bad command-line input: reported as one line, without a traceback."""


def run_command(main: Callable[[list[str] | None], object], argv: list[str] | None = None) -> int:
    """Runs a command's `main`, turning an `InputError` into one `error:` line on stderr and exit status 2."""
    try:
        main(argv)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def quiet_libraries() -> None:
    """Keeps the commands' own progress bars and tables readable (no per-step logs from transformers)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # weight-loading bars; the commands draw their own


def load_checkpoint(path: str | os.PathLike, role: str = "checkpoint"):
    """Loads a causal LM and its tokenizer from a local folder, or fails with one line saying what is missing."""
    from transformers import AutoModelForCausalLM

    from ..tiny import load_tokenizer

    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise InputError(f"{role} {str(path)!r} does not exist (expected a folder written by save_pretrained).")
    if not (folder / "config.json").exists():
        raise InputError(f"{role} {str(path)!r} has no config.json; point it at a checkpoint-<step> or model folder.")
    try:
        tokenizer = load_tokenizer(folder)
    except Exception as error:  # noqa: BLE001 - any failure means the same thing to the user
        raise InputError(f"{role} {str(path)!r} has no loadable tokenizer ({type(error).__name__}).") from error
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    return model, tokenizer


def write_csv(path, records: list[dict]) -> None:
    """Writes dict rows as CSV; the header is the union of their keys, in first-seen order."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in records for k in r)))
        writer.writeheader()
        writer.writerows(records)


def check_ratios(ratios: Sequence[float]) -> list[float]:
    bad = [r for r in ratios if not 0.0 <= r < 1.0]
    if bad or not ratios:
        raise InputError(f"cut ratios must lie in [0, 1), got {bad or 'none'}.")
    return sorted(set(ratios))


def load_reward(spec: str) -> Callable:
    """A reward function given as `module:function` (TRL's signature: completions plus dataset columns)."""
    module_name, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as error:
        raise InputError(f"reward {spec!r} cannot be imported ({error}); give it as module:function.") from error


def load_prompts(source: str, limit: int | None = None, seed: int = 0) -> list[dict]:
    """Rows with `prompt` and `answer` from a .jsonl or .parquet file, or `embedded` (the built-in task's held-out set).

    A `prompt_id` column is kept when present, else the prompt's stable hash is used.
    """
    from ..data import prompt_id_of

    if source == "embedded" or source.startswith("embedded:"):
        from ..embedded.task import EmbeddedTask

        difficulty = int(source.split(":", 1)[1]) if ":" in source else 2
        rows = EmbeddedTask(difficulty=difficulty, seed=seed).make_splits(1, limit or 64)[1].to_list()
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise InputError(f"prompt set {source!r} does not exist (give a .jsonl or .parquet file, or 'embedded').")
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        elif path.suffix == ".parquet":
            import pyarrow.parquet as pq

            rows = pq.read_table(path).to_pylist()
        else:
            raise InputError(f"prompt set {source!r} must be a .jsonl or .parquet file, or 'embedded'.")
    if not rows:
        raise InputError(f"prompt set {source!r} is empty.")
    for column in ("prompt", "answer"):
        if column not in rows[0]:
            raise InputError(f"prompt set {source!r} has no {column!r} column (found {sorted(rows[0])}).")
    rows = rows[:limit] if limit else rows
    for row in rows:
        row["prompt_id"] = str(row.get("prompt_id") or prompt_id_of(row["prompt"]))
    return rows


def prompt_token_ids(tokenizer, prompt) -> list[int]:
    """The token ids a GRPO run fed the model for `prompt`: the text as is, or chat messages with the template."""
    if isinstance(prompt, str) and prompt.startswith("[{"):
        try:
            prompt = json.loads(prompt)  # the seed dataset stores chat prompts as JSON
        except json.JSONDecodeError:
            pass
    if isinstance(prompt, list):
        return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True))
    return tokenizer(prompt)["input_ids"]


def sample_continuations(
    model,
    tokenizer,
    contexts: Sequence[Sequence[int]],
    budgets: Sequence[int],
    seed: int,
    batch_size: int = 64,
    temperature: float = 1.0,
    desc: str = "sampling",
) -> list[list[int]]:
    """Samples one continuation per context (token ids), each cut at its budget and after its first EOS.

    Sampling is plain (no top-k, no top-p) at `temperature`, as GRPO samples, and deterministic given `seed`.
    """
    import torch
    from tqdm.auto import tqdm

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    results: list[list[int]] = [[] for _ in contexts]
    order = sorted(range(len(contexts)), key=lambda i: len(contexts[i]))  # similar lengths share a batch
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        for start in tqdm(range(0, len(order), batch_size), desc=desc, leave=False):
            batch = [i for i in order[start : start + batch_size] if budgets[i] > 0]
            if not batch:
                continue
            width = max(len(contexts[i]) for i in batch)
            input_ids = torch.full((len(batch), width), pad)
            attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):
                input_ids[row, width - len(contexts[i]) :] = torch.tensor(list(contexts[i]))
                attention_mask[row, width - len(contexts[i]) :] = 1
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max(budgets[i] for i in batch),
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_k=0,
                top_p=1.0,
                pad_token_id=pad,
                eos_token_id=eos,
            )
            for row, i in enumerate(batch):
                ids = output[row, width:].tolist()[: budgets[i]]
                if eos in ids:
                    ids = ids[: ids.index(eos) + 1]
                results[i] = ids
    return results


def token_logprobs(model, contexts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], batch_size=32):
    """Per-token log-probs of each completion after its context under `model` (one list per completion)."""
    import torch
    from tqdm.auto import tqdm

    results = []
    with torch.no_grad():
        for start in tqdm(range(0, len(contexts), batch_size), desc="scoring", leave=False):
            ctx, comp = contexts[start : start + batch_size], completions[start : start + batch_size]
            width = max(len(a) + len(b) for a, b in zip(ctx, comp))
            input_ids = torch.zeros((len(ctx), width), dtype=torch.long)
            attention_mask = torch.zeros((len(ctx), width), dtype=torch.long)
            for row, (a, b) in enumerate(zip(ctx, comp)):  # right padding: positions stay those of a lone sequence
                input_ids[row, : len(a) + len(b)] = torch.tensor(list(a) + list(b))
                attention_mask[row, : len(a) + len(b)] = 1
            logps = torch.log_softmax(model(input_ids=input_ids, attention_mask=attention_mask).logits.float(), -1)
            for row, (a, b) in enumerate(zip(ctx, comp)):
                positions = torch.arange(len(a) - 1, len(a) + len(b) - 1)
                results.append(logps[row, positions, torch.tensor(list(b), dtype=torch.long)].tolist())
    return results


def wilson_interval(passes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% by default); (nan, nan) for n = 0."""
    if n == 0:
        return math.nan, math.nan
    p = passes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def output_dir(path: str | os.PathLike) -> Path:
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"cannot create the output folder {str(path)!r} ({error.strerror}).") from error
    return folder


def prefix_overlap(logp_current, logp_behaviour):
    """State coverage of prefixes sampled from a behaviour policy q, as seen by the current policy p.

    Each argument holds one summed log-probability per prefix (log p(prefix), log q(prefix)), the prefixes having been
    sampled from q. Returns E_q[min(1, p/q)] = 1 - TV(p, q) over those prefixes: the share of q's prefix mass that p
    still reaches. It falls as p moves away from q's states and is 1 when p = q, whatever the prefix length (a mean
    per-token log-prob threshold does neither). One definition, used by `positions` and by `compare`.
    """
    import numpy as np

    log_ratio = np.asarray(logp_current, dtype=np.float64) - np.asarray(logp_behaviour, dtype=np.float64)
    log_ratio = log_ratio[np.isfinite(log_ratio)]
    if log_ratio.size == 0:
        return math.nan
    return float(np.mean(np.exp(np.minimum(log_ratio, 0.0))))
