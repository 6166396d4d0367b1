"""The dialogue contexts the data commands read and the scenario rows they write.

:func:`load_contexts` is the one place the data commands call the training data loader (the same files,
formats and turn selection as ``rapo-echo train``'s ``data`` section). :func:`scenario_row` writes a
context back in our ``scenarios`` format (``rapo_echo/data/scenario_file.py``), which ``train`` and the
next data command read as it is. :func:`context_key` fingerprints a context's content, so that a resumed
command can tell an item whose input changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from rapo_echo.errors import ConfigError, DataError
from rapo_echo.types import Scenario

# meta fields that say where a context was read from, not what it is (left out of its key)
LOCATION_META = ("file", "where")


def load_contexts(path: str | None, fmt: str = "auto", limit: int | None = None) -> list[Scenario]:
    """The contexts of ``path`` (None: the bundled English scenarios) read by the training loader
    (:func:`rapo_echo.data.scenarios_from_config` with a ``data`` section of these values), the first
    ``limit``; ids must be unique and every context must end with the person's message."""
    from pydantic import ValidationError

    from rapo_echo.config import DataConfig
    from rapo_echo.data import scenarios_from_config

    try:
        cfg = DataConfig(path=path, format=fmt, limit=limit)  # type: ignore[arg-type]  # fmt: a str the config validates
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"--{'format' if field == 'format' else field}: {first['msg']}") from None
    contexts = scenarios_from_config(cfg)
    check_contexts(contexts, path)
    return contexts


def check_contexts(contexts: Sequence[Scenario], path: str | None) -> None:
    """Refuse repeated ids and contexts the policy cannot reply to (empty, or not ending with the person)."""
    name = path or "the bundled scenarios"
    seen: set[str] = set()
    for sc in contexts:
        if sc.id in seen:
            raise DataError(f"{name}: context id {sc.id!r} appears twice; ids must be unique")
        seen.add(sc.id)
        if not sc.messages or sc.messages[-1]["role"] != "user":
            where = sc.meta.get("where") or sc.id
            raise DataError(
                f"{name}: context {where}: the dialogue is empty or does not end with the person's "
                "message; the data commands write the next supporter turn, so each context needs one"
            )


def context_key(scenario: Scenario) -> str:
    """A hash of what the context holds (id, dialogue, profile, reference, meta but its location)."""
    meta = {k: v for k, v in scenario.meta.items() if k not in LOCATION_META}
    data = [scenario.id, scenario.messages, scenario.profile, scenario.reference, meta]
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def scenario_row(scenario: Scenario, **meta: Any) -> dict[str, Any]:
    """``scenario`` as a row of our scenarios format, ``meta`` added to its ``meta``; without the
    location fields, which the reader sets to the new file's."""
    row: dict[str, Any] = {"id": scenario.id, "messages": list(scenario.messages)}
    if scenario.profile:
        row["profile"] = dict(scenario.profile)
    if scenario.reference is not None:
        row["reference"] = scenario.reference
    kept = {k: v for k, v in scenario.meta.items() if k not in LOCATION_META}
    row["meta"] = {**kept, **meta}
    return row
