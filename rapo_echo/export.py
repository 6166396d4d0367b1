"""``rapo-echo export RUN --to DIR [--merge] [--push-to-hub REPO]``: a run's model as a folder that travels.

DIR gets the run's model (``final/``, else the newest checkpoint's; or the checkpoint named), loadable
with plain ``transformers`` (or ``peft`` for an adapter), and a model card (``README.md``) holding the
run's config and results: the last step's metrics, the held-out validations and any evaluation folders
given with ``--eval``. ``--merge`` merges a LoRA adapter into its base. An adapter exported unmerged
names a base that plain ``peft`` loads from any working folder: a hub id as it is, a local model folder by
its absolute path, and rapo-echo's embedded model (``default``) or a ``.gguf`` base, which no plain
library loads, materialised beside it in ``DIR/base-model/`` and named by its absolute path.
``--push-to-hub REPO`` uploads DIR with ``huggingface_hub`` (the token from ``HF_TOKEN`` or
``hf auth login``; never from a config).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field

from rapo_echo.config import Flag, Strict, add_flags, section_from_args
from rapo_echo.errors import ConfigError, RapoEchoError
from rapo_echo.jsonl import read_jsonl
from rapo_echo.models import (
    DEFAULT_GGUF_NAME,
    DEFAULT_SPEC,
    adapter_base,
    is_model_folder,
    resolve,
    run_model_folder,
)

log = logging.getLogger(__name__)

CARD_FILE = "README.md"
BASE_DIR = "base-model"  # where an adapter's base that no plain library loads is materialised
# the metrics of a run's last step shown on the card, when the run logged them
CARD_METRICS = ("reward/mean", "reward/std", "loss/total", "kl/mean", "completion_len/mean", "valid")


class ExportConfig(Strict):
    """`rapo-echo export`: the run exported, where to, and whether to merge and push it."""

    run: Annotated[str, Flag(positional=True)] = Field(
        description="A training run folder, or one of its checkpoints/step-N."
    )
    to: Annotated[str, Flag(metavar="DIR")] = Field(description="The folder to write (new or empty).")
    merge: bool = Field(False, description="Merge a LoRA adapter into its base model.")
    eval: Annotated[list[str], Flag(metavar="EVAL_DIR")] = Field(
        default_factory=list, description="An eval folder to report on the card; repeatable."
    )
    push_to_hub: Annotated[str | None, Flag(metavar="REPO")] = Field(
        None, description="Upload the folder to this Hugging Face Hub repository."
    )
    private: bool = Field(False, description="With `push_to_hub`: create the repository private.")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="copy a run's model to a folder with a model card; merge LoRA; push to the Hugging Face Hub",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flags(p, ExportConfig, config=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = section_from_args(ExportConfig, args)
    out = export_run(cfg.run, cfg.to, merge=cfg.merge, evals=cfg.eval)
    print(f"exported: {out}")
    if cfg.push_to_hub:
        url = push_to_hub(out, cfg.push_to_hub, private=cfg.private)
        print(f"pushed: {url}")
    return 0


def find_model(run: str | Path) -> tuple[Path, Path]:
    """``(model folder, run folder)`` of a run folder (``final/``, else its newest checkpoint) or of one
    of its checkpoints (``checkpoints/step-N``)."""
    path = Path(run)
    if not path.is_dir():
        raise ConfigError(f"export: {path} is not a folder; give a training run folder or a checkpoint")
    if (path / "model").is_dir() and path.parent.name == "checkpoints":
        if not is_model_folder(path / "model"):
            raise ConfigError(f"export: {path / 'model'} holds no model weights")
        return path / "model", path.parent.parent
    folder = run_model_folder(path)
    if folder is None:
        raise ConfigError(
            f"export: {path} holds no final/ or checkpoints/step-N/model; is it a rapo-echo run folder?"
        )
    return folder, path


def export_run(
    run: str | Path, to: str | Path, *, merge: bool = False, evals: list[str] | None = None
) -> Path:
    """Write the run's model and its model card into ``to`` (new or empty); returns ``to``."""
    folder, run_dir = find_model(run)
    out = Path(to)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"export: --to {out} exists and is not an empty folder; name a new one")
    _check_destination(out, folder, run_dir)
    config = _read_config(run_dir)
    files = model_files(folder, run_dir)
    adapter = (folder / "adapter_config.json").is_file()
    base_note = None
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if adapter and merge:
            _merge(folder, tmp)
        else:
            if merge:
                log.info("export: %s holds full weights already; --merge changes nothing", folder)
            for f in files:
                shutil.copy2(f, tmp / f.name)
            if adapter:
                base_note = _rebase_adapter(folder, tmp, out)
        card = model_card(run_dir, folder, config, merged=adapter and merge, adapter=adapter and not merge,
                          evals=evals or [], base_note=base_note)  # fmt: skip
        (tmp / CARD_FILE).write_text(card, encoding="utf-8")
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _check_destination(out: Path, folder: Path, run_dir: Path) -> None:
    """Refuse an export folder inside the model folder being exported or inside the run's ``final/`` or
    ``checkpoints/`` (the copy would land in what it copies, and a later run would replace it)."""
    dest = out.resolve()
    for inside in (folder, run_dir / "final", run_dir / "checkpoints"):
        if dest.is_relative_to(inside.resolve()):
            raise ConfigError(
                f"export: --to {out} lies inside {inside}, part of the run being exported; name a folder "
                "outside it"
            )


def model_files(folder: Path, run_dir: Path) -> list[Path]:
    """The files of ``folder`` to copy, each checked: a link must stay inside the run (a link to a file
    elsewhere would carry that file into the export, and ``--push-to-hub`` to the Hub), and a weights file
    must be whole (:func:`check_weights`). ConfigError names the file."""
    root = run_dir.resolve()
    if not folder.resolve().is_relative_to(root):
        raise ConfigError(f"export: {folder} is a link to {folder.resolve()}, outside the run {run_dir}")
    files = []
    for f in sorted(folder.iterdir()):
        if f.is_symlink() and not f.resolve().is_relative_to(root):
            raise ConfigError(
                f"export: {f} is a link to {f.resolve()}, outside the run {run_dir}; an export copies only "
                "the run's own files: replace the link with the file, or remove it"
            )
        if f.is_file():
            check_weights(f)
            files.append(f)
    return files


def check_weights(path: Path) -> None:
    """ConfigError when a ``*.safetensors`` file is not whole: its header must parse and the tensors it
    declares must end exactly at the end of the file (a copy cut short by a full disk or a killed
    transfer fails here, not when someone loads the export)."""
    if path.suffix != ".safetensors":
        return
    size = path.stat().st_size
    why = None
    with path.open("rb") as fh:
        head = fh.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if length < 0 or 8 + length > size:
            why = f"its header is cut ({size} bytes in all)"
        else:
            try:
                header = json.loads(fh.read(length))
                end = max(
                    (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0
                )
            except (ValueError, TypeError, KeyError, IndexError, AttributeError):
                header, end = None, 0
                why = "its header is not a safetensors header"
            if header is not None and 8 + length + end != size:
                why = f"its header declares {8 + length + end} bytes and the file holds {size} (truncated?)"
    if why:
        raise ConfigError(f"export: {path} is not a whole safetensors file: {why}; nothing was exported")


def _read_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"export: {run_dir} has no config.yaml; is it a rapo-echo run folder?")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        why = type(exc).__name__
        raise ConfigError(f"export: {path}{line}: not a readable YAML config ({why})") from None
    return data if isinstance(data, dict) else {}


def _merge(folder: Path, out: Path) -> None:
    """Load the adapter over its base, merge, save the plain model and tokenizer."""
    from rapo_echo.models import load_model

    model, tok = load_model(str(folder), device="cpu")
    merged = model.merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    value_head = folder / "value_head.safetensors"
    if value_head.is_file():
        shutil.copy2(value_head, out / value_head.name)


def _rebase_adapter(folder: Path, out: Path, final: Path) -> str:
    """Name the exported adapter's base so that plain ``peft`` loads it from any working folder (peft reads
    a relative base against the working folder, and looks ``default`` up on the Hub): a hub id stays as it
    is, a local model folder is named by its absolute path, and a base no plain library loads (rapo-echo's
    embedded model, a ``.gguf`` file) is materialised in ``final/base-model/`` and named by that absolute
    path. Returns how the model card describes the base."""
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    named = cfg.get("base_model_name_or_path") or ""
    base = adapter_base(folder, named)
    resolved = resolve(base)
    if resolved.is_hub:
        return f"the Hub model `{base}`"
    if named == DEFAULT_SPEC or base.endswith(".gguf"):  # resolved is rapo-echo's converted copy
        shutil.copytree(resolved.path, out / BASE_DIR)
        where = (final / BASE_DIR).resolve()
        what = "rapo-echo's embedded model" if named == DEFAULT_SPEC else f"the GGUF model {base}"
        note = f"{what}, converted to a plain model folder in `{BASE_DIR}/` and named by its absolute path"
    else:
        where = Path(resolved.path).resolve()
        note = "a local model folder, named by its absolute path"
    cfg["base_model_name_or_path"] = str(where)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    log.info("export: the adapter's base is %s (%s)", where, note)
    return f"{note} (`{where}`): it loads from any working folder while that folder stays where it is"


def _base_model(config: dict[str, Any]) -> tuple[str, str | None]:
    """How the card names the base model, and its hub id when it has one."""
    name = str((config.get("model") or {}).get("name") or DEFAULT_SPEC)
    if name == DEFAULT_SPEC:
        return f"rapo-echo's embedded model (SmolLM2-135M-Instruct from {DEFAULT_GGUF_NAME})", None
    is_hub = name.count("/") == 1 and not Path(name).exists() and not name.startswith((".", "/", "~"))
    return (name, name) if is_hub else (f"the local model {name}", None)


def _table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "–" if v is None else str(v)

    head = "| " + " | ".join(keys) + " |\n| " + " | ".join("---" for _ in keys) + " |\n"
    return head + "".join("| " + " | ".join(cell(r.get(k)) for k in keys) + " |\n" for r in rows)


def _results(run_dir: Path, evals: list[str]) -> str:
    parts = []
    steps = [r for _, r in read_jsonl(run_dir / "metrics.jsonl", "metrics file") if isinstance(r, dict)]
    if steps:
        last = steps[-1]
        keys = ["step", *[k for k in CARD_METRICS if k in last]]
        parts.append(f"Last training step ({len(steps)} logged):\n\n" + _table([last], keys))
    vals = [r for _, r in read_jsonl(run_dir / "validation.jsonl", "validation file") if isinstance(r, dict)]
    if vals:
        keys = ["step", *sorted({k for r in vals for k in r if k.startswith("val/")})]
        parts.append("Held-out validation (`validation.jsonl`):\n\n" + _table(vals, keys))
        best = run_dir / "final" / "best.json"
        if best.is_file():
            parts.append(
                f"`final/` is the best-validated model: step {json.loads(best.read_text())['step']}."
            )
    for folder in evals:
        summary = Path(folder) / "summary.json"
        if not summary.is_file():
            raise ConfigError(f"export: --eval {folder}: no summary.json; is it a rapo-echo eval folder?")
        try:
            data = json.loads(summary.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"export: --eval {summary}: not a whole JSON file ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"export: --eval {summary}: holds a {type(data).__name__}, not a JSON object")
        metrics = {k: v for k, v in (data.get("metrics") or {}).items() if isinstance(v, (int, float))}
        name = data.get("benchmark", Path(folder).name)
        parts.append(f"Benchmark `{name}` ({data.get('n_cases', '?')} cases, `{folder}`):\n\n"
                     + _table([metrics], list(metrics)))  # fmt: skip
    return "\n\n".join(parts) if parts else "No metrics were logged."


def model_card(
    run_dir: Path,
    folder: Path,
    config: dict[str, Any],
    *,
    merged: bool,
    adapter: bool,
    evals: list[str],
    base_note: str | None = None,
) -> str:
    """The model card: Hub metadata (``huggingface_hub.ModelCardData``), how the model was trained, its
    results, how to load it, and the run's config as it was saved."""
    from huggingface_hub import ModelCardData

    algo = str(config.get("algo", "?"))
    base, hub_id = _base_model(config)
    data = ModelCardData(
        base_model=hub_id,
        library_name="peft" if adapter else "transformers",
        pipeline_tag="text-generation",
        tags=[
            "rapo-echo",
            algo,
            "reinforcement-learning",
            "empathetic-dialogue",
            *(["lora"] if adapter else []),
        ],
    )
    train = config.get("train") or {}
    rollout = config.get("rollout") or {}
    rewards = (
        ", ".join(str(r.get("name")) for r in config.get("rewards") or []) or "none (the algorithm's own)"
    )
    if adapter:
        load = (
            "```python\nfrom peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer\n\n"
            'model = AutoPeftModelForCausalLM.from_pretrained("PATH")  # PATH: this folder\n'
            'tokenizer = AutoTokenizer.from_pretrained("PATH")\n```\n\n'
            f"`adapter_config.json` names the base: {base_note or 'as the run named it'}. Moved to another "
            "machine, point `base_model_name_or_path` at the base there, or export with `--merge` for a "
            "folder that travels alone."
        )
    else:
        load = (
            "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            'model = AutoModelForCausalLM.from_pretrained("PATH")\n'
            'tokenizer = AutoTokenizer.from_pretrained("PATH")\n```'
        )
    where = folder.relative_to(run_dir) if folder.is_relative_to(run_dir) else folder
    what = (
        "a LoRA adapter"
        if adapter
        else ("the LoRA adapter merged into its base" if merged else "full weights")
    )
    text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    return f"""---
{data.to_yaml()}
---

# {Path(run_dir).resolve().name}

An empathetic, emotionally supportive dialogue model trained with rapo-echo (`--algo {algo}`)
from {base}: {what} (`{where}` of the run).

- steps: {_steps(folder, run_dir, train)}, contexts per step: {rollout.get("batch_size", "?")}, replies per
  context: {rollout.get("group_size", "?")}, learning rate: {train.get("lr", "?")}
- rewards: {rewards}

## Results

{_results(run_dir, evals)}

The embedded 135M model and small simulators or judges give numbers that say only that the pipeline
runs; see rapo-echo's docs/limits.md.

## Use

{load}

## Training config

The run's `config.yaml` (secrets are never written to it):

```yaml
{text}```
"""


def _steps(folder: Path, run_dir: Path, train: dict[str, Any]) -> str:
    """The steps the exported model was trained for: a checkpoint's own step, else the last step the run
    logged; "N of M" when the run stopped before its ``max_steps``."""
    planned = train.get("max_steps")
    step = folder.parent.name
    if folder.name == "model" and folder.parent.parent.name == "checkpoints" and step[5:].isdigit():
        done: Any = int(step[5:])
    else:
        rows = [r for _, r in read_jsonl(run_dir / "metrics.jsonl", "metrics file") if isinstance(r, dict)]
        steps = [r["step"] for r in rows if isinstance(r.get("step"), int)]
        done = max(steps) if steps else planned
    if done is None:
        return "?"
    if isinstance(planned, int) and isinstance(done, int) and done < planned:
        return f"{done} of the {planned} planned (the run stopped early)"
    return str(done)


def hub_api() -> Any:
    """The ``huggingface_hub`` client that uploads (one place, so tests can stand in for the Hub here)."""
    from huggingface_hub import HfApi

    return HfApi()


def push_to_hub(folder: str | Path, repo: str, *, private: bool = False) -> str:
    """Create ``repo`` (if it does not exist) and upload ``folder`` to it; returns the commit URL."""
    api = hub_api()
    try:
        api.create_repo(repo, private=private, exist_ok=True, repo_type="model")
        info = api.upload_folder(
            repo_id=repo,
            folder_path=str(folder),
            repo_type="model",
            commit_message=f"rapo-echo export of {Path(folder).name}",
        )
    except Exception as exc:  # HfHubHTTPError, connection errors: the export itself is kept
        raise RapoEchoError(
            f"--push-to-hub {repo}: the upload failed ({type(exc).__name__}: {exc}); the exported folder "
            f"{folder} is complete: push it later with: hf upload {repo} {folder}"
        ) from exc
    return str(getattr(info, "commit_url", info))
