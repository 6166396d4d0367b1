"""Judge training: the example format (errors name file, line and field), the held-out split, the
humanlike negatives (shuffled context, swapped reply), the prompts and answers the judge learns (both
orders for the empathy judge), and ``rapo-echo train-judge`` end to end on the embedded model."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rapo_echo.data import bundled_file
from rapo_echo.errors import DataError
from rapo_echo.judges.training_data import load_examples, negatives, pairs, split
from rapo_echo.judges.verdict import answer_text
from rapo_echo.types import msg

HUMANLIKE = str(bundled_file("judge_humanlike_en.jsonl"))
EMPATHY = str(bundled_file("judge_empathy_en.jsonl"))


def write(tmp_path: Path, rows: list) -> str:
    path = tmp_path / "ex.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_bundled_example_sets_load() -> None:
    hum, emp = load_examples([HUMANLIKE]), load_examples([EMPATHY])
    assert len(hum) == 24 and {e.label for e in hum} == {"human", "AI"}
    assert sum(e.label == "human" for e in hum) == 12
    assert len(emp) == 8 and {e.label for e in emp} == {"win", "tie", "loss"}
    assert all(e.reasoning and e.needs is not None for e in emp)
    assert all("{reply}" in e.reasoning and "{reference}" in e.reasoning for e in emp)  # type: ignore[operator]  # these examples have reasoning


@pytest.mark.parametrize(
    ("row", "error"),
    [
        (
            '{"task": "humanlike", "reply": "hi", "label": "robot"}',
            r":2: label: got 'robot'; expected one of human, AI",
        ),
        ('{"task": "humanlike", "label": "human"}', r":2: reply: missing"),
        ('{"task": "chat", "reply": "x", "label": "human"}', r":2: task: got 'chat'"),
        ('{"task": "humanlike", "reply": "x", "label": "human", "score": 5}', r":2: score: unknown key"),
        ('{"task": "empathy", "opening": "hi", "reply": "x", "label": "win"}', r":2: reference: missing"),
        (
            '{"task": "empathy", "reply": "x", "reference": "y", "label": "win"}',
            r":2: messages / opening: an empathy",
        ),
        (
            '{"task": "empathy", "opening": "o", "reply": "x", "reference": "y", "label": "win", '
            '"needs": {"cognitive": "a"}}',
            r":2: needs: expected an object with exactly cognitive, affective, proactive",
        ),
        (
            '{"task": "humanlike", "messages": [{"role": "bot", "content": "x"}], "reply": "x", '
            '"label": "AI"}',
            r":2: messages\[0\].role",
        ),
        ("{not json", r":2: invalid JSON"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path: Path, row: str, error: str) -> None:
    good = {"task": "humanlike", "opening": "hey", "reply": "yo", "label": "human"}
    path = write(tmp_path, [good, row])
    with pytest.raises(DataError, match=r"ex\.jsonl" + error):
        load_examples([path])


def test_an_empty_file_names_the_data_stage_that_wrote_it(tmp_path: Path) -> None:
    """critique-rewrite exited 0 with 0 pairs and train-judge said only "the file is empty" (issue 49,
    item 6): the error names the stage that wrote the file, its figures and its summary."""
    folder = tmp_path / "judge-data"
    folder.mkdir()
    (folder / "pairs.jsonl").write_text("")
    summary = {
        "command": "critique-rewrite",
        "dataset": {"file": "pairs.jsonl", "rows": 0},
        "figures": {"not_empathy": 1, "no_pair": 1, "note": "text is left out"},
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(DataError) as exc:
        load_examples([folder / "pairs.jsonl"])
    said = str(exc.value)
    assert f"{folder / 'pairs.jsonl'}: the file is empty" in said
    assert "`rapo-echo data critique-rewrite`, made 0 rows (not_empathy 1, no_pair 1)" in said
    assert str(folder / "summary.json") in said
    (tmp_path / "other.jsonl").write_text("")  # a file no data command wrote: the plain message
    with pytest.raises(DataError, match=r"other.jsonl: the file is empty; expected JSON or JSONL records$"):
        load_examples([tmp_path / "other.jsonl"])


def test_an_empty_file_of_a_stopped_stage_says_it_stopped(tmp_path: Path) -> None:
    """A critique-rewrite stopped by Ctrl-C leaves an empty pairs.jsonl; train-judge said the stage "made 0
    rows" and pointed at switches, as if it had finished (the newcomer's walk, issue 49)."""
    (tmp_path / "pairs.jsonl").write_text("")
    summary = {
        "command": "critique-rewrite",
        "n_contexts": 4,
        "n_done": 1,
        "complete": False,
        "stopped": "stopped by SIGINT",
        "dataset": {"file": "pairs.jsonl", "rows": 0},
        "figures": {"pairs": 0},
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(DataError) as exc:
        load_examples([tmp_path / "pairs.jsonl"])
    said = str(exc.value)
    stage = "`rapo-echo data critique-rewrite` did not finish"
    assert f"{stage} (stopped by SIGINT; 1 of 4 contexts done; " in said
    assert "run the same command again to finish it" in said and "switches" not in said


def test_default_task_and_case_insensitive_labels(tmp_path: Path) -> None:
    [e] = load_examples([write(tmp_path, [{"reply": "yo", "label": "ai"}])], default_task="humanlike")
    assert e.task == "humanlike" and e.label == "AI" and e.messages == []


def test_split_is_seeded_and_per_task() -> None:
    examples = load_examples([HUMANLIKE, EMPATHY])
    train, held = split(examples, 0.25, seed=0)
    assert sum(e.task == "humanlike" for e in held) == 6 and sum(e.task == "empathy" for e in held) == 2
    assert len(train) + len(held) == 32 and split(examples, 0.25, seed=0)[1] == held
    assert split(examples, 0.25, seed=1)[1] != held


def test_negatives_shuffled_context_and_swapped_reply() -> None:
    examples = load_examples([HUMANLIKE])
    negs = negatives(examples, ("shuffle", "swap"), seed=0)
    shuffled = [n for n in negs if n.origin == "shuffle"]
    swapped = [n for n in negs if n.origin == "swap"]
    multi_turn = [e for e in examples if e.label == "human" and len(e.messages) > 1]
    assert len(shuffled) == len(multi_turn) == 3 and len(swapped) == 12
    for n in shuffled:
        original = next(e for e in multi_turn if e.reply == n.reply)
        assert n.label == "AI" and n.messages != original.messages
        assert sorted(m["content"] for m in n.messages) == sorted(m["content"] for m in original.messages)
    for n in swapped:
        own = next(e for e in examples if e.messages == n.messages and e.label == "human")
        assert n.label == "AI" and n.reply != own.reply
        assert any(
            e.reply == n.reply and e.label == "human" for e in examples
        )  # a real human reply, elsewhere
    assert negatives(examples, (), seed=0) == []
    with pytest.raises(ValueError, match="unknown negative kind"):
        negatives(examples, ("flip",), seed=0)


def test_pairs_teach_the_judges_own_prompts_and_answers() -> None:
    rng = random.Random(0)
    hum = load_examples([HUMANLIKE])[1]  # the AI-written dentist reply
    [p] = pairs(hum, reasoning=True, context_aware=True, rng=rng)
    assert p.prompt[0]["role"] == "system" and "numb" in p.prompt[1]["content"]
    assert p.target == answer_text("AI", hum.reasoning)
    assert "'Verdict: human' or 'Verdict: AI'" in p.prompt[1]["content"]  # the targets' form is asked for
    [free] = pairs(hum, reasoning=False, context_aware=False, rng=rng)
    assert free.target == "Verdict: AI" and "numb" not in free.prompt[1]["content"].split("REPLY")[0]
    emp = load_examples([EMPATHY])[0]  # label win
    first, second, *needs = pairs(emp, reasoning=True, context_aware=True, rng=rng)
    # reply shown as A: the verdict is A; shown as B: B; the reasoning names the right reply each time
    assert first.gold == "A" and second.gold == "B"
    assert first.target.startswith("Reasoning: Reply A names the exhaustion")
    assert first.target.endswith("\nVerdict: A") and second.target.endswith("\nVerdict: B")
    assert (
        second.target.startswith("Reasoning: Reply B names the exhaustion")
        and "Reply A is kind" in second.target
    )
    assert [n.task for n in needs] == ["empathy_needs"] * 3 and needs[0].prompt[-1] == msg(
        "assistant", "Cognitive need:"
    )
    assert needs[0].target == " " + emp.needs.cognitive  # type: ignore[union-attr]  # an empathy example has needs
    loss = load_examples([EMPATHY])[1]
    assert [p.gold for p in pairs(loss, reasoning=False, context_aware=True, rng=rng)[:2]] == ["B", "A"]


def test_reasoning_required_when_training_with_it(tmp_path: Path) -> None:
    [e] = load_examples([write(tmp_path, [{"task": "humanlike", "reply": "yo", "label": "human"}])])
    with pytest.raises(DataError, match=r"ex\.jsonl:1: reasoning: missing"):
        pairs(e, reasoning=True, context_aware=True, rng=random.Random(0))


def test_sft_loss_by_hand() -> None:
    import torch

    from rapo_echo.judges.training import sft_loss

    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -9.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert float(sft_loss(logp, mask)) == pytest.approx((1.0 + 2.0 + 0.5) / 3)  # padding left out
    # two micro-batches over the batch's 3 tokens add up to the same mean: (1 + 2) / 3 + 0.5 / 3
    parts = float(sft_loss(logp[:1], mask[:1], 3.0)) + float(sft_loss(logp[1:], mask[1:], 3.0))
    assert parts == pytest.approx(3.5 / 3)


def test_accuracy_reads_verdicts_like_the_rewards() -> None:
    import math

    from rapo_echo.engines.scripted import ScriptedEngine
    from rapo_echo.judges.training import accuracy
    from rapo_echo.judges.training_data import JudgePair

    def item(task: str, reply: str, gold: str, labels: tuple[str, ...]) -> JudgePair:
        return JudgePair(task, [msg("user", reply)], "", gold, labels)

    items = [
        item("humanlike", "lol", "human", ("human", "AI")),
        item("humanlike", "As an AI", "human", ("human", "AI")),
        item("humanlike", "ok", "AI", ("human", "AI")),
        item("empathy", "pick B", "B", ("A", "B", "tie")),
        item("empathy_needs", "no gold", None, ()),  # type: ignore[arg-type]  # the bad input under test
    ]

    def fn(prompt, options):
        text = prompt[-2]["content"]
        if " human" in options:
            p = 0.9 if text in ("lol", "ok") else 0.2  # P(human)
            return {" human": math.log(p), " AI": math.log(1 - p)}
        return {" A": -2.0, " B": -0.1, " tie": -3.0}

    got = accuracy(ScriptedEngine(choice_fn=fn), items, reasoning=False, max_new_tokens=8)
    # humanlike: lol -> human (right), As an AI -> AI (wrong), ok -> human (wrong): 1 / 3
    assert got == {
        "empathy": {"accuracy": 1.0, "n": 1, "invalid": 0},
        "humanlike": {"accuracy": pytest.approx(1 / 3), "n": 3, "invalid": 0},
    }
    # text mode reads the declared JSON verdict (a server without structured output: parse, retry, invalid)
    answers = ['{"verdict": "human"}', "no idea", '{"verdict": "AI"}'] + ["???"] * 9
    text = ScriptedEngine(replies=answers, structured=False)
    got = accuracy(text, items[:3], reasoning=False, max_new_tokens=8)
    assert got["humanlike"] == {"accuracy": pytest.approx(2 / 3), "n": 3, "invalid": 1}


@pytest.mark.integration
def test_train_judge_end_to_end(tmp_path: Path, smol_path: str, capsys: pytest.CaptureFixture) -> None:
    from rapo_echo.cli import main
    from rapo_echo.engines.hf import HFEngine
    from rapo_echo.judges.humanlike import HumanlikeJudge
    from rapo_echo.models import resolve

    rows = [json.loads(line) for line in Path(HUMANLIKE).read_text().splitlines()]
    data = write(tmp_path, rows[:6])  # 3 human, 3 AI
    out = tmp_path / "judge"
    argv = ["train-judge", "--data", data, "--output", str(out), "--max-steps", "1", "--batch-size", "2"]
    assert main(argv + ["--no-reasoning", "--eval-fraction", "0.25", "--lr", "1e-3"]) == 0
    printed = capsys.readouterr().out
    assert "humanlike: held-out accuracy" in printed and "steps: 1," in printed
    report = json.loads((out / "judge_training.json").read_text())
    negs = report["negatives"]
    assert report["steps"] == 1 and report["loss"]["first"] > 0
    assert report["examples"] == {
        "train": 4 + negs["swap"]["train"] + negs["shuffle"]["train"],
        "held_out": 2 + negs["swap"]["held_out"] + negs["shuffle"]["held_out"],
        "duplicates_removed": 0,  # the bundled examples hold no repeats
    }
    for when in ("before", "after"):
        acc = report["held_out_accuracy"][when]["humanlike"]
        assert acc["n"] == report["examples"]["held_out"] and 0.0 <= acc["accuracy"] <= 1.0
    # the folder is a judge model that --judge / judge.model accept
    engine = HFEngine.from_spec(resolve(str(out)).path, device="cpu")
    [score] = HumanlikeJudge(engine).score([([msg("user", "hi")], "hey you")])
    assert 0.0 <= score.p_human <= 1.0  # type: ignore[operator]  # a valid score
    assert main(["train-judge", "--output", str(tmp_path / "x")]) == 2  # --data is required
    assert "--data: required" in capsys.readouterr().err
    assert main(argv) == 2  # the output folder is not empty: refused, nothing overwritten
