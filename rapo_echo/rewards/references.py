"""Reference replies for reference-anchored rewards: the scenario's own ``reference``, or one written by
a reference model once per (model, scenario) and cached on disk.

The cache is a JSONL file per reference model and generation setting (``<cache>/<model>-<hash>.jsonl``,
one ``{"key", "scenario", "reference"}`` line per scenario), where ``<cache>`` is the run directory's
``references/`` folder or ``$RAPO_ECHO_CACHE/references``. A scenario's key hashes its id and
dialogue, so an edited dialogue gets a new reference. Lines are appended as references are written,
so an interrupted run keeps what it generated; a torn last line is skipped on reading.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Container, Sequence
from pathlib import Path
from typing import Any

from rapo_echo.engines.base import ChatEngine, generate_texts
from rapo_echo.prompting import policy_conversation
from rapo_echo.scrub import scrub
from rapo_echo.types import SamplingParams, Scenario

log = logging.getLogger(__name__)


def scenario_key(scenario: Scenario) -> str:
    """A short hash of the scenario's id and dialogue."""
    data = json.dumps([scenario.id, scenario.messages], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(data.encode()).hexdigest()[:20]


def uncached(scenarios: Sequence[Scenario], cache: Container[str]) -> tuple[list[str], dict[str, Scenario]]:
    """Each scenario's :func:`scenario_key`, and the first scenario of each key that ``cache`` lacks."""
    keys = [scenario_key(sc) for sc in scenarios]
    todo: dict[str, Scenario] = {}
    for key, sc in zip(keys, scenarios):
        if key not in cache:
            todo.setdefault(key, sc)
    return keys, todo


def model_identity(engine: Any) -> str:
    """What names the model behind an engine: its model id or folder (``hf``: the weights' source path,
    ``openai``: the served model name), else the engine's name."""
    for attr in ("model_id", "model_name"):
        value = getattr(engine, attr, None)
        if isinstance(value, str) and value:
            return value
    model = getattr(engine, "model", None)
    if isinstance(model, str) and model:
        return model
    path = getattr(getattr(model, "config", None), "_name_or_path", None)
    if isinstance(path, str) and path:
        return path
    return str(getattr(engine, "name", "engine"))


class ReferenceStore:
    """References written by ``engine`` (the model's reply to each scenario, greedy), cached on disk."""

    def __init__(
        self,
        engine: ChatEngine,
        folder: str | Path,
        *,
        system_prompt: str | None,
        max_new_tokens: int = 96,
        identity: str | None = None,
    ) -> None:
        self.engine = engine
        self.system_prompt = system_prompt
        self.max_new_tokens = max_new_tokens
        self.identity = identity or model_identity(engine)
        setting = json.dumps([self.identity, system_prompt, max_new_tokens])
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(self.identity).name or self.identity)[-40:]
        self.path = Path(folder) / f"{slug}-{hashlib.sha256(setting.encode()).hexdigest()[:10]}.jsonl"
        self.generated = 0
        self._cache: dict[str, str] = self._read()

    def _read(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if not self.path.is_file():
            return out
        for n, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
            try:
                row = json.loads(line)
                out[str(row["key"])] = str(row["reference"])
            except (json.JSONDecodeError, KeyError, TypeError):
                log.warning("%s:%d: unreadable reference cache line skipped", self.path, n)
        return out

    def get(self, scenarios: Sequence[Scenario]) -> list[str | None]:
        """The cached or newly written reference of each scenario (one batched call for the missing
        ones); None where the model wrote nothing."""
        keys, missing = uncached(scenarios, self._cache)
        if missing:
            prompts = [
                policy_conversation(sc, self.system_prompt, with_persona=False) for sc in missing.values()
            ]
            params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0)
            texts = [t.strip() for t in generate_texts(self.engine, prompts, params)]
            self.generated += len(texts)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                for (key, sc), text in zip(missing.items(), texts):
                    if text:
                        self._cache[key] = text
                        row = {"key": key, "scenario": sc.id, "reference": text}
                        fh.write(scrub(json.dumps(row, ensure_ascii=False)) + "\n")
        return [self._cache.get(key) for key in keys]
