"""The seed dataset's card (`README.md` of a run's `seeds/` folder and of its Hub dataset repo), rendered from
`model_cards/dataset_card.md.j2`; the template lookup, citation and license text the model card
(`trainer/model_card.py`) shares."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from huggingface_hub import DatasetCard, DatasetCardData

from ..resources import packaged_file
from .checkpoints import checkpoint_folders
from .files import is_hub_id, public_model_name
from .schema import SEED_COLUMNS, TURN_COLUMNS, column_type_name

DATASET_CARD_TEMPLATE = "dataset_card.md.j2"
# Where a seed dataset's shards are: at the top of a run's local `seeds/` folder (where `superseded/` holds set-aside
# shards that are not part of it), and under `data/` in its Hub repo. The card's `configs:` block names both patterns
# (`datasets` skips a wildcard pattern that matches nothing), so that one card, written to the folder and pushed to the
# repo, makes `load_dataset(<local folder>)` and `load_dataset(<repo id>)` read exactly these.
LOCAL_SHARDS = "step-*.parquet"
HUB_SHARDS = "data/*.parquet"


def dataset_configs(shards: Sequence[str]) -> list[dict]:
    """The `configs:` entry of a seed dataset card: one `train` split of the shards matching the patterns `shards`."""
    return [{"config_name": "default", "data_files": [{"split": "train", "path": list(shards)}]}]


# The paper has no arXiv number at hand, so the entry carries none rather than a made-up one.
THINKING_SEEDS_CITATION = """\
@misc{sun2026thinkingseeds,
    title         = {{Thinking Seeds: Restarting On-Policy RL from the Model's Own Past Reasoning States}},
    author        = {Chenxi Sun and Deyi Xiong and Lei Yang and Renren Jin and Wei Bi},
    year          = {2026},
    archivePrefix = {arXiv},
    primaryClass  = {cs.CL},
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


def external_provenance(provenance: Mapping | None) -> dict | None:
    """Where a run's external seeds came from, as the cards show it (`external_seeds.py` records it)."""
    if not provenance:
        return None
    model, tokenizer = provenance.get("model"), provenance.get("tokenizer")
    return {
        **provenance,
        "link": hub_link(provenance["dataset"], "dataset"),
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
        return f"The terms of the base model {hub_link(base_model)} and of the training data apply."
    return (
        "No license was chosen for this model (`card_license`); the terms of its base model and training data apply. "
        "Set `card_license` (a Hub license id such as `apache-2.0`) to publish it under one."
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
    hub: bool = True,
    external: Mapping | None = None,
    turn_columns: Sequence[str] = (),
    checkpoint_steps: Sequence[int] = (),
) -> DatasetCard:
    """The card of a seed dataset, one text for a run's `seeds/` folder (shards at its top) and, with `hub=True`, its
    Hub repo (shards under `data/`): its `configs:` block makes `load_dataset` read the shards in either.
    `repo_id`: where the card says to load it from (the Hub repo when the run pushes one, else the folder's path).
    `steps`: the seed snapshots' (a shard each); `checkpoint_steps`: those with a checkpoint kept.

    Long: a keyword-only signature of every field the card shows, then one mapping to the template.
    """
    steps, model = sorted(set(steps)), public_model_name(model)  # a Hub id or a folder's name, never a local path
    card_data = DatasetCardData(
        **license_metadata(license, model if is_hub_id(model) else None),
        pretty_name=f"Thinking Seeds rollouts of {model}",
        size_categories=[_size_category(num_rows)],
        task_categories=["text-generation"],
        tags=["thinking-seeds", "trl"],
        configs=dataset_configs([LOCAL_SHARDS, HUB_SHARDS] if hub else [LOCAL_SHARDS]),
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
        hub=hub,
        trained_model_link=hub_link(trained_model_id),
        model=model,
        model_link=hub_link(model),
        tokenizer_fingerprint=tokenizer_fingerprint,
        steps=steps,
        steps_text=_steps_text(steps),
        checkpoint_steps=sorted(set(checkpoint_steps) & set(steps)),
        num_rows=num_rows,
        columns=columns,
        external=external_provenance(external),
        thinking_seeds_citation=THINKING_SEEDS_CITATION,
    )


def dataset_card_of(
    manifest,
    columns: Sequence[str],
    repo_id: str,
    license: str | None = None,
    trained_model_id: str | None = None,
    hub: bool = True,
) -> DatasetCard:
    """The dataset card of a run's seed folder and (`hub=True`) of its Hub repo `repo_id`, from its `manifest` (a
    `format.SeedManifest`, as the store holds it in memory) and its shards' `columns`: nothing is read back from disk
    but the names of the run's checkpoint folders, which count the snapshots that are checkpoints."""
    reward_columns = [name for name in columns if name.startswith("reward_")]
    model, tokenizer = manifest.model, manifest.tokenizer
    steps, num_rows = [entry["step"] for entry in manifest.shards], manifest.num_rows
    external = manifest.external
    # A shard is written every seed_snapshot_steps steps and at each checkpoint: the kept, complete ones are these.
    checkpoints = [step for step, _ in checkpoint_folders(Path(manifest.seeds_dir).parent, complete=True)]
    return render_dataset_card(
        turn_columns=[c.name for c in TURN_COLUMNS if c.name in columns],
        repo_id=repo_id,
        model=model,
        tokenizer_fingerprint=tokenizer,
        steps=steps,
        num_rows=num_rows,
        reward_columns=reward_columns,
        license=license,
        trained_model_id=trained_model_id,
        hub=hub,
        external=external,
        checkpoint_steps=checkpoints,
    )


def hub_link(repo_id: str | None, kind: str = "model") -> str | None:
    """A Markdown link to a Hub repo, a local path in backticks, or a description (of a model built in memory)."""
    if not repo_id:
        return None
    if is_hub_id(repo_id):
        prefix = "datasets/" if kind == "dataset" else ""
        return f"[{repo_id}](https://huggingface.co/{prefix}{repo_id})"
    return f"`{repo_id}`" if "/" in repo_id or Path(repo_id).exists() else repo_id


def format_value(value) -> str:
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
