"""Shared fixtures: the tiny tokenizer and model are built in-process, so the suite never touches the network."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from ts_trl.tiny import build_tiny_model, build_tokenizer  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def tiny_model(tokenizer):
    return build_tiny_model(tokenizer)


@pytest.fixture
def gsm8k_path():
    path = SHARED_DATA / "gsm8k_test.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is not laid out beside this checkout")
    return path
