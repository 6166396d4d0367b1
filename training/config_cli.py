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
    and defaults (a plugin's are its own to document)."""
    from rapo_echo.algorithms import get, names
    from rapo_echo.config.reference import reference_markdown

    from .run_config import RunConfig

    algorithms = {name: get(name) for name in names(builtin=True)}
    return reference_markdown(
        RunConfig, {name: (cls.config, cls.defaults()) for name, cls in algorithms.items()}
    )


def run(args: argparse.Namespace) -> int:
    text = reference()
    if args.output:
        write_text_atomic(Path(args.output), text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0
