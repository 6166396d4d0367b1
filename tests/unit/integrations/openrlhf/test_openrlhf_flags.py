"""The OpenRLHF launch command uses only flags that the lowest OpenRLHF our ``openrlhf`` extra allows
accepts (issue 31, item 19): ``--actor.loss_agg_mode`` arrived in 0.11.2, and 0.11.0 / 0.11.1 stop at
argument parsing on a flag they do not know (``parser.parse_args()``, no ``parse_known_args``).

The flag names below are facts read off OpenRLHF's own parser, ``openrlhf/cli/train_ppo_ray.py``
(every ``parser.add_argument("--...")``, with the ``for prefix in ("actor", "critic")`` loop expanded),
in the PyPI wheels openrlhf 0.11.0, 0.11.1 and 0.11.2 (0.11.0's file equals the git tag v0.11.0,
commit 3c3be6234e0cb353e76bb8019947db9dfe99fca7 of github.com/OpenRLHF/OpenRLHF). This test runs
without OpenRLHF installed; test_openrlhf.py also runs the real parser where it is installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

from tests.unit.integrations.openrlhf.test_openrlhf import bundle, run_config  # noqa: F401 (bundle: the fixture)

ROOT = Path(__file__).resolve().parents[4]

# openrlhf 0.11.2, openrlhf/cli/train_ppo_ray.py: every option the parser defines.
FLAGS_0_11_2 = frozenset(
    """
    --actor.adam.betas --actor.adam.eps --actor.adam.lr --actor.adam.weight_decay --actor.aux_loss_coef
    --actor.dual_clip --actor.entropy_coef --actor.eps_clip --actor.eps_clip_low_high
    --actor.freeze_visual_encoder --actor.gradient_checkpointing_enable
    --actor.gradient_checkpointing_reentrant --actor.loss_agg_mode --actor.lr_scheduler
    --actor.lr_warmup_ratio --actor.max_norm --actor.min_lr_ratio --actor.model_name_or_path --actor.muon.lr
    --actor.muon.momentum --actor.muon.nesterov --actor.muon.no_nesterov --actor.muon.ns_steps
    --actor.num_gpus_per_node --actor.num_nodes --actor.optim --actor.policy_loss_type
    --algo.advantage.estimator --algo.advantage.gamma --algo.advantage.is_correction_gating
    --algo.advantage.is_correction_level --algo.advantage.is_correction_mode
    --algo.advantage.is_correction_threshold --algo.advantage.lambd --algo.advantage.no_std_norm
    --algo.dynamic_filtering_enable --algo.dynamic_filtering_range --algo.kl.estimator --algo.kl.horizon
    --algo.kl.init_coef --algo.kl.target --algo.kl.unbiased_gradient --algo.kl.use_loss
    --ckpt.best_metric_key --ckpt.disable_ds --ckpt.load_enable --ckpt.max_mem --ckpt.max_num
    --ckpt.output_dir --ckpt.path --ckpt.save_hf --ckpt.save_steps --critic.adam.betas --critic.adam.eps
    --critic.adam.lr --critic.adam.weight_decay --critic.freezing_steps --critic.lr_scheduler
    --critic.lr_warmup_ratio --critic.max_norm --critic.min_lr_ratio --critic.model_name_or_path
    --critic.muon.lr --critic.muon.momentum --critic.muon.nesterov --critic.muon.no_nesterov
    --critic.muon.ns_steps --critic.num_gpus_per_node --critic.num_nodes --critic.optim
    --critic.save_value_network --critic.value_clip --data.apply_chat_template --data.dataloader_num_workers
    --data.disable_fast_tokenizer --data.image_key --data.input_key --data.input_template --data.label_key
    --data.max_images_per_prompt --data.max_len --data.max_samples --data.prompt_dataset --data.prompt_probs
    --data.prompt_split --ds.adam_offload --ds.attn_implementation --ds.deepcompile --ds.enable_sleep
    --ds.experts_implementation --ds.grad_accum_dtype --ds.load_in_4bit --ds.lora.alpha --ds.lora.dropout
    --ds.lora.rank --ds.lora.target_modules --ds.overlap_comm --ds.packing_samples --ds.param_dtype
    --ds.ring_attn_head_stride --ds.ring_attn_size --ds.tensor_parallel_size --ds.use_liger_kernel
    --ds.use_universal_ckpt --ds.value_head_prefix --ds.zero_stage --ds.zpg --eval.dataset
    --eval.n_samples_per_prompt --eval.split --eval.steps --eval.temperature --local_rank
    --logger.logging_steps --logger.tensorboard_dir --logger.wandb.group --logger.wandb.key
    --logger.wandb.org --logger.wandb.project --logger.wandb.run_name --ref.num_gpus_per_node
    --ref.num_nodes --ref.offload --reward.clip_range --reward.model_name_or_path --reward.normalize_enable
    --reward.num_gpus_per_node --reward.num_nodes --reward.offload --reward.overlong_buffer_len
    --reward.overlong_penalty_factor --reward.remote_url --reward.stop_properly_penalty_coef
    --rollout.batch_size --rollout.max_new_tokens --rollout.max_tokens_per_gpu --rollout.micro_batch_size
    --rollout.n_samples_per_prompt --rollout.temperature --rollout.top_p --rollout.vllm_generate_batch_size
    --train.agent_func_path --train.async_enable --train.async_queue_size --train.batch_size
    --train.colocate_actor_ref --train.colocate_all --train.colocate_critic_reward
    --train.dynamic_batch_enable --train.ema_beta --train.enable_ema --train.full_determinism_enable
    --train.max_epochs --train.max_tokens_per_gpu --train.micro_batch_size --train.num_episodes
    --train.partial_rollout_enable --train.seed --use_ms --vllm.enable_prefix_caching --vllm.enable_sleep
    --vllm.enforce_eager --vllm.gpu_memory_utilization --vllm.num_engines --vllm.sync_backend
    --vllm.sync_with_ray --vllm.tensor_parallel_size
    """.split()  # noqa: SIM905 (the names as read, wrapped)
)
# 0.11.1 lacks the three is-correction options 0.11.2 split out of its two, and loss_agg_mode.
FLAGS_0_11_1 = (
    FLAGS_0_11_2
    - {
        "--actor.loss_agg_mode",
        "--algo.advantage.is_correction_gating",
        "--algo.advantage.is_correction_level",
        "--algo.advantage.is_correction_mode",
    }
) | {"--algo.advantage.is_correction_enable", "--algo.advantage.is_correction_type"}
# 0.11.0 also lacks --algo.kl.unbiased_gradient (added in 0.11.1).
FLAGS_0_11_0 = FLAGS_0_11_1 - {"--algo.kl.unbiased_gradient"}
PARSER_FLAGS = {
    Version("0.11.0"): FLAGS_0_11_0,
    Version("0.11.1"): FLAGS_0_11_1,
    Version("0.11.2"): FLAGS_0_11_2,
}


def lowest_allowed_openrlhf() -> Version:
    """The lowest OpenRLHF version among those recorded above that pyproject's ``openrlhf`` extra allows."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    req = next(Requirement(r) for r in extras["openrlhf"] if Requirement(r).name == "openrlhf")
    allowed = [v for v in sorted(PARSER_FLAGS) if req.specifier.contains(v)]
    assert allowed, f"pyproject's openrlhf extra ({req}) allows none of {sorted(map(str, PARSER_FLAGS))}"
    return allowed[0]


def emitted_flags(cmd: list[str]) -> set[str]:
    args = cmd[cmd.index("openrlhf.cli.train_ppo_ray") + 1 :]
    return {a for a in args if a.startswith("--")}


def test_the_recorded_parsers_differ_as_the_releases_do():
    assert len(FLAGS_0_11_2) == 167 and len(FLAGS_0_11_1) == 165 and len(FLAGS_0_11_0) == 164
    assert "--actor.loss_agg_mode" in FLAGS_0_11_2 and "--actor.loss_agg_mode" not in FLAGS_0_11_1


@pytest.mark.parametrize("agent", [False, True])
def test_every_emitted_flag_parses_in_the_lowest_allowed_openrlhf(tmp_path, smol_path, bundle, agent):  # noqa: F811
    from rapo_echo.integrations.openrlhf import ClusterSpec, launch_command

    # every optional flag on: KL loss, entropy bonus, colocation, checkpointing, attention, TensorBoard
    cfg = run_config(
        tmp_path,
        smol_path,
        **{
            "loss.beta": 0.02,
            "loss.entropy_coef": 0.001,
            "loss.agg": "seq-mean-token-mean",
            "model.gradient_checkpointing": True,
            "model.attn_implementation": "sdpa",
            "logging.tensorboard": True,
            "train.lr": 1e-6,
        },
    )
    cmd = launch_command(cfg, bundle, agent=agent, cluster=ClusterSpec(nodes=1, gpus_per_node=4))
    version = lowest_allowed_openrlhf()
    unknown = sorted(emitted_flags(cmd) - PARSER_FLAGS[version])
    assert not unknown, (
        f"pyproject's openrlhf extra allows OpenRLHF {version}, whose train_ppo_ray parser rejects "
        f"{unknown}; raise the extra's lower bound or stop emitting the flag"
    )
    assert "--actor.loss_agg_mode" in cmd and "--actor.gradient_checkpointing_enable" in cmd
