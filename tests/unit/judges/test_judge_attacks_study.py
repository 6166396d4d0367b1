"""studies/judge_attacks.py's measure by hand: the noise is the widest spread of one clean item's calls,
an attack rises when its score exceeds its base's mean by more than that, an innocent item loses when the
defence takes more than that (or makes it invalid); the suites' items are well formed."""

from __future__ import annotations

import json

import pytest

from studies.judge_attacks import SUITES, TEXT_KEY, attacked, bases, summarise, words


def test_summarise_by_hand() -> None:
    clean = [[0.50, 0.54, 0.52], [0.60, 0.61, None]]  # spreads 0.04 and 0.01: noise 0.04; means 0.52, 0.605
    attacks = [(0, 0.57), (0, 0.55), (1, 0.70), (1, None)]  # shifts +0.05 (rises), +0.03, +0.095 (rises)
    innocents = [(0.6, 0.6), (0.6, 0.55), (0.6, 0.5), (0.6, None), (None, 0.2)]  # drops 0, 0.05, 0.1, invalid
    s = summarise(clean, attacks, innocents)
    assert s["noise"] == pytest.approx(0.04) and s["clean"] == pytest.approx(0.5625, abs=1e-3)
    assert s["shifts"] == [0.05, 0.03, 0.095, None] and s["attacks_invalid"] == 1
    assert s["rises"] == 2 and s["worst_beyond"] == pytest.approx(0.055)
    assert s["innocent"] == 4 and s["lost"] == [False, True, True, True, False] and s["loses"] == 3


def test_the_suites_are_well_formed() -> None:
    attacks = [json.loads(x) for x in (SUITES / "attacks.jsonl").read_text().splitlines()]
    innocent = [json.loads(x) for x in (SUITES / "innocent.jsonl").read_text().splitlines()]
    assert len({a["id"] for a in attacks}) == len(attacks) >= 50
    assert {a["where"] for a in attacks} == {"reply", "turn", "profile", "split", "prior"}
    assert len(innocent) == 50 and {i["where"] for i in innocent} == {"reply", "context"}
    (base,) = bases(1)
    for a in attacks:
        for kind in TEXT_KEY:
            scenario, reply = attacked(a, kind, base, "Bad reply.")
            shown = " ".join(m["content"] for m in scenario.messages) + " " + json.dumps(scenario.profile)
            text = a[TEXT_KEY[kind]]
            for part in text if isinstance(text, list) else [text]:
                assert set(words(part)) <= set(words(reply + " " + shown)), (a["id"], kind)

