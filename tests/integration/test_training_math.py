"""Issue 9, the training math: old log-probs in bf16, DDP collectives, token_kl micro-batches and
teacher, GSPO aggregation, gradient checkpointing, dropout, scorer logit transforms, RAPO details."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rapo_echo.algorithms.base import PG
from rapo_echo.training.run import Run
from rapo_echo.training.run_config import load_config
from tests.conftest import model_dims
from tests.helpers.runs import QUIET, SMALL, metrics, run_config

# ---------------------------------------------------------------------------- 9.3 bf16 old log-probs


@pytest.mark.integration
def test_bf16_step_one_has_ratio_one_and_reports_the_sampler_gap(tmp_path: Path) -> None:
    """In bf16 the cached decode and the training forward disagree (the sampler gap is > 0), yet the
    first update's ratio is exactly 1: GSPO's 3e-4 sequence clip used to drop every sequence."""
    run = tmp_path / "run"
    cfg = load_config(
        overrides=[
            f"output={run}",
            "model.dtype=bfloat16",
            "model.lora.enabled=true",  # (a cheaper backward; the adapter starts at 0, so this is the base)
            "model.lora.r=4",
            "model.lora.target_modules=[q_proj, v_proj]",
            "rollout.batch_size=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=8",
            "loss.policy_loss=gspo",
            "loss.beta=0",
            "rewards=[{name: length, args: {target: 3}}]",
            "train.max_steps=1",
            "train.seed=1",
            *QUIET,
        ]
    )
    Run(cfg).train()
    import yaml

    assert yaml.safe_load((run / "config.yaml").read_text())["loss"]["agg"] == "seq-mean-token-mean"  # 9.5
    m = metrics(run)[0]
    assert m["adv/max"] > 0  # some sequences carry an advantage, so a clipped one would count
    assert m["clip_frac"] == 0.0
    assert m["train/sampler_logprob_gap/max"] > 1e-3  # bf16 decode != training forward
    assert 0 < m["train/sampler_logprob_gap/mean"] <= m["train/sampler_logprob_gap/max"]


def _tiny_trainer(tiny_folder: Path, run: Path, *extra: str) -> Run:
    return Run(run_config(tiny_folder, run, *SMALL, "rollout.max_new_tokens=5", *extra))


@pytest.mark.parametrize(("dtype", "recomputed"), [("bfloat16", True), ("float32", False)])
def test_old_logprobs_with_several_mini_batches(tmp_path: Path, tiny_folder: Path, dtype, recomputed) -> None:
    """With two mini-batches the first update's forward cannot give the old log-probs: fp32 uses the
    sampler's (they match), bf16 recomputes them with the scorer and measures the gap there."""
    from rapo_echo.training.learner import LogprobGap

    trainer = _tiny_trainer(tiny_folder, tmp_path / "run", f"model.dtype={dtype}", "train.mini_batches=2")
    rollout = trainer.algorithm.rollout(trainer._batch(), 0)
    items = [it for it in rollout.items if it.kind == PG]
    gap = LogprobGap()
    assert trainer.learner.fill_old(items, gap) is recomputed
    for it in items:
        assert it.old_logprobs is not None and len(it.old_logprobs) == len(it.completion_ids)
        assert (it.old_logprobs is it.sampler_logprobs) is not recomputed
    assert bool(gap.metrics()) is recomputed


# ---------------------------------------------------------------------------- 9.4 DDP collectives


@pytest.mark.slow
def test_ddp_ranks_with_nothing_to_train_and_a_nonfinite_loss_do_not_hang(
    tmp_path: Path, tiny_folder: Path
) -> None:
    """2 processes (gloo): rank 1's rewards are all None, so it has nothing to train on in any step;
    there are more mini-batches than items (one is empty on both ranks); in step 2 rank 0's loss is
    non-finite. Every rank must still join every collective: the run finishes, step 2 is skipped on
    both ranks, and the replicas stay identical (checked at every checkpoint). The probe also checks that
    each rank's process group is torn down once the run returns, its gloo threads included (a module that
    captured the group at import kept them running into the interpreter's exit: a rank aborted now and
    then, once in CI)."""
    from tests.helpers.launch import run_processes, torchrun

    run = tmp_path / "run"
    probe = Path(__file__).resolve().parents[1] / "helpers" / "ddp_fault_probe.py"
    cmd = [*torchrun(2), str(probe), "train"]
    cmd += ["--model", str(tiny_folder), "--output", str(run), "--max-steps", "3"]
    for s in (
        "rollout.batch_size=1",
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "rewards=[{name: 'tests.helpers.plugin_rewards:length_or_none_on_rank_one'}]",
        "train.mini_batches=3",
        "train.save_every=1",
        *QUIET,
    ):
        cmd += ["--set", s]
    res = run_processes(cmd, env={"PROBE_NAN_STEP": "2"}, timeout=240)  # a hang: a rank skipped a collective
    assert res.returncode == 0, res.stderr[-3000:]
    m = metrics(run)
    assert [x["world"] for x in m] == [2.0, 2.0, 2.0]
    assert [x["invalid"] for x in m] == [2.0, 2.0, 2.0]  # rank 1's two replies each step
    assert [x["items"] for x in m] == [2.0, 2.0, 2.0]  # rank 0's two replies only
    assert [x["nonfinite_skipped"] for x in m] == [0.0, 2.0, 0.0]  # both non-empty mini-batches
    assert [x["updates"] for x in m] == [2.0, 0.0, 2.0]  # the mini-batch empty everywhere is skipped
    assert (run / "final" / "config.json").is_file()


def test_training_tears_down_the_process_group_even_when_it_fails(tmp_path: Path) -> None:
    """A rank that leaves its process group alive can abort at interpreter exit ("terminate called
    without an active exception", seen once in the test above after the run had finished): ``run_training``
    ends the group on its way out, a run that fails to start too (the data file is missing)."""
    import torch.distributed as dist

    from rapo_echo.errors import RapoEchoError
    from rapo_echo.training.run import run_training

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        cfg = load_config(
            algo="grpo",
            overrides=[f"output={tmp_path / 'run'}", f"data.path={tmp_path / 'no.jsonl'}", *QUIET],
        )
        with pytest.raises(RapoEchoError, match="no.jsonl"):
            run_training(cfg)
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# ---------------------------------------------------------------------------- 9.2 token_kl micro-batches


def _scripted_rapo_trainer(tiny_folder: Path, run: Path, *extra: str) -> Run:
    """A RAPO trainer on the tiny model whose replies, reactions and rankings are the scripted ones
    of tests/unit/algorithms/test_rapo.py (known ranks: two replies per group are distilled)."""
    from rapo_echo.algorithms.base import AlgoContext
    from rapo_echo.algorithms.rapo import RAPO
    from tests.unit.algorithms.test_rapo import SCENARIOS, ScriptedPolicyEngine, judge, simulator

    path = run.parent / "scenarios.json"
    path.write_text(
        json.dumps([{"id": s.id, "messages": s.messages, "profile": s.profile} for s in SCENARIOS])
    )
    cfg = load_config(
        algo="rapo",
        overrides=[
            f"model.name={tiny_folder}",
            f"output={run}",
            f"data.path={path}",
            "data.shuffle=false",
            "rollout.batch_size=2",
            "rollout.group_size=4",
            "simulator.engine=scripted",
            "judge.engine=scripted",
            "train.max_steps=1",
            *QUIET,
            *extra,
        ],
    )
    trainer = Run(cfg)
    policy = trainer.policy
    policy.engine = ScriptedPolicyEngine(policy.lm, policy.tokenizer, name="policy")
    trainer.algorithm = RAPO(cfg, AlgoContext(policy, trainer.rewards, simulator(), judge()))
    trainer.algorithm.rewriter = policy.engine
    trainer.open_logs()
    return trainer


def test_token_kl_runs_with_any_micro_batch_size(tmp_path: Path, tiny_folder: Path) -> None:
    """A micro-batch without distillation rows used to raise ("token_kl distillation needs the
    student's log-probs at the teacher's top-k ids"); the accumulated loss and gradient are the same
    whatever the micro-batch size."""
    trainer = _scripted_rapo_trainer(
        tiny_folder, tmp_path / "run", "rapo.sd.loss=token_kl", "rapo.sd.top_k_logits=8"
    )
    rollout = trainer.algorithm.rollout(trainer._batch(), 0)
    items = rollout.items
    assert rollout.metrics["sd/items"] == 4.0 and len(items) == 12
    seen = {}
    for size in (1, 4, 8):
        trainer.cfg.train.micro_batch_size = size
        micro = list(trainer.learner.scoring_batches(items))
        clock = {"policy_forward": 0.0, "backward": 0.0}
        finite, m = trainer.learner.accumulate(
            micro, trainer.learner.global_totals(items), clock, trainer.algorithm.loss
        )
        grad = torch.cat([p.grad.flatten() for p in trainer.policy.trainable_parameters()])
        trainer.learner.optimizer.zero_grad(set_to_none=True)
        assert finite
        seen[size] = (m["loss/total"], m["loss/sd"], grad)
    for size in (4, 8):
        assert seen[size][:2] == pytest.approx(seen[1][:2], rel=1e-4, abs=1e-6)
        assert torch.allclose(seen[size][2], seen[1][2], rtol=1e-3, atol=1e-6)
    assert seen[1][1] > 0


# ---------------------------------------------------------------------------- 9.1 token_kl teacher


def _teacher_prompts(trainer: Run) -> tuple[list, list[str]]:
    """Run a rollout and return its samples and the decoded teacher contexts token_kl scored with."""
    policy = trainer.policy
    seen: list[list[int]] = []
    real = policy.batch

    def batch(prompts, completions):
        seen.extend(list(p) for p in prompts)
        return real(prompts, completions)

    policy.batch = batch  # type: ignore[method-assign,assignment]  # a recording seam
    rollout = trainer.algorithm.rollout(trainer._batch(), 0)
    policy.batch = real  # type: ignore[method-assign]  # the seam undone
    return rollout.samples, [policy.tokenizer.decode(p) for p in seen]


@pytest.mark.parametrize("demo", [False, True])
def test_token_kl_teacher_sees_feedback_never_the_failed_reply(
    tmp_path: Path, tiny_folder: Path, demo
) -> None:
    from tests.unit.algorithms.test_rapo import REPLIES

    trainer = _scripted_rapo_trainer(
        tiny_folder,
        tmp_path / "run",
        "rapo.sd.loss=token_kl",
        "rapo.sd.top_k_logits=4",
        f"rapo.sd.teacher_demo={str(demo).lower()}",
    )
    _, contexts = _teacher_prompts(trainer)
    assert len(contexts) == 4  # the two bottom-ranked replies of each of the two groups
    failed = {"meh": REPLIES[2].split(": ", 1)[1], "bad": REPLIES[3].split(": ", 1)[1]}
    for text in contexts:
        tag = "meh" if "critique of meh" in text else "bad"
        assert f"reaction to {tag}" in text and f"critique of {tag}" in text  # the feedback
        assert failed[tag] not in text and f"{tag}:" not in text  # never the reply it is about
        assert (REPLIES[0] in text) is demo  # the best-ranked sibling, behind the switch


@pytest.mark.integration
def test_token_kl_teacher_does_not_inflate_the_copied_reply(smol_engine) -> None:
    """On the embedded model: the failed reply's mean token log-prob under the teacher's context stays
    near its value under the student's (plain) context. Control: with the reply quoted in the context
    (the rewriting prompt, as token_kl used to score it) the model mostly copies it (about +3.4 nats)."""
    import statistics

    from rapo_echo.algorithms.rapo import feedback_prompt, teacher_prompt
    from rapo_echo.config import DEFAULT_SYSTEM_PROMPT
    from rapo_echo.llm.reaction import Reaction
    from rapo_echo.prompting import policy_conversation
    from rapo_echo.types import Scenario, msg

    scenario = Scenario("x", [msg("user", "I failed my exam and my parents are furious with me.")])
    conv = policy_conversation(scenario, DEFAULT_SYSTEM_PROMPT)
    reply = "Just study harder next time, it is not a big deal."
    reaction = Reaction("That makes me feel worse, you don't get it at all.", -6.0, "", True)
    critique = "The reply dismisses the person's feelings; acknowledge how upset they are before any advice."

    def mean_logp(context) -> float:
        return statistics.fmean(smol_engine.score([context], [reply])[0].logprobs)

    student = mean_logp(conv)
    teacher = mean_logp(feedback_prompt(conv, reply, reaction, critique))
    quoted = mean_logp(teacher_prompt(conv, reply, reaction, critique))
    assert quoted - student > 1.0  # the control: a context holding the reply is copied from
    assert teacher - student < 0.5


# ---------------------------------------------------------------------------- 9.5 GSPO aggregation


def test_gspo_weighs_sequences_equally_by_default() -> None:
    """``loss.agg: auto`` resolves at load time: gspo -> seq-mean-token-mean, clip -> token-mean; an
    explicit choice is kept. By hand: a 10-token reply with A = -1 and a 2-token one with A = +1,
    ratio 1, so each token's loss is -A: seq-mean-token-mean gives (1 + -1) / 2 = 0, where token-mean
    would give (10 * 1 + 2 * -1) / 12 = 2/3 (the long reply weighing 5x)."""
    from rapo_echo.algorithms.base import MicroBatch
    from rapo_echo.algorithms.grpo import pg_loss

    assert load_config(overrides=["loss.policy_loss=gspo"]).loss.agg == "seq-mean-token-mean"
    assert load_config(algo="rapo", overrides=["loss.policy_loss=gspo"]).loss.agg == "seq-mean-token-mean"
    assert load_config(overrides=["loss.policy_loss=clip"]).loss.agg == "token-mean"
    assert load_config(overrides=["loss.policy_loss=gspo", "loss.agg=token-mean"]).loss.agg == "token-mean"
    assert (
        load_config("configs/grpo.yaml", overrides=["loss.policy_loss=gspo"]).loss.agg
        == "seq-mean-token-mean"
    )

    mask = torch.zeros(2, 10)
    mask[0, :10] = 1
    mask[1, :2] = 1
    logp = torch.full((2, 10), -1.0, requires_grad=True)
    mb = MicroBatch(
        [], None, mask, logp.detach().clone(), None, torch.tensor([-1.0, 1.0]), torch.ones(2), [PG, PG]
    )
    totals = {PG: {"tokens": 12.0, "seqs": 2.0}}
    for agg, expected in (("auto", 0.0), ("token-mean", 2 / 3)):
        cfg = load_config(overrides=["loss.policy_loss=gspo", f"loss.agg={agg}", "loss.beta=0"])
        loss, _ = pg_loss(cfg, mb, logp, torch.zeros_like(logp), totals)
        assert loss.item() == pytest.approx(expected, abs=1e-6)


# ---------------------------------------------------------------------------- 9.6 gradient checkpointing


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_recomputes_in_the_training_forward(
    tmp_path: Path, tiny_folder: Path, lora: bool
) -> None:
    """With ``model.gradient_checkpointing`` each decoder layer runs twice per training micro-batch
    (forward, then recomputed in backward), under full fine-tuning as under LoRA; it used to be a
    no-op under full fine-tuning (the model was never in train mode). The model rests in eval mode."""
    trainer = _tiny_trainer(
        tiny_folder,
        tmp_path / "run",
        "model.gradient_checkpointing=true",
        f"model.lora.enabled={str(lora).lower()}",
    )
    items = trainer.algorithm.rollout(trainer._batch(), 0).items
    calls: list[bool] = []
    mlp = trainer.policy.lm.get_decoder().layers[0].mlp  # inside the checkpointed layer forward
    forward = mlp.forward

    def counted(*args, **kwargs):  # (module hooks do not fire in the recompute)
        calls.append(True)
        return forward(*args, **kwargs)

    mlp.forward = counted
    micro = list(trainer.learner.scoring_batches(items))
    clock = {"policy_forward": 0.0, "backward": 0.0}
    finite, _ = trainer.learner.accumulate(
        micro, trainer.learner.global_totals(items), clock, trainer.algorithm.loss
    )
    del mlp.forward
    assert finite and len(calls) == 2 * len(micro)
    assert not any(m.training for m in trainer.policy.lm.modules())


# ---------------------------------------------------------------------------- 9.7 one dropout rule


def test_eval_mode_restores_each_modules_own_mode(smol_tokenizer) -> None:
    from rapo_echo.engines.hf import _EvalMode
    from tests.conftest import make_tiny_model

    model = make_tiny_model(smol_tokenizer).train()
    model.model.layers[1].eval()
    with _EvalMode(model):
        assert not any(m.training for m in model.modules())
    assert model.training and model.model.layers[0].training
    assert not any(m.training for m in model.model.layers[1].modules())


def _policy(folder: Path, *overrides: str):
    from rapo_echo.policy import Policy

    cfg = load_config(overrides=[f"model.name={folder}", *overrides])
    return Policy(cfg.model, cfg.rollout, need_reference=False, device="cpu")


def test_dropout_only_in_the_training_forward(tmp_path: Path, smol_tokenizer) -> None:
    """LoRA dropout 0.5 (adapter made non-zero): scoring forwards outside the training forward are
    dropout-free (they used to run in train mode and were random), the training forward has it; the
    base model's own attention dropout is off even in train mode (full fine-tuning)."""
    from rapo_echo.policy import collate
    from tests.conftest import make_tiny_model

    model = make_tiny_model(smol_tokenizer)
    model.config.attention_dropout = 0.5
    folder = tmp_path / "tiny-dropout"
    model.save_pretrained(folder)
    smol_tokenizer.save_pretrained(folder)

    def logp(policy) -> torch.Tensor:
        batch = collate([[5, 6, 7, 8]], [[9, 10, 11, 12]], policy.pad_id)
        with torch.no_grad():
            return policy.scorer(batch.to("cpu"))[0]

    lora = _policy(folder, "model.lora.enabled=true", "model.lora.dropout=0.5", "model.lora.r=4")
    torch.manual_seed(0)
    for name, p in lora.lm.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    assert torch.equal(logp(lora), logp(lora))  # scoring: no dropout
    with lora.training_mode():
        assert not torch.equal(logp(lora), logp(lora))  # the training forward: LoRA dropout
    assert torch.equal(logp(lora), logp(lora))
    full = _policy(folder)
    with full.training_mode():
        assert torch.equal(logp(full), logp(full))  # train mode, yet the model's own dropout is off


# ---------------------------------------------------------------------------- 9.8 logit transforms


def _tiny_lm(kind: str):
    """A tiny random causal LM of the given family, with a logit transform that shows at its scale."""
    import transformers as tf

    torch.manual_seed(0)
    common = dict(vocab_size=512, max_position_embeddings=64, **model_dims(hidden=32, layers=1))
    if kind == "granite":
        model = tf.GraniteForCausalLM(tf.GraniteConfig(**common, logits_scaling=4.0))
    elif kind == "gemma2":
        model = tf.Gemma2ForCausalLM(tf.Gemma2Config(**common, head_dim=8, final_logit_softcapping=0.1))
    elif kind == "cohere":
        model = tf.CohereForCausalLM(tf.CohereConfig(**common, logit_scale=0.25))
    else:  # phi: the LM head has a bias
        model = tf.PhiForCausalLM(tf.PhiConfig(**common))
        torch.nn.init.normal_(model.lm_head.bias, std=0.5)
    return model.eval()


@pytest.mark.parametrize("kind", ["granite", "gemma2", "cohere", "phi"])
def test_scorer_applies_the_models_own_logit_transform(kind: str) -> None:
    """Log-probs of the scorer (both layouts), its top-k and its gathered ids against log_softmax of
    the model's own forward logits (Granite logits_scaling, Gemma-2 final softcap, Cohere logit_scale,
    a head bias). The scorer used to compute plain ``h @ W^T`` on its top-k and gather paths, and
    skip the scaling everywhere."""
    from rapo_echo.policy import TokenScorer, collate

    model = _tiny_lm(kind)
    scorer = TokenScorer(model)
    assert scorer.check([5, 6, 7, 8, 9]) < 1e-4
    prompt, completion = [5, 6, 7, 8], [9, 10, 11]
    with torch.no_grad():
        own = torch.log_softmax(model(input_ids=torch.tensor([prompt + completion])).logits.float(), -1)
    own = own[0, len(prompt) - 1 : -1]  # positions predicting the completion
    expected = own.gather(-1, torch.tensor(completion)[:, None])[:, 0]
    assert (expected - torch.log_softmax(torch.zeros(512), -1)[0]).abs().max() > 1e-3  # not uniform
    for shared in (True, False):
        batch = collate([prompt], [completion], 0, shared=shared)
        with torch.no_grad():
            got = scorer(batch.to("cpu"), gather_ids=torch.tensor([[[1, 2, 3]] * 3]))
        assert torch.allclose(got.logp[0], expected, atol=1e-5), (shared, got.logp[0], expected)
        assert torch.allclose(got.gathered[0], own[:, 1:4], atol=1e-5)
    ids, vals = scorer.topk(collate([prompt], [completion], 0), 5)
    top = own.topk(5, -1)
    assert torch.equal(ids[0], top.indices) and torch.allclose(vals[0], top.values, atol=1e-5)


def test_scorer_refuses_an_unknown_logit_transform(smol_tokenizer) -> None:
    from transformers import LlamaForCausalLM

    from rapo_echo.logprobs import UnsupportedLogitsError
    from rapo_echo.policy import TokenScorer
    from tests.conftest import make_tiny_model

    class Tripled(LlamaForCausalLM):  # a model family with a logit step the scorer does not know
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 3
            return out

    base = make_tiny_model(smol_tokenizer)
    model = Tripled(base.config).eval()
    model.load_state_dict(base.state_dict())
    assert TokenScorer(base).check([5, 6, 7]) < 1e-4
    with pytest.raises(UnsupportedLogitsError, match="'llama'.*does not\\s+reproduce"):
        TokenScorer(model).check([5, 6, 7])


# ---------------------------------------------------------------------------- 9.9 smaller items


def test_a_reply_whose_reaction_failed_is_masked_not_ranked(tiny_folder: Path) -> None:
    """The simulator fails on the "good" reply: it is not shown to the judge (which ranks the other
    three), its reward is None (masked) and it is counted; the others get the ranks of three."""
    from rapo_echo.engines.scripted import prompt_text
    from tests.unit.algorithms.test_rapo import SCENARIOS, make_rapo

    algo, _, sim, jud = make_rapo(tiny_folder, "rapo.simulator.max_retries=0", "rapo.sd.enabled=false")
    base = sim.fn
    sim.fn = lambda prompt: "" if base(prompt) == "reaction to good" else base(prompt)  # type: ignore[misc]  # a scripted reply function swapped in
    sim.structured = False  # an empty answer is what a server without structured output can send
    out = algo.rollout(SCENARIOS[:1], 0)
    s = out.samples
    assert [x.info["reaction"]["valid"] for x in s] == [True, False, True, True]
    assert [x.reward for x in s] == [1.0, None, 0.5, 0.0]  # best, (failed), meh, bad ranked 1..3
    assert [x.info["rank"] for x in s] == [1.0, None, 2.0, 3.0]
    assert out.metrics["invalid"] == 1.0 and out.metrics["sim/invalid"] == 1.0
    assert [it.advantage for it in out.items] == pytest.approx([0.5, 0.0, -0.5])  # dr_grpo over 3
    shown = prompt_text(jud.calls[0]["prompts"][0])
    assert "good:" not in shown and "(no reaction)" not in shown


def test_adv_nll_with_a_negative_weight_is_bounded(tiny_folder: Path) -> None:
    """Weight -2 on an SD row with token probabilities 0.5 and 0.001: -w * max(log p, -5) per token,
    (2 ln 0.5 + 2 * -5) / 2 = -5.6931 (unclipped it was (2 ln 0.5 + 2 ln 0.001) / 2 = -7.6009 and
    kept falling as p -> 0); the token already below the floor gets no gradient."""
    from rapo_echo.algorithms.rapo import SD
    from rapo_echo.policy import TokenScores
    from tests.unit.algorithms.test_rapo import make_rapo, micro

    algo, *_ = make_rapo(tiny_folder, "rapo.sd.loss=adv_nll", "rapo.sd.coef=1.0")
    logp = torch.log(torch.tensor([[0.5, 0.001], [0.9, 0.9]])).requires_grad_(True)
    mb = micro([[0, 0], [0, 0]], [SD, PG], [0.0, 0.0], [-2.0, 1.0])
    totals = {SD: {"tokens": 2.0, "seqs": 1.0}, PG: {"tokens": 2.0, "seqs": 1.0}}
    loss, metrics = algo.loss(mb, TokenScores(logp, torch.zeros_like(logp)), totals)
    assert metrics["loss/sd"].item() == pytest.approx((2 * math.log(0.5) + 2 * -5.0) / 2, abs=1e-5)
    loss.backward()
    assert logp.grad[0, 0].item() == pytest.approx(2 / 2, abs=1e-6) and logp.grad[0, 1].item() == 0.0


def test_sd_advantages_use_the_total_reward(tiny_folder: Path) -> None:
    """adv_nll's weight is R(correction) - mean R(originals) with the same total reward as the
    policy-gradient samples: rank reward mixed with the emotion change, plus the reward plugins.
    Re-ranked group: fixed 1, best 2, good 3, meh 4, bad 5 (worse 6, not kept): linear (6 - rank)/5;
    emotion labels 6, 7, 5, 4, 1 -> (label - 1) / 6; mix 0.5; plugin 0.1 x words (7, 7, 4, 2, 4):
      fixed 0.5 * 1.0 + 0.5 * 5/6 + 0.7 = 1.616667
      originals 0.5 * (0.8, 0.6, 0.4, 0.2) + 0.5 * (1, 2/3, 1/2, 0) + (0.7, 0.4, 0.2, 0.4), mean 0.945833
    weight 0.670833 (with the linear rank reward alone it was 0.5)."""
    from rapo_echo.algorithms.base import AlgoContext
    from rapo_echo.algorithms.rapo import RAPO, SD
    from rapo_echo.policy import Policy
    from rapo_echo.rewards import RewardContext, RewardSet
    from tests.unit.algorithms.test_rapo import SCENARIOS, ScriptedPolicyEngine, judge, simulator

    cfg = load_config(
        algo="rapo",
        overrides=[
            f"model.name={tiny_folder}",
            "rollout.group_size=4",
            "rapo.sd.verify=true",
            "rapo.sd.loss=adv_nll",
            "rapo.judge.tie_eps=0.001",
            "rapo.emotion_mix=0.5",
            "rewards=[{name: 'tests.helpers.plugin_rewards:words', weight: 0.1}]",
        ],
    )
    policy = Policy(cfg.model, cfg.rollout, need_reference=False, device="cpu")
    policy.engine = ScriptedPolicyEngine(policy.lm, policy.tokenizer, name="policy")
    rewards = RewardSet.from_specs(cfg.rewards, RewardContext())
    algo = RAPO(cfg, AlgoContext(policy, rewards, simulator(), judge()))
    algo.rewriter = policy.engine
    out = algo.rollout(SCENARIOS[:1], 0)
    sd = [it for it in out.items if it.kind == SD]
    assert len(sd) == 1 and sd[0].weight == pytest.approx(0.670833, abs=1e-5)


@pytest.mark.parametrize("loss", ["nll", "token_kl"])
def test_sd_losses_distil_the_temperature_one_distribution(tmp_path: Path, tiny_folder: Path, loss) -> None:
    """With rollout.temperature 0.5 the PG rows are scored at 0.5 (the sampling distribution) and the
    SD rows at 1: nll is the mean -log p of the rewrites under the model's own distribution; the
    token_kl teacher's top-k are temperature-1 log-probs (they used to be the 0.5-scaled ones)."""
    from rapo_echo.algorithms.rapo import SD

    trainer = _scripted_rapo_trainer(
        tiny_folder,
        tmp_path / "run",
        f"rapo.sd.loss={loss}",
        "rapo.sd.top_k_logits=4",
        "rollout.temperature=0.5",
    )
    policy = trainer.policy
    teacher_batches, real = [], policy.batch
    policy.batch = lambda p, c: teacher_batches.append(real(p, c)) or teacher_batches[-1]  # type: ignore[method-assign,assignment,misc,func-returns-value]  # a recording seam
    items = trainer.algorithm.rollout(trainer._batch(), 0).items
    policy.batch = real  # type: ignore[method-assign]  # the seam undone
    sd = [it for it in items if it.kind == SD]
    if loss == "token_kl":
        (batch,) = teacher_batches
        _, logp = policy.scorer.topk(batch, 4, temperature=1.0)
        for row, it in enumerate(sd):
            assert torch.allclose(it.fields["teacher_logp"], logp[row, : len(it.completion_ids)])
        return
    batch = policy.batch([it.prompt_ids for it in sd], [it.completion_ids for it in sd])
    with torch.no_grad():
        plain = policy.scorer(batch.to("cpu"), 1.0)[0]
    micro = list(trainer.learner.scoring_batches(items))
    clock = {"policy_forward": 0.0, "backward": 0.0}
    _, m = trainer.learner.accumulate(
        micro, trainer.learner.global_totals(items), clock, trainer.algorithm.loss
    )
    expected = -(plain * batch.target_mask).sum() / batch.target_mask.sum()
    assert m["loss/sd"] == pytest.approx(float(expected), rel=1e-5)
