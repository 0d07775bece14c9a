"""The seed dataset's schema: its columns (`SEED_COLUMNS`, the multi-turn `TURN_COLUMNS`), `Rollout`, and the names
a row carries (prompt ids, the tokenizer's fingerprint, the model's name), and the checks of Arrow text every reader
shares. See docs/seed-dataset.md."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pyarrow as pa

SAMPLING_METADATA_KEY = b"ts_trl.sampling"  # a shard's Parquet metadata: how its rollouts were sampled (JSON)


@dataclass(frozen=True)
class Rollout:
    """One generated response, as written to the seed dataset (one Parquet row)."""

    rollout_id: str
    prompt_id: str
    prompt: str
    completion: str
    completion_ids: Sequence[int]
    logprobs: Sequence[float]
    reward: float
    step: int
    prefix_len: int = 0
    seed_origin: str | None = None
    rewards: dict[str, float] = field(default_factory=dict)  # per reward function
    tool_mask: Sequence[int] | None = None  # multi-turn rollouts: 1 on model tokens, 0 on tool results (TRL's)


class SeedColumn(NamedTuple):
    name: str
    type: pa.DataType
    meaning: str
    nullable: bool = False


# The columns of a seed dataset, in shard order; `reward_<name>` columns (float32, one per reward function) go
# after `reward`.
SEED_COLUMNS = (
    SeedColumn("rollout_id", pa.string(), "Unique id of the rollout."),
    SeedColumn("prompt_id", pa.string(), "Stable id of the prompt (a hash of it unless the training set had one)."),
    SeedColumn(
        "prompt",
        pa.string(),
        "The prompt; JSON text of the messages for conversational prompts, or of the row for rows whose environment "
        "makes the prompt.",
    ),
    SeedColumn("completion", pa.string(), "The decoded response: seed prefix (if any), then the generated tokens."),
    SeedColumn("completion_ids", pa.list_(pa.int32()), "Token ids of the response."),
    SeedColumn("logprobs", pa.list_(pa.float32()), "Per-token log-probs of the policy that produced each token."),
    SeedColumn("reward", pa.float32(), "Total reward of the whole response.", nullable=True),
    SeedColumn("step", pa.int32(), "Training step at which the rollout was generated."),
    SeedColumn(
        "checkpoint", pa.string(), "The checkpoint folder whose snapshot holds the row, e.g. `checkpoint-100`."
    ),
    SeedColumn("prefix_len", pa.int32(), "Number of leading tokens copied from a seed (0: from the prompt alone)."),
    SeedColumn("seed_origin", pa.string(), "`rollout_id` of the seed the prefix was cut from.", nullable=True),
    SeedColumn("model", pa.string(), "The model that was trained."),
    SeedColumn("tokenizer", pa.string(), "Fingerprint of the tokenizer's vocabulary."),
)


BANK_COLUMNS = ("rollout_id", "prompt_id", "completion_ids", "logprobs", "reward", "step")  # what the bank reads


def column_type_name(column: SeedColumn) -> str:
    """How a dataset card shows a column's type: `list<int32>`, `string (nullable)`."""
    name = str(column.type).replace("item: ", "")
    return f"{name} (nullable)" if column.nullable else name


# Multi-turn rollouts (tools, environments) add two columns after these: TRL's tool mask and the OpenAI-style messages.
TOOL_CALL_TYPE = pa.struct(
    [("type", pa.string()), ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))]
)


MESSAGE_TYPE = pa.struct(
    [("role", pa.string()), ("content", pa.string()), ("name", pa.string()), ("tool_calls", pa.list_(TOOL_CALL_TYPE))]
)


TURN_COLUMNS = (
    SeedColumn(
        "tool_mask",
        pa.list_(pa.int8()),
        "Multi-turn rollouts: per token of `completion_ids`, 1 for the model's tokens, 0 for tool results.",
        nullable=True,
    ),
    SeedColumn(
        "messages",
        pa.list_(MESSAGE_TYPE),
        "Multi-turn rollouts: the response as OpenAI-style messages (assistant turns with `tool_calls`, whose "
        "`arguments` are JSON text, and `tool` results).",
        nullable=True,
    ),
)


def openai_messages(completion: str) -> list[dict]:
    """A multi-turn completion (JSON of TRL's messages) as rows of `MESSAGE_TYPE`."""
    rows = []
    for message in json.loads(completion):
        calls = [
            {
                "type": call.get("type", "function"),
                "function": {
                    "name": call["function"]["name"],
                    "arguments": json.dumps(call["function"].get("arguments", {})),
                },
            }
            for call in message.get("tool_calls") or []
        ]
        content = message.get("content")
        rows.append(
            {
                "role": message["role"],
                "content": content if isinstance(content, str) or content is None else json.dumps(content),
                "name": message.get("name"),
                "tool_calls": calls or None,
            }
        )
    return rows


def seed_schema(reward_names: Sequence[str]) -> pa.Schema:
    """The Arrow schema of a run's shards, with one `reward_<name>` column per reward function."""
    fields = []
    for column in SEED_COLUMNS:
        fields.append(pa.field(column.name, column.type))
        if column.name == "reward":
            fields += [pa.field(f"reward_{name}", pa.float32()) for name in reward_names]
    return pa.schema(fields)


def bank_columns(names: Sequence[str]) -> list[str]:
    """The columns of a table the bank reads: its own and the per-function rewards (one may be the success reward),
    and for multi-turn rollouts their tool mask and completion (the recorded messages that a replay needs)."""
    turns = ("tool_mask", "completion") if "tool_mask" in names else ()
    return [n for n in names if n in BANK_COLUMNS or n.startswith("reward_") or n in turns]


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the vocabulary (token -> id), equal for tokenizers that map text to the same ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def rollouts_to_table(
    rollouts: Sequence[Rollout],
    checkpoint: str,
    model: str,
    tokenizer: str,
    reward_names: Sequence[str],
    sampling: dict | None = None,
) -> pa.Table:
    """The seed-dataset rows of `rollouts`, with list columns built from flat arrays (no per-token Python objects).

    `sampling` (see `snapshots.sampling_settings`) goes into the table's metadata.
    """
    lengths = np.fromiter((len(r.completion_ids) for r in rollouts), dtype=np.int32, count=len(rollouts))
    offsets = np.zeros(len(rollouts) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat_ids = np.concatenate([np.asarray(r.completion_ids, np.int32) for r in rollouts] or [np.zeros(0, np.int32)])
    flat_logps = np.concatenate([np.asarray(r.logprobs, np.float32) for r in rollouts] or [np.zeros(0, np.float32)])
    columns = {
        "rollout_id": [r.rollout_id for r in rollouts],
        "prompt_id": [r.prompt_id for r in rollouts],
        "prompt": [r.prompt for r in rollouts],
        "completion": [r.completion for r in rollouts],
        "completion_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat_ids)),
        "logprobs": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat_logps)),
        "reward": [r.reward for r in rollouts],
        **{f"reward_{name}": [r.rewards.get(name) for r in rollouts] for name in reward_names},
        "step": [r.step for r in rollouts],
        "checkpoint": [checkpoint] * len(rollouts),
        "prefix_len": [r.prefix_len for r in rollouts],
        "seed_origin": [r.seed_origin for r in rollouts],
        "model": [model] * len(rollouts),
        "tokenizer": [tokenizer] * len(rollouts),
    }
    schema = seed_schema(reward_names)
    if any(r.tool_mask is not None for r in rollouts):
        columns["tool_mask"] = [None if r.tool_mask is None else [int(x) for x in r.tool_mask] for r in rollouts]
        columns["messages"] = [None if r.tool_mask is None else openai_messages(r.completion) for r in rollouts]
        for column in TURN_COLUMNS:
            schema = schema.append(pa.field(column.name, column.type))
    table = pa.table([pa.array(columns[f.name], f.type) for f in schema], schema=schema)
    return with_sampling_metadata(table, sampling)


def with_sampling_metadata(table: pa.Table, sampling: dict | None) -> pa.Table:
    """`table` carrying `sampling` in its Parquet metadata; unchanged when None."""
    if not sampling:
        return table
    return table.replace_schema_metadata({SAMPLING_METADATA_KEY: json.dumps(sampling, sort_keys=True).encode()})


def prompt_id_of(prompt: str | list[dict]) -> str:
    """Stable id of a prompt: 16 hex chars of the sha1 of its text, or of its canonical JSON for chat messages."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def model_name_of(model) -> str:
    """What a model is, for cards and the seed dataset's `model` column: its Hub id or path, or for a model built in
    memory the description it carries (`ts_trl.tiny`'s models carry one), else its architecture and size."""
    description = getattr(model, "ts_trl_description", None)
    if description:
        return description
    name = getattr(model.config, "_name_or_path", "")
    if name:
        return name
    parameters = sum(parameter.numel() for parameter in model.parameters())
    return f"a {model.config.model_type} model built in memory ({parameters / 1e6:.2f}M parameters)"


def check_text(table: pa.Table, path: str | os.PathLike) -> pa.Table:
    """`table`, once its text columns are checked to be UTF-8: Parquet readers do not check, and a bad byte would
    otherwise surface as a `UnicodeDecodeError` at the first step that reads the row."""
    for name, column in zip(table.column_names, table.columns):
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            try:
                column.validate(full=True)
            except pa.ArrowInvalid as error:
                raise ValueError(
                    f"{path}: column {name!r} holds text that is not valid UTF-8 ({error}). Repair or remove the file."
                ) from None
    return table


def string_buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The UTF-8 bytes and offsets of an Arrow string array, without copying them."""
    array = array.cast(pa.string()) if array.type != pa.string() else array
    if array.null_count:
        raise ValueError("The seed dataset has rows without a rollout_id or prompt_id; every row needs both.")
    _, offsets, data = array.buffers()
    offsets = np.frombuffer(offsets, dtype=np.int32)[array.offset : array.offset + len(array) + 1]
    data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    return data, offsets.astype(np.int64)
