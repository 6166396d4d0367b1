"""The benchmark card: what a figure was measured with (``card.json``, and ``summary.json``'s ``card``),
and the check that two runs were measured alike. Its parts and what each holds: docs/reading-results.md
(The benchmark card).

Prompt hashes: the SHA-256 of the wording of each module that writes a role's prompts (its string
constants in order, docstrings left out), so a changed word in any prompt changes its module's hash,
while a change of code alone does not."""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rapo_echo import __version__
from rapo_echo.benchmarks.base import Case, EvalSettings, Roles, repeat_seed
from rapo_echo.errors import ConfigError, DataError

CARD_FILE = "card.json"
CARD_VERSION = 1
FINGERPRINT_VALUES = 256  # values of each weight tensor the local model's fingerprint reads


def digest(text: str | bytes) -> str:
    """SHA-256 hex digest of a text (UTF-8) or bytes."""
    return hashlib.sha256(text.encode("utf-8") if isinstance(text, str) else text).hexdigest()


# ------------------------------------------------------------------------------------------ the parts
def prompt_wording(module: str) -> str:
    """The string constants of a module's source in order, docstrings left out, one per line (what its
    prompts are made of)."""
    path = importlib.import_module(module).__file__
    if path is None:
        raise ConfigError(f"card: module {module} has no source file")
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    docstrings = {
        id(first.value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and ast.get_docstring(node, clean=False) is not None
        and isinstance(first := node.body[0], ast.Expr)
    }
    strings = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]
    return "\n".join(strings)


def prompt_hashes(modules: Sequence[str], system_prompt: str | None) -> dict[str, str]:
    """The hash of each prompt module's wording (:func:`prompt_wording`) and of the policy's system
    prompt (``policy system prompt``: the text sent, or ``none``)."""
    out = {m: digest(prompt_wording(m)) for m in modules}
    out["policy system prompt"] = digest(system_prompt) if system_prompt else "none"
    return out


def weights_fingerprint(model: Any) -> str | None:
    """A SHA-256 over the first :data:`FINGERPRINT_VALUES` values of every weight tensor (names and
    shapes too): two fine-tunes of one base model differ, the same weights agree; None without weights."""
    named = getattr(model, "named_parameters", None)
    if not callable(named):
        return None
    h = hashlib.sha256()
    for name, p in named():
        flat = p.detach().reshape(-1)[:FINGERPRINT_VALUES].float().cpu().numpy()
        h.update(f"{name}:{tuple(p.shape)}".encode())
        h.update(flat.tobytes())
    return h.hexdigest()


def engine_identity(engine: Any, spec: str | None) -> dict[str, Any]:
    """The model behind an engine as it reports itself: a served engine's
    :meth:`~rapo_echo.engines.openai_engine.OpenAIEngine.served_identity` (its ``/v1/models`` entry and
    server version), a local model's type, parameter count, dtype and weights fingerprint; ``spec`` is the
    command line's."""
    out: dict[str, Any] = {"spec": spec, "engine": type(engine).__name__}
    served = getattr(engine, "served_identity", None)
    if callable(served):
        return {**out, **served()}
    model = getattr(engine, "model", None)
    config = getattr(model, "config", None)
    if config is not None:
        out["model_type"] = getattr(config, "model_type", None)
        params = getattr(model, "parameters", None)
        out["parameters"] = sum(p.numel() for p in params()) if callable(params) else None
        out["dtype"] = str(getattr(model, "dtype", None))
        out["weights_sha256"] = weights_fingerprint(model)
    return out


def code_version() -> dict[str, Any]:
    """The rapo-echo version; the git commit and whether the tracked files have changes, where the
    package runs from a git checkout (None otherwise)."""
    folder = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"version": __version__, "commit": commit, "dirty": None if status is None else bool(status)}


def cases_digest(cases: Sequence[Case]) -> str:
    """A hash of the cases as the benchmark read them: each case's id and data (its ``repr``)."""
    h = hashlib.sha256()
    for c in cases:
        h.update(f"{c.id}\n{c.data!r}\n".encode())
    return h.hexdigest()


def file_digest(path: str | None) -> str | None:
    """The SHA-256 of a data file's bytes (a bundled file's too); None for none or a folder."""
    if not path:
        return None
    if path.startswith("bundled:"):
        from rapo_echo.data.files import bundled_file

        return digest(bundled_file(path[len("bundled:") :]).read_bytes())
    p = Path(path)
    if not p.is_file():
        return None
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sampling(settings: EvalSettings, simulator_tokens: int | None) -> dict[str, dict[str, Any]]:
    """Each role's sampling settings (the simulator's reply length as the benchmark resolves it)."""
    return {
        "policy": {"temperature": settings.temperature, "max_new_tokens": settings.max_new_tokens},
        "simulator": {
            "temperature": settings.simulator_temperature,
            "max_new_tokens": simulator_tokens
            or settings.simulator_max_new_tokens
            or settings.max_new_tokens,
            "retries": settings.judge_retries,
        },
        "judge": {
            "temperature": 0.0,
            "max_new_tokens": settings.judge_max_new_tokens,
            "retries": settings.judge_retries,
            "logprobs": settings.judge_logprobs,
        },
    }


# ------------------------------------------------------------------------------------------ the card
def build_card(
    benchmark: Any,
    roles: Roles,
    models: Mapping[str, str],
    data: str | None,
    settings: EvalSettings,
    cases: Sequence[Case],
) -> dict[str, Any]:
    """The card of an evaluation about to run (``cases``: the cases it asked for, one repeat)."""
    details = benchmark.card_details(settings) if hasattr(benchmark, "card_details") else {}
    episode = dict(details.get("episode", {}))
    instrument: dict[str, Any] = {
        "benchmark": benchmark.name,
        "protocol": getattr(benchmark, "protocol", None),
    }
    for role in ("simulator", "judge"):
        if role in benchmark.roles and getattr(roles, role) is not None:
            instrument[role] = engine_identity(getattr(roles, role), models.get(role))
    roles_sampling = sampling(settings, details.get("simulator_max_new_tokens"))
    instrument["sampling"] = {r: roles_sampling[r] for r in ("simulator", "judge") if r in benchmark.roles}
    instrument["episode"] = episode
    prompts = prompt_hashes(getattr(benchmark, "prompt_modules", ()), details.get("system_prompt"))
    instrument["prompts"] = {k: v for k, v in prompts.items() if k != "policy system prompt"}
    instrument["data"] = {
        "path": data,
        "file_sha256": file_digest(data),
        "cases": len(cases),
        "cases_sha256": cases_digest(cases),
    }
    return {
        "card_version": CARD_VERSION,
        "instrument": instrument,
        "under_test": {
            "policy": engine_identity(roles.policy, models.get("policy"))
            if "policy" in benchmark.roles
            else None,
            "sampling": roles_sampling["policy"],
            "system_prompt_sha256": prompts["policy system prompt"],
        },
        "seeds": {
            "seed": settings.seed,
            "repeats": [repeat_seed(settings.seed, k) for k in range(settings.repeats)],
        },
        "measures": {
            "repeats": settings.repeats,
            "judge_recheck": settings.judge_recheck,
            "state_probe": settings.state_probe,
        },
        "code": code_version(),
    }


def card_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A partial card for an evaluation written before cards existed (its ``config.json``): the models as
    specified, the settings and the data hash; marked ``partial``."""
    settings = config.get("settings", {})
    models = config.get("models", {})
    instrument: dict[str, Any] = {"benchmark": config.get("benchmark"), "protocol": config.get("protocol")}
    for role in ("simulator", "judge"):
        if role in models:
            instrument[role] = {"spec": models[role]}
    instrument["settings"] = {k: v for k, v in settings.items() if k not in ("batch_size", "seed")}
    instrument["data"] = {"path": config.get("data"), "file_sha256": config.get("data_sha256")}
    return {
        "card_version": CARD_VERSION,
        "partial": True,
        "instrument": instrument,
        "under_test": {"policy": {"spec": models.get("policy")}},
        "seeds": {"seed": settings.get("seed")},
    }


def read_card(output: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    """An evaluation folder's card (``card.json``), or the partial one of its ``config.json``."""
    path = Path(output) / CARD_FILE
    if not path.is_file():
        return card_from_config(config)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from exc


# ------------------------------------------------------------------------------------------ comparing
def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, Mapping):
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}."))
    return out


def _identity_view(ident: Any) -> Any:
    """What of a role's identity is compared: the model as reported (not the spec it was reached by)
    where the engine reports one, else the spec."""
    if not isinstance(ident, Mapping):
        return ident
    reported = {k: v for k, v in ident.items() if k != "spec"}
    if any(k in reported for k in ("id", "weights_sha256", "model_type")):
        return reported
    return dict(ident)


def comparable_view(card: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened instrument of a card, as compared (data by content where both have a hash)."""
    instrument = dict(card.get("instrument") or {})
    for role in ("simulator", "judge"):
        if role in instrument:
            instrument[role] = _identity_view(instrument[role])
    data = dict(instrument.get("data") or {})
    if data.get("cases_sha256") or data.get("file_sha256"):
        data.pop("path", None)
    instrument["data"] = data
    return _flatten(instrument)


def card_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """What differs between two cards' instruments, one ``key: A vs B`` line each (empty when they agree).
    A key that only one card has (a partial card of an older folder) counts when the other's value is
    set, except for keys a partial card cannot know."""
    va, vb = comparable_view(a), comparable_view(b)
    partial = a.get("partial") or b.get("partial")
    out = []
    for key in sorted(set(va) | set(vb)):
        if va.get(key) == vb.get(key):
            continue
        if partial and (key not in va or key not in vb):
            continue  # an older folder's card knows less: only what both know is compared
        if key == "data.cases_sha256" and va.get("data.cases") != vb.get("data.cases"):
            continue  # the case count says it
        out.append(f"{key}: {_short(va.get(key))} vs {_short(vb.get(key))}")
    return out


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12] + "..."
    return text if len(text) <= 80 else text[:77] + "..."


def check_card_resume(output: Path, card: Mapping[str, Any]) -> None:
    """Refuse to resume an evaluation whose instrument changed since it started (the model behind a URL,
    a prompt's wording, the cases): its finished cases would be mixed with cases measured otherwise."""
    path = Path(output) / CARD_FILE
    if not path.is_file():
        return
    old = read_card(output, {})
    old_data = dict(old.get("instrument", {}).get("data", {}))
    new_data = dict(card.get("instrument", {}).get("data", {}))
    for d in (old_data, new_data):  # a resume may ask for more or fewer cases of the same data
        d.pop("cases", None)
        d.pop("cases_sha256", None)
    old = {**old, "instrument": {**old.get("instrument", {}), "data": old_data}}
    new = {**card, "instrument": {**card.get("instrument", {}), "data": new_data}}
    diffs = card_differences(old, new)
    if diffs:
        raise ConfigError(
            f"{output} holds an evaluation measured with another instrument ({CARD_FILE}): "
            + "; ".join(diffs)
            + ". Its finished cases would be mixed with cases measured otherwise: evaluate into a new "
            "--output"
        )
