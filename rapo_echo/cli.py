"""The ``rapo-echo`` command line: chat, serve, train, train-judge, data, eval, report, config, export.

Each sub-command lives in its own module, which adds its parser through ``register(subparsers)``
and sets ``func(args) -> exit code``. The command run is the only module imported: the others appear in
the help with their one-line summary, so ``rapo-echo --help`` and a mistyped command answer at once
(issue 49: importing every command's module cost 3-8 s of torch imports).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from rapo_echo import __version__
from rapo_echo.errors import ConfigError, RapoEchoError
from rapo_echo.progress import quiet_third_party
from rapo_echo.scrub import ScrubFilter

# command -> (the module that registers it, its one-line help as the module's parser says it)
COMMAND_MODULES = {
    "chat": ("rapo_echo.chat", "chat with a model in the terminal"),
    "serve": ("rapo_echo.serve", "serve a model behind an OpenAI-compatible API"),
    "train": ("rapo_echo.algorithms.train_cli", "train a policy (--algo grpo|ppo|rapo|rlver|sft)"),
    "train-judge": (
        "rapo_echo.judges.training",
        "fine-tune a humanlike / empathy judge on reasoning + verdict examples (JSONL)",
    ),
    "data": (
        "rapo_echo.algorithms.datagen.cli",
        "make Echo-N1's data: critique-rewrite, references, hard-prompts, synthesize",
    ),
    "eval": (
        "rapo_echo.benchmarks.cli",
        "run a benchmark (esconv, esconv-ref, sotopia, epm, sage) on a policy, or fidelity",
    ),
    "report": ("rapo_echo.benchmarks.cli", "render evaluation / training-run folders into an HTML report"),
    "openrlhf": ("rapo_echo.algorithms.openrlhf.cli", "export / launch a run on Ray with OpenRLHF"),
    "config": ("rapo_echo.algorithms.config_cli", "write the config reference (docs/config.md)"),
    "export": (
        "rapo_echo.export",
        "copy a run's model to a folder with a model card; merge LoRA; push to the Hugging Face Hub",
    ),
}


def command_in(argv: list[str]) -> str | None:
    """The sub-command ``argv`` names (its first word that is not an option), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = "*") -> argparse.ArgumentParser:
    """The top-level parser. The module of ``command`` registers its full parser (``"*"``: every
    command's); the others stand as their one-line help, enough for ``--help``."""
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
    registered: set[str] = set()
    for name, (module_name, help_) in COMMAND_MODULES.items():
        if name in registered:
            continue
        if command not in ("*", name):
            sub.add_parser(name, help=help_, add_help=False)
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # the command is not part of this installation
                continue
            raise
        before = set(sub.choices)
        module.register(sub)
        registered |= set(sub.choices) - before
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rapo-echo`` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = command_in(argv)
    parser = build_parser(command if command in COMMAND_MODULES else None)
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
