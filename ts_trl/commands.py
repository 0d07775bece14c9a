"""The analysis subcommands of the `ts_trl` console script: `main(["relay", ...])` runs `ts_trl.analysis.relay`.

`ts_trl.cli:main` hands its argv here when the first word is one of `COMMANDS`; each command also runs on its own as
`python -m ts_trl.<command>`.
"""

from __future__ import annotations

import sys
from importlib import import_module

COMMANDS = {
    "relay": ("ts_trl.analysis.relay", "checkpoint A writes the first r of a solution, B finishes it"),
    "positions": ("ts_trl.analysis.positions", "per-position divergence of a checkpoint from a seed dataset"),
    "compare": ("ts_trl.analysis.compare", "none / replay / seeds+action / seeds+state on the embedded task"),
}


def main(argv: list[str] | None = None) -> int:
    """Runs `argv[0]` with the rest of `argv`; returns the exit status (2 with one `error:` line on bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"error: unknown command {argv[0]!r}; choose one of {', '.join(COMMANDS)}.", file=sys.stderr)
        print("usage: ts_trl {" + ",".join(COMMANDS) + "} [options]   (ts_trl <command> --help for its options)")
        for name, (_, help_text) in COMMANDS.items():
            print(f"  {name:<10} {help_text}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module, _ = COMMANDS[argv[0]]
    return import_module(module).cli(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
