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
