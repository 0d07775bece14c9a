"""`python -m ts_trl.positions`: token-position analysis of a seed dataset (the code is in `ts_trl.analysis.positions`)."""

from .analysis.positions import cli, main  # noqa: F401

if __name__ == "__main__":
    raise SystemExit(cli())
