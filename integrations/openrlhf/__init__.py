"""OpenRLHF backend: run rapo-echo's rewards and RLVER's simulated user on a Ray cluster.

OpenRLHF (0.11) trains with Ray, DeepSpeed and vLLM; rapo-echo plugs into it through files:
``export_reward_file`` writes a ``reward_func.py`` for ``--reward.remote_url``, ``export_rlver_agent``
an agent for ``--train.agent_func_path``, ``export_dataset`` the prompts, and ``launch_command`` the
``ray job submit`` command line. OpenRLHF itself is only needed on the cluster.
"""

from .export import (
    export_dataset,
    export_profiles,
    export_reward_file,
    export_rlver_agent,
)
from .launch import ClusterSpec, launch_command

__all__ = [
    "ClusterSpec",
    "export_dataset",
    "export_profiles",
    "export_reward_file",
    "export_rlver_agent",
    "launch_command",
]
