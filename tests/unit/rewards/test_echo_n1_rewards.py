"""Echo-N1's reward plugins: ``humanlike``, ``empathy`` (both orders / random / fixed, discrete and
probability outcomes, process term, references from the scenario or a cached reference model) and
``echo_n1`` (routing by domain, weighted), on scripted engines; one training run from the CLI on the
embedded model."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.judges.bias import INJECTION
from rapo_echo.rewards import RewardContext, RewardSet, build_reward
from rapo_echo.rewards.echo_n1 import EchoN1Reward, EmpathyReward, HumanlikeReward, scenario_domain
from rapo_echo.rewards.references import ReferenceStore, scenario_key
from rapo_echo.training.run_config import load_config
from rapo_echo.types import Sample, Scenario, msg
from tests.helpers.meeting import MeetingEngine

GOOD, BAD = "That sounds exhausting. What happened at the test?", "ok"
NEED_RULES = [
    (r"assistant: Cognitive need:$", " to understand what went wrong"),
    (r"assistant: Affective need:$", " to feel their frustration is fair"),
    (r"assistant: Proactive need:$", " a plan for the next attempt"),
]


def scenario(sid: str = "s1", reference: str | None = "I'm sorry. That's rough.", **meta) -> Scenario:
    return Scenario(
        sid,
        [msg("user", f"I failed my driving test again ({sid}).")],
        {"need": "encouragement"},
        reference,
        meta,
    )


def sample(text: str, sc: Scenario | None = None, group: int = 0) -> Sample:
    return Sample(sc or scenario(), group, [1], [2, 3], None, text)


def block(text: str, label: str) -> str:
    """The content of a fenced block in a prompt's text."""
    m = re.search(rf"<<<{label} (\w+)>>>\n(.*?)\n<<<END {label} \1>>>", text, re.S)
    return m.group(2) if m else ""


def comparer(prefer: dict[str, float]):
    """A judge's choice_fn that likes replies by their score in ``prefer`` (reference: 1.0): label
    log-probs A / B are the two replies' scores, tie 0. Need-axis questions: C 1, A 2, P 1."""

    def fn(prompt, options):
        text = prompt_text(prompt)
        if " C" in options:
            return {" C": math.log(1), " A": math.log(2), " P": math.log(1)}
        a, b = (prefer.get(block(text, f"REPLY {x}"), 1.0) for x in "AB")
        return {" A": a, " B": b, " tie": 0.0}

    return fn


def judge_engine(prefer: dict[str, float], **kw) -> ScriptedEngine:
    return ScriptedEngine(rules=NEED_RULES, choice_fn=comparer(prefer), **kw)


# ---------------------------------------------------------------------------- humanlike
def test_humanlike_reward_scores_and_marks_invalid() -> None:
    answers = ['{"verdict": "human"}', "hmm", '{"verdict": "AI"}', "no", "still no"]
    engine = ScriptedEngine(replies=answers, structured=False)  # no structured output: parse, retry
    reward = HumanlikeReward(RewardContext(judge=engine), use_logprobs="never", max_retries=1)
    out = reward([sample("lol same"), sample("???"), sample("As an AI, I understand.")])
    assert [o.score for o in out] == [1.0, None, 0.0]
    assert out[1].info["invalid"] == "unparseable verdict" and reward.stats["invalid"] == 1
    with pytest.raises(ConfigError, match="needs a judge engine"):
        HumanlikeReward(RewardContext())
    with pytest.raises(ConfigError, match="use_logprobs"):
        HumanlikeReward(RewardContext(judge=engine), use_logprobs="sometimes")


# ---------------------------------------------------------------------------- empathy
def test_empathy_both_orders_discrete_and_probability_by_hand() -> None:
    # scores: GOOD 3, reference 1, BAD 0.5 -> with tie 0: label log-probs are the scores themselves.
    prefer = {GOOD: 3.0, BAD: 0.5}
    engine = judge_engine(prefer)
    reward = EmpathyReward(RewardContext(judge=engine), outcome="discrete")
    out = reward([sample(GOOD), sample(BAD)])
    # GOOD vs ref: argmax is GOOD in both orders -> win, win -> 1; BAD: ref wins both -> 0
    assert [o.score for o in out] == [1.0, 0.0]
    assert out[0].info["verdicts"] == ["A", "B"] and out[0].info["reference_source"] == "scenario"
    prob = EmpathyReward(RewardContext(judge=judge_engine(prefer)))  # the default: probability
    got = [o.score for o in prob([sample(GOOD), sample(BAD)])]
    # P = softmax(3, 1, 0): win = e^3 / (e^3 + e + 1), tie = 1 / (...); outcome = win + tie / 2
    # (the same in both orders)
    z = math.e**3 + math.e + 1
    z2 = math.exp(0.5) + math.e + 1
    assert got[0] == pytest.approx((math.e**3 + 0.5) / z)
    assert got[1] == pytest.approx((math.exp(0.5) + 0.5) / z2)


def test_empathy_position_bias_both_orders_cancel_it() -> None:
    always_a = ScriptedEngine(rules=NEED_RULES, choice_fn=lambda p, o: {" A": 2.0, " B": 0.0, " tie": 0.0})
    both = EmpathyReward(RewardContext(judge=always_a), outcome="discrete")
    fixed = EmpathyReward(RewardContext(judge=always_a), order="fixed", outcome="discrete")
    # a judge that always says A: policy-first alone gives a win; both orders give win + loss = 0.5
    assert [o.score for o in both([sample(BAD)])] == [0.5]
    assert [o.score for o in fixed([sample(BAD)])] == [1.0]
    rnd = EmpathyReward(RewardContext(judge=always_a), order="random", seed=3, outcome="discrete")
    scores = [o.score for o in rnd([sample(BAD, group=i) for i in range(40)])]
    assert set(scores) == {0.0, 1.0} and 10 <= scores.count(1.0) <= 30  # one random order per sample


def probs_by_order(first: dict[str, float], second: dict[str, float]):
    """A choice_fn giving these label probabilities when the policy's reply (GOOD) is shown first / second."""

    def fn(prompt, options):
        if " C" in options:
            return {" C": 0.0, " A": 0.0, " P": 0.0}
        probs = first if block(prompt_text(prompt), "REPLY A") == GOOD else second
        return {o: math.log(probs[o.strip()]) for o in options}

    return fn


def test_empathy_p_policy_better_averaged_over_both_orders_by_hand() -> None:
    # policy first: {A: .7, B: .2, tie: .1} -> P(policy > ref) + tie/2 = 0.7 + 0.05 = 0.75
    # policy second: {A: .4, B: .5, tie: .1} -> 0.5 + 0.05 = 0.55; the mean is 0.65
    fn = probs_by_order({"A": 0.7, "B": 0.2, "tie": 0.1}, {"A": 0.4, "B": 0.5, "tie": 0.1})
    reward = EmpathyReward(
        RewardContext(judge=ScriptedEngine(rules=NEED_RULES, choice_fn=fn)), injection_probe=0
    )
    [out] = reward([sample(GOOD)])
    assert out.score == pytest.approx(0.65) and out.info["verdicts"] == ["A", "B"]
    # the discrete switch: policy first A (win, 1), policy second B (win, 1) -> 1
    discrete = EmpathyReward(
        RewardContext(judge=ScriptedEngine(rules=NEED_RULES, choice_fn=fn)), outcome="discrete"
    )
    assert discrete([sample(GOOD)])[0].score == 1.0
    # first-position share: the decisions were A (first shown won) then B -> 1 of 2 = 0.5, chance 0.5
    metrics = reward.step_metrics()
    assert {k: v for k, v in metrics.items() if k.startswith("judge/position_bias/")} == {
        "judge/position_bias/first_share": 0.5,
        "judge/position_bias/chance": 0.5,
        "judge/position_bias/n": 2.0,
    }
    assert metrics["judge/addressed"] == 0.0 and metrics["judge/addressed/n"] == 2.0  # the screen counts
    assert not any(k.startswith("judge/position_bias/") for k in reward.step_metrics())  # nothing new


def test_empathy_first_share_of_a_slot_judge_and_auto_orders() -> None:
    always_a = ScriptedEngine(rules=NEED_RULES, choice_fn=lambda p, o: {" A": 2.0, " B": 0.0, " tie": 0.0})
    reward = EmpathyReward(RewardContext(judge=always_a), order="auto", auto_probe=4)
    reward([sample(BAD, group=i) for i in range(2)])  # 2 samples x both orders = 4 decisions, all A
    metrics = reward.step_metrics()
    assert metrics["judge/position_bias/first_share"] == 1.0 and metrics["judge/position_bias/n"] == 4
    reward([sample(BAD, group=i) for i in range(2)])
    assert reward.step_metrics()["judge/position_bias/n"] == 4  # biased: auto keeps both orders
    fair = EmpathyReward(RewardContext(judge=judge_engine({GOOD: 3.0})), order="auto", auto_probe=4)
    fair([sample(GOOD, group=i) for i in range(2)])  # GOOD wins in both orders: first share 0.5
    assert fair.step_metrics()["judge/position_bias/first_share"] == 0.5
    fair([sample(GOOD, group=i) for i in range(2)])
    assert fair.step_metrics()["judge/position_bias/n"] == 2  # unbiased: one random order per sample
    with pytest.raises(ConfigError, match="order"):
        EmpathyReward(RewardContext(judge=always_a), order="sometimes")
    with pytest.raises(ConfigError, match="auto_probe"):
        EmpathyReward(RewardContext(judge=always_a), auto_probe=0)


def test_injection_probe_measures_how_far_an_instruction_moves_the_judge() -> None:
    # a judge that follows the note: the injected reply wins for sure (P(win) 1), the plain one has its
    # ordinary probability; the shift is the difference, measured on the first `injection_probe` samples
    def fn(prompt, options):
        if " C" in options:
            return {" C": 0.0, " A": 0.0, " P": 0.0}
        text = prompt_text(prompt)
        a, b = block(text, "REPLY A"), block(text, "REPLY B")
        if INJECTION in a or INJECTION in b:
            win = " A" if INJECTION in a else " B"
            return {o: 0.0 if o == win else -50.0 for o in options}
        return {" A": math.log(0.4), " B": math.log(0.4), " tie": math.log(0.2)}  # plain: 0.4 + 0.1 = 0.5

    engine = ScriptedEngine(rules=NEED_RULES, choice_fn=fn)
    reward = EmpathyReward(RewardContext(judge=engine), injection_probe=2)
    out = reward([sample(GOOD, group=i) for i in range(3)])
    assert [o.score for o in out] == pytest.approx([0.5] * 3)  # the probe never changes a score
    choices = [c for c in engine.calls if c["method"] == "choice_logprobs"]
    # probes ride in the same call: 3 samples x 2 orders, and per probe 2 orders x (the bare judge, and the
    # screen's two readings under `lower`: as written and with the attack set aside)
    assert [len(c["prompts"]) for c in choices] == [3 * 2 + 2 * 2 * 3]
    metrics = reward.step_metrics()
    # the probe takes issue 39's attacks in turn: the first probe appends the note (this judge follows it:
    # +0.5), the second the judge's answer object (this judge ignores it: 0); the mean is 0.25
    assert metrics["judge/injection_bias/note/shift"] == pytest.approx(0.5)
    assert metrics["judge/injection_bias/json/shift"] == pytest.approx(0.0)
    assert metrics["judge/injection_bias/shift"] == pytest.approx(0.25)
    # through the screen the note buys nothing: the set-aside reading (0.5) is the lower one
    assert metrics["judge/injection_bias/defended_shift"] == pytest.approx(0.0)
    assert metrics["judge/injection_bias/n"] == 2
    assert metrics["judge/position_bias/n"] == 6  # the probes are not counted as decisions
    assert reward.stats["comparisons"] == 6
    reward([sample(GOOD, group=i) for i in range(3)])
    assert "judge/injection_bias/n" not in reward.step_metrics()  # measured once per run


def test_empathy_needs_once_per_scenario_and_one_compare_call() -> None:
    engine = judge_engine({GOOD: 3.0})
    reward = EmpathyReward(RewardContext(judge=engine), injection_probe=0)
    a, b = scenario("a"), scenario("b")
    samples = [sample(t, sc, g) for g, sc in enumerate((a, b)) for t in (GOOD, BAD, GOOD, BAD)]
    reward(samples)
    gens = [c for c in engine.calls if c["method"] == "generate"]
    choices = [c for c in engine.calls if c["method"] == "choice_logprobs"]
    assert [len(c["prompts"]) for c in gens] == [6]  # 2 scenarios x 3 axes, not 8 samples x 3
    assert [len(c["prompts"]) for c in choices] == [16]  # 8 samples x 2 orders in one call
    reward(samples)  # the next step: the analyses are cached
    assert len([c for c in engine.calls if c["method"] == "generate"]) == 1
    assert "to feel their frustration is fair" in prompt_text(choices[0]["prompts"][0])


def test_empathy_invalid_analysis_and_verdicts_are_none_not_zero() -> None:
    garbage = ScriptedEngine(default=" ...", choice_fn=comparer({}))
    reward = EmpathyReward(RewardContext(judge=garbage), max_retries=0)
    [out] = reward([sample(GOOD)])
    assert out.score is None and out.info["invalid"] == "need analysis unparseable"
    text_judge = ScriptedEngine(rules=[*NEED_RULES, (r"Reply A", "I cannot decide.")], structured=False)
    r2 = EmpathyReward(RewardContext(judge=text_judge), use_logprobs="never", max_retries=1)
    [out2] = r2([sample(GOOD)])
    assert out2.score is None and out2.info["invalid"] == "unparseable verdict"
    assert r2.stats["comparisons_invalid"] == 2
    no_ref = EmpathyReward(RewardContext(judge=judge_engine({})), reference="scenario")
    [out3] = no_ref([sample(GOOD, scenario(reference=None))])
    assert out3.score is None and out3.info["invalid"] == "no reference"


def test_empathy_process_term_multiplies_the_outcome() -> None:
    engine = judge_engine({GOOD: 3.0})
    reward = EmpathyReward(RewardContext(judge=engine), process=True, outcome="discrete")
    annotated = scenario("a")  # need "encouragement" -> axis P; the judge gives P 1/4 (C 1, A 2, P 1)
    plain = Scenario("b", [msg("user", "hello there")], {}, "Hi!", {})
    out = reward([sample(GOOD, annotated), sample(GOOD, plain, 1)])
    assert out[0].info["outcome"] == 1.0 and out[0].info["process"] == pytest.approx(0.25)
    assert out[0].score == pytest.approx(0.25)
    assert out[1].score == 1.0 and out[1].info["process_missing"] == "no annotated need"
    assert reward.stats["process_missing/no annotated need"] == 1


def test_reference_model_written_once_and_cached_on_disk(tmp_path: Path) -> None:
    writer = ScriptedEngine(default="I'm here with you. What happened?")
    judge = judge_engine({})
    ctx = RewardContext(judge=judge, policy=writer, run_dir=tmp_path)
    reward = EmpathyReward(ctx, reference="model", reference_model="policy", reference_cache="run")
    a, b = scenario("a"), scenario("b", reference=None)
    out = reward([sample(GOOD, a), sample(BAD, a), sample(GOOD, b, 1)])
    assert [o.info["reference_source"] for o in out] == ["model"] * 3
    assert len(writer.calls) == 1 and len(writer.calls[0]["prompts"]) == 2  # one call, one per scenario
    files = list((tmp_path / "references").glob("*.jsonl"))
    rows = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert {r["key"] for r in rows} == {scenario_key(a), scenario_key(b)}
    # a new run (fresh reward) reads the cache: nothing is generated again
    again = EmpathyReward(ctx, reference="model", reference_model="policy", reference_cache="run")
    again([sample(GOOD, a), sample(GOOD, b)])
    assert len(writer.calls) == 1
    # auto: the scenario's own reference first, the model only where it has none
    auto = EmpathyReward(
        RewardContext(judge=judge, policy=writer),
        reference_model="policy",
        reference_cache=str(tmp_path / "c"),
    )
    got = auto([sample(GOOD, a), sample(GOOD, b)])
    assert [o.info["reference_source"] for o in got] == ["scenario", "model"]


def test_reference_store_keys_by_model_and_skips_torn_lines(tmp_path: Path) -> None:
    one = ReferenceStore(ScriptedEngine(default="ref one"), tmp_path, system_prompt="x", identity="m1")
    two = ReferenceStore(ScriptedEngine(default="ref two"), tmp_path, system_prompt="x", identity="m2")
    sc = scenario()
    assert one.get([sc]) == ["ref one"] and two.get([sc]) == ["ref two"] and one.path != two.path
    with open(one.path, "a") as fh:
        fh.write('{"key": "torn')
    assert ReferenceStore(ScriptedEngine(), tmp_path, system_prompt="x", identity="m1").get([sc]) == [
        "ref one"
    ]


# ---------------------------------------------------------------------------- echo_n1
def test_domain_field() -> None:
    assert scenario_domain(scenario(domain="Chit-chat"), "domain", "empathy") == "chitchat"
    assert scenario_domain(scenario(), "domain", "empathy") == "empathy"
    prof = Scenario("p", [msg("user", "hi")], {"domain": "chit_chat"})
    assert scenario_domain(prof, "domain", "empathy") == "chitchat"
    with pytest.raises(DataError, match=r"scenario 's1': meta.domain: got 'sports'"):
        scenario_domain(scenario(domain="sports"), "domain", "empathy")


def test_echo_n1_routes_by_domain_and_weights() -> None:
    def fn(prompt, options):
        if " human" in options:
            return {" human": math.log(0.8), " AI": math.log(0.2)}
        return comparer({GOOD: 3.0})(prompt, options)

    ctx = RewardContext(judge=ScriptedEngine(rules=NEED_RULES, choice_fn=fn))
    emp, chat = scenario("e", domain="empathy"), scenario("c", domain="chitchat")
    routed = EchoN1Reward(ctx, empathy={"outcome": "discrete"})([sample(GOOD, emp), sample(GOOD, chat, 1)])
    assert [o.score for o in routed] == [1.0, pytest.approx(0.8)]
    assert [o.info["domain"] for o in routed] == ["empathy", "chitchat"]
    weighted = EchoN1Reward(
        ctx, mode="weighted", weights={"empathy": 0.25, "humanlike": 0.75}, empathy={"outcome": "discrete"}
    )
    # 0.25 * 1 + 0.75 * 0.8 = 0.85, whatever the domain
    assert [o.score for o in weighted([sample(GOOD, emp), sample(GOOD, chat, 1)])] == pytest.approx(
        [0.85, 0.85]
    )
    with pytest.raises(ConfigError, match="mode"):
        EchoN1Reward(ctx, mode="sum")
    with pytest.raises(ConfigError, match="bad humanlike / empathy args"):
        EchoN1Reward(ctx, empathy={"colour": "red"})


def test_on_a_served_judge_independent_stages_go_out_together(tmp_path: Path) -> None:
    def fn(prompt, options):
        if " human" in options:
            return {" human": math.log(0.8), " AI": math.log(0.2)}
        return comparer({GOOD: 3.0})(prompt, options)

    # weighted: the empathy judge (its need analysis first) and the humanlike judge at once
    served = MeetingEngine(2, rules=NEED_RULES, choice_fn=fn)
    reward = EchoN1Reward(RewardContext(judge=served), mode="weighted", empathy={"outcome": "discrete"})
    out = reward([sample(GOOD), sample(BAD, group=1)])
    assert served.peak == 2
    alone = EchoN1Reward(
        RewardContext(judge=ScriptedEngine(rules=NEED_RULES, choice_fn=fn)),
        mode="weighted",
        empathy={"outcome": "discrete"},
    )([sample(GOOD), sample(BAD, group=1)])
    assert [o.score for o in out] == [o.score for o in alone]  # the same scores either way
    # empathy alone: the reference the judge writes and the need analysis at once
    rules = [*NEED_RULES, (r"(?s)^(?!.*need:$).*", "I'm sorry, that sounds hard.")]
    served = MeetingEngine(2, rules=rules, choice_fn=fn)
    empathy = EmpathyReward(RewardContext(judge=served), reference_cache=str(tmp_path), outcome="discrete")
    [scored] = empathy([sample(GOOD, scenario("n", reference=None))])
    assert served.peak == 2 and scored.info["reference_source"] == "model" and scored.score is not None


def test_registered_by_name_through_the_reward_registry() -> None:
    ctx = RewardContext(judge=judge_engine({}))
    for name, cls in (("humanlike", HumanlikeReward), ("empathy", EmpathyReward), ("echo_n1", EchoN1Reward)):
        assert isinstance(build_reward(name, {}, ctx), cls)
    cfg = load_config(overrides=["rewards=[{name: echo_n1, args: {mode: weighted}}]"])
    rs = RewardSet.from_specs(cfg.rewards, ctx)
    assert rs.names == ["echo_n1"]
    shipped = load_config("configs/echo_n1.yaml")  # every switch spelled out, with the defaults
    [reward] = RewardSet.from_specs(shipped.rewards, ctx).rewards
    assert isinstance(reward[0], EchoN1Reward) and reward[0].empathy.order == "both"
    text = Path("pyproject.toml").read_text()
    for name in ("humanlike", "empathy", "echo_n1"):
        assert f'{name} = "rapo_echo.rewards.echo_n1:' in text


# ---------------------------------------------------------------------------- on the embedded model
@pytest.mark.integration
def test_train_grpo_with_echo_n1_from_the_cli(tmp_path: Path, smol_path: str) -> None:
    from rapo_echo.cli import main

    data = tmp_path / "data.jsonl"
    rows = [
        {
            "id": "emp",
            "opening": "I failed my driving test again.",
            "reference": "Oh no. How are you?",
            "meta": {"domain": "empathy"},
        },
        {"id": "chat", "opening": "anyone watching the match tonight?", "meta": {"domain": "chit-chat"}},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    sets = [
        f"data.path={data}",
        "data.shuffle=false",
        "rollout.batch_size=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "loss.beta=0",
        "model.lora.enabled=true",
        "logging.progress=false",
        "logging.tensorboard=false",
        "rewards.0.args={empathy: {need_tokens: 6}}",
    ]
    argv = ["train", "--algo", "grpo", "--reward", "echo_n1", "--output", str(run), "--max-steps", "1"]
    assert main(argv + [x for s in sets for x in ("--set", s)]) == 0
    [row] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["updates"] == 1.0 and "reward/echo_n1/mean" in row
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    domains = {s["scenario"]: s["info"]["echo_n1"]["domain"] for s in samples}
    assert domains == {"emp": "empathy", "chat": "chitchat"}
    assert all(s["reward"] is None or 0.0 <= s["reward"] <= 1.0 for s in samples)
    assert (run / "final").is_dir()
