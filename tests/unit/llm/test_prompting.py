"""The policy's prompt rules: system prompt placement and dropping the oldest turns to fit."""

from rapo_echo.prompting import fit_turns, policy_conversation
from rapo_echo.types import Scenario, msg


def words(conv) -> list[int]:
    """A stand-in encoder: one id per word of every message."""
    return [0 for m in conv for _ in m["content"].split()]


def test_system_prompt_is_added_unless_the_scenario_has_one() -> None:
    plain = Scenario("a", [msg("user", "hi")])
    own = Scenario("b", [msg("system", "mine"), msg("user", "hi")])
    assert policy_conversation(plain, "be kind") == [msg("system", "be kind"), msg("user", "hi")]
    assert policy_conversation(own, "be kind") == own.messages
    assert policy_conversation(plain, None) == plain.messages


def test_fit_turns_drops_oldest_turns_but_keeps_system_and_last() -> None:
    conv = [
        msg("system", "s s"),  # 2
        msg("user", "a a a"),  # 3
        msg("assistant", "b b"),  # 2
        msg("user", "c c c c"),  # 4
    ]
    kept, ids = fit_turns(conv, words, 8)  # 11 -> drop "a" (8) fits
    assert [m["content"] for m in kept] == ["s s", "b b", "c c c c"] and len(ids) == 8
    kept, ids = fit_turns(conv, words, 5)  # never drops the system prompt or the last message
    assert [m["content"] for m in kept] == ["s s", "c c c c"] and len(ids) == 6
    kept, _ = fit_turns(conv[1:], words, 4)
    assert [m["content"] for m in kept] == ["c c c c"]
