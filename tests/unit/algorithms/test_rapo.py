"""A whole RAPO step with scripted simulator and judge: known reactions and rankings give known
rewards, advantages, self-distillation targets and masks; the SD losses against hand values."""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import pytest
import torch

from rapo_echo.algorithms.base import PG, AlgoContext, MicroBatch
from rapo_echo.algorithms.rapo import RAPO, SD, select_for_distillation, teacher_prompt
from rapo_echo.engines.hf import HFEngine
from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from rapo_echo.policy import Policy, TokenScores
from rapo_echo.rewards import RewardSet
from rapo_echo.training.run_config import load_config
from rapo_echo.types import Generation, Scenario, msg

REPLIES = [
    "best: That sounds so hard. What happened?",
    "good: I am sorry.",
    "meh: Okay.",
    "bad: Just move on.",
]
QUALITY = {"best": 0.0, "good": -1.0, "meh": -2.0, "bad": -3.0, "fixed": 0.5, "worse": -4.0}
EMOTION_LABEL = {"best": "7", "good": "5", "meh": "4", "bad": "1", "fixed": "6", "worse": "1"}
CORRECTION = {"meh": "fixed: That must hurt. Tell me more?", "bad": "worse: Whatever."}


class ScriptedPolicyEngine(HFEngine):
    """The tiny policy's real prompts and tokenizer, with fixed replies instead of samples."""

    def generate_ids(self, prompt_ids, params):
        out = []
        for ids in prompt_ids:
            text = self.tokenizer.decode(ids)
            if "Write a better reply" in text:
                tag = re.search(r'Your reply was: "(\w+):', text).group(1)
                replies = [CORRECTION[tag]]
            else:
                replies = REPLIES[: params.n]
            gens = []
            for r in replies:
                tok = self.tokenizer(r, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
                gens.append(Generation(r, tok, [-1.0] * len(tok), list(ids), "stop"))
            out.append(gens)
        return out


def tag_of(text: str) -> str:
    return text.split(":", 1)[0].strip()


def simulator() -> ScriptedEngine:
    def reply(prompt):
        if "privately think" in prompt_text(prompt):
            return "thinking about it"
        return f"reaction to {tag_of(prompt[-1]['content'])}"

    def emotion(prompt, options):
        said = re.search(r"The supporter now says:\n<<<REPLY \w+>>>\n(.*?)\n", prompt_text(prompt)).group(1)
        chosen = EMOTION_LABEL[tag_of(said)]
        return {o: (0.0 if o == chosen else -50.0) for o in options}

    return ScriptedEngine(fn=reply, choice_fn=emotion)


def judge(text_mode_garbage: bool = False) -> ScriptedEngine:
    def best(prompt, options):
        shown = dict(re.findall(r"<<<REPLY ([A-Z]) \w+>>>\n(\w+):", prompt_text(prompt)))
        return {o: QUALITY[shown[o.strip()]] for o in options}

    def critique(prompt):
        if text_mode_garbage:
            return "I cannot decide."
        under = re.search(r"1 = best\):\n<<<REVIEWED REPLY \w+>>>\n(\w+):", prompt_text(prompt)).group(1)
        return f"critique of {under}"

    # garbage comes from a server without structured output (a constrained engine could not write it)
    return ScriptedEngine(
        fn=critique, choice_fn=None if text_mode_garbage else best, structured=not text_mode_garbage
    )


def make_rapo(
    tiny_folder, *overrides: str, judge_engine=None
) -> tuple[RAPO, Policy, ScriptedEngine, ScriptedEngine]:
    cfg = load_config(
        algo="rapo",
        overrides=[
            f"model.name={tiny_folder}",
            "rollout.group_size=4",
            "rapo.judge.shuffle=true",
            "rapo.judge.orders=random",  # one presentation per group: these tests count the judge's prompts
            *overrides,
        ],
    )
    policy = Policy(cfg.model, cfg.rollout, need_reference=False, device="cpu")
    policy.engine = ScriptedPolicyEngine(policy.lm, policy.tokenizer, name="policy")
    sim, jud = simulator(), judge_engine or judge()
    algo = RAPO(cfg, AlgoContext(policy, RewardSet([]), sim, jud))
    algo.rewriter = policy.engine  # rewrites come from the same scripted replies
    return algo, policy, sim, jud


SCENARIOS = [
    Scenario("s0", [msg("user", "I failed my exam.")], profile={"need": "be heard"}),
    Scenario("s1", [msg("user", "My dog died.")], profile={"need": "validation"}),
]


def test_rewards_advantages_and_distillation_targets(tiny_folder) -> None:
    algo, policy, sim, jud = make_rapo(tiny_folder)
    out = algo.rollout(SCENARIOS, step=0)
    samples = out.samples
    assert [s.text for s in samples[:4]] == REPLIES
    # ranks best=1..bad=4 -> linear rank rewards (4 - rank) / 3
    assert [s.info["rank"] for s in samples[:4]] == [1.0, 2.0, 3.0, 4.0]
    assert [s.reward for s in samples[:4]] == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0])
    # dr_grpo (mean-centred, RAPO default): mean 0.5
    pg = [it for it in out.items if it.kind == PG]
    assert [it.advantage for it in pg[:4]] == pytest.approx([0.5, 1 / 6, -1 / 6, -0.5])
    # reactions: emotion labels 7,5,4,1 -> (E - 4) / 3 * 10
    deltas = [s.info["reaction"]["emotion_delta"] for s in samples[:4]]
    assert deltas == pytest.approx([10.0, 10 / 3, 0.0, -10.0])
    assert samples[0].info["reaction"]["message"] == "reaction to best"
    # critiques are written for the replies self-distillation rewrites (critique_for: selected)
    assert [s.critique for s in samples[:4]] == [None, None] + [
        f"The person's reaction shows critique of {t}" for t in ("meh", "bad")
    ]
    # bottom half (ranks 3, 4) rewritten; learnt under the PLAIN prompt of the original
    sd = [it for it in out.items if it.kind == SD]
    assert len(sd) == 4
    texts = [policy.tokenizer.decode(it.completion_ids, skip_special_tokens=True) for it in sd]
    assert sorted(texts) == sorted([CORRECTION["bad"], CORRECTION["meh"]] * 2)
    for it in sd:
        assert it.prompt_ids == samples[it.sample].prompt_ids and it.weight == 1.0
    # one engine call per stage: simulator = messages, emotions, thoughts; judge = ranking, critiques
    assert [c["method"] for c in sim.calls] == ["generate", "choice_logprobs", "generate"]
    assert [c["method"] for c in jud.calls] == ["choice_logprobs", "generate"]
    assert len(jud.calls[1]["prompts"]) == 4
    assert out.metrics["sd/items"] == 4.0 and out.metrics["judge/invalid_groups"] == 0.0


def test_critiques_for_every_reply_when_asked(tiny_folder) -> None:
    algo, _, _, jud = make_rapo(tiny_folder, "rapo.judge.critique_for=all")
    samples = algo.rollout(SCENARIOS, 0).samples
    assert all(s.critique for s in samples) and len(jud.calls[1]["prompts"]) == 8


def test_emotion_mix_and_gopo(tiny_folder) -> None:
    algo, *_ = make_rapo(tiny_folder, "rapo.emotion_mix=0.5", "rapo.sd.enabled=false")
    s = algo.rollout(SCENARIOS[:1], 0).samples
    # 0.5 * rank reward + 0.5 * (delta/10 + 1)/2 : best 1.0, good 0.5*2/3 + 0.5*2/3, meh 1/6 + 1/4, bad 0
    assert [x.reward for x in s] == pytest.approx([1.0, 2 / 3, 5 / 12, 0.0])
    algo, *_ = make_rapo(tiny_folder, "rapo.rank_reward=gopo", "rapo.sd.enabled=false")
    out = algo.rollout(SCENARIOS[:1], 0)
    # GOPO: 2 - 4 (rank - 1) / 3
    assert [it.advantage for it in out.items] == pytest.approx([2.0, 2 / 3, -2 / 3, -2.0])


def test_verification_and_adv_nll_weights(tiny_folder) -> None:
    algo, _, _, jud = make_rapo(
        tiny_folder, "rapo.sd.verify=true", "rapo.sd.loss=adv_nll", "rapo.judge.tie_eps=0.001"
    )
    out = algo.rollout(SCENARIOS[:1], 0)
    corr = {tag_of(c.generation.text): c for c in out.extra["corrections"]}
    # re-ranked group of 6: fixed(0.5) 1, best 2, good 3, meh 4, bad 5, worse 6
    assert corr["fixed"].rank_delta == pytest.approx(1 - 4) and corr["fixed"].kept
    assert corr["worse"].rank_delta == pytest.approx(6 - 5) and not corr["worse"].kept
    # RLTF-SD weight: R(correction) - mean R(originals) with R = (6 - rank)/5 -> 1.0 - mean(.8,.6,.4,.2)
    sd = [it for it in out.items if it.kind == SD]
    assert len(sd) == 1 and sd[0].weight == pytest.approx(0.5)
    assert out.metrics["sd/beat_original"] == pytest.approx(0.5)
    # samples.jsonl shows each rewrite with its original: its text, whether it was distilled, its rank change
    rewrites = {tag_of(s.text): s.info["rewrite"] for s in out.samples if "rewrite" in s.info}
    assert set(rewrites) == {"meh", "bad"}
    by_text = {tag_of(r["text"]): r for r in rewrites.values()}
    assert by_text["fixed"]["kept"] and by_text["fixed"]["rank_delta"] == pytest.approx(-3)
    assert not by_text["worse"]["kept"] and by_text["worse"]["rank_delta"] == pytest.approx(1)
    assert all(isinstance(r["emotion_delta"], float) for r in rewrites.values())
    json.dumps([s.info for s in out.samples])  # what the trainer writes
    assert len(jud.calls[-1]["prompts"]) == 1 and "Reply F" in prompt_text(jud.calls[-1]["prompts"][0])


def test_invalid_group_is_masked_and_counted(tiny_folder) -> None:
    algo, *_ = make_rapo(tiny_folder, "rapo.judge.max_retries=1", judge_engine=judge(text_mode_garbage=True))
    out = algo.rollout(SCENARIOS[:1], 0)
    assert all(s.reward is None for s in out.samples)
    assert out.items == [] and out.metrics["invalid"] == 4.0 and out.metrics["judge/invalid_groups"] == 1.0


def test_selection_rules() -> None:
    ranks = [1.0, 2.5, 2.5, 4.0]
    rewards = [1.0, 0.5, 0.5, None]
    assert select_for_distillation(ranks, rewards, "bottom_half", 0.5) == []  # only rank 4 is below; invalid
    assert select_for_distillation([1.0, 2.0, 3.0, 4.0], [1, 2 / 3, 1 / 3, 0], "bottom_half", 0) == [2, 3]
    assert select_for_distillation(ranks, rewards, "all_but_best", 0.5) == [1, 2]
    assert select_for_distillation(ranks, [0.9, 0.4, 0.6, 0.1], "below_threshold", 0.5) == [1, 3]


def test_teacher_prompt_carries_reply_reaction_and_critique() -> None:
    from rapo_echo.llm.reaction import Reaction

    conv = [msg("system", "S"), msg("user", "I lost my job.")]
    out = teacher_prompt(
        conv, "Cheer up!", Reaction("That doesn't help.", -5.0, "ugh", True), "Too dismissive."
    )
    assert out[:2] == conv and out[2] == msg("assistant", "Cheer up!")
    text = out[3]["content"]
    assert "That doesn't help." in text and "worse" in text and "Too dismissive." in text
    assert '"I lost my job."' in text


def micro(logp_rows, kinds, adv, weights) -> MicroBatch:
    n = max(len(r) for r in logp_rows)
    mask = torch.tensor([[1.0] * len(r) + [0.0] * (n - len(r)) for r in logp_rows])
    items = [SimpleNamespace(kind=k) for k in kinds]
    return MicroBatch(
        items,
        SimpleNamespace(n_targets=n),
        mask,
        torch.zeros_like(mask),
        None,
        torch.tensor(adv),
        torch.tensor(weights),
        kinds,
    )


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # nll: mean of -log p over the 3 SD tokens: -(ln .5 + ln .25 + ln .5)/3 = (0.6931 + 1.3863 + 0.6931)/3
        ("nll", (0.693147 + 1.386294 + 0.693147) / 3),
        # adv_nll with weight 2 on the SD row: 2 * the above
        ("adv_nll", 2 * (0.693147 + 1.386294 + 0.693147) / 3),
        # in_group: -A p/(p+0.1) with A = 0.5: -(0.5*(.5/.6) + 0.5*(.25/.35) + 0.5*(.5/.6))/3
        ("in_group", -(0.5 * 0.5 / 0.6 + 0.5 * 0.25 / 0.35 + 0.5 * 0.5 / 0.6) / 3),
    ],
)
def test_sd_losses_by_hand(tiny_folder, mode: str, expected: float) -> None:
    algo, *_ = make_rapo(tiny_folder, f"rapo.sd.loss={mode}", "rapo.sd.coef=1.0")
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.5], [0.9, 0.9, 0.9]]))
    mb = micro([[0, 0, 0], [0, 0, 0]], [SD, PG], [0.5, 0.0], [2.0, 1.0])
    totals = {SD: {"tokens": 3.0, "seqs": 1.0}, PG: {"tokens": 3.0, "seqs": 1.0}}
    loss, metrics = algo.loss(mb, TokenScores(logp, torch.zeros_like(logp)), totals)
    assert metrics["loss/sd"].item() == pytest.approx(expected, abs=1e-5)
    # the PG row has advantage 0 and ratio 1: its loss is 0, so the total is the SD term
    assert loss.item() == pytest.approx(expected, abs=1e-5)
    assert math.isfinite(loss.item())


@pytest.mark.integration
def test_rapo_step_on_the_embedded_model(tmp_path) -> None:
    """One RAPO training step with policy, simulator and judge all the real embedded model (LoRA;
    simulator and judge see the base with the adapter off)."""
    import json

    from rapo_echo.training.run import Run

    run = tmp_path / "run"
    cfg = load_config(
        algo="rapo",
        overrides=[
            f"output={run}",
            "rollout.batch_size=1",
            "rollout.group_size=3",
            "rollout.max_new_tokens=12",
            "rapo.simulator.max_new_tokens=12",
            "rapo.simulator.thought_tokens=8",
            "rapo.judge.critique_tokens=12",
            "rapo.sd.max_new_tokens=12",
            "rapo.sd.select=all_but_best",
            "train.max_steps=1",
            "logging.progress=false",
            "logging.tensorboard=false",
        ],
    )
    Run(cfg).train()
    m = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert m["judge/invalid_groups"] == 0.0 and m["items"] >= 3
    for key in ("loss/grpo", "time/simulate", "time/judge", "time/distill", "sd/corrections"):
        assert key in m, key
    rows = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["info"]["reaction"]["message"] for r in rows)
    assert any(r["critique"] for r in rows)
    assert (run / "final" / "config.json").is_file()
