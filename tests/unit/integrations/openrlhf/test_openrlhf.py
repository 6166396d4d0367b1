"""OpenRLHF backend: chat-template markers, the RLVER agent episode (the simulated user itself is
tested in test_sage.py), the exported reward / agent files, and the launch command.

OpenRLHF itself needs CUDA to install fully. Where ``openrlhf.utils.agent`` is importable (``pip install
--no-deps openrlhf==0.11.2`` plus ``aiohttp`` and ``pylatexenc``), the exported files are also run
through OpenRLHF's own executors and our launch command through its own argument parser; otherwise
those tests are skipped with the reason.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rapo_echo.chat_template import ChatMarkers
from rapo_echo.data.sage_profiles import SageProfile
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.errors import ConfigError, DataError, RapoEchoError
from rapo_echo.training.run_config import load_config
from rapo_echo.types import msg
from tests.helpers.answers import sage_analysis, sage_reply

ROOT = Path(__file__).resolve().parents[4]
HAS_OPENRLHF = importlib.util.find_spec("openrlhf") is not None
PLUGIN = "tests.helpers.plugin_estimators:minmax_advantages"  # a third-party advantage estimator
needs_openrlhf = pytest.mark.skipif(
    not HAS_OPENRLHF,
    reason="openrlhf is not installed (to run: pip install --no-deps openrlhf==0.11.2 aiohttp pylatexenc)",
)


# A scripted simulator: the analysis answer depends on the current emotion, the reply on the tier.
def _rule_reply(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")  # a rule's reply is a format string


SIM_SCRIPT = {
    "rules": [
        [r"emotion right now: 40\n", _rule_reply(sage_analysis(10, "a bit better"))],
        [r"emotion right now: 50\n", _rule_reply(sage_analysis(10))],
        [r"emotion right now: 60\n", _rule_reply(sage_analysis(10))],
        [r"now it is A:", _rule_reply(sage_reply("Thanks, that helped. Bye!"))],
        [r"now it is [BC]:", _rule_reply(sage_reply("It still hurts, honestly."))],
    ]
}
JUDGE_SCRIPT = {
    # the reply sits in a fenced block: "<<<REPLY marker>>>" on its own line, then the text
    "rules": [
        [r"reply to rate:\s*<<<REPLY \w+>>>\s*I'm so sorry", '{{"score": 5}}'],
        [r"reply to rate:\s*<<<REPLY \w+>>>\s*ok", '{{"score": 2}}'],
    ],
    "default": "I cannot decide.",
    "structured": False,  # a server without structured output: "I cannot decide." is retried, then invalid
}
RLVER_ROW = {
    "id": "p1",
    "player": "* Name: Lina\n* Age: 29\n* Speaking style: polite, reserved",
    "scene": "Her dog died last week; her partner says it was only a dog.",
    "task": "be deeply empathised with, not merely comforted",
    "first_talk": "My dog died and nobody gets why I'm this upset.",
}


@pytest.fixture(scope="module")
def markers(smol_tokenizer) -> ChatMarkers:
    return ChatMarkers.from_tokenizer(smol_tokenizer)


def render(tok, conv, gen=True) -> str:
    return tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def run_config(tmp_path: Path, smol_path: str, **extra):
    flags = {
        "model.name": smol_path,
        "rewards": [
            {"name": "judge", "weight": 1.0, "args": {"use_logprobs": "never"}},
            {"name": "length", "weight": 0.5},
        ],
        "judge.engine": "scripted",
        "judge.script": JUDGE_SCRIPT,
        "simulator.engine": "scripted",
        "simulator.script": SIM_SCRIPT,
        "output": str(tmp_path / "run"),
        "rollout.batch_size": 8,
        "train.micro_batch_size": 2,
        **extra,
    }
    return load_config(None, flags=flags)


# ---------------------------------------------------------------------------- chat markers


def test_markers_of_the_embedded_chatml_template(markers, smol_tokenizer):
    assert markers.generation == "<|im_start|>assistant\n"
    assert markers.user_prefix == "<|im_start|>user\n" and markers.suffix == "<|im_end|>\n"
    assert markers.stop_texts == ("<|im_end|>",)
    conv = [
        msg("system", "Be kind."),
        msg("user", "I failed."),
        msg("assistant", "Oh no."),
        msg("user", "Yes."),
    ]
    assert markers.parse(render(smol_tokenizer, conv)) == conv
    # a conversation without a system message: the template's default system prompt is not returned
    assert markers.parse(render(smol_tokenizer, conv[1:2])) == conv[1:2]


def test_split_query_and_clean_reply(markers, smol_tokenizer):
    prompt = render(smol_tokenizer, [msg("user", "I lost my job.")])
    query = prompt + "That sounds hard.<|im_end|>"
    assert markers.split_query(query, prompt) == (prompt, "That sounds hard.<|im_end|>")
    # a reply that writes an assistant marker itself cannot move the split when the prompt is known
    tricky = prompt + "Hi<|im_start|>assistant\nagain"
    assert markers.split_query(tricky, prompt + "x")[1] == "Hi<|im_start|>assistant\nagain"
    assert markers.split_query(query) == (prompt, "That sounds hard.<|im_end|>")
    assert markers.clean_reply(" That sounds hard.<|im_end|>") == ("That sounds hard.", True)
    assert markers.clean_reply("cut off mid") == ("cut off mid", False)
    with pytest.raises(ValueError, match="no assistant opening"):
        markers.split_query("plain text")


def test_feedback_continues_the_template_token_for_token(markers, smol_tokenizer):
    conv = [msg("system", "Be kind."), msg("user", "My dog died.")]
    obs = render(smol_tokenizer, conv)
    action = "I'm so sorry.<|im_end|>"  # vLLM text with special tokens kept (OpenRLHF's default)
    feedback = markers.feedback(action, "Thanks.")
    assert feedback == "\n<|im_start|>user\nThanks.<|im_end|>\n<|im_start|>assistant\n"
    tokens = ids(smol_tokenizer, obs) + ids(smol_tokenizer, action) + ids(smol_tokenizer, feedback)
    full = conv + [msg("assistant", "I'm so sorry."), msg("user", "Thanks.")]
    assert tokens == ids(smol_tokenizer, render(smol_tokenizer, full))
    # a truncated reply (no EOS) gets the whole end-of-turn marker first
    assert markers.feedback("I'm so", "Hm.").startswith("<|im_end|>\n<|im_start|>user\n")


def test_unsupported_template_is_a_clear_error():
    class Plain:
        name_or_path = "plain"

        def apply_chat_template(self, conv, tokenize=False, add_generation_prompt=False):
            return " ".join(m["content"] for m in conv)

    with pytest.raises(ConfigError, match="not supported for multi-turn token building"):
        ChatMarkers.from_tokenizer(Plain())


# ---------------------------------------------------------------------------- the RLVER episode


def test_rlver_episode_reset_and_steps(smol_tokenizer):
    from rapo_echo.integrations.openrlhf.agent import RLVEREpisode

    engine = ScriptedEngine.from_config(SIM_SCRIPT)
    ep = RLVEREpisode(engine, smol_tokenizer, system_prompt="Be kind.")
    obs = ep.reset({"observation": "ignored", "label": json.dumps(RLVER_ROW)})["observation"]
    conv = [msg("system", "Be kind."), msg("user", RLVER_ROW["first_talk"])]
    assert obs == render(smol_tokenizer, conv)
    tokens = ids(smol_tokenizer, obs)
    rewards, done, replies = [], False, ["That must hurt.", "Tell me about her.", "She sounds wonderful."]
    for reply in replies:
        action = reply + "<|im_end|>"
        out = ep.step({"observation_text": obs, "action_text": action, "label": "", "sampling_params": None})
        rewards.append(float(out["rewards"]))
        done = out["done"]
        tokens += ids(smol_tokenizer, action) + ids(smol_tokenizer, out["environment_feedback"])
        conv.append(msg("assistant", reply))
        if not done:
            conv.append(msg("user", "It still hurts, honestly."))
    assert done and out["extra_logs"]["sage/goodbye"] == 1.0 and out["extra_logs"]["sage/turns"] == 3.0
    # per-step reward = emotion change / 100 (first step from 0): 50/100, then +10/100 twice; sum = 70/100
    assert rewards == pytest.approx([0.5, 0.1, 0.1]) and sum(rewards) == pytest.approx(0.7)
    assert float(out["scores"]) == pytest.approx(0.7)
    assert tokens == ids(smol_tokenizer, render(smol_tokenizer, conv, gen=False).removesuffix("\n"))


# ---------------------------------------------------------------------------- exports


@pytest.fixture
def bundle(tmp_path, smol_path, smol_tokenizer):
    from rapo_echo.integrations.openrlhf import export_dataset, export_reward_file, export_rlver_agent

    cfg = run_config(tmp_path, smol_path)
    out = tmp_path / "bundle"
    export_reward_file(cfg, out, tokenizer=smol_tokenizer)
    export_rlver_agent(cfg, out, tokenizer=smol_tokenizer)
    export_dataset(cfg, out, tokenizer=smol_tokenizer)
    return out


def test_export_writes_the_job_folder(bundle):
    names = sorted(p.name for p in bundle.iterdir())
    assert names == [
        "prompts.jsonl",
        "reward_func.py",
        "rlver_agent.json",
        "rlver_agent.py",
        "run_config.yaml",
        "tokenizer",
    ]
    assert "INVALID_REWARD = -1.5" in (bundle / "reward_func.py").read_text()  # -(|1| + |0.5|)
    row = json.loads((bundle / "prompts.jsonl").read_text().splitlines()[0])
    assert row["prompt"][0]["role"] == "system" and row["prompt"][-1]["role"] == "user"
    assert json.loads(row["label"])["rapo_echo_scenario"] == 1
    assert json.loads((bundle / "rlver_agent.json").read_text())["sage"]["initial_emotion"] == 40.0


def test_export_redacts_secrets(tmp_path, smol_path, smol_tokenizer, monkeypatch):
    from rapo_echo.integrations.openrlhf import export_reward_file

    monkeypatch.setenv("MY_API_KEY", "sk-very-secret-value")
    leaky = {"judge.script": {"default": "Score: 3 sk-very-secret-value"}}
    with pytest.raises(ConfigError, match="the environment variable MY_API_KEY"):  # refused when loaded
        run_config(tmp_path, smol_path, **leaky)
    cfg = run_config(tmp_path, smol_path)
    cfg.judge.script = leaky["judge.script"]  # a config built in code still never leaks it
    export_reward_file(cfg, tmp_path / "b", tokenizer=smol_tokenizer)
    assert "sk-very-secret-value" not in (tmp_path / "b" / "run_config.yaml").read_text()


def test_export_refuses_what_cannot_run(tmp_path, smol_path, smol_tokenizer):
    from rapo_echo.integrations.openrlhf import export_reward_file, export_rlver_agent

    with pytest.raises(ConfigError, match="no rewards"):
        export_reward_file(load_config(None, flags={"model.name": smol_path, "rewards": []}), tmp_path / "x")
    with pytest.raises(ConfigError, match="judge.engine: 'policy' is not available"):
        export_reward_file(load_config(None, flags={"model.name": smol_path}), tmp_path / "x")
    with pytest.raises(ConfigError, match="simulator.engine"):
        export_rlver_agent(
            load_config(None, flags={"model.name": smol_path}), tmp_path / "y", tokenizer=smol_tokenizer
        )


REWARD_SCRIPT = """
import importlib.util, json, sys
from transformers import AutoTokenizer
bundle = sys.argv[1]
# loaded the way OpenRLHF loads it
spec = importlib.util.spec_from_file_location("reward_func", bundle + "/reward_func.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
tok = AutoTokenizer.from_pretrained(bundle + "/tokenizer")
rows = [json.loads(line) for line in open(bundle + "/prompts.jsonl")][:3]
prompts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
replies = [
    "I'm so sorry about your gran, that is a heavy loss.<|im_end|>", "ok<|im_end|>", "whatever and then more"
]
queries = [p + r for p, r in zip(prompts, replies)]
out = mod.reward_func(queries, prompts, [rows[0]["label"], "", rows[2]["label"]])
print(json.dumps({"rewards": out["rewards"].tolist(), "scores": out["scores"].tolist(),
                  "logs": {k: v.tolist() for k, v in out["extra_logs"].items()}}))
"""


def test_exported_reward_file_in_a_fresh_process(bundle):
    proc = subprocess.run(
        [sys.executable, "-c", REWARD_SCRIPT, str(bundle)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
        cwd=str(ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # 1: judge "Score: 5" -> (5-1)/4 = 1; 11 words -> length 1 - |11-40|/40 = 0.275; total 1 + 0.5*0.275
    # 2: judge "Score: 2" -> 0.25; 1 word -> 1 - 39/40 = 0.025; total 0.25 + 0.5*0.025
    #    (its label is "", so the prompt conversation is parsed from the rendered text)
    # 3: the judge never answers a score -> invalid -> INVALID_REWARD = -1.5, score 0
    assert out["rewards"] == pytest.approx([1.1375, 0.2625, -1.5])
    assert out["scores"] == pytest.approx([1.0, 0.2625, 0.0])
    assert out["logs"]["rapo/invalid"] == [0.0, 0.0, 1.0]
    assert out["logs"]["rapo/judge"] == pytest.approx([1.0, 0.25, 0.0])
    assert out["logs"]["rapo/judge_invalid"] == [0.0, 0.0, 1.0]
    assert out["logs"]["rapo/length"] == pytest.approx([0.275, 0.025, 1 - 36 / 40])


def test_reward_sample_uses_the_label_scenario_and_marks_truncation(bundle, smol_tokenizer):
    from rapo_echo.integrations.openrlhf.reward_runtime import OpenRLHFReward, bundle_tokenizer

    cfg = load_config(bundle / "run_config.yaml")
    reward = OpenRLHFReward.from_config(cfg, bundle_tokenizer(bundle / "tokenizer"))
    row = json.loads((bundle / "prompts.jsonl").read_text().splitlines()[1])
    prompt = render(smol_tokenizer, row["prompt"])
    s = reward.sample(0, prompt + "I hear you and", prompt, row["label"])
    assert s.finish_reason == "length" and s.text == "I hear you and"
    assert s.scenario.id == json.loads(row["label"])["id"] and s.scenario.profile
    assert s.completion_ids == ids(smol_tokenizer, "I hear you and")
    parsed = reward.sample(1, prompt + "Sure.<|im_end|>", prompt, "")
    assert parsed.finish_reason == "stop" and parsed.scenario.messages == row["prompt"][1:]
    assert parsed.scenario.meta["system"] == row["prompt"][0]["content"]


def test_policy_judge_is_explained(tmp_path, smol_path, smol_tokenizer):
    from rapo_echo.integrations.openrlhf.reward_runtime import OpenRLHFReward

    cfg = run_config(tmp_path, smol_path, **{"judge.engine": "policy"})
    with pytest.raises(ConfigError, match="engine: openai"):
        OpenRLHFReward.from_config(cfg, smol_tokenizer)


def test_profiles_dataset_from_rlver_rows(tmp_path, smol_path):
    from rapo_echo.integrations.openrlhf import export_profiles

    src = tmp_path / "profiles.jsonl"
    src.write_text(
        json.dumps(RLVER_ROW, ensure_ascii=False)
        + "\n\n"
        + json.dumps({**RLVER_ROW, "first_talk": None})
        + "\n"
    )
    path = export_profiles(run_config(tmp_path, smol_path), src, tmp_path / "b")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 2 and rows[0]["prompt"][-1]["content"] == RLVER_ROW["first_talk"]
    assert [m["role"] for m in rows[1]["prompt"]] == ["system"]  # no preset opening: the agent writes it
    assert SageProfile.from_label(rows[0]["label"]).persona == RLVER_ROW["player"]
    src.write_text("{broken\n")
    with pytest.raises(DataError, match=r"profiles.jsonl:1: invalid JSON"):
        export_profiles(run_config(tmp_path, smol_path), src, tmp_path / "c")


# ---------------------------------------------------------------------------- launch


def flag(cmd: list[str], name: str, n: int = 1):
    i = cmd.index(name)
    return cmd[i + 1] if n == 1 else cmd[i + 1 : i + 1 + n]


def test_launch_command_maps_the_run(tmp_path, smol_path, bundle):
    from rapo_echo.integrations.openrlhf import ClusterSpec, launch_command

    cfg = run_config(
        tmp_path, smol_path, **{"loss.beta": 0.02, "train.warmup_steps": 10, "train.mini_batches": 2}
    )
    # train.lr: auto needs the policy's size; a hub id this machine cannot read is a clear error
    with pytest.raises(ConfigError, match=r"train.lr: auto needs the policy's size.*--set train.lr="):
        launch_command(
            cfg, bundle, cluster=ClusterSpec(nodes=2, gpus_per_node=4), pretrain="Qwen/Qwen2.5-7B-Instruct"
        )
    cfg.train.lr = 1e-6
    cmd = launch_command(
        cfg, bundle, cluster=ClusterSpec(nodes=2, gpus_per_node=4), pretrain="Qwen/Qwen2.5-7B-Instruct"
    )
    assert cmd[:3] == ["ray", "job", "submit"] and json.loads(flag(cmd, "--runtime-env-json")) == {
        "working_dir": str(bundle)
    }
    assert cmd[cmd.index("--") + 1 : cmd.index("--") + 4] == ["python3", "-m", "openrlhf.cli.train_ppo_ray"]
    assert flag(cmd, "--actor.model_name_or_path") == "Qwen/Qwen2.5-7B-Instruct"
    assert flag(cmd, "--algo.advantage.estimator") == "group_norm"
    assert flag(cmd, "--rollout.n_samples_per_prompt") == "4" and flag(cmd, "--rollout.batch_size") == "8"
    assert flag(cmd, "--train.batch_size") == "16"  # 8 prompts x 4 samples / 2 mini-batches
    assert flag(cmd, "--vllm.num_engines") == "8"  # colocated: one engine per GPU of 2 x 4
    assert flag(cmd, "--actor.eps_clip_low_high", 2) == ["0.2", "0.2"]
    assert flag(cmd, "--algo.kl.init_coef") == "0.02" and flag(cmd, "--algo.kl.estimator") == "k3"
    assert "--algo.kl.use_loss" in cmd and flag(cmd, "--ref.num_nodes") == "2"
    # 10 warm-up updates of 100 steps x 2 updates each
    assert flag(cmd, "--actor.lr_warmup_ratio") == "0.05"
    rows = len((bundle / "prompts.jsonl").read_text().splitlines())
    assert flag(cmd, "--train.num_episodes") == str(-(-100 * 8 // rows))  # ceil(steps x prompts/step / rows)
    assert flag(cmd, "--reward.remote_url") == "reward_func.py" and "--train.agent_func_path" not in cmd
    agent = launch_command(cfg, bundle, agent=True, cluster=ClusterSpec(nodes=2, gpus_per_node=4))
    assert flag(agent, "--train.agent_func_path") == "rlver_agent.py" and "--reward.remote_url" not in agent
    assert flag(agent, "--data.max_len") == str(1024 + 2 * 64 * 10)


@pytest.mark.parametrize(
    ("overrides", "cluster", "match"),
    [
        ({"algo": "rapo"}, {}, "cannot run on OpenRLHF"),
        ({"rollout.top_k": 20}, {}, "top-k"),
        ({"loss.agg": "seq-mean-token-sum-norm"}, {}, "no OpenRLHF equivalent"),
        # a plugin formula: OpenRLHF has only its own
        ({"loss.advantage": PLUGIN}, {}, "loss.advantage: .*minmax_advantages' has no OpenRLHF equivalent"),
        ({"model.lora.enabled": True}, {}, "LoRA"),
        ({"rollout.group_size": 1}, {}, "at least 2"),
        ({"train.micro_batch_size": 8}, {"gpus_per_node": 8}, "multiple of"),
        ({}, {"vllm_engines": 3}, "must equal"),
    ],
)
def test_launch_refuses_what_openrlhf_cannot_do(tmp_path, smol_path, bundle, overrides, cluster, match):
    from rapo_echo.integrations.openrlhf import ClusterSpec, launch_command

    group = overrides.get("rollout.group_size")  # load_config itself refuses 1: set it afterwards
    cfg = run_config(tmp_path, smol_path, **{k: v for k, v in overrides.items() if k != "rollout.group_size"})
    if group is not None:
        cfg.rollout.group_size = group
    with pytest.raises(ConfigError, match=match):
        launch_command(cfg, bundle, cluster=ClusterSpec(**{"gpus_per_node": 4, **cluster}))


def test_launch_needs_the_exported_files(tmp_path, smol_path):
    from rapo_echo.integrations.openrlhf import ClusterSpec, launch_command

    with pytest.raises(ConfigError, match="openrlhf export"):
        launch_command(run_config(tmp_path, smol_path), tmp_path, cluster=ClusterSpec(gpus_per_node=4))


def test_cli_export_and_launch(tmp_path, smol_path, capsys, monkeypatch):
    from rapo_echo.integrations.openrlhf.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    out = tmp_path / "job"
    common = [
        "--model",
        smol_path,
        "--reward",
        "length",
        "--set",
        "rollout.batch_size=8",
        "--set",
        "train.micro_batch_size=2",
        "--output",
        str(tmp_path / "run"),
    ]
    args = parser.parse_args(["openrlhf", "export", *common, "--out", str(out)])
    assert args.func(args) == 0
    assert (out / "reward_func.py").is_file() and (out / "prompts.jsonl").is_file()
    args = parser.parse_args(["openrlhf", "launch", *common, "--bundle", str(out), "--gpus-per-node", "4"])
    assert args.func(args) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed.startswith("ray job submit") and "--reward.remote_url reward_func.py" in printed
    monkeypatch.setattr("shutil.which", lambda name: None)
    args = parser.parse_args(
        ["openrlhf", "launch", *common, "--bundle", str(out), "--gpus-per-node", "4", "--run"]
    )
    with pytest.raises(RapoEchoError, match="'ray' is not on PATH"):
        args.func(args)
    args = parser.parse_args(
        ["openrlhf", "export", "--model", smol_path, "--set", "rewards=[]", "--out", str(tmp_path / "none")]
    )
    with pytest.raises(RapoEchoError, match="nothing to train with"):
        args.func(args)


# ---------------------------------------------------------------------------- with OpenRLHF installed


def openrlhf_args(argv: list[str]) -> SimpleNamespace:
    """Run OpenRLHF 0.11's own ``train_ppo_ray`` argument parser and checks on ``argv`` (its
    ``__main__`` block without the final ``train(args)`` call, so nothing needs Ray or a GPU)."""
    path = (
        Path(importlib.util.find_spec("openrlhf").submodule_search_locations[0]) / "cli" / "train_ppo_ray.py"
    )
    tree = ast.parse(path.read_text())
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    assert ast.unparse(main.body[-1]) == "train(args)"
    code = compile(ast.Module(body=main.body[:-1], type_ignores=[]), str(path), "exec")
    namespace = {"argparse": argparse, "datetime": __import__("datetime").datetime, "os": __import__("os")}
    saved = sys.argv
    sys.argv = ["train_ppo_ray", *argv]
    try:
        exec(code, namespace)
    finally:
        sys.argv = saved
    return namespace["args"]


@needs_openrlhf
def test_launch_flags_parse_with_openrlhfs_own_parser(tmp_path, smol_path, bundle):
    from rapo_echo.integrations.openrlhf import ClusterSpec, launch_command

    cfg = run_config(tmp_path, smol_path, **{"loss.beta": 0.02, "loss.policy_loss": "gspo"})
    cmd = launch_command(cfg, bundle, cluster=ClusterSpec(nodes=1, gpus_per_node=4))
    args = openrlhf_args(cmd[cmd.index("openrlhf.cli.train_ppo_ray") + 1 :])
    assert args.algo.advantage.estimator == "group_norm" and args.rollout.n_samples_per_prompt == 4
    assert args.actor.policy_loss_type == "gspo" and list(args.actor.eps_clip_low_high) == [3e-4, 4e-4]
    assert args.algo.kl.use_loss and args.algo.kl.estimator == "k3" and args.algo.kl.init_coef == 0.02
    assert args.reward.remote_url == ["reward_func.py"] and args.data.label_key == "label"
    assert args.train.colocate_all and args.vllm.enable_sleep and args.vllm.num_engines == 4
    # train.lr: auto, from the embedded model's size read off its config (134.5M parameters: 1e-4)
    assert args.actor.adam.lr == 1e-4 and list(args.actor.adam.betas) == [0.9, 0.999]
    agent_cmd = launch_command(cfg, bundle, agent=True, cluster=ClusterSpec(nodes=1, gpus_per_node=4))
    agent_args = openrlhf_args(agent_cmd[agent_cmd.index("openrlhf.cli.train_ppo_ray") + 1 :])
    assert agent_args.train.agent_func_path == "rlver_agent.py" and agent_args.reward.remote_url == ["agent"]


def load_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeVLLM:
    """Stands in for OpenRLHF's vLLM actor: returns scripted policy replies as token ids + text with the
    EOS token kept (OpenRLHF samples with skip_special_tokens=False)."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer, self.replies, self.prompts = tokenizer, list(replies), []

    async def generate(self, token_ids, sampling_params, multi_modal_data=None):
        self.prompts.append(list(token_ids))
        text = self.replies.pop(0) + "<|im_end|>"
        out = SimpleNamespace(
            token_ids=ids(self.tokenizer, text), text=text, finish_reason="stop", logprobs=None
        )
        return SimpleNamespace(outputs=[out])


@needs_openrlhf
def test_exported_agent_runs_in_openrlhfs_multi_turn_executor(bundle, smol_tokenizer):
    from openrlhf.utils.agent import AgentExecutorBase, AgentInstanceBase

    module = load_file(bundle / "rlver_agent.py", "agent_module")
    assert issubclass(module.AgentInstance, AgentInstanceBase)
    assert issubclass(module.AgentExecutor, AgentExecutorBase)
    executor = module.AgentExecutor()  # OpenRLHF instantiates it without arguments
    replies = ["That must hurt.", "Tell me about her.", "She sounds wonderful."]
    engine = FakeVLLM(smol_tokenizer, replies)
    params = SimpleNamespace(max_tokens=None, logprobs=None)
    result = asyncio.run(
        executor.execute("ignored prompt", json.dumps(RLVER_ROW), params, 4096, smol_tokenizer, engine)
    )
    assert result["reward"] == pytest.approx(0.7) and float(result["scores"]) == pytest.approx(0.7)
    system = load_config(bundle / "run_config.yaml").rollout.system_prompt
    conv = [msg("system", system), msg("user", RLVER_ROW["first_talk"])]
    for i, reply in enumerate(replies):
        conv.append(msg("assistant", reply))
        if i < 2:
            conv.append(msg("user", "It still hurts, honestly."))
    expected = ids(smol_tokenizer, render(smol_tokenizer, conv, gen=False).removesuffix("\n"))
    assert result["observation_tokens"] == expected
    spans = [smol_tokenizer.decode(expected[a:b]) for a, b in result["action_ranges"]]
    assert spans == [r + "<|im_end|>" for r in replies]  # only the policy's tokens are trained on


@needs_openrlhf
def test_exported_reward_file_through_openrlhfs_single_turn_executor(bundle, smol_tokenizer):
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor(str(bundle / "reward_func.py"))
    row = json.loads((bundle / "prompts.jsonl").read_text().splitlines()[0])
    prompt = render(smol_tokenizer, row["prompt"])
    engine = FakeVLLM(smol_tokenizer, ["I'm so sorry about your gran, that is a heavy loss."])
    params = SimpleNamespace(max_tokens=64, logprobs=None)
    out = asyncio.run(executor.execute(prompt, row["label"], params, 2048, smol_tokenizer, engine))
    # judge 5 -> 1.0, 11 words -> length 0.275: 1 + 0.5 * 0.275
    assert float(out["reward"][0]) == pytest.approx(1.1375) and float(out["scores"][0]) == pytest.approx(1.0)
    assert float(out["extra_logs"]["rapo/invalid"][0]) == 0.0


def test_launch_with_the_defaults(tmp_path, smol_path, bundle):
    """The defaults launch: 4 contexts x 4 replies = 16 samples per update on 1 node x 8 GPUs, with
    train.micro_batch_size: auto, take micro-batches of 2 (16 = 2 x 8, one per GPU); before, auto meant 8
    and the command was refused (16 is no multiple of 8 x 8)."""
    from rapo_echo.integrations.openrlhf import ClusterSpec, launch_command

    cfg = run_config(tmp_path, smol_path, **{"rollout.batch_size": 4, "train.micro_batch_size": "auto"})
    cfg.train.lr = 1e-6
    cmd = launch_command(cfg, bundle, cluster=ClusterSpec())
    assert flag(cmd, "--train.batch_size") == "16" and flag(cmd, "--actor.num_gpus_per_node") == "8"
    assert flag(cmd, "--train.micro_batch_size") == "2" == flag(cmd, "--rollout.micro_batch_size")
    # OpenRLHF's own launch checks (train_ppo_ray.py and its DeepSpeed strategy), on the flags given
    samples, micro, gpus = 16, 2, 8
    assert samples % (micro * gpus) == 0 and samples // micro >= gpus
    # four GPUs: the largest size up to 8 that fits
    assert (
        flag(launch_command(cfg, bundle, cluster=ClusterSpec(gpus_per_node=4)), "--train.micro_batch_size")
        == "4"
    )
    twelve = r"16 samples per update .* cannot be split evenly over 12 GPUs; use rollout.batch_size: 6"
    with pytest.raises(ConfigError, match=twelve):
        launch_command(cfg, bundle, cluster=ClusterSpec(gpus_per_node=12))
    cfg.train.micro_batch_size = 4
    with pytest.raises(ConfigError, match=r"must be a multiple of micro_batch_size x GPUs \(4 x 8\)"):
        launch_command(cfg, bundle, cluster=ClusterSpec())
