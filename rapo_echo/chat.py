"""``rapo-echo chat``: talk to a model in the terminal, the reply streamed as it is produced.

Commands: ``/reset`` forgets the conversation, ``/system TEXT`` sets the system prompt (and resets;
``/system`` alone removes it), ``/help`` lists the commands, ``/quit``, end of input (Ctrl-D) and
Ctrl-C end the session. An engine error is shown and the turn is dropped, so the session goes on.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Annotated, Any, TextIO

from pydantic import Field

from rapo_echo.config import Flag, Strict, add_flags, section_from_args
from rapo_echo.engines.base import ChatEngine
from rapo_echo.errors import EngineError
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


class ChatConfig(Strict):
    """`rapo-echo chat`: the model talked to and how its replies are sampled."""

    model: Annotated[str, Flag(metavar="SPEC_OR_URL")] = Field(
        "default",
        description="`default`, a model folder, a training run folder, a .gguf file, a hub id, or the "
        "http(s) URL of an OpenAI-compatible API such as http://127.0.0.1:8000/v1.",
    )
    system: Annotated[str | None, Flag(metavar="TEXT")] = Field(None, description="The system prompt.")
    max_new_tokens: Annotated[int, Flag(metavar="N")] = Field(256, ge=1, description="Reply length limit.")
    temperature: Annotated[float, Flag(metavar="T")] = Field(0.7, ge=0.0, description="0: greedy.")
    top_p: Annotated[float, Flag(metavar="P")] = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling.")
    api_key_env: Annotated[str | None, Flag(metavar="VAR")] = Field(
        None, description="For a URL: the environment variable holding the API key (unset: OPENAI_API_KEY)."
    )

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p
        )


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``chat`` subcommand to an argparse sub-parsers object."""
    p = subparsers.add_parser(
        "chat",
        help="chat with a model in the terminal",
        description="Chat with a model (or an OpenAI-compatible endpoint); replies stream in.",
    )
    add_flags(p, ChatConfig)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Build the engine from ``--model`` and run the REPL."""
    from rapo_echo.engines import engine_from_spec

    cfg = section_from_args(ChatConfig, args)
    kw = {"api_key_env": cfg.api_key_env} if cfg.api_key_env else {}
    engine = engine_from_spec(cfg.model, **kw)
    repl(engine, cfg.sampling(), system=cfg.system)
    return 0
