"""The `ts_trl` command: `ts_trl train` trains, `relay`/`positions`/`compare` run the analyses.

`python -m ts_trl <command>` is the same. Each subcommand owns its parser: this one only picks the command and hands
it the rest of the command line.
"""

from __future__ import annotations

import argparse
import sys
from importlib import import_module

# Analysis commands: the module whose `main(argv)` runs it, and its one-line help.
ANALYSES = {
    "relay": ("ts_trl.analysis.relay", "checkpoint A writes the first r of a solution, B finishes it"),
    "positions": ("ts_trl.analysis.positions", "per-position divergence of a checkpoint from a seed dataset"),
    "compare": (
        "ts_trl.analysis.compare",
        "none / replay / seeds+action / seeds+state on the embedded task or a recipe (--config)",
    ),
    "probe-cuts": ("ts_trl.analysis.probe_cuts", "all-equal groups per cut ratio on one model: pick cut_ratio_max"),
}
COMMANDS = ("train", *ANALYSES)


def make_parser() -> tuple[argparse.ArgumentParser, dict]:
    """The `ts_trl` parser, and its subparsers by command name."""
    from trl import TrlParser

    from .script import make_parser as make_train_parser

    parser = argparse.ArgumentParser(prog="ts_trl", description="Thinking Seeds for TRL's GRPOTrainer.")
    # TrlParser subparsers, as TRL's own CLI builds them: `train` is the script's parser, recipes and all.
    subparsers = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}", parser_class=TrlParser)
    commands = {"train": make_train_parser(subparsers)}
    for name, (_, help_text) in ANALYSES.items():
        # add_help=False: `ts_trl <command> --help` reaches the analysis module's own parser.
        commands[name] = subparsers.add_parser(name, help=help_text, add_help=False)
    return parser, commands


def main(argv: list[str] | None = None) -> int:
    """Runs the command named by `argv[0]` with the rest of `argv`; returns its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, commands = make_parser()
    if not argv or argv[0] not in commands:
        if argv and argv[0] not in ("-h", "--help"):
            parser.print_usage(sys.stderr)
            print(f"ts_trl: error: unknown command {argv[0]!r}; choose one of {', '.join(COMMANDS)}.", file=sys.stderr)
            return 2
        parser.print_help()
        return 0
    if argv[0] == "train":
        from .script import run

        return run(argv[1:], commands["train"], prog="ts_trl train")
    from .analysis.common import run_command

    return run_command(import_module(ANALYSES[argv[0]][0]).main, argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
