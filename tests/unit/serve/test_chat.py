"""The chat REPL driven by a scripted engine and fake input, and the ``chat`` subcommand's parser."""

from __future__ import annotations

import argparse
import io
from collections.abc import Iterator

import pytest

from rapo_echo import chat
from rapo_echo.config import section_from_args
from rapo_echo.engines.openai_engine import OpenAIEngine
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.errors import ConfigError, EngineError
from rapo_echo.types import Conversation, SamplingParams

PARAMS = SamplingParams(max_new_tokens=32, temperature=0)


class Writes(io.StringIO):
    """A text stream that also keeps each ``write`` call, to see that replies arrive piece by piece."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


def feed(*lines: str):
    """An ``input_fn`` returning ``lines`` one by one, then raising EOFError (Ctrl-D)."""
    it = iter(lines)
    prompts: list[str] = []

    def input_fn(prompt: str) -> str:
        prompts.append(prompt)
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None

    input_fn.prompts = prompts  # type: ignore[attr-defined]  # the fake input records its prompts
    return input_fn


def stream_prompts(engine: ScriptedEngine) -> list[Conversation]:
    return [call["prompts"][0] for call in engine.calls]


def test_history_is_kept_and_replies_stream():
    engine = ScriptedEngine(replies=["That sounds really hard.", "I am here for you."])
    out = Writes()
    chat.repl(engine, PARAMS, input_fn=feed("I lost my job.", "  ", "I feel useless."), out=out)
    first, second = stream_prompts(engine)
    assert first == [{"role": "user", "content": "I lost my job."}]
    assert second == [
        {"role": "user", "content": "I lost my job."},
        {"role": "assistant", "content": "That sounds really hard."},
        {"role": "user", "content": "I feel useless."},
    ]
    text = out.getvalue()
    assert "assistant> That sounds really hard.\n" in text and "assistant> I am here for you.\n" in text
    # word-by-word pieces were written (and flushed) one at a time
    assert out.writes[out.writes.index("assistant> ") + 1 : out.writes.index("assistant> ") + 5] == [
        "That",
        " sounds",
        " really",
        " hard.",
    ]


def test_reset_system_help_and_quit():
    engine = ScriptedEngine(default="ok")
    inputs = feed(
        "hello", "/reset", "again", "/system Be gentle.", "hi", "/help", "/bogus", "/quit", "never read"
    )
    out = io.StringIO()
    chat.repl(engine, PARAMS, system="Be brief.", input_fn=inputs, out=out)
    prompts = stream_prompts(engine)
    assert prompts[0] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    assert prompts[1] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "again"},
    ]  # reset
    assert prompts[2] == [{"role": "system", "content": "Be gentle."}, {"role": "user", "content": "hi"}]
    assert len(prompts) == 3 and len(inputs.prompts) == 8  # /quit stopped reading
    text = out.getvalue()
    assert (
        "(conversation cleared)" in text and "(system prompt set: Be gentle.; conversation cleared)" in text
    )
    assert "/system TEXT" in text and "unknown command /bogus" in text


def test_system_without_text_removes_it():
    engine = ScriptedEngine(default="ok")
    chat.repl(engine, PARAMS, system="Be brief.", input_fn=feed("/system", "hi"), out=io.StringIO())
    assert stream_prompts(engine) == [[{"role": "user", "content": "hi"}]]


def test_ctrl_c_ends_the_session():
    def interrupt(prompt: str) -> str:
        raise KeyboardInterrupt

    chat.repl(ScriptedEngine(), PARAMS, input_fn=interrupt, out=io.StringIO())  # returns instead of raising

    class InterruptedStream(ScriptedEngine):
        def stream(self, prompt: Conversation, params: SamplingParams) -> Iterator[str]:
            yield "Well"
            raise KeyboardInterrupt

    out = io.StringIO()
    inputs = feed("hi", "not read")
    chat.repl(InterruptedStream(), PARAMS, input_fn=inputs, out=out)
    assert "assistant> Well\n" in out.getvalue() and len(inputs.prompts) == 1


def test_engine_error_drops_the_turn_and_goes_on():
    class Flaky(ScriptedEngine):
        def __init__(self) -> None:
            super().__init__(default="ok")
            self.failed = False

        def stream(self, prompt: Conversation, params: SamplingParams) -> Iterator[str]:
            if not self.failed:
                self.failed = True
                raise EngineError("http://127.0.0.1:9/v1/chat/completions: connection failed")
            yield from super().stream(prompt, params)

    engine = Flaky()
    out = io.StringIO()
    chat.repl(engine, PARAMS, input_fn=feed("first", "second"), out=out)
    assert "error: http://127.0.0.1:9/v1/chat/completions: connection failed" in out.getvalue()
    assert stream_prompts(engine) == [[{"role": "user", "content": "second"}]]  # "first" was dropped


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rapo-echo")
    chat.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(list(argv))


def test_register_chat_subcommand():
    args = parse("chat")
    assert args.func is chat.run
    cfg = section_from_args(chat.ChatConfig, args)
    assert (cfg.model, cfg.system, cfg.max_new_tokens, cfg.temperature, cfg.top_p) == (
        "default",
        None,
        256,
        0.7,
        1.0,
    )
    args = parse(
        "chat",
        "--model",
        "http://h:1/v1",
        "--system",
        "Be kind.",
        "--max-new-tokens",
        "9",
        "--temperature",
        "0",
        "--top-p",
        "0.5",
    )
    cfg = section_from_args(chat.ChatConfig, args)
    assert cfg.sampling() == SamplingParams(max_new_tokens=9, temperature=0.0, top_p=0.5)


def test_run_with_a_url_uses_the_openai_engine(monkeypatch):
    seen = {}

    def fake_repl(engine, params, *, system=None):
        seen.update(engine=engine, params=params, system=system)

    monkeypatch.setattr(chat, "repl", fake_repl)
    assert (
        chat.run(
            parse("chat", "--model", "http://127.0.0.1:9/v1", "--system", "Be kind.", "--temperature", "0.2")
        )
        == 0
    )
    assert isinstance(seen["engine"], OpenAIEngine) and seen["engine"].base_url == "http://127.0.0.1:9/v1"
    assert (
        seen["params"] == SamplingParams(max_new_tokens=256, temperature=0.2) and seen["system"] == "Be kind."
    )


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--top-p", "1.5"), ("--max-new-tokens", "0"), ("--temperature", "-1"), ("--temperature", "nan")],
)
def test_bad_sampling_flags_name_the_flag(flag, value):
    with pytest.raises(ConfigError, match=f"flag {flag}: "):
        chat.run(parse("chat", "--model", "http://127.0.0.1:9/v1", flag, value))
