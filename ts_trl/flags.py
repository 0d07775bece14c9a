"""How the commands spell their flags and print their help: TRL's snake_case, dash spellings accepted but not shown.

TRL and transformers name every flag after its dataclass field (`--output_dir`); `HfArgumentParser` also accepts
`--output-dir`. Every `ts_trl` command does the same, and `--help` lists one spelling per flag.
"""

from __future__ import annotations

import argparse
import contextlib


def snake_case(option: str) -> str:
    """`--max-new-tokens` -> `--max_new_tokens`; a boolean's `--no-` prefix is kept, as argparse needs it."""
    if not option.startswith("--"):
        return option
    negation = "no-" if option.startswith("--no-") else ""
    return "--" + negation + option[2 + len(negation) :].replace("-", "_")


class _HideDashSpellings:
    """Lists a flag under its snake_case spelling only, in the usage line and in the list; the dash spelling parses."""

    def _format_usage(self, usage, actions, groups, prefix):
        with _shown_spellings(actions):
            return super()._format_usage(usage, actions, groups, prefix)

    def _format_action_invocation(self, action):
        with _shown_spellings([action]):
            return super()._format_action_invocation(action)


@contextlib.contextmanager
def _shown_spellings(actions):
    """Inside the block, each action's option strings are the ones help shows."""
    original = [action.option_strings for action in actions]
    for action in actions:
        action.option_strings = [o for o in action.option_strings if not _is_dash_spelling(o, action.option_strings)]
    try:
        yield
    finally:
        for action, option_strings in zip(actions, original):
            action.option_strings = option_strings


def _is_dash_spelling(option: str, spellings: list[str]) -> bool:
    """Whether `option` is the dash spelling of another of `spellings` (`--no-x-y` of `--no-x_y` or `--no_x_y`)."""
    if not option.startswith("--"):
        return False
    return any(
        other != option and other in spellings for other in (snake_case(option), "--" + option[2:].replace("-", "_"))
    )


class HelpFormatter(_HideDashSpellings, argparse.HelpFormatter):
    """The analysis commands' help: their help texts say the defaults themselves."""


class DefaultsHelpFormatter(_HideDashSpellings, argparse.ArgumentDefaultsHelpFormatter):
    """`ts_trl train`'s help, which appends each field's default as `HfArgumentParser`'s does."""


def accept_both_spellings(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Makes every long flag of `parser` parse in both spellings, lists the snake_case one first, hides the other."""
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse.BooleanOptionalAction):
            continue  # positionals; booleans declare their `--no-` spellings themselves
        spellings = []
        for option in action.option_strings:
            if option.startswith("--"):
                spellings += [snake_case(option), "--" + option[2:].replace("_", "-")]
            else:
                spellings.append(option)
        spellings = sorted(dict.fromkeys(spellings), key=lambda o: snake_case(o) != o)  # stable: snake_case first
        for option in spellings:
            parser._option_string_actions.setdefault(option, action)
        action.option_strings = spellings
    parser.formatter_class = HelpFormatter
    return parser
