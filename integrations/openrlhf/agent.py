"""The RLVER episode behind an exported OpenRLHF agent (``--train.agent_func_path``).

OpenRLHF 0.11's ``MultiTurnAgentExecutor`` creates one agent instance per rollout sample and calls

* ``reset({"observation": prompt, "label": label})`` -> ``{"observation": text}``: the first prompt;
* ``step({"observation_text", "action_text", "label", "sampling_params"})`` -> ``{"rewards", "scores",
  "environment_feedback", "done", "sampling_params", "extra_logs"}`` after every policy turn; it sums
  the ``rewards`` of all steps, appends ``environment_feedback`` to the token sequence with loss mask 0,
  and keeps the last step's ``scores`` and ``extra_logs``.

:class:`RLVEREpisode` plays one dialogue with :class:`~rapo_echo.simulators.sage.SageSimulator` (the user's
profile from the label); its rewards and invalid dialogues are described in docs/scaling.md, "Multi-node
with OpenRLHF and Ray" (RLVER). ``scores`` is the current reward.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rapo_echo.chat_template import ChatMarkers, render_prompt
from rapo_echo.data.sage_profiles import SageProfile
from rapo_echo.engines.base import ChatEngine
from rapo_echo.errors import ConfigError
from rapo_echo.simulators.sage import SageDialogue, SageSettings, SageSimulator
from rapo_echo.types import Conversation, msg

AGENT_SETTINGS = "rlver_agent.json"
_EPISODES = itertools.count()


class RLVEREpisode:
    """One dialogue between the policy and a simulated user, driven by OpenRLHF's reset / step."""

    def __init__(
        self,
        engine: ChatEngine,
        tokenizer: Any,
        *,
        settings: SageSettings | None = None,
        system_prompt: str | None = None,
        markers: ChatMarkers | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.markers = markers or ChatMarkers.from_tokenizer(tokenizer)
        self.settings = settings or SageSettings()
        self.simulator = SageSimulator(engine, self.settings)
        self.system_prompt = system_prompt
        self.dialogue: SageDialogue | None = None
        self.reported = 0.0

    def reset(self, states: dict[str, Any]) -> dict[str, Any]:
        """Start the dialogue for the profile in ``states["label"]``; returns the first observation."""
        profile = SageProfile.from_label(states.get("label"), "label")
        episode = f"{profile.id or 'episode'}-{next(_EPISODES)}"
        self.dialogue = self.simulator.start([profile], [episode])[0]
        self.reported = 0.0
        return {"observation": render_prompt(self.tokenizer, self._conversation())}

    def _conversation(self) -> Conversation:
        assert self.dialogue is not None
        head = [msg("system", self.system_prompt)] if self.system_prompt else []
        # an opening that never parsed leaves no user message: the first step then ends the episode
        return head + (self.dialogue.history or [msg("user", "")])

    def step(self, states: dict[str, Any]) -> dict[str, Any]:
        """Show the policy's reply to the user, update the emotion, and return OpenRLHF's step dict."""
        import torch

        d = self.dialogue
        if d is None:
            raise RuntimeError("step() before reset()")
        action = states["action_text"]
        reply, _ended = self.markers.clean_reply(action)
        if not d.done:
            self.simulator.step([d], [reply])
        score = 0.0 if d.invalid else d.reward
        reward, self.reported = score - self.reported, score
        feedback = ""
        if not d.done:
            feedback = self.markers.feedback(action, d.history[-1]["content"])
        logs = {
            "sage/emotion": d.emotion,
            "sage/turns": float(d.turns),
            "sage/parse_failures": float(d.parse_failures),
            "sage/invalid": float(d.invalid),
            "sage/goodbye": float(d.reason == "goodbye"),
            "sage/emotion_high": float(d.reason == "emotion_high"),
            "sage/emotion_low": float(d.reason == "emotion_low"),
        }
        return {
            "rewards": torch.tensor(reward, dtype=torch.float32),
            "scores": torch.tensor(score, dtype=torch.float32),
            "environment_feedback": feedback,
            "done": d.done,
            "sampling_params": states.get("sampling_params"),
            "extra_logs": logs,
        }


def write_agent_settings(path: str | Path, settings: SageSettings) -> None:
    """Write the simulated user's settings next to an exported agent."""
    Path(path).write_text(json.dumps({"sage": asdict(settings)}, indent=2) + "\n")


def episode_factory(bundle: str | Path) -> Callable[[], RLVEREpisode]:
    """A function making fresh episodes from an export folder (``run_config.yaml``, ``tokenizer/``,
    ``rlver_agent.json``). The tokenizer, markers and simulator engine are built once, on first use,
    and shared by all episodes of the process."""
    from rapo_echo.engines import make_engine
    from rapo_echo.training.run_config import load_config

    from .reward_runtime import bundle_tokenizer

    root = Path(bundle)
    lock = threading.Lock()
    shared: dict[str, Any] = {}

    def build() -> dict[str, Any]:
        with lock:
            if not shared:
                cfg = load_config(root / "run_config.yaml")
                if cfg.simulator.engine == "policy":
                    raise ConfigError(
                        "simulator.engine: 'policy' cannot drive the RLVER agent under OpenRLHF; use "
                        "'openai' with the base_url of a 'vllm serve' replica"
                    )
                data = json.loads((root / AGENT_SETTINGS).read_text())
                tokenizer = bundle_tokenizer(root / "tokenizer")
                shared.update(
                    engine=make_engine(cfg.simulator, role="simulator"),
                    tokenizer=tokenizer,
                    markers=ChatMarkers.from_tokenizer(tokenizer),
                    settings=SageSettings.from_mapping(
                        data.get("sage", {}), f"{root / AGENT_SETTINGS}: sage"
                    ),
                    system_prompt=cfg.rollout.system_prompt,
                )
            return shared

    def new_episode() -> RLVEREpisode:
        s = build()
        return RLVEREpisode(
            s["engine"],
            s["tokenizer"],
            settings=s["settings"],
            system_prompt=s["system_prompt"],
            markers=s["markers"],
        )

    return new_episode
