"""The ``rapo-echo`` command line: chat, serve, train, train-judge, data, eval, report, compare, openrlhf,
config, export.

Each sub-command lives in its own module, named by an entry point of the ``rapo_echo.commands`` group
(pyproject.toml): its ``register(subparsers)`` adds its parser and sets ``func(args) -> exit code``. The
commands live in every layer, this door in the core, so the core names none of them; an installed package
adds a command the same way. Only commands whose module imports are listed.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import entry_points

from rapo_echo import __version__
from rapo_echo.errors import ConfigError, RapoEchoError
from rapo_echo.progress import quiet_third_party
from rapo_echo.scrub import ScrubFilter

COMMAND_GROUP = "rapo_echo.commands"


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available sub-command."""
    parser = argparse.ArgumentParser(
        prog="rapo-echo",
        description="Reinforcement learning of empathetic, emotionally supportive dialogue models.",
    )
    parser.add_argument("--version", action="version", version=f"rapo-echo {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log debug messages, and the libraries' own logs and warnings",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for entry in entry_points(group=COMMAND_GROUP):
        try:
            register = entry.load()
        except ModuleNotFoundError as exc:
            if exc.name == entry.module:  # the command is not part of this installation
                continue
            raise
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rapo-echo`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    quiet_third_party(args.verbose)
    for handler in logging.getLogger().handlers:  # no secret value reaches a log line
        if not any(isinstance(f, ScrubFilter) for f in handler.filters):
            handler.addFilter(ScrubFilter())
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"rapo-echo: {exc}", file=sys.stderr)
        return 2
    except RapoEchoError as exc:
        print(f"rapo-echo: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rapo-echo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
