"""Issue 39 item 5: scripted replies that break the declared format are a config error (exit 2), text of
only Unicode whitespace and zero-width characters is blank wherever blankness is checked (one helper,
:func:`rapo_echo.text.is_blank`), and what a kill -9 leaves while ``final/`` is written goes on resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rapo_echo.atomic import remove_leftovers, replace_dir, staging_for
from rapo_echo.cli import main
from rapo_echo.errors import DataError
from rapo_echo.text import is_blank, visible_strip
from tests.helpers.runs import QUIET, set_flags

INVISIBLE = "\u3000\u200b"  # an ideographic space and a zero-width space


@pytest.mark.parametrize(
    "text",
    ["", "   ", INVISIBLE, "\u200b\u200c\u200d\u2060\ufeff", "\u00a0\u2003\n\t", "\u3164\u2800", None, 3],
)
def test_blank_texts(text) -> None:
    assert is_blank(text)


@pytest.mark.parametrize("text", ["a", " . ", "\u200bhi\u200b", "你好", "\u3000x"])
def test_texts_that_say_something(text) -> None:
    assert not is_blank(text)
    assert visible_strip(f"\u200b {text} \u3000") == text.strip().strip("\u200b\u3000")


def test_a_sage_first_talk_of_invisible_characters_is_no_opening() -> None:
    from rapo_echo.data.sage_profiles import SageProfile

    profile = SageProfile.from_mapping({"persona": "a nurse", "background": "tired", "first_talk": INVISIBLE})
    assert profile.first_talk is None  # the simulator writes the opening instead of an invisible one
    assert SageProfile("a", "b", first_talk=" Hi\u200b").first_talk == " Hi\u200b"


def test_a_scenario_opening_of_invisible_characters_is_refused(tmp_path) -> None:
    from rapo_echo.data import load_scenarios

    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"id": "a", "opening": INVISIBLE}) + "\n")
    with pytest.raises(DataError, match="opening"):
        load_scenarios(str(path))


def test_an_invisible_reply_is_empty_for_the_format_reward() -> None:
    from rapo_echo.rewards.builtin import FormatReward

    out = FormatReward().score_one(INVISIBLE)
    assert out.score == 0.0 and out.info == {"empty": True}


def test_scripted_replies_that_break_the_format_are_a_config_error_exit_2(
    tmp_path, tiny_folder, capsys
) -> None:
    argv = ["train", "--algo", "grpo", "--reward", "judge", "--output", str(tmp_path / "run")]
    sets = [f"model.name={tiny_folder}", "train.max_steps=1", "rollout.batch_size=1", "rollout.group_size=2"]
    sets += ["rollout.max_new_tokens=4", "judge.engine=scripted"]
    code = main(argv + set_flags(*sets, "judge.script={replies: ['A lovely reply!']}", *QUIET))
    err = capsys.readouterr().err
    assert code == 2 and "does not conform to the answer format 'score'" in err and "Traceback" not in err


# ---------------------------------------------------------------------- final/ and kill -9
WRITER = """
import sys, torch
from pathlib import Path
from safetensors.torch import save_file
from rapo_echo.atomic import staging_for
staged = staging_for(Path(sys.argv[1]) / "final")
print("writing", flush=True)
save_file({"w": torch.zeros(150_000_000)}, str(staged / "model.safetensors"))
"""


def test_a_kill_during_the_final_write_leaves_nothing_after_the_cleanup(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    old = run / "final"
    old.mkdir()
    (old / "config.json").write_text("{}")  # a final/ from before: it must survive a killed rewrite
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(run)], stdout=subprocess.PIPE)
    assert child.stdout.readline().strip() == b"writing"
    staged = run / ".final.tmp"
    deadline = time.time() + 120
    while time.time() < deadline and not any(p.name.startswith(".tmp") for p in staged.glob("*")):
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert (old / "config.json").is_file()  # never half replaced
    assert staged.exists()  # the leftover (safetensors' .tmpXXXX inside, or the model half written)
    # an older writer wrote into final/ itself and could leave its temp file there
    (old / ".tmpAbC123").write_bytes(b"x" * 1000)
    removed = remove_leftovers(run)
    assert staged in removed and old / ".tmpAbC123" in removed
    assert not staged.exists() and sorted(p.name for p in old.iterdir()) == ["config.json"]


def test_a_final_set_aside_by_an_interrupted_swap_is_put_back(tmp_path) -> None:
    run = tmp_path / "run"
    (run / ".final.old").mkdir(parents=True)
    (run / ".final.old" / "config.json").write_text("{}")
    assert remove_leftovers(run) == []
    assert (run / "final" / "config.json").is_file() and not (run / ".final.old").exists()
    staged = staging_for(run / "final")
    (staged / "new.json").write_text("{}")
    replace_dir(staged, run / "final")
    assert sorted(p.name for p in (run / "final").iterdir()) == ["new.json"] and not staged.exists()
