"""``--algo rlver`` with scripted engines: the policy samples scripted token ids (so every sequence is
known), the simulator is a scripted SAGE-style user. Covered: the token sequence equals what each turn
was sampled from (SmolLM2's template and a template that trims / adds whitespace), loss masks, dialogues
that drop out without misaligning the others, termination, budgets and truncation counts, invalid
dialogues masked and counted, thinking mode, the format reward, PPO's values and GAE; then training
through the trainer (value head checkpointed and restored) and the CLI on the embedded model."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from rapo_echo.algorithms.base import AlgoContext
from rapo_echo.algorithms.rlver import RLVER, visible_start
from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from rapo_echo.policy import Policy
from rapo_echo.rewards import RewardSet, build_reward
from rapo_echo.training.run_config import load_config
from rapo_echo.types import Generation, SamplingParams, Scenario
from tests.helpers.answers import sage_analysis
from tests.helpers.runs import QUIET, metrics, run_config, set_flags


class TokenScript:
    """A policy sampler with scripted replies: ``fn(decoded prompt) -> reply text``; the reply's tokens
    (plus the end-of-turn token) are 'sampled' with log-prob -0.5 each. Records every prompt."""

    def __init__(self, tokenizer: Any, fn: Any, eos: int | None = None) -> None:
        self.tok, self.fn = tokenizer, fn
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>") if eos is None else eos
        self.calls: list[list[list[int]]] = []

    def generate_ids(self, prompt_ids, params: SamplingParams) -> list[list[Generation]]:
        self.calls.append([list(p) for p in prompt_ids])
        out = []
        for p in prompt_ids:
            ids = self.tok(self.fn(self.tok.decode(p)), add_special_tokens=False)["input_ids"] + [self.eos]
            finish = "stop"
            if len(ids) > params.max_new_tokens:
                ids, finish = ids[: params.max_new_tokens], "length"
            text = self.tok.decode(ids, skip_special_tokens=True)
            out.append([Generation(text, ids, [-0.5] * len(ids), list(p), finish)])
        return out


def last_user(prompt: str) -> str:
    return re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, re.S)[-1]


def echo_policy(prompt: str) -> str:
    return f"you said {last_user(prompt)[:24]}"


def simulator(
    step_of: dict[str, str], reply: str = "Response: tell me more, {name}", structured: bool = True
) -> ScriptedEngine:
    """Each profile's emotion moves by its own step; the user's answer names the profile."""

    def fn(prompt):
        text = prompt_text(prompt)
        name = re.search(r"I am (\w+)", text).group(1)
        if "emotion right now" in text:
            step = step_of[name]
            return sage_analysis(int(step)) if step.lstrip("+-").isdigit() else f"Change: {step}"
        return reply.format(name=name)  # the user's message alone: plain_reply is the default

    return ScriptedEngine(fn=fn, structured=structured)


def scenario(name: str) -> Scenario:
    row = {
        "id": name,
        "player": f"I am {name}",
        "scene": "a scene",
        "task": "be heard",
        "first_talk": f"{name} opens",
    }
    return Scenario(
        name, [{"role": "user", "content": row["first_talk"]}], profile=row, meta={"format": "sage"}
    )


@pytest.fixture(scope="module")
def policy(request) -> Policy:
    from rapo_echo.config import ModelConfig, RolloutConfig

    folder = request.getfixturevalue("tiny_module_folder")
    return Policy(ModelConfig(name=str(folder)), RolloutConfig(), need_reference=False, device="cpu")


def make_algo(policy: Policy, sim: ScriptedEngine, *sets: str, rewards=None) -> RLVER:
    policy.scorer.value_head = None
    # a group of one (refused by load_config for GRPO, which would train nothing) is set in code: these
    # tests look at the rollouts and the PPO estimates of single dialogues
    one = "rollout.group_size=1" in sets
    sets = tuple(x for x in sets if x != "rollout.group_size=1")
    # no Learner resolves "auto" here, so the micro-batch size is given
    base = ["rollout.group_size=2", "rollout.max_new_tokens=24", "train.micro_batch_size=8"]
    cfg = load_config(algo="rlver", overrides=[*base, *sets])
    if one:
        cfg.rollout.group_size = 1
    policy.rollout_cfg = cfg.rollout
    if RLVER.needs(cfg).value_head:  # what the Learner does before it builds the algorithm
        policy.add_value_head()
    return RLVER(cfg, AlgoContext(policy, rewards or RewardSet([]), simulator=sim))


def test_dialogues_drop_out_without_misaligning_the_others(policy):
    sampler = TokenScript(policy.tokenizer, echo_policy)
    policy.rollout_engine = sampler
    steps = {"Down": "-10", "Up": "+5", "Flat": "0"}
    algo = make_algo(policy, simulator(steps), "rlver.simulator.max_turns=4", "rollout.group_size=1")
    out = algo.rollout([scenario("Down"), scenario("Up"), scenario("Flat")], step=0)
    episodes = out.extra["episodes"]
    # rlver preset: start 30, stop at <= 0; Down: 20, 10, 0 -> ends after 3 replies; the others go on
    assert [e.dialogue.reason for e in episodes] == ["emotion_low", "max_turns", "max_turns"]
    assert [len(e.turns) for e in episodes] == [3, 4, 4]
    assert [len(c) for c in sampler.calls] == [3, 3, 3, 2]  # one call per turn over the active dialogues
    for e in episodes:
        name = e.dialogue.profile.persona.split()[-1]
        users = [m["content"] for m in e.dialogue.history if m["role"] == "user"]
        assert users[0] == f"{name} opens" and all(u == f"tell me more, {name}" for u in users[1:])
        # each policy reply answered that dialogue's own last user message
        replies = [m["content"] for m in e.dialogue.history if m["role"] == "assistant"]
        assert replies == [f"you said {u[:24]}".strip() for u in users[: len(replies)]]
        assert [t.reply for t in e.turns] == replies
    assert out.metrics["emotion/final"] == pytest.approx((0 + 50 + 30) / 3)
    assert [s.reward for s in out.samples] == pytest.approx([0.0, 0.5, 0.3])
    assert [it.sample for it in out.items] == [0, 1, 2]


def test_groups_share_a_profile_and_get_group_advantages(policy):
    policy.rollout_engine = TokenScript(policy.tokenizer, echo_policy)
    algo = make_algo(policy, simulator({"Down": "-10", "Up": "+5"}), "rlver.simulator.max_turns=4")
    out = algo.rollout([scenario("Down"), scenario("Up")], step=0)
    assert [s.group for s in out.samples] == [0, 0, 1, 1]
    assert [s.reward for s in out.samples] == pytest.approx([0.0, 0.0, 0.5, 0.5])
    assert [it.advantage for it in out.items] == [0.0] * 4  # equal rewards within each group: no signal


def test_sequence_is_exactly_what_each_turn_was_sampled_from(policy, smol_tokenizer):
    sampler = TokenScript(policy.tokenizer, echo_policy)
    policy.rollout_engine = sampler
    algo = make_algo(policy, simulator({"A": "+5"}), "rlver.simulator.max_turns=3", "rollout.group_size=1")
    out = algo.rollout([scenario("A")], step=0)
    [e], [item] = out.extra["episodes"], out.items
    full = item.prompt_ids + item.completion_ids
    prompts = [c[0] for c in sampler.calls]
    for turn, prompt in zip(e.turns, prompts):
        assert turn.prompt_ids == prompt and full[: len(prompt)] == prompt  # sampled from a prefix
        assert full[len(prompt) : len(prompt) + len(turn.ids)] == turn.ids  # the sampled ids follow
    # the loss mask is 1 exactly on the sampled ids; the sampler log-probs are kept there
    masked = [t for t, m in zip(item.completion_ids, item.loss_mask) if m]
    assert masked == [t for turn in e.turns for t in turn.ids]
    assert [lp for lp, m in zip(item.sampler_logprobs, item.loss_mask) if m] == [-0.5] * len(masked)
    assert item.loss_tokens == len(masked)
    # with SmolLM2's template the whole sequence also equals the template's rendering of the dialogue
    system = [{"role": "system", "content": algo.system_prompt()}]
    text = smol_tokenizer.apply_chat_template(system + e.dialogue.history, tokenize=False)
    assert full == smol_tokenizer(text.removesuffix("\n"), add_special_tokens=False)["input_ids"]


TRIM_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}\n<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_template_that_trims_and_adds_whitespace(policy, smol_tokenizer):
    """The template trims contents and writes a newline before <|im_end|>; the policy samples ' padded '
    replies ending straight in <|im_end|>. Re-rendering would change the tokens; we keep what was sampled."""
    import copy

    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = TRIM_TEMPLATE
    old = policy.tokenizer, policy.engine.tokenizer
    policy.tokenizer = policy.engine.tokenizer = tok
    try:
        sampler = TokenScript(tok, lambda p: "  padded reply  ")
        policy.rollout_engine = sampler
        algo = make_algo(
            policy, simulator({"A": "+5"}), "rlver.simulator.max_turns=3", "rollout.group_size=1"
        )
        out = algo.rollout([scenario("A")], step=0)
    finally:
        policy.tokenizer, policy.engine.tokenizer = old
    [e], [item] = out.extra["episodes"], out.items
    full = item.prompt_ids + item.completion_ids
    for turn, [prompt] in zip(e.turns, sampler.calls):
        assert full[: len(prompt)] == prompt and full[len(prompt) : len(prompt) + len(turn.ids)] == turn.ids
    # the user turn after a sampled <|im_end|> is the rest of the template's end marker + the next turn
    assert tok.decode(item.completion_ids[len(e.turns[0].ids) :][:4]).startswith("\n<|im_start|>user\n")
    rerendered = tok(
        tok.apply_chat_template(
            [{"role": "system", "content": algo.system_prompt()}, *e.dialogue.history], tokenize=False
        ),
        add_special_tokens=False,
    )["input_ids"]
    assert rerendered[: len(full)] != full  # naive re-rendering would not match what was sampled


def test_budgets_truncate_and_count(policy):
    policy.rollout_engine = TokenScript(policy.tokenizer, lambda p: "word " * 40)
    algo = make_algo(
        policy, simulator({"A": "+5"}), "rollout.max_new_tokens=8", "rlver.max_dialogue_tokens=60"
    )
    out = algo.rollout([scenario("A")], step=0)
    for e in out.extra["episodes"]:
        assert all(t.truncated and len(t.ids) <= 8 for t in e.turns)
        assert len(e.response) <= 60 and e.dialogue.reason == "token_budget"
    assert out.metrics["rlver/truncated_turns"] == sum(len(e.turns) for e in out.extra["episodes"])
    assert out.metrics["truncated"] == 2 and out.metrics["rlver/end/token_budget"] == 1.0


def test_invalid_dialogues_are_masked_and_counted(policy):
    policy.rollout_engine = TokenScript(policy.tokenizer, echo_policy)
    # a server without structured output: parse, then invalid
    sim = simulator({"Good": "+5", "Bad": "no number"}, structured=False)
    algo = make_algo(policy, sim, "rlver.simulator.max_turns=2", "rlver.simulator.max_retries=0")
    out = algo.rollout([scenario("Bad"), scenario("Good")], step=0)
    assert [s.reward for s in out.samples][:2] == [None, None]
    assert out.metrics["invalid"] == 2 and out.metrics["rlver/end/invalid"] == 0.5
    assert {it.sample for it in out.items} == {2, 3}  # only the valid dialogues train


def test_goodbye_ends_and_a_shared_generated_opening(policy):
    def sim_fn(prompt):
        text = prompt_text(prompt)
        if "emotion right now" in text:
            return sage_analysis(10)
        if "conversation begins now" in text:
            return "Response: ugh, long week"
        return "Response: thanks, bye!"

    policy.rollout_engine = TokenScript(policy.tokenizer, echo_policy)
    sim = ScriptedEngine(fn=sim_fn)
    algo = make_algo(policy, sim, "rollout.group_size=3")
    sc = Scenario("x", [], profile={"player": "I am X", "scene": "s"}, meta={"format": "sage"})
    out = algo.rollout([sc], step=0)
    episodes = out.extra["episodes"]
    assert [e.dialogue.history[0]["content"] for e in episodes] == ["ugh, long week"] * 3  # one opening
    assert sum("conversation begins now" in prompt_text(c["prompts"][0]) for c in sim.calls) == 1
    assert all(e.dialogue.reason == "goodbye" and len(e.turns) == 1 for e in episodes)


def test_thinking_mode_strips_thoughts_and_trains_each_turn(policy):
    sampler = TokenScript(policy.tokenizer, lambda p: "<think>be gentle</think> that sounds hard")
    policy.rollout_engine = sampler
    seen: list[str] = []

    def sim_fn(prompt):
        text = prompt_text(prompt)
        seen.append(text)
        return sage_analysis(5) if "emotion right now" in text else "Response: go on"

    rewards = RewardSet([(build_reward("think_format", {}, None), 0.5)])
    algo = make_algo(
        policy,
        ScriptedEngine(fn=sim_fn),
        "rlver.thinking=true",
        "rlver.simulator.max_turns=2",
        "rollout.group_size=1",
        rewards=rewards,
    )
    out = algo.rollout([scenario("A")], step=0)
    [e] = out.extra["episodes"]
    assert "<think>" in algo.system_prompt() and all("be gentle" not in t for t in seen)
    assert e.dialogue.history[1]["content"] == "that sounds hard"
    # later turns' contexts keep only the reply; each turn is one row trained on its own sampled ids
    second = policy.tokenizer.decode(sampler.calls[1][0])
    assert "be gentle" not in second and "that sounds hard" in second
    assert [(it.prompt_ids, it.completion_ids) for it in out.items] == [
        (t.prompt_ids, t.ids) for t in e.turns
    ]
    assert out.samples[0].rewards["think_format"] == 1.0
    assert out.samples[0].reward == pytest.approx(0.4 + 0.5)  # (30 + 5 + 5) / 100 + 0.5 * 1.0
    tok = policy.tokenizer
    ids = tok("<think>x</think> hi", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids[visible_start(ids, tok.decode) :]).strip() == "hi"


def test_ppo_values_and_gae(policy):
    policy.rollout_engine = TokenScript(policy.tokenizer, echo_policy)
    algo = make_algo(
        policy,
        simulator({"A": "+10"}),
        "rlver.estimator=ppo",
        "rlver.ppo.whiten=false",
        "rlver.simulator.max_turns=2",
        "rollout.group_size=1",
    )
    assert policy.scorer.value_head is not None
    out = algo.rollout([scenario("A")], step=0)
    [item] = out.items
    # the value head starts at zero, so with gamma = lambda = 1 every policy token's advantage is the
    # reward (30 + 10 + 10) / 100 = 0.5 and its return too; the user's tokens get 0
    assert item.fields["old_values"] == pytest.approx([0.0] * len(item.completion_ids))
    for a, r, m in zip(item.fields["token_advantages"], item.fields["returns"], item.loss_mask):
        assert (a, r) == pytest.approx((0.5, 0.5) if m else (0.0, 0.0))
    dense = make_algo(
        policy,
        simulator({"A": "+10"}),
        "rlver.estimator=ppo",
        "rlver.ppo.whiten=false",
        "rlver.dense_reward=true",
        "rlver.simulator.max_turns=2",
        "rollout.group_size=1",
    )
    d_out = dense.rollout([scenario("A")], step=0)
    [d_item], n1 = d_out.items, len(d_out.extra["episodes"][0].turns[0].ids)
    on = [a for a, m in zip(d_item.fields["token_advantages"], d_item.loss_mask) if m]
    # rewards (40 - 30) / 100 and (50 - 40) / 100 at the two turns' ends: 0.2 left on turn 1, 0.1 on turn 2
    assert on[:n1] == pytest.approx([0.2] * n1) and on[n1:] == pytest.approx([0.1] * (len(on) - n1))
    # thinking mode: one row per turn, GAE across a dialogue's rows ([dialogue, turn, token] flattened)
    policy.rollout_engine = TokenScript(policy.tokenizer, lambda p: "<think>hm</think> I see")
    think = make_algo(
        policy,
        simulator({"A": "+10"}),
        "rlver.estimator=ppo",
        "rlver.ppo.whiten=false",
        "rlver.ppo.lam=0.5",
        "rlver.dense_reward=true",
        "rlver.thinking=true",
        "rlver.simulator.max_turns=2",
        "rollout.group_size=1",
    )
    first, second = think.rollout([scenario("A")], step=0).items
    n1, n2 = len(first.completion_ids), len(second.completion_ids)
    # values 0, lambda .5: turn 2 (reward .1 at its end) gets .1 * .5^(n2-1-t); turn 1's tokens add
    # its own .1 at its end and the carried advantage of turn 2's first token
    tail2 = [0.1 * 0.5 ** (n2 - 1 - t) for t in range(n2)]
    tail1 = [(0.1 + 0.5 * tail2[0]) * 0.5 ** (n1 - 1 - t) for t in range(n1)]
    assert second.fields["token_advantages"] == pytest.approx(tail2)
    assert first.fields["token_advantages"] == pytest.approx(tail1)
    with pytest.raises(Exception, match="dense_reward needs estimator: ppo"):
        load_config(algo="rlver", overrides=["rlver.dense_reward=true"])
    policy.scorer.value_head = None


# ---------------------------------------------------------------------------- through the trainer

SIM_SCRIPT = (
    "{rules: [['emotion right now', '"
    + sage_analysis(10).replace("{", "{{").replace("}", "}}")  # a script reply is a format string
    + "'], ['the final message you say', 'Response: hm, go on']]}"
)


def rlver_cfg(model: Path, out: Path, *extra: str):
    return run_config(
        model,
        out,
        "simulator.engine=scripted",
        f"simulator.script={SIM_SCRIPT}",
        "data.limit=2",
        "rollout.batch_size=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=6",
        "rlver.simulator.max_turns=2",
        "train.lr=1e-3",
        *extra,
        algo="rlver",
    )


def train_rlver_cli(model: str, run: Path, steps: int, *sets: str) -> int:
    """``rapo-echo train --algo rlver``, scripted simulator: one prompt, two replies, two turns, LoRA."""
    from rapo_echo.cli import main

    args = ["train", "--algo", "rlver", "--model", model, "--output", str(run), "--max-steps", str(steps)]
    scripted = ["simulator.engine=scripted", f"simulator.script={SIM_SCRIPT}", "rlver.simulator.max_turns=2"]
    small = ["rollout.batch_size=1", "rollout.group_size=2", "model.lora.enabled=true", *QUIET]
    return main(args + set_flags(*scripted, *small, *sets))


def test_ppo_trains_and_its_value_head_is_checkpointed_and_restored(tmp_path, tiny_folder):
    from safetensors.torch import load_file

    from rapo_echo.training.run import Run

    run = tmp_path / "run"
    t = Run(rlver_cfg(tiny_folder, run, "rlver.estimator=ppo", "train.max_steps=1"))
    t.train()
    rows = metrics(run)
    assert rows[0]["loss/value"] > 0 and rows[0]["items"] == 4 and rows[0]["emotion/final"] == 50.0
    saved = load_file(str(run / "checkpoints" / "step-1" / "model" / "value_head.safetensors"))
    trained = t.policy.scorer.value_head.state_dict()
    assert saved["linear.bias"].abs().item() > 0  # it learnt something in one step
    resumed = Run(rlver_cfg(tiny_folder, run, "rlver.estimator=ppo", "train.max_steps=2"), resume=True)
    resumed._restore()
    for k, v in resumed.policy.scorer.value_head.state_dict().items():
        assert torch.equal(v, trained[k]) and torch.equal(v, saved[k])
    (run / "checkpoints" / "step-1" / "model" / "value_head.safetensors").unlink()
    again = Run(rlver_cfg(tiny_folder, run, "rlver.estimator=ppo", "train.max_steps=2"), resume=True)
    with pytest.raises(Exception, match="holds no value_head.safetensors"):
        again._restore()


@pytest.mark.integration
@pytest.mark.parametrize("estimator", ["grpo", "ppo"])
def test_cli_trains_rlver_on_the_embedded_model(tmp_path, smol_path, estimator):
    run = tmp_path / estimator
    assert (
        train_rlver_cli(smol_path, run, 1, "rollout.max_new_tokens=12", f"rlver.estimator={estimator}") == 0
    )
    [row] = metrics(run)
    assert row["emotion/final"] == 50.0 and row["rlver/turns"] == 2 and row["invalid"] == 0
    assert row["updates"] == 1 and (run / "final" / "config.json").is_file()
    if estimator == "ppo":
        assert (run / "final" / "value_head.safetensors").is_file() and "loss/value" in row


def test_split_thinking_and_the_format_reward():
    from rapo_echo.prompting import split_thinking
    from rapo_echo.types import Sample

    good = split_thinking("<think>plan: be gentle</think>\nThat sounds hard.")
    assert (good.thought, good.reply, good.well_formed) == ("plan: be gentle", "That sounds hard.", True)
    cases = {
        "That sounds hard.": (None, "That sounds hard.", False),  # no tags: the whole text is said
        "<think>cut off mid-thou": (None, "cut off mid-thou", False),  # unclosed: RLVER shows it all
        "<think></think> hi": (None, "hi", False),  # empty thought
        "<think>x</think>": ("x", "", False),  # no reply
        "hi <think>x</think> there": ("hi x", "there", False),  # does not open with the tag
        "<think>a</think><think>b</think> c": ("a</think>b", "c", False),  # two pairs
    }
    for text, (thought, reply, well) in cases.items():
        t = split_thinking(text)
        assert (t.thought, t.reply, t.well_formed) == (thought, reply, well), text
    reward = build_reward("think_format", {}, None)
    sc = Scenario("s", [])
    outs = reward([Sample(sc, 0, [1], [2], None, text) for text in ["<think>a</think> b", "b"]])
    assert [o.score for o in outs] == [1.0, 0.0] and outs[1].critique


# ---------------------------------------------------------------------------- per-turn rewards


def test_per_turn_rewards_give_each_turn_its_advantage(policy):
    """A user who warms up (+10) at a question and cools (-10) otherwise, starting at 10 (the dialogue
    ends at 0): dialogue A asks, asks, then does not (3 turns: 10 -> 20 -> 30 -> 20); B does not ask and
    ends after one turn (10 -> 0). Per-turn rewards: A +.1, +.1, -.1; B -.1. Returns-to-go: A .1, 0, -.1;
    B -.1. Advantages (leave-one-out, an ended dialogue counts 0): A .1 - (-.1) = .2, 0 - 0, -.1 - 0;
    B -.1 - .1 = -.2. Each policy token carries its turn's advantage, the user's tokens 0."""
    replies = iter(["Tell me more?", "ok", "Why?", "ok"])
    policy.rollout_engine = TokenScript(policy.tokenizer, lambda prompt: next(replies))

    def sim(prompt):
        text = prompt_text(prompt)
        if "emotion right now" in text:
            newest = re.findall(r"Supporter: (.*)", text)[-1]
            return sage_analysis(10 if "?" in newest else -10)
        return "Response: hm, go on"

    sets = ["rlver.simulator.max_turns=3", "rlver.simulator.initial_emotion=10", "rlver.reward=per_turn"]
    algo = make_algo(policy, ScriptedEngine(fn=sim), *sets)
    out = algo.rollout([scenario("A")], step=0)
    a, b = out.extra["episodes"]
    assert [len(a.turns), len(b.turns)] == [3, 1] and b.dialogue.reason == "emotion_low"
    assert [s.info["turn_advantages"] for s in out.samples] == [
        pytest.approx([0.2, 0.0, -0.1]),
        pytest.approx([-0.2]),
    ]
    row_a, row_b = out.items
    per_token = row_a.fields["turn_advantages"]
    expected = [adv for t, adv in zip(a.turns, [0.2, 0.0, -0.1]) for _ in t.ids]
    assert [v for v, m in zip(per_token, a.mask) if m] == pytest.approx(expected)
    assert all(v == 0.0 for v, m in zip(per_token, a.mask) if not m)
    assert row_b.fields["turn_advantages"] == pytest.approx([-0.2] * len(b.turns[0].ids))
    assert out.samples[0].reward == pytest.approx(0.2) and out.samples[1].reward == 0.0  # still the final
    with pytest.raises(Exception, match="per_turn is GRPO's"):
        load_config(algo="rlver", overrides=["rlver.reward=per_turn", "rlver.estimator=ppo"])


def test_per_turn_rewards_train_two_steps(tmp_path, tiny_folder):
    from rapo_echo.training.run import Run

    run = tmp_path / "run"
    Run(rlver_cfg(tiny_folder, run, "rlver.reward=per_turn", "train.max_steps=2")).train()
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2] and all(r["items"] == 4 and r["updates"] == 1 for r in rows)
    assert all(math.isfinite(r["loss/total"]) for r in rows)


@pytest.mark.integration
def test_cli_trains_per_turn_rewards_on_the_embedded_model(tmp_path, smol_path):
    """``rlver.reward: per_turn`` trains 2 steps of the embedded model (LoRA, few tokens)."""
    run = tmp_path / "per_turn"
    assert train_rlver_cli(smol_path, run, 2, "rollout.max_new_tokens=8", "rlver.reward=per_turn") == 0
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2] and all(
        r["rlver/turns"] == 2 and r["updates"] == 1 for r in rows
    )
