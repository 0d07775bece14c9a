"""What a user gets from `ts_trl train`: a saved model, tokenizer, adapter and card that the standard loaders read, and
one clear line when the Hub is out of reach or the checkpoint to resume from does not exist."""

import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path

import datasets
import pytest
import transformers.utils.hub
from huggingface_hub import DatasetCard, ModelCard
from huggingface_hub import constants as hf_constants

from tests.conftest import EMBEDDED_TINY, free_port
from ts_trl.__main__ import main as ts_trl_main
from ts_trl.analysis.common import load_checkpoint
from ts_trl.tiny import build_tokenizer

EMBEDDED_SMALL = [*EMBEDDED_TINY, "--max_steps", "2", "--save_steps", "1", "--disable_tqdm", "true"]
TEXTS = ["Q: 3+13\nA:", "Q: 7+15+9\nA: 7+15=22\n22+9=31", "  two  spaces,\n\nblank line ~`|{}"]


def _train(output_dir: Path, *extra: str) -> Path:
    assert ts_trl_main(["train", "--output_dir", str(output_dir), *EMBEDDED_SMALL, *extra]) == 0
    return output_dir


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One warm-up cache for the module's runs (TS_TRL_CACHE is read when a run starts)."""
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TS_TRL_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="module")
def embedded_run(cache, tmp_path_factory):
    return _train(tmp_path_factory.mktemp("runs") / "embedded")


@pytest.fixture(scope="module")
def adapter_run(cache, tmp_path_factory):
    return _train(tmp_path_factory.mktemp("runs") / "lora", "--use_peft", "true", "--lora_r", "4")


def _load_snippet(card_text: str) -> str:
    """The Python block of the card's "How to load" section."""
    section = card_text.split("## How to load", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run_snippet(card_text: str) -> str:
    output = io.StringIO()
    with redirect_stdout(output):
        exec(_load_snippet(card_text), {})  # noqa: S102 - the card's own code, as a visitor would paste it
    return output.getvalue()


# ---------------------------------------------------------------------------------------------------------------------
# The saved tokenizer


def test_the_saved_embedded_model_reads_text_exactly_through_autotokenizer_and_pipeline(embedded_run):
    """Beside a qwen2 config.json, AutoTokenizer and pipeline() load Qwen2Tokenizer whatever the folder names: the
    saved tokenizer must give the ids the run trained with and decode back to the same text."""
    from transformers import AutoTokenizer, pipeline

    trained_with = build_tokenizer()
    loaded = AutoTokenizer.from_pretrained(embedded_run)
    generator = pipeline("text-generation", model=str(embedded_run))
    for tokenizer in (loaded, generator.tokenizer):
        for text in TEXTS:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert ids == trained_with(text, add_special_tokens=False)["input_ids"]
            assert tokenizer.decode(ids) == text
    prompt = TEXTS[0]
    assert generator(prompt, max_new_tokens=4, do_sample=False)[0]["generated_text"].startswith(prompt)


# ---------------------------------------------------------------------------------------------------------------------
# The cards


def test_the_model_card_loads_what_it_describes(embedded_run, monkeypatch):
    card = ModelCard((embedded_run / "README.md").read_text())
    assert "This model is a model" not in card.text and "Qwen2ForCausalLM" not in card.text
    assert f"{embedded_run.name} is ts_trl's tiny Qwen2 model" in card.text  # named by what it is
    assert "| `learning_rate` | `0.0001` |" in card.text and "| `num_generations` | `4` |" in card.text
    assert "- TRL: " in card.text and "- Transformers: " in card.text  # framework versions, as TRL's cards
    assert card.data.license == "apache-2.0" and not card.data.datasets and not card.data.base_model
    # The snippet loads the saved folder by its name (it lies outside the folder the run started from), never by this
    # machine's absolute path, and runs, from the folder's parent, on the run's own prompt.
    assert f'model="{embedded_run.name}"' in card.text and str(embedded_run.parent) not in card.text
    monkeypatch.chdir(embedded_run.parent)
    assert _run_snippet(card.text).strip() != ""
    # A 0.3M-parameter model's one reply may be wrong, and the card says so with its held-out score (issue 58).
    after = json.loads((embedded_run / "report.json").read_text())["held_out_pass@1_after"]
    assert (
        f"may well be wrong: a sample of this model solves a held-out problem with probability\n{after:.4g}"
        in card.text
    )

    dataset_card = DatasetCard((embedded_run / "seeds" / "README.md").read_text())
    assert "Qwen2ForCausalLM" not in str(dataset_card) and "ts_trl's tiny Qwen2 model" in dataset_card.text
    seeds = datasets.load_dataset(str(embedded_run / "seeds"), split="train", cache_dir=str(embedded_run / "ds"))
    assert set(seeds["model"]) == {dataset_card.data.pretty_name.removeprefix("Thinking Seeds rollouts of ")}


# ---------------------------------------------------------------------------------------------------------------------
# The adapter of the embedded model


def test_an_adapter_of_the_embedded_model_names_a_base_that_loads(adapter_run, monkeypatch):
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM

    for folder in (adapter_run, adapter_run / "checkpoint-2"):
        base = json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"]
        assert base == str((adapter_run / "base_model").resolve())
        model = AutoPeftModelForCausalLM.from_pretrained(folder)
        assert isinstance(model, PeftModel)
    # The card's snippet: the base from the run's base_model/ subfolder (also on the Hub), then the adapter.
    card = ModelCard((adapter_run / "README.md").read_text())
    assert card.data.library_name == "peft" and 'from_pretrained(f"{folder}/base_model")' in card.text
    assert "PEFT adapter for ts_trl's tiny Qwen2 model" in card.text
    monkeypatch.chdir(adapter_run.parent)  # the snippet names the folder, as seen from its parent
    assert _run_snippet(card.text).strip() != ""
    base = AutoModelForCausalLM.from_pretrained(adapter_run / "base_model")
    assert base.config.vocab_size == len(build_tokenizer())
    # The analyses (relay, positions) take the checkpoint too: its base, with the adapter merged.
    merged, tokenizer = load_checkpoint(adapter_run / "checkpoint-2")
    assert merged.config.vocab_size == base.config.vocab_size and tokenizer(TEXTS[0])["input_ids"]


# ---------------------------------------------------------------------------------------------------------------------
# Errors: one line


def _closed_port_endpoint() -> str:
    """A loopback address where nothing listens: connections are refused at once, as with no network."""
    return f"http://127.0.0.1:{free_port()}"


def _point_the_hub_client_at(endpoint: str, monkeypatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    # huggingface_hub reads it at import time (conftest imported it offline), so the module value is patched too, and
    # the HfApi that transformers shares between calls (made once, with the endpoint of its time) is made again.
    monkeypatch.setattr(hf_constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(transformers.utils.hub, "_hf_api", None)


@pytest.fixture
def no_network(monkeypatch):
    """huggingface_hub online, pointed at a loopback port where nothing listens."""
    endpoint = _closed_port_endpoint()
    _point_the_hub_client_at(endpoint, monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_FakeTokenForAnUnreachableHub0123456789")
    return endpoint


def test_push_to_hub_without_network_fails_in_one_line(no_network, cache, tmp_path, capsys):
    output_dir = tmp_path / "pushed"
    argv = ["train", "--output_dir", str(output_dir), *EMBEDDED_SMALL, "--push_to_hub", "true"]
    with pytest.raises(SystemExit) as exit_info:
        ts_trl_main([*argv, "--hub_model_id", "org/model"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "create the model repo 'org/model'" in err and no_network in err and "Connection refused" in err
    assert "train without push_to_hub" in err
    assert not (output_dir / "checkpoint-1").exists()  # refused before any training


def test_a_failed_final_push_keeps_the_model_and_says_so(hub, make_trainer, tmp_path, monkeypatch):  # noqa: F811
    """The Hub answers when the run starts and is gone when the model is pushed: one line that says where it is."""
    from ts_trl.store.hub import HubUnreachableError

    _point_the_hub_client_at(hub.endpoint, monkeypatch)
    trainer = make_trainer(output_dir=str(tmp_path / "run"), push_to_hub=True, hub_model_id="org/model", max_steps=1)
    trainer.train()
    _point_the_hub_client_at(_closed_port_endpoint(), monkeypatch)  # the network goes
    with pytest.raises(HubUnreachableError) as error:
        trainer.push_to_hub()
    message = str(error.value)
    assert "\n" not in message and "org/model" in message and f"hf upload org/model {tmp_path / 'run'}" in message
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_resuming_from_a_checkpoint_that_does_not_exist_names_it_and_the_ones_that_do(embedded_run, capsys):
    missing = embedded_run / "checkpoint-9"
    argv = ["train", "--output_dir", str(embedded_run), *EMBEDDED_SMALL, "--resume_from_checkpoint", str(missing)]
    try:  # refused before TRL's import (the status returned), or by the full parser
        status = ts_trl_main(argv)
    except SystemExit as exit_info:
        status = exit_info.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "manifest.json" not in err
    assert f"{missing}' does not exist" in err and "checkpoint-1, checkpoint-2" in err


def test_trainer_train_refuses_a_checkpoint_that_does_not_exist(tmp_path, make_trainer):
    trainer = make_trainer(output_dir=str(tmp_path / "run"), max_steps=1, save_steps=1)
    trainer.train()
    with pytest.raises(ValueError, match=r"checkpoint-7' does not exist: the checkpoints in .* are checkpoint-1\."):
        trainer.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-7"))
