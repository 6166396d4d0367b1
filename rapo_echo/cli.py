"""The ``rapo-echo`` command line. Each sub-command is an entry point of the ``rapo_echo.commands`` group
(pyproject.toml) whose ``register(subparsers)`` adds its parser and sets ``func(args) -> exit code``.
Only the command run is imported; the other built-ins stand in the help as :data:`COMMAND_HELP`, so
``--help`` answers at once (importing every command cost 3-8 s of torch imports).
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
from rapo_echo.stopping import Stopped

COMMAND_GROUP = "rapo_echo.commands"
# The one-line help of the built-in commands, shown without importing them (each module's parser says the
# same; tests/unit/architecture/test_lazy_cli.py holds them to it). A command another package adds is
# imported for its help.
COMMAND_HELP = {
    "chat": "chat with a model in the terminal",
    "serve": "serve a model behind an OpenAI-compatible API",
    "train": "train a policy (--algo grpo|ppo|rapo|rlver|sft)",
    "train-judge": "fine-tune a humanlike / empathy judge on reasoning + verdict examples (JSONL)",
    "data": "make Echo-N1's data: critique-rewrite, references, hard-prompts, synthesize",
    "eval": "run a benchmark (esconv, esconv-ref, sotopia, epm, sage) on a policy, or fidelity",
    "report": "render evaluation / training-run folders into an HTML report",
    "compare": "compare two evaluations of one benchmark figure by figure (difference, interval, p)",
    "openrlhf": "export / launch a run on Ray with OpenRLHF",
    "config": "write the config reference (docs/config.md)",
    "export": "copy a run's model to a folder with a model card; merge LoRA; push to the Hugging Face Hub",
}


def command_in(argv: list[str]) -> str | None:
    """The sub-command ``argv`` names (its first word that is not an option), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = "*") -> argparse.ArgumentParser:
    """The top-level parser. The module of ``command`` registers its full parser (``"*"``: every
    command's); the other built-in commands stand as their one-line help, enough for ``--help``."""
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
        if command not in ("*", entry.name) and entry.name in COMMAND_HELP:
            sub.add_parser(entry.name, help=COMMAND_HELP[entry.name], add_help=False)
            continue
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
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_in(argv))
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
    except Stopped as exc:
        print(f"rapo-echo: {exc}", file=sys.stderr)
        return exc.exit_code
    except RapoEchoError as exc:
        print(f"rapo-echo: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rapo-echo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
