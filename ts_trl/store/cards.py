"""Model and seed-dataset cards for the Hub, rendered from the Jinja templates in `model_cards/`."""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pyarrow.parquet as pq
from huggingface_hub import DatasetCard, DatasetCardData, ModelCard, ModelCardData
from trl.trainer.utils import get_comet_experiment_url, get_trackio_space_url

from ..resources import packaged_file
from ..tiny import BASE_MODEL_DIR
from .format import SEED_COLUMNS, TURN_COLUMNS, SeedManifest, column_type_name

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
    repo_ref: str,
    dataset_name: str | None,
    seed_dataset_id: str | None,
    is_peft: bool,
    seed_config: Mapping,
    metrics: Mapping,
    hyperparameters: Mapping = {},
    license: str | None = None,
    tags: Sequence[str] = (),
    base_description: str | None = None,
    base_subfolder: str | None = None,
    example_prompt: str | list | None = None,
    max_new_tokens: int = 64,
    num_processes: int = 1,
    trackers: Sequence[tuple[str, str, str]] = (),
    versions: Sequence[tuple[str, str]] = (),
    external_seeds: Mapping | None = None,
) -> ModelCard:
    """The model card of a Thinking Seeds run: metadata for the Hub, how to load it, the method, settings and metrics.

    `repo_ref` is what the "How to load" snippet loads: the pushed repo id, or the run's folder. Only Hub ids go into
    the metadata (`base_model`, `datasets`); a local model or data path is named in the text. The run's own seed
    dataset is an output, so it is linked in the text and not listed under `datasets`. `base_description` names a base
    that has no Hub id (e.g. "ts_trl's tiny ... model"); `base_subfolder` is where an adapter's base is saved inside
    `repo_ref` when it has no Hub id.
    """
    hub_base = base_model if _is_hub_id(base_model) else None
    card_data = ModelCardData(
        base_model=hub_base,
        library_name="peft" if is_peft else "transformers",
        datasets=[name for name in (dataset_name, (external_seeds or {}).get("dataset")) if _is_hub_id(name)] or None,
        tags=list(dict.fromkeys([*TAGS, *tags])),
        pipeline_tag="text-generation",
        model_name=model_name,
        **license_metadata(license, hub_base),
    )
    if hub_base:
        base_description = _hub_link(hub_base)
    elif base_description is None:
        base_description = f"the model at `{base_model}`" if base_model else "a model built in memory"
    seed_settings = [
        (name, _format_value(value))
        for name, value in sorted(seed_config.items())
        if name.startswith(SEED_SETTING_PREFIXES)
    ]
    example = example_prompt if example_prompt else "Hello"
    return ModelCard.from_template(
        card_data,
        template_path=str(template_path(MODEL_CARD_TEMPLATE)),
        model_name=model_name,
        base_description=base_description,
        dataset_link=_hub_link(dataset_name, "dataset"),
        seed_dataset_link=_hub_link(seed_dataset_id, "dataset"),
        is_peft=is_peft,
        base_subfolder=base_subfolder,
        prefix_mode=seed_config.get("prefix_mode", "state"),
        repo_ref=repo_ref,
        repo_is_hub_id=_is_hub_id(repo_ref),
        example=repr(example),
        example_is_chat=isinstance(example, list),
        max_new_tokens=max_new_tokens,
        num_processes=num_processes,
        trackers=list(trackers),
        hyperparameters=[(name, _format_value(value)) for name, value in hyperparameters.items()],
        seed_settings=seed_settings,
        metrics=[(name, _format_value(value)) for name, value in metrics.items()],
        versions=list(versions),
        external_seeds=external_provenance(external_seeds),
        license_text=license_text(license, hub_base),
        thinking_seeds_citation=THINKING_SEEDS_CITATION,
        grpo_citation=GRPO_CITATION,
        trl_citation=TRL_CITATION,
    )


def external_provenance(provenance: Mapping | None) -> dict | None:
    """Where a run's external seeds came from, as the cards show it (`external_seeds.py` records it)."""
    if not provenance:
        return None
    model, tokenizer = provenance.get("model"), provenance.get("tokenizer")
    return {
        **provenance,
        "link": _hub_link(provenance["dataset"], "dataset"),
        "model": ", ".join(model) if isinstance(model, list) else model,
        "tokenizer": f"`{tokenizer}`" if isinstance(tokenizer, str) else None,
        "kept": provenance.get("kept"),
    }


def license_metadata(license: str | None, base_model: str | None) -> dict:
    """The card metadata for `card_license`: a Hub license id as is; `other` (the base model's and the data's terms)
    with `license_name`/`license_link` pointing at the base model when it is on the Hub, else no license key at all,
    since the Hub reads `license: other` without a name and a link as an incomplete card."""
    if not license:
        return {}
    if license != "other":
        return {"license": license}
    if base_model:
        return {
            "license": "other",
            "license_name": "same-as-base-model",
            "license_link": f"https://huggingface.co/{base_model}",
        }
    return {}


def license_text(license: str | None, base_model: str | None) -> str:
    if license and license != "other":
        return f"`{license}`."
    if base_model:
        return f"The terms of the base model {_hub_link(base_model)} and of the training data apply."
    return (
        "No license was chosen for this model (`card_license`); the terms of its base model and training data apply. "
        "Set `card_license` (a Hub license id such as `apache-2.0`) to publish it under one."
    )


# GRPOConfig fields shown in a card's hyper-parameter table: those that decide what was trained and how long.
HYPERPARAMETERS = (
    "learning_rate",
    "lr_scheduler_type",
    "warmup_ratio",
    "weight_decay",
    "optim",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "max_completion_length",
    "temperature",
    "top_p",
    "beta",
    "epsilon",
    "loss_type",
    "scale_rewards",
    "num_iterations",
    "num_train_epochs",
    "max_steps",
    "seed",
    "bf16",
)
# (name on the card, distribution) of the libraries whose versions a card lists, as TRL's own cards do, plus ours.
FRAMEWORKS = (
    ("ts_trl", "ts-trl"),
    ("TRL", "trl"),
    ("Transformers", "transformers"),
    ("PyTorch", "torch"),
    ("Datasets", "datasets"),
    ("Tokenizers", "tokenizers"),
    ("PEFT", "peft"),
)
TRACKER_BADGES = {
    "Weights & Biases": "https://raw.githubusercontent.com/wandb/assets/main/wandb-github-badge-28.svg",
    "Trackio": "https://raw.githubusercontent.com/gradio-app/trackio/refs/heads/main/trackio/assets/badge.png",
    "Comet": "https://raw.githubusercontent.com/comet-ml/comet-examples/master/logo/comet_badge.png",
}


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


def _local_ref(folder: Path) -> str:
    """How a card's snippet names the folder it is saved in: relative to where the run started when it lies below it
    (`runs/embedded`), else by its name; never the absolute path, which names this machine's folders and breaks once
    the folder is copied."""
    try:
        return Path(folder).relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return Path(folder).name


def model_card_for(trainer, model_name=None, dataset_name=None, tags=None, metrics=None) -> ModelCard:
    """The model card of `trainer`'s run, as TRL's `create_model_card` gathers it (base model, tags, tracker links,
    framework versions), rendered from this package's template with what a Hub visitor needs to load and judge it."""

    args, model = trainer.args, trainer.model
    output_dir = Path(args.output_dir).resolve()
    name_or_path = getattr(model.config, "_name_or_path", "") or None
    is_peft = hasattr(model, "peft_config")
    saved_base = name_or_path == str(output_dir / BASE_MODEL_DIR)
    # TRL's tag rules: the trainer's tags, the caller's, and the Trackio run's link.
    tags = [tags] if isinstance(tags, str) else list(tags or [])
    tags += [tag for tag in trainer._tag_names if tag not in tags]
    trackers = []
    if (trackio_url := get_trackio_space_url()) is not None:
        tags.append(f"trackio:{trackio_url}")
        trackers.append(("Trackio", trackio_url))
    wandb_run = getattr(sys.modules.get("wandb"), "run", None)
    if wandb_run is not None:
        trackers.append(("Weights & Biases", wandb_run.url))
    if (comet_url := get_comet_experiment_url()) is not None:
        trackers.append(("Comet", comet_url))
    card_metrics = {}
    for key in ("reward", "seeds/seeded_group_share", "seeds/reward_seeded", "seeds/reward_unseeded"):
        # TRL logs None for a window where every value was NaN (e.g. a reward that returned None for a whole
        # batch): such windows have no mean to contribute.
        values = [h[key] for h in trainer.state.log_history if isinstance(h.get(key), (int, float))]
        values = [value for value in values if not math.isnan(value)]
        if values:
            card_metrics[f"{key} (mean over training)"] = sum(values) / len(values)
    versions = []
    for label, distribution in FRAMEWORKS:
        if distribution == "peft" and not is_peft:
            continue
        try:
            versions.append((label, version(distribution)))
        except PackageNotFoundError:
            continue
    pushed = args.push_to_hub and getattr(trainer, "hub_model_id", None)
    return render_model_card(
        base_model=None if saved_base else name_or_path,
        model_name=model_name or output_dir.name,
        repo_ref=trainer.hub_model_id if pushed else _local_ref(output_dir),
        dataset_name=dataset_name,
        seed_dataset_id=args.hub_seed_dataset_id if args.push_seeds_to_hub else None,
        is_peft=is_peft,
        seed_config={f.name: getattr(args, f.name) for f in dataclasses.fields(args)},
        metrics={**card_metrics, **(metrics or {})},
        hyperparameters={name: getattr(args, name) for name in HYPERPARAMETERS if hasattr(args, name)},
        license=args.card_license,
        tags=tags,
        base_description=None if name_or_path and not saved_base else model_name_of(model),
        base_subfolder=BASE_MODEL_DIR if is_peft and saved_base else None,
        example_prompt=_first_prompt(trainer.train_dataset),
        max_new_tokens=args.max_completion_length,
        num_processes=trainer.accelerator.num_processes,
        trackers=[(name, url, TRACKER_BADGES[name]) for name, url in trackers],
        versions=versions,
        external_seeds=getattr(getattr(trainer, "seed_store", None), "external_provenance", None),
    )


def _first_prompt(dataset) -> str | list | None:
    """The first training prompt, as the card's example input (text, or a conversation's messages)."""
    try:
        prompt = dataset[0]["prompt"]
    except Exception:  # noqa: BLE001 - no dataset, an iterable one, no prompt column: the card uses a plain example
        return None
    return prompt if isinstance(prompt, (str, list)) else None


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
    external: Mapping | None = None,
    turn_columns: Sequence[str] = (),
) -> DatasetCard:
    """The card of a seed dataset: a Hub repo `repo_id` (shards under `data/`), or with `local=True` a run's `seeds/`
    folder at path `repo_id` (shards at its top). Its `configs:` block makes `load_dataset(repo_id)` read them."""
    steps = sorted(set(steps))
    card_data = DatasetCardData(
        **license_metadata(license, model if _is_hub_id(model) else None),
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
    columns += [(c.name, column_type_name(c), c.meaning) for c in TURN_COLUMNS if c.name in turn_columns]
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
        external=external_provenance(external),
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

    shard_path = Path(shard_path)
    schema = pq.read_schema(shard_path)
    reward_columns = [name for name in schema.names if name.startswith("reward_")]
    manifest = SeedManifest.load(shard_path.parent)
    if manifest is not None:
        model, tokenizer = manifest.model, manifest.tokenizer
        steps, num_rows = [entry["step"] for entry in manifest.shards], manifest.num_rows
        external = manifest.external
    else:  # a shard handed over without its manifest: describe that shard alone
        first = pq.read_table(shard_path, columns=[c for c in ("model", "tokenizer", "step") if c in schema.names])
        row = first.slice(0, 1).to_pylist()[0] if first.num_rows else {}
        model, tokenizer = row.get("model", "unknown"), row.get("tokenizer", "unknown")
        match = re.search(r"(\d+)", shard_path.stem)
        steps = [int(match.group(1))] if match else []
        num_rows, external = first.num_rows, None
    return render_dataset_card(
        turn_columns=[c.name for c in TURN_COLUMNS if c.name in schema.names],
        repo_id=repo_id,
        model=model,
        tokenizer_fingerprint=tokenizer,
        steps=steps,
        num_rows=num_rows,
        reward_columns=reward_columns,
        license=license,
        trained_model_id=trained_model_id,
        local=local,
        external=external,
    )


def _is_hub_id(name: str | None) -> bool:
    """Whether `name` reads as a Hub repo id (`org/name`) rather than a local path."""
    return bool(name) and re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None and not Path(name).exists()


def _hub_link(repo_id: str | None, kind: str = "model") -> str | None:
    """A Markdown link to a Hub repo, a local path in backticks, or a description (of a model built in memory)."""
    if not repo_id:
        return None
    if _is_hub_id(repo_id):
        prefix = "datasets/" if kind == "dataset" else ""
        return f"[{repo_id}](https://huggingface.co/{prefix}{repo_id})"
    return f"`{repo_id}`" if "/" in repo_id or Path(repo_id).exists() else repo_id


def _format_value(value) -> str:
    if isinstance(value, enum.Enum):  # transformers' SchedulerType, OptimizerNames, ...
        value = value.value
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
