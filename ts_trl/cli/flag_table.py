"""The flags of `ts_trl train` as data, so that bad flags and recipe values are answered before TRL is imported.

The parser is TRL's `TrlParser` over `SeedScriptArguments`, `SeedGRPOConfig` and `ModelConfig`: building it means
importing torch, transformers and TRL. Its flags (spellings, how many values, type, choices) are written as a table:
`train_flags.json`, shipped beside this module for the TRL and transformers versions it was made with, and a copy in
`$TS_TRL_CACHE/flags/` written by every run that builds the parser, for other versions or edited source. The same checks
(`flag_problems`) run on the table read here, before the import, and on the table of the live parser, after it, so
both say the same; tests/test_early.py fails when the shipped table drifts from the parser
(`python -m ts_trl.cli.flag_table` writes it again).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..resources import cache_root
from ..rewards import REWARD_NAMES

SHIPPED_TABLE = Path(__file__).with_name("train_flags.json")
# The packages whose dataclasses the parser reads: the table holds for their installed versions only.
PARSER_PACKAGES = ("trl", "transformers")
# What a flag's values must parse as; `"any"`: not checked here (the parser converts them).
_PARSERS = {"int": int, "float": float, "str": str}
_TRUE, _FALSE = ("yes", "true", "t", "y", "1"), ("no", "false", "f", "n", "0")
_ACTIONS = {
    argparse._StoreAction: "store",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreConstAction: "store_const",
}


def installed_versions() -> dict[str, str]:
    found = {}
    for package in PARSER_PACKAGES:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "none"
    return found


# ---------------------------------------------------------------------------------------------------------------------
# The table: made from the live parser, read back without it


def _value_type(action: argparse.Action) -> tuple[str, bool]:
    """The name of what `action`'s values parse as, and whether `none`/`null` also parse (TRL's `T | None` fields)."""
    converter = action.type
    if converter is None:
        return "str", False
    nullable = "_accept_none" in getattr(converter, "__qualname__", "")
    name = getattr(converter, "__name__", "")
    if name == "string_to_bool":
        return "bool", nullable
    if action.choices is not None:
        return "choice", nullable
    return (name if name in _PARSERS else "any"), nullable


def table_of(parser: argparse.ArgumentParser, defaults: dict[str, dict], rewards: list[str]) -> dict:
    """The table of `parser`'s flags (help and `--config` aside), with what else the early checks read: the defaults
    of each kind of run (`defaults`, by `early.run_kind`: a built-in task's name, or `""` for a named model or
    dataset) and the registered reward names (`rewards`)."""
    flags = []
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "config"):
            continue
        kind, nullable = _value_type(action)
        flags.append(
            {
                "dest": action.dest,
                "options": list(action.option_strings),
                "action": _ACTIONS.get(type(action), "store"),
                "nargs": action.nargs,
                "const": action.const if isinstance(action.const, (bool, int, float, str, type(None))) else None,
                "type": kind,
                "nullable": nullable,
                "choices": None if action.choices is None else [str(choice) for choice in action.choices],
            }
        )
    return {"versions": installed_versions(), "flags": flags, "defaults": defaults, "rewards": rewards}


def _cache_file() -> Path:
    """The table's cache file, named by everything it depends on: TRL's and transformers' versions, this package's
    source and Python's version."""
    digest = hashlib.sha256(json.dumps(installed_versions(), sort_keys=True).encode())
    digest.update(f"{sys.version_info[:2]}".encode())
    package_dir = Path(__file__).resolve().parents[1]
    for path in sorted(package_dir.rglob("*.py")):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0" + path.read_bytes())
    return cache_root() / "flags" / f"{digest.hexdigest()[:24]}.json"


def load_table() -> dict | None:
    """The table of this install's parser: the cached one for this source and these versions, else the shipped one when
    the versions match; None when neither holds (the checks then wait for the parser)."""
    for path, check_versions in ((_cache_file(), False), (SHIPPED_TABLE, True)):
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not check_versions or table.get("versions") == installed_versions():
            return table
    return None


def store_table(table: dict) -> None:
    """Saves the live parser's table for the next command (atomically; a cache that cannot be written is skipped)."""
    try:
        path = _cache_file()
        if path.is_file():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
            json.dump(table, f)
        os.replace(f.name, path)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------------------------------
# The checks


class _Refused(Exception):
    """argparse's own error (a flag without its value, an ambiguous abbreviation), raised instead of exiting."""


class _TableParser(argparse.ArgumentParser):
    """The flags of a table, every value kept as its string: conversions are checked afterwards, all at once."""

    def error(self, message):
        raise _Refused(message)


def _parser_of(table: dict) -> _TableParser:
    parser = _TableParser(add_help=False)
    for flag in table["flags"]:
        if flag["action"] == "store":
            parser.add_argument(
                *flag["options"],
                dest=flag["dest"],
                nargs=flag["nargs"],
                const=flag["const"],
                default=argparse.SUPPRESS,
            )
        elif flag["action"] == "store_const":
            parser.add_argument(
                *flag["options"],
                dest=flag["dest"],
                action="store_const",
                const=flag["const"],
                default=argparse.SUPPRESS,
            )
        else:
            parser.add_argument(*flag["options"], dest=flag["dest"], action=flag["action"], default=argparse.SUPPRESS)
    return parser


def is_true(value) -> bool:
    """Whether a boolean flag's value (`True` when given bare, a string as typed, a recipe's YAML value) says yes."""
    return value is True or (isinstance(value, str) and value.lower() in _TRUE)


def _value_problem(flag: dict, value) -> str | None:
    """Why `value` (a string from the command line, or a recipe's YAML value) is not one of `flag`'s, else None."""
    if value is None or (flag["nullable"] and isinstance(value, str) and value.lower() in ("none", "null")):
        return None
    kind = flag["type"]
    if kind == "bool":
        if isinstance(value, bool) or (isinstance(value, str) and value.lower() in _TRUE + _FALSE):
            return None
        return "expected true or false"
    if kind == "choice" or flag["choices"] is not None:
        if str(value) in flag["choices"]:
            return None
        return "choose one of " + ", ".join(flag["choices"])
    if kind in ("int", "float"):
        expected = f"expected {'an integer' if kind == 'int' else 'a number'}"
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            return expected
        if isinstance(value, float) and kind == "int":
            return expected
        try:
            _PARSERS[kind](value if isinstance(value, str) else str(value))
        except ValueError:
            return expected
    return None


def _values_problem(flag: dict, value) -> str | None:
    """`_value_problem` for each of a list flag's values (`--reward_funcs math format`)."""
    values = value if isinstance(value, list) else [value]
    if flag["nargs"] in ("+", "*") and isinstance(value, list):
        return next((p for p in map(lambda v: _value_problem(flag, v), values) if p), None)
    if isinstance(value, (list, dict)):  # a recipe may give a mapping or a list to a text field (model_init_kwargs)
        return None if flag["type"] in ("str", "any") else "expected a single value"
    return _value_problem(flag, value)


def _shown(value) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def _unknown(names: list[str], known: list[str]) -> str:
    return ", ".join(
        f"{n} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(n, known, 1)) else n for n in names
    )


def parse_flags(table: dict, argv: list[str]) -> tuple[dict, list[str]]:
    """The values `argv` gives, by field (strings, as typed), and every problem with them: flags the parser does not
    know, values that do not parse, a flag without its value."""
    namespace, rest = argparse.Namespace(), []
    problems = []
    try:
        namespace, rest = _parser_of(table).parse_known_args(argv, namespace)
    except _Refused as refused:
        problems.append(f"{refused}.")
    given = vars(namespace)
    unknown = [arg.split("=", 1)[0] for arg in rest if arg.startswith("-")]
    stray = [arg for arg in rest if not arg.startswith("-")]
    if unknown:
        options = [o for flag in table["flags"] for o in flag["options"] if "-" not in o[2:]]
        problems.insert(0, f"unknown flag(s): {_unknown(unknown, options)}.")
    elif stray:
        problems.insert(0, f"unexpected value(s): {' '.join(stray)} (each value follows its --flag).")
    flags = {flag["dest"]: flag for flag in table["flags"] if flag["action"] == "store"}
    for dest, value in given.items():
        problem = _values_problem(flags[dest], value) if dest in flags else None
        if problem:
            problems.append(f"--{dest} {_shown(value)}: {problem}.")
    return given, problems


def recipe_problems(table: dict, recipe: dict, path: str) -> list[str]:
    """Every problem of a recipe's keys and values, in one sentence: keys the parser does not know, values that do
    not parse."""
    flags = {flag["dest"]: flag for flag in table["flags"] if flag["action"] == "store"}
    known = sorted({flag["dest"] for flag in table["flags"]} | {"env"})
    problems = []
    unknown = sorted(set(recipe) - set(known))
    if unknown:
        problems.append(f"unknown key(s): {_unknown(unknown, known)}")
    if "env" in recipe and not isinstance(recipe["env"], dict):
        problems.append("env: expected a mapping of environment variables to values")
    for key, value in recipe.items():
        problem = _values_problem(flags[key], value) if key in flags else None
        if problem:
            problems.append(f"{key}: {value}: {problem}")
    return [f"--config {path}: {'; '.join(problems)}."] if problems else []


def main() -> None:
    """Writes `train_flags.json` from the live parser (after a change of flags, or of TRL or transformers)."""
    from .arguments import make_parser, run_defaults  # lazy: this is the one place that builds the parser

    table = table_of(make_parser(), run_defaults(), REWARD_NAMES)
    # A flag a line, and a kind of run's defaults a line: a change reads as one.
    defaults = ",\n".join(f"{json.dumps(kind)}: {json.dumps(values)}" for kind, values in table["defaults"].items())
    flags = ",\n".join(json.dumps(flag) for flag in table["flags"])
    SHIPPED_TABLE.write_text(
        f'{{"versions": {json.dumps(table["versions"])}, "rewards": {json.dumps(table["rewards"])}, '
        f'"defaults": {{\n{defaults}\n}}, "flags": [\n{flags}\n]}}\n'
    )
    print(f"wrote {SHIPPED_TABLE} ({len(table['flags'])} flags, {table['versions']})")


if __name__ == "__main__":
    main()
