"""A character-level tokenizer and a tiny Qwen2 model that the package builds itself, with no download.

They serve the embedded default (`train.py` with no model) and the test-suite: every printable ASCII character and
the newline is one token, so any text round-trips exactly and sequence lengths are easy to reason about.

The tokenizer is stored as a byte-level BPE with no merges, the form of Qwen2's own tokenizer: `AutoTokenizer` and
`pipeline()` load a saved Qwen2 folder with `Qwen2Tokenizer` whatever class the folder names, and rebuild its
pre-tokenizer and decoder as Qwen2's. With byte-level tokens and no merges that rebuilt tokenizer splits text into the
same single characters, with the same ids, as the one built here; a character-level vocabulary would lose its spaces
and newlines there.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import string
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from accelerate import PartialState
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>")
CHARACTERS = tuple(string.printable[:95]) + ("\n",)  # digits, letters, punctuation, space, newline

# A chat template so conversational datasets work too; the generation prompt is a plain "A:" line.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}Q: {{ message['content'] }}\n"
    "{% else %}A: {{ message['content'] }}<eos>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Returns the character-level tokenizer (vocabulary of 100 tokens: 4 special, 96 characters).

    Character `c` has id `4 + CHARACTERS.index(c)`; its token is spelled as byte-level BPE spells it (`Ġ` for a
    space, `Ċ` for a newline, the character itself for the other 94). A character outside the vocabulary is
    `<unk>` here (one per UTF-8 byte) and is dropped by `Qwen2Tokenizer`, which has no unknown token.
    """
    byte_level = bytes_to_unicode()
    tokens = SPECIAL_TOKENS + tuple(byte_level[ord(character)] for character in CHARACTERS)
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )
    hf_tokenizer.chat_template = CHAT_TEMPLATE
    return hf_tokenizer


def load_tokenizer(path) -> PreTrainedTokenizerFast:
    """Loads a saved tokenizer; one saved as a plain `tokenizer.json` comes back exactly as saved.

    `AutoTokenizer` picks the tokenizer class registered for the model's architecture when a `config.json` sits
    beside it (transformers 5 forces `Qwen2Tokenizer` for `qwen2`), whose own pre-tokenizer replaces the saved one.
    The tokenizer built here survives that, but folders saved with the earlier character-level vocabulary (spelled
    `" "` and `"\\n"` rather than `Ġ` and `Ċ`) would silently lose their spaces and newlines through it.
    """

    config = Path(path) / "tokenizer_config.json"
    if config.exists() and json.loads(config.read_text()).get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES:
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = 512,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """Returns a randomly initialised Qwen2 causal LM sized for `tokenizer` (about 0.1M parameters by default)."""

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    with torch.random.fork_rng():  # building the model must not move the caller's RNG
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    # What cards and seed datasets call it: it has no Hub id or path (see `ts_trl.store.schema.model_name_of`).
    model.ts_trl_description = describe_tiny_model(model, "built in memory")
    return model


def describe_tiny_model(model, how: str) -> str:
    parameters = sum(parameter.numel() for parameter in model.parameters())
    return f"ts_trl's tiny Qwen2 model ({parameters / 1e6:.2f}M parameters, {how})"


def save_model_from_this_rank(model, folder) -> None:
    """Writes a model built in memory (config and weights) to `folder` from this process, whatever its rank.

    `save_pretrained` writes the weights on rank 0 only once torch.distributed is up, while every rank of a run needs
    its own complete copy here: the warm-up cache that the first rank to finish renames into place, and the folder a
    KL reference model is loaded from.
    """

    config = copy.copy(model.config)
    config.architectures = [type(model).__name__]  # what loaders (TRL's reference model) read to pick the class
    config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    weights, stored = {}, set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in stored:  # a tied copy (the LM head of tied embeddings) is tied again on load
            stored.add(tensor.data_ptr())
            weights[name] = tensor.detach().contiguous()
    save_file(weights, Path(folder) / "model.safetensors", metadata={"format": "pt"})


BASE_MODEL_DIR = "base_model"


def save_base_for_adapter(model, tokenizer, output_dir, peft_config) -> Path | None:
    """With a `peft_config`, saves a model built in memory to `<output_dir>/base_model` and names it there.

    PEFT writes the base model's `name_or_path` into every `adapter_config.json`; a model built in memory (the embedded
    default's warm model, or one made from a config) has none, and its adapter could not be loaded by anyone. Saved
    here, `PeftModel`/`AutoPeftModelForCausalLM` find the base by that absolute path, and the folder travels with the
    run (a Hub repo gets it as its `base_model/` subfolder). Returns the folder, or None when nothing was saved.
    """
    if (
        peft_config is None
        or isinstance(model, str)
        or getattr(model.config, "_name_or_path", "")
        or hasattr(model, "peft_config")
    ):
        return None

    folder = (Path(output_dir) / BASE_MODEL_DIR).resolve()
    state = PartialState()
    if state.is_main_process:
        # Written beside and renamed into place, so a crash never leaves a torn base under an adapter that names it.
        folder.parent.mkdir(parents=True, exist_ok=True)
        temporary = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        save_model_from_this_rank(model, temporary)
        if tokenizer is not None:
            tokenizer.save_pretrained(temporary)
        previous = folder.with_name(f".{folder.name}-previous")
        if folder.exists():
            shutil.rmtree(previous, ignore_errors=True)
            os.rename(folder, previous)
        os.rename(temporary, folder)
        shutil.rmtree(previous, ignore_errors=True)
    state.wait_for_everyone()
    # PEFT reads the name from the model's own `name_or_path`, which `from_pretrained` sets beside the config's.
    model.config._name_or_path = model.name_or_path = str(folder)
    return folder


def build_word_tokenizer(corpus: Sequence[str], vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained here, offline, on `corpus` (texts of the task it will tokenise).

    It splits text into words, numbers and merged pieces, unlike `build_tokenizer`'s one token per character: the
    "other model family" of the tests of text seeds across tokenizers. Same special tokens and chat template.
    """

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    byte_level = bytes_to_unicode()
    trainer = trainers.BpeTrainer(  # the characters of `build_tokenizer`, so that any text of one is text of the other
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=[byte_level[ord(character)] for character in CHARACTERS],
        limit_alphabet=len(CHARACTERS),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )
    hf_tokenizer.chat_template = CHAT_TEMPLATE
    return hf_tokenizer
