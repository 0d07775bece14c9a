"""The model card of a Thinking Seeds run, rendered from `model_cards/model_card.md.j2` with what TRL's
`create_model_card` gathers of the trainer (base model, tags, tracker links, framework versions)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData
from trl.trainer.utils import get_comet_experiment_url, get_trackio_space_url

from ..resources import converted_from
from ..store.dataset_card import (
    THINKING_SEEDS_CITATION,
    external_provenance,
    format_value,
    hub_link,
    license_metadata,
    license_text,
    template_path,
)
from ..store.files import atomic_write_json, is_hub_id, public_model_name
from ..store.schema import model_name_of
from ..tiny import BASE_MODEL_DIR

MODEL_CARD_TEMPLATE = "model_card.md.j2"


TAGS = ("trl", "grpo", "thinking-seeds")


# Config fields worth showing in a card: those that change how seeds are picked, cut and trained.
SEED_SETTING_PREFIXES = ("seed_", "cut_", "prefix_")


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
    base_origin: Mapping | None = None,
) -> ModelCard:
    """The model card of a Thinking Seeds run: metadata for the Hub, how to load it, the method, settings and metrics.

    `repo_ref` is what the "How to load" snippet loads: the pushed repo id, or the run's folder. Only Hub ids go into
    the metadata (`base_model`, `datasets`); a local model or data path is named in the text. The run's own seed
    dataset is an output, so it is linked in the text and not listed under `datasets`. `base_description` names a base
    that has no Hub id (e.g. "ts_trl's tiny ... model"); `base_subfolder` is where an adapter's base is saved inside
    `repo_ref` when it has no Hub id. `base_origin`: where a base that ts_trl converted from a Hub model's release came
    from (`resources.converted_from`): the card names the Hub model, says where the weights came from, and its snippet
    loads the base as ts_trl got it. `base_model` is named as `store.files.public_model_name` names it, never by a path.

    Long: a keyword-only signature of every field the template shows, then one mapping to the template.
    """
    base_model = public_model_name(base_model)
    hub_base = base_model if is_hub_id(base_model) else None
    card_data = ModelCardData(
        base_model=hub_base,
        library_name="peft" if is_peft else "transformers",
        datasets=[name for name in (dataset_name, (external_seeds or {}).get("dataset")) if is_hub_id(name)] or None,
        tags=list(dict.fromkeys([*TAGS, *tags])),
        pipeline_tag="text-generation",
        model_name=model_name,
        **license_metadata(license, hub_base),
    )
    if hub_base:
        base_description = hub_link(hub_base)
    elif base_description is None:
        base_description = f"the local model `{base_model}`" if base_model else "a model built in memory"
    seed_settings = [
        (name, format_value(value))
        for name, value in sorted(seed_config.items())
        if name.startswith(SEED_SETTING_PREFIXES)
    ]
    example = example_prompt if example_prompt else "Hello"
    held_out = metrics.get("held_out_pass@1_after")  # said beside the snippet: its one reply may be wrong
    return ModelCard.from_template(
        card_data,
        template_path=str(template_path(MODEL_CARD_TEMPLATE)),
        model_name=model_name,
        base_description=base_description,
        dataset_link=hub_link(dataset_name, "dataset"),
        seed_dataset_link=hub_link(seed_dataset_id, "dataset"),
        is_peft=is_peft,
        base_subfolder=base_subfolder,
        base_origin=base_origin,
        local_base=None if hub_base or base_subfolder or not base_model else base_model,
        prefix_mode=seed_config.get("prefix_mode", "state"),
        repo_ref=repo_ref,
        repo_is_hub_id=is_hub_id(repo_ref),
        example=repr(example),
        example_is_chat=isinstance(example, list),
        max_new_tokens=max_new_tokens,
        held_out_pass_at_1=None if held_out is None else format_value(held_out),
        num_processes=num_processes,
        trackers=list(trackers),
        hyperparameters=[(name, format_value(value)) for name, value in hyperparameters.items()],
        seed_settings=seed_settings,
        metrics=[(name, format_value(value)) for name, value in metrics.items()],
        versions=list(versions),
        external_seeds=external_provenance(external_seeds),
        license_text=license_text(license, hub_base),
        thinking_seeds_citation=THINKING_SEEDS_CITATION,
        grpo_citation=GRPO_CITATION,
        trl_citation=TRL_CITATION,
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
    framework versions), rendered from this package's template with what a Hub visitor needs to load and judge it.

    Long: TRL's `create_model_card` gathering, one field after another, then one call of the renderer.
    """

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
        base_origin=converted_from(name_or_path) if name_or_path else None,
    )


def name_adapter_bases(folder, output_dir) -> None:
    """Makes the `adapter_config.json` saved in `folder` name its base as the card does (`public_model_name`): the
    Hub id where one is known. A local model without a Hub id keeps its path here (the card names it by its folder's
    name and says how to get it): PEFT and `relay`/`positions` load the base by this field, and a bare folder name
    would make the adapter unloadable even on the machine that trained it.

    Rewritten after PEFT saved it: while saving, PEFT looks the base up by that name (on the Hub, for a Hub id), which
    would cost a Hub request, or an offline warning, at every checkpoint. A base saved in the run's own `base_model/`
    keeps its path: `AutoPeftModelForCausalLM` loads the run folder by it, and the card's snippet loads the base from
    that subfolder wherever the run is copied.
    """
    path = Path(folder) / "adapter_config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text())
    base = config.get("base_model_name_or_path")
    if not base or base == str((Path(output_dir) / BASE_MODEL_DIR).resolve()):
        return
    public = public_model_name(base)
    if public == base or (Path(base).exists() and public == Path(base).name):
        return  # a local model without a Hub id keeps its path: PEFT loads the adapter's base by it, and only by it
    config["base_model_name_or_path"] = public
    atomic_write_json(path, config)


def _first_prompt(dataset) -> str | list | None:
    """The first training prompt, as the card's example input (text, or a conversation's messages)."""
    try:
        prompt = dataset[0]["prompt"]
    except Exception:  # noqa: BLE001 - no dataset, an iterable one, no prompt column: the card uses a plain example
        return None
    return prompt if isinstance(prompt, (str, list)) else None
