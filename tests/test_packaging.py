"""pyproject lists its packages explicitly (for the model_cards mapping): every subpackage must be in that list."""

from pathlib import Path

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
