"""The command line imports only the command it runs (issue 49, item 10): ``rapo-echo --help`` and a
mistyped command load no torch or transformers, and the one-line help of each command in the top-level
table is the one its module registers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rapo_echo.cli import COMMAND_HELP, build_parser, command_in

HEAVY = ("torch", "transformers", "datasets")


def modules_after(argv: list[str]) -> tuple[int, str, set[str]]:
    """Run the CLI on ``argv`` in a fresh interpreter: its exit code, its output, and which heavy
    libraries it imported."""
    code = (
        "import sys\nfrom rapo_echo.cli import main\n"
        f"try:\n    rc = main({argv!r})\nexcept SystemExit as e:\n    rc = e.code\n"
        f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules], rc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    line = next(x for x in done.stdout.splitlines() if x.startswith("LOADED"))
    loaded = set(eval(line.split(" ", 1)[1].rsplit(" ", 1)[0]))
    return int(line.rsplit(" ", 1)[1]), done.stdout + done.stderr, loaded


@pytest.mark.parametrize("argv", [["--help"], ["no-such-command"], ["export", "--help"]])
def test_help_and_a_wrong_command_load_no_heavy_library(argv: list[str]) -> None:
    rc, out, loaded = modules_after(argv)
    assert loaded == set(), (argv, loaded)
    assert rc in (0, 2)
    if argv == ["--help"]:
        assert all(name in out for name in COMMAND_HELP)


def test_the_table_help_is_the_modules_own() -> None:
    full = build_parser()
    sub = next(a for a in full._actions if a.dest == "command")
    registered = {a.dest: a.help for a in sub._choices_actions}
    assert {name: registered[name] for name in COMMAND_HELP} == COMMAND_HELP


def test_the_command_is_the_first_word_that_is_not_an_option() -> None:
    assert command_in(["-v", "train", "--config", "x.yaml"]) == "train"
    assert command_in(["--help"]) is None
    args = build_parser("export").parse_args(["export", "RUN", "--to", "DIR"])
    assert (args.command, args.run, args.to) == ("export", "RUN", "DIR")
