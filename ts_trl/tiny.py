"""A character-level tokenizer and a tiny Qwen2 model that the package builds itself, with no download.

They serve the embedded default (`train.py` with no model) and the test-suite: every printable ASCII character and
the newline is one token, so any text round-trips exactly and sequence lengths are easy to reason about.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

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
    """Returns the character-level tokenizer (vocabulary of 100 tokens: 4 special, 96 characters)."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )
    hf_tokenizer.chat_template = CHAT_TEMPLATE
    return hf_tokenizer


def load_tokenizer(path) -> PreTrainedTokenizerFast:
    """Loads a saved tokenizer; one saved as a plain `tokenizer.json` (like ours) comes back exactly as saved.

    `AutoTokenizer` picks the tokenizer class registered for the model's architecture when a `config.json` sits
    beside it (transformers 5 forces `Qwen2Tokenizer` for `qwen2`), whose own pre-tokenizer replaces the saved one and
    silently changes the ids (spaces vanish with the character tokenizer).
    """
    from transformers import AutoTokenizer

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
    import torch

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
    return model


def save_model_from_this_rank(model, folder) -> None:
    """Writes a model built in memory (config and weights) to `folder` from this process, whatever its rank.

    `save_pretrained` writes the weights on rank 0 only once torch.distributed is up, while every rank of a run needs
    its own complete copy here: the warm-up cache that the first rank to finish renames into place, and the folder a
    KL reference model is loaded from.
    """
    import copy

    from safetensors.torch import save_file

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
