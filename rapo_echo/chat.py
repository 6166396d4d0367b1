"""``rapo-echo chat``: talk to a model in the terminal, the reply streamed as it is produced.

Commands: ``/reset`` forgets the conversation, ``/system TEXT`` sets the system prompt (and resets;
``/system`` alone removes it), ``/help`` lists the commands, ``/quit``, end of input (Ctrl-D) and
Ctrl-C end the session. An engine error is shown and the turn is dropped, so the session goes on.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TextIO

from rapo_echo.engines.base import ChatEngine
from rapo_echo.errors import ConfigError, EngineError
from rapo_echo.types import Conversation, SamplingParams, msg

USER_PROMPT = "you> "
REPLY_PREFIX = "assistant> "
HELP = """commands:
  /reset         forget the conversation
  /system TEXT   set the system prompt and start over (/system alone removes it)
  /help          show this list
  /quit          leave (Ctrl-D and Ctrl-C too)"""


def repl(
    engine: ChatEngine,
    params: SamplingParams,
    *,
    system: str | None = None,
    input_fn: Callable[[str], str] = input,
    out: TextIO = sys.stdout,
) -> None:
    """Read user lines from ``input_fn`` and stream each reply to ``out``, keeping the history."""
    history: Conversation = []

    def say(text: str) -> None:
        out.write(text + "\n")
        out.flush()

    say(f"chatting with {engine.name}; /help lists the commands")
    while True:
        try:
            line = input_fn(USER_PROMPT)
        except (EOFError, KeyboardInterrupt):
            say("")
            return
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            command, _, arg = text.partition(" ")
            if command in ("/quit", "/exit"):
                return
            if command == "/reset":
                history.clear()
                say("(conversation cleared)")
            elif command == "/system":
                system = arg.strip() or None
                history.clear()
                say(
                    f"(system prompt set: {system}; conversation cleared)"
                    if system
                    else "(system prompt removed)"
                )
            elif command == "/help":
                say(HELP)
            else:
                say(f"unknown command {command}; /help lists the commands")
            continue
        history.append(msg("user", text))
        prompt = ([msg("system", system)] if system else []) + history
        out.write(REPLY_PREFIX)
        out.flush()
        pieces: list[str] = []
        try:
            for piece in engine.stream(prompt, params):
                pieces.append(piece)
                out.write(piece)
                out.flush()
        except KeyboardInterrupt:
            say("")
            return
        except EngineError as exc:
            history.pop()
            say(f"\nerror: {exc}")
            continue
        say("")
        history.append(msg("assistant", "".join(pieces)))


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``chat`` subcommand to an argparse sub-parsers object."""
    p = subparsers.add_parser(
        "chat",
        help="chat with a model in the terminal",
        description="Chat with a model (or an OpenAI-compatible endpoint); replies stream in.",
    )
    p.add_argument(
        "--model",
        default="default",
        metavar="SPEC_OR_URL",
        help="'default', a model folder, a training run folder, a .gguf file, a hub id, or the http(s) URL "
        "of an OpenAI-compatible API such as http://127.0.0.1:8000/v1 (default: %(default)s)",
    )
    p.add_argument("--system", default=None, metavar="TEXT", help="system prompt")
    p.add_argument(
        "--max-new-tokens", type=int, default=256, metavar="N", help="reply length limit (default: 256)"
    )
    p.add_argument("--temperature", type=float, default=0.7, metavar="T", help="0 = greedy (default: 0.7)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling (default: 1.0)")
    p.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="for a URL: environment variable holding the API key (default: OPENAI_API_KEY)",
    )
    p.set_defaults(func=run)
    return p


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    """The sampling flags as :class:`SamplingParams`; a bad value is a :class:`ConfigError` naming it."""
    flags = {"max_new_tokens": "--max-new-tokens", "temperature": "--temperature", "top_p": "--top-p"}
    try:
        return SamplingParams(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p
        )
    except ValueError as exc:
        text = str(exc)
        for field, flag in flags.items():
            text = text.replace(field, flag)
        raise ConfigError(text) from exc


def run(args: argparse.Namespace) -> int:
    """Build the engine from ``--model`` and run the REPL."""
    from rapo_echo.engines import engine_from_spec

    params = sampling_from_args(args)
    kw = {"api_key_env": args.api_key_env} if args.api_key_env else {}
    engine = engine_from_spec(args.model, **kw)
    repl(engine, params, system=args.system)
    return 0
