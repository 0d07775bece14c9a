"""`python -m ts_trl.relay`: relay inference, checkpoint A starts and B finishes (the code is in `ts_trl.analysis.relay`)."""

from .analysis.relay import cli, main  # noqa: F401

if __name__ == "__main__":
    raise SystemExit(cli())
