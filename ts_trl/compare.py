"""`python -m ts_trl.compare`: the four methods on the embedded task, same budget (the code is in `ts_trl.analysis.compare`)."""

from .analysis.compare import cli, main  # noqa: F401

if __name__ == "__main__":
    raise SystemExit(cli())
