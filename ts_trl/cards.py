"""Model and seed-dataset cards for the Hub, rendered from the Jinja templates in `model_cards/`."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from huggingface_hub import DatasetCard, DatasetCardData, ModelCard, ModelCardData

from .resources import packaged_file
from .seed_data import SEED_COLUMNS, SeedManifest, column_type_name

MODEL_CARD_TEMPLATE = "model_card.md.j2"
DATASET_CARD_TEMPLATE = "dataset_card.md.j2"
TAGS = ("trl", "grpo", "thinking-seeds")
# Where a seed dataset's shards are: under `data/` in a Hub repo, at the top of a run's local `seeds/` folder (where
# `superseded/` holds set-aside shards that are not part of it). The card's `configs:` block names them, so that
# `load_dataset(<repo id>)` and `load_dataset(<local folder>)` read exactly these.
HUB_SHARDS = "data/*.parquet"
LOCAL_SHARDS = "step-*.parquet"


def dataset_configs(shards: str) -> list[dict]:
    """The `configs:` entry of a seed dataset card: one `train` split of the shards matching `shards`."""
    return [{"config_name": "default", "data_files": [{"split": "train", "path": shards}]}]


# Config fields worth showing in a card: those that change how seeds are picked, cut and trained.
SEED_SETTING_PREFIXES = ("seed_", "cut_", "prefix_")

# The paper has no arXiv number at hand, so the entry carries none rather than a made-up one.
THINKING_SEEDS_CITATION = """\
@misc{sun2026thinkingseeds,
    title         = {{Thinking Seeds: Restarting On-Policy RL from the Model's Own Past Reasoning States}},
    author        = {Chenxi Sun and Deyi Xiong and Lei Yang and Renren Jin and Wei Bi},
    year          = {2026},
    archivePrefix = {arXiv},
    primaryClass  = {cs.CL},
}"""
GRPO_CITATION = """\
@article{shao2024deepseekmath,
    title  = {{DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models}},
    author = {Zhihong Shao and Peiyi Wang and Qihao Zhu and Runxin Xu and Junxiao Song and Mingchuan Zhang and Y. K. Li and Y. Wu and Daya Guo},
    year   = {2024},
    eprint = {arXiv:2402.03300},
}"""
TRL_CITATION = """\
@software{vonwerra2020trl,
    title   = {{TRL: Transformers Reinforcement Learning}},
    author  = {von Werra, Leandro and Belkada, Younes and Tunstall, Lewis and Beeching, Edward and Thrush, Tristan and Lambert, Nathan and Huang, Shengyi and Rasul, Kashif and Gallouédec, Quentin},
    license = {Apache-2.0},
    url     = {https://github.com/huggingface/trl},
    year    = {2020}
}"""


def template_path(name: str) -> Path:
    """Path of a card template: the installed package data `ts_trl.model_cards`, else `model_cards/` of the checkout."""
    path = packaged_file("model_cards", name)
    if path is None:
        raise FileNotFoundError(
            f"Card template {name!r} is neither in the installed package (ts_trl.model_cards) nor in the checkout's "
            "model_cards/. Reinstall ts_trl (`pip install .`) so that its model_cards/ templates are included."
        )
    return path


def render_model_card(
    *,
    base_model: str | None,
    model_name: str,
    hub_model_id: str | None,
    dataset_name: str | None,
    seed_dataset_id: str | None,
    is_peft: bool,
    seed_config: Mapping,
    metrics: Mapping,
    license: str | None = None,
    tags: Sequence[str] = (),
    tokenizer_class: str = "AutoTokenizer",
) -> ModelCard:
    """The model card of a Thinking Seeds run: metadata for the Hub, the method, the seeding settings and metrics.

    Only Hub ids go into the metadata (`base_model`, `datasets`); a local model or data path is named in the text.
    `tokenizer_class` is what the "How to load" snippet uses (`PreTrainedTokenizerFast` for a tokenizer of that
    generic class, which `AutoTokenizer` would swap for the one registered for the architecture).
    """
    card_data = ModelCardData(
        base_model=base_model if _is_hub_id(base_model) else None,
        library_name="peft" if is_peft else "transformers",
        datasets=[name for name in (dataset_name, seed_dataset_id) if _is_hub_id(name)] or None,
        tags=list(dict.fromkeys([*TAGS, *tags])),
        pipeline_tag="text-generation",
        license=license,
        model_name=model_name,
    )
    seed_settings = [
        (name, _format_value(value))
        for name, value in sorted(seed_config.items())
        if name.startswith(SEED_SETTING_PREFIXES)
    ]
    return ModelCard.from_template(
        card_data,
        template_path=str(template_path(MODEL_CARD_TEMPLATE)),
        base_model_link=_hub_link(base_model),
        model_name=model_name,
        dataset_link=_hub_link(dataset_name, "dataset"),
        seed_dataset_link=_hub_link(seed_dataset_id, "dataset"),
        is_peft=is_peft,
        prefix_mode=seed_config.get("prefix_mode", "state"),
        repo_ref=hub_model_id or model_name,
        tokenizer_class=tokenizer_class,
        seed_settings=seed_settings,
        metrics=[(name, _format_value(value)) for name, value in metrics.items()],
        thinking_seeds_citation=THINKING_SEEDS_CITATION,
        grpo_citation=GRPO_CITATION,
        trl_citation=TRL_CITATION,
    )


def render_dataset_card(
    *,
    repo_id: str,
    model: str,
    tokenizer_fingerprint: str,
    steps: list[int],
    num_rows: int,
    reward_columns: list[str],
    license: str | None = None,
    trained_model_id: str | None = None,
    local: bool = False,
) -> DatasetCard:
    """The card of a seed dataset: a Hub repo `repo_id` (shards under `data/`), or with `local=True` a run's `seeds/`
    folder at path `repo_id` (shards at its top). Its `configs:` block makes `load_dataset(repo_id)` read them."""
    steps = sorted(set(steps))
    card_data = DatasetCardData(
        license=license,
        pretty_name=f"Thinking Seeds rollouts of {model}",
        size_categories=[_size_category(num_rows)],
        task_categories=["text-generation"],
        tags=["thinking-seeds", "trl"],
        configs=dataset_configs(LOCAL_SHARDS if local else HUB_SHARDS),
    )
    columns = []
    for seed_column in SEED_COLUMNS:
        columns.append((seed_column.name, column_type_name(seed_column), seed_column.meaning))
        if seed_column.name == "reward":
            columns += [
                (column, "float32", f"Reward of the `{column.removeprefix('reward_')}` reward function.")
                for column in reward_columns
            ]
    return DatasetCard.from_template(
        card_data,
        template_path=str(template_path(DATASET_CARD_TEMPLATE)),
        repo_id=repo_id,
        local=local,
        trained_model_link=_hub_link(trained_model_id),
        model=model,
        model_link=_hub_link(model),
        tokenizer_fingerprint=tokenizer_fingerprint,
        steps=steps,
        steps_text=_steps_text(steps),
        num_rows=num_rows,
        columns=columns,
        thinking_seeds_citation=THINKING_SEEDS_CITATION,
    )


def dataset_card_for_shard(
    shard_path: Path,
    repo_id: str,
    license: str | None = None,
    trained_model_id: str | None = None,
    local: bool = False,
) -> DatasetCard:
    """The dataset card for a run's seed folder, read from the `manifest.json` next to `shard_path` and its schema."""
    import pyarrow.parquet as pq

    shard_path = Path(shard_path)
    schema = pq.read_schema(shard_path)
    reward_columns = [name for name in schema.names if name.startswith("reward_")]
    manifest = SeedManifest.load(shard_path.parent)
    if manifest is not None:
        model, tokenizer = manifest.model, manifest.tokenizer
        steps, num_rows = [entry["step"] for entry in manifest.shards], manifest.num_rows
    else:  # a shard handed over without its manifest: describe that shard alone
        first = pq.read_table(shard_path, columns=[c for c in ("model", "tokenizer", "step") if c in schema.names])
        row = first.slice(0, 1).to_pylist()[0] if first.num_rows else {}
        model, tokenizer = row.get("model", "unknown"), row.get("tokenizer", "unknown")
        match = re.search(r"(\d+)", shard_path.stem)
        steps = [int(match.group(1))] if match else []
        num_rows = first.num_rows
    return render_dataset_card(
        repo_id=repo_id,
        model=model,
        tokenizer_fingerprint=tokenizer,
        steps=steps,
        num_rows=num_rows,
        reward_columns=reward_columns,
        license=license,
        trained_model_id=trained_model_id,
        local=local,
    )


def _is_hub_id(name: str | None) -> bool:
    """Whether `name` reads as a Hub repo id (`org/name`) rather than a local path."""
    return bool(name) and re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None and not Path(name).exists()


def _hub_link(repo_id: str | None, kind: str = "model") -> str | None:
    """A Markdown link to a Hub repo, or the name in backticks when it is a local path rather than a Hub id."""
    if not repo_id:
        return None
    if _is_hub_id(repo_id):
        prefix = "datasets/" if kind == "dataset" else ""
        return f"[{repo_id}](https://huggingface.co/{prefix}{repo_id})"
    return f"`{repo_id}`"


def _format_value(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _steps_text(steps: list[int]) -> str:
    if not steps:
        return "none"
    return ", ".join(str(step) for step in steps) if len(steps) <= 8 else f"{steps[0]} to {steps[-1]}"


def _size_category(num_rows: int) -> str:
    """The Hub's `size_categories` bucket for a row count."""
    bounds = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"))
    for bound, label in bounds:
        if num_rows < bound:
            return label
    return "1M<n<10M" if num_rows < 10_000_000 else "n>10M"
