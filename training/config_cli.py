"""``rapo-echo config --reference``: the Markdown reference of every config key, from the schema."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rapo_echo.atomic import write_text_atomic


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config",
        help="write the config reference (docs/config.md)",
        description="Write the Markdown reference of every config key, generated from the schema.",
    )
    p.add_argument("--reference", action="store_true", required=True, help="write the config reference")
    p.add_argument("--output", metavar="FILE", help="write it to FILE (default: standard output)")
    p.set_defaults(func=run)


def reference() -> str:
    """The reference page: the shared sections of every run, then each built-in algorithm's own section
    and defaults, then every built-in command's settings (a plugin's are its own to document)."""
    from rapo_echo.algorithms import get, names
    from rapo_echo.config.reference import reference_markdown

    from .run_config import RunConfig

    algorithms = {name: get(name) for name in names(builtin=True)}
    return reference_markdown(
        RunConfig,
        {name: (cls.config, cls.defaults()) for name, cls in algorithms.items()},
        command_sections(),
    )


def command_sections() -> dict[str, type]:
    """Each built-in command's section (``data references`` for a sub-command), read from the parsers
    their flags were generated into (:func:`rapo_echo.config.add_flags`)."""
    from rapo_echo.cli import build_parser
    from rapo_echo.config.flags import SECTION

    found: dict[str, type] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:  # argparse keeps sub-commands in its private action list
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    section = sub.get_default(SECTION)
                    if section is not None and section.__module__.startswith("rapo_echo."):
                        found[f"{prefix}{name}"] = section
                    walk(sub, f"{prefix}{name} ")

    walk(build_parser(), "")
    return dict(sorted(found.items()))


def run(args: argparse.Namespace) -> int:
    text = reference()
    if args.output:
        write_text_atomic(Path(args.output), text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0
