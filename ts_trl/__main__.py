"""The `ts_trl` command: `ts_trl train` trains, `relay`/`positions`/`compare` run the analyses.

`python -m ts_trl <command>` is the same. Each subcommand owns its parser: this one only picks the command and hands
it the rest of the command line.
"""

from __future__ import annotations

import argparse
import sys
from importlib import import_module

from .cli.refusals import refuse_bad_recipe
from .trainer.notices import quiet_dependencies

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
TRAIN_HELP = "train with Thinking Seeds (the embedded default without a model or a dataset)"


def make_parser() -> argparse.ArgumentParser:
    """The `ts_trl` parser: it only names the commands, each of which parses its own flags (TRL stays unimported)."""
    parser = argparse.ArgumentParser(prog="ts_trl", description="Thinking Seeds for TRL's GRPOTrainer.")
    subparsers = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    subparsers.add_parser("train", help=TRAIN_HELP)
    for name, (_, help_text) in ANALYSES.items():
        subparsers.add_parser(name, help=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the command named by `argv[0]` with the rest of `argv`; returns its exit status."""
    quiet_dependencies()  # a command may (a library may not): before TRL or DeepSpeed is imported
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser = make_parser()
        if argv and argv[0] not in ("-h", "--help"):
            parser.print_usage(sys.stderr)
            print(f"ts_trl: error: unknown command {argv[0]!r}; choose one of {', '.join(COMMANDS)}.", file=sys.stderr)
            return 2
        parser.print_help()
        return 0
    if argv[0] == "train":
        prog = "ts_trl train"
        try:
            refuse_bad_recipe(prog, argv[1:])  # before TRL is imported: a recipe needs no parser
        except SystemExit as done:
            return done.code
        from .cli.train import run  # lazy: start-up time (`ts_trl <command> --help` without TRL)

        return run(argv[1:], prog=prog)
    from .analysis.common import run_command  # lazy: start-up time, as above

    module = ANALYSES[argv[0]][0]
    if argv[0] == "compare":
        from .analysis.compare import wants_recipe  # lazy: start-up time, as above

        if wants_recipe(argv[1:]):
            module = "ts_trl.analysis.recipe_compare"  # the arms on a recipe's model, data and rewards
    return run_command(import_module(module).main, argv[1:], prog=f"ts_trl {argv[0]}")


if __name__ == "__main__":
    raise SystemExit(main())
