"""Run a benchmark into an output folder: batched, resumable, summarised from the JSONL (docs/benchmarks.md).

Cases are taken in batches (:func:`batch_size`); each batch advances together inside the benchmark.
Every finished case is appended to ``results.jsonl`` at once, so an evaluation started again with the
same arguments skips the cases already there; ``summary.json`` is recomputed from every record in the
file. With ``settings.repeats`` N repeat ``k`` of a case runs with :func:`repeat_seed`'s seed as
``<case id>#r<k>`` (:func:`with_repeats`). The benchmark card (:mod:`rapo_echo.benchmarks.card`) is
written before the first case runs; a resume whose instrument changed is refused."""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rapo_echo import progress
from rapo_echo.benchmarks.base import Benchmark, Case, EvalSettings, Record, Roles, repeat_seed
from rapo_echo.benchmarks.card import CARD_FILE, build_card, check_card_resume, file_digest, read_card
from rapo_echo.benchmarks.figures import METHOD, by_repeat, figures_of, mean_metrics, run_figures
from rapo_echo.benchmarks.results import (
    CONFIG_FILE,
    RESULTS_FILE,
    SUMMARY_FILE,
    ResultWriter,
    read_records,
    write_json_atomic,
)
from rapo_echo.config import redacted
from rapo_echo.engines import failed_items
from rapo_echo.engines.concurrency import calls_concurrently
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.rundir import DirLock, check_writable, held_files

log = logging.getLogger(__name__)

# name -> "module:Class", imported only when chosen (each benchmark package loads its own role players)
BENCHMARKS: dict[str, str] = {
    "esconv": "rapo_echo.benchmarks.esconv.interactive:EsconvInteractive",
    "esconv-ref": "rapo_echo.benchmarks.esconv.reference:EsconvReference",
    "sotopia": "rapo_echo.benchmarks.sotopia.run:Sotopia",
    "epm": "rapo_echo.benchmarks.epm.run:Epm",
    "sage": "rapo_echo.benchmarks.sage.run:Sage",
    "fidelity": "rapo_echo.benchmarks.fidelity:Fidelity",
}
# settings that do not change what a case's result means, so they may differ when resuming (repeats: a
# larger number adds repeats to a finished run)
RESUME_FREE = ("batch_size", "written_at", "repeats")
LOCAL_BATCH = 8  # cases per batch when every role runs on a local engine
REMOTE_WAVE = 512  # cases per wave when a role is served (a crash loses at most one wave's cases)


def repeat_id(case_id: str, repeat: int) -> str:
    """The record id of a case's repeat (the case's own id for the first)."""
    return case_id if repeat == 0 else f"{case_id}#r{repeat}"


def with_repeats(cases: Sequence[Case], repeats: int) -> list[Case]:
    """Each case ``repeats`` times, repeat-major: repeat ``k`` as :func:`repeat_id` with ``meta``'s
    ``case`` and ``repeat`` set."""
    return [
        Case(repeat_id(c.id, k), c.data, {**c.meta, "case": c.id, "repeat": k})
        for k in range(repeats)
        for c in cases
    ]


def batch_size(settings: EvalSettings, roles: Roles) -> int:
    """Cases run together: ``settings.batch_size`` when given, else :data:`REMOTE_WAVE` when any role's
    engine is served (every case's requests in flight at once), else :data:`LOCAL_BATCH`."""
    if settings.batch_size is not None:
        return settings.batch_size
    served = any(calls_concurrently(getattr(roles, r)) for r in ("policy", "simulator", "judge"))
    return REMOTE_WAVE if served else LOCAL_BATCH


def get_benchmark(name: str) -> Benchmark:
    """A benchmark by name (``esconv``, ``esconv-ref``, ``sotopia``, ``epm``, ``sage``, ``fidelity``)."""
    if name not in BENCHMARKS:
        raise ConfigError(f"unknown benchmark {name!r}; available: {', '.join(BENCHMARKS)}")
    module, _, cls = BENCHMARKS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()


def data_or_default(benchmark: Benchmark, data: str | None) -> str | None:
    """``data``, or the benchmark's bundled data (``default_data``) when none is given, said in a warning
    (ours, for trying the pipeline: its figures are not comparable with published ones). ``eval`` and
    :func:`rapo_echo.evaluate` both read a benchmark's data through this."""
    default = getattr(benchmark, "default_data", None)
    if data is not None or not default:
        return data
    log.warning(
        "%s: no data given, so the bundled %s (ours, for trying the pipeline; its figures are not "
        "comparable with published ones). A real run: --data (data= in Python) with the benchmark's data "
        "(docs/data.md)",
        benchmark.name,
        default,
    )
    return default


def eval_config(
    benchmark: str,
    models: dict[str, str],
    data: str | None,
    settings: EvalSettings,
    protocol: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What ``config.json`` records: benchmark, model per role, data file (and, for a file on disk, the
    SHA-256 of its content, so that a resume refuses a file changed in place), settings, and the
    benchmark's ``protocol`` (e.g. the simulator prompts' version), secrets redacted."""
    config = {
        "benchmark": benchmark,
        "models": models,
        "data": data,
        "settings": settings.model_dump(),
    }
    digest = data_digest(data)
    if digest is not None:
        config["data_sha256"] = digest
    if protocol:
        config["protocol"] = protocol
    return redacted(config)


def data_digest(data: str | None) -> str | None:
    """The SHA-256 of a data file's bytes (None for no data or a bundled file: the card hashes those)."""
    if not data or data.startswith("bundled:"):
        return None
    return file_digest(data)


def check_output(output: Path, config: dict[str, Any], what: str = "evaluation") -> None:
    """An output folder holds nothing, or this same evaluation (:func:`check_resume`): a folder with other
    files (a training run, another tool's output) is refused, never written into. ``what`` names the
    folder's kind of content in the messages (the data commands reuse this check)."""
    shown = held_files(output)
    if shown and not (output / CONFIG_FILE).is_file():
        raise ConfigError(
            f"--output {output} is not empty ({shown}) and holds no {what} ({CONFIG_FILE}); choose an "
            "empty --output"
        )
    check_resume(output, config, what)


def claim_output(
    output: str | Path, configs: dict[Path, dict[str, Any]], what: str = "evaluation"
) -> DirLock:
    """Lock ``output`` (one process per folder) and check each folder to be written there with its config
    (:func:`check_output`); the lock is released when a check fails."""
    lock = DirLock(check_writable(output)).acquire()
    try:
        for folder, config in configs.items():
            check_output(Path(folder), config, what)
    except BaseException:
        lock.release()
        raise
    return lock


def check_resume(output: Path, config: dict[str, Any], what: str = "evaluation") -> None:
    """Refuse to continue an output folder written with a different benchmark, model, data or setting."""
    old_path = output / CONFIG_FILE
    if not old_path.exists():
        return
    try:
        old = json.loads(old_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{old_path}: not valid JSON ({exc})") from exc
    flat_old, flat_new = _flatten(old), _flatten(config)
    if "data_sha256" in flat_old and flat_old["data_sha256"] != flat_new.get("data_sha256"):
        raise ConfigError(
            f"{output} holds an evaluation of {config.get('data')} whose content has changed since (SHA-256 "
            f"{str(flat_old['data_sha256'])[:12]}... then, {str(flat_new.get('data_sha256'))[:12]}... now): "
            "its "
            "finished cases would be mixed with cases of the new content. Restore the file, or evaluate "
            "it into a new --output"
        )
    defaults = {
        f"settings.{name}": f.get_default(call_default_factory=True)
        for name, f in EvalSettings.model_fields.items()
    }
    for key in sorted(set(flat_old) | set(flat_new)):
        if key.split(".")[-1] in RESUME_FREE or key == "data_sha256":  # an older folder has no hash
            continue
        if key not in flat_old and key in defaults and flat_new.get(key) == defaults[key]:
            continue  # a setting added since that folder was written, at its default
        if flat_old.get(key) != flat_new.get(key):
            raise ConfigError(
                f"{output} holds {_article(what)} {what} with {key}={flat_old.get(key)!r}, this run has "
                f"{flat_new.get(key)!r}; resume with the same arguments or choose another --output"
            )


def _article(noun: str) -> str:
    return "an" if noun[:1] in "aeiou" else "a"


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def run_eval(
    benchmark: Benchmark,
    roles: Roles,
    settings: EvalSettings,
    output: str | Path,
    *,
    data: str | None = None,
    limit: int | None = None,
    models: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Evaluate every case not yet in ``output/results.jsonl``; returns the summary (also written)."""
    output = Path(output)
    if settings.repeats > 1 and not getattr(benchmark, "repeatable", True):
        raise ConfigError(f"{benchmark.name}: --repeats does not apply (its intervals are its own)")
    cases = benchmark.load_cases(data, settings)
    if limit is not None:
        if limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {limit}")
        # a benchmark may count its limit in larger units (fidelity: conversations, not rated points)
        limit_cases = getattr(benchmark, "limit_cases", None)
        cases = limit_cases(cases, limit) if limit_cases else cases[:limit]
    runs = with_repeats(cases, settings.repeats)
    ids = [c.id for c in runs]
    if len(set(ids)) != len(ids):
        raise DataError(
            f"{data}: case ids are not unique (first repeat: {next(i for i in ids if ids.count(i) > 1)!r})"
        )
    config = eval_config(benchmark.name, models or {}, data, settings, getattr(benchmark, "protocol", None))
    with claim_output(output, {output: config}):  # one process per output folder, its own evaluation only
        card = build_card(benchmark, roles, models or {}, data, settings, cases)
        check_card_resume(output, card)
        write_json_atomic(output / CARD_FILE, card)
        return _run_cases(benchmark, roles, settings, output, runs, config)


def _run_cases(
    benchmark: Benchmark,
    roles: Roles,
    settings: EvalSettings,
    output: Path,
    cases: list[Case],
    config: dict[str, Any],
) -> dict[str, Any]:
    write_json_atomic(output / CONFIG_FILE, config)
    done = {r["id"] for r in read_records(output / RESULTS_FILE)}
    pending = [c for c in cases if c.id not in done]
    log.info(
        "%s: %d cases, %d already done, %d to run",
        benchmark.name,
        len(cases),
        len(cases) - len(pending),
        len(pending),
    )
    cuts_before = prompt_cuts(roles)
    engines = (roles.policy, roles.simulator, roles.judge)
    failed_before = failed_items(*engines)
    size = batch_size(settings, roles)
    initial = len(cases) - len(pending)
    bar = progress.task(benchmark.name, total=len(cases), initial=initial, unit="case")
    finished = len(cases) - len(pending)
    with bar as cases_bar, ResultWriter(output / RESULTS_FILE) as writer:
        for repeat in sorted({c.meta.get("repeat", 0) for c in pending}):
            mine = [c for c in pending if c.meta.get("repeat", 0) == repeat]
            own = settings.model_copy(update={"seed": repeat_seed(settings.seed, repeat)})
            for start in range(0, len(mine), size):
                batch = mine[start : start + size]
                _run_one_batch(benchmark, batch, roles, own, writer, cases_bar)
                finished += len(batch)
                log.info("%s: %d/%d cases done", benchmark.name, finished, len(cases))
    cut = {role: n - cuts_before.get(role, 0) for role, n in prompt_cuts(roles).items()}
    if any(cut.values()):
        log.warning(
            "%s: prompts cut to fit the model's context (oldest turns first): %s",
            benchmark.name,
            ", ".join(f"{role} {n}" for role, n in cut.items() if n),
        )
    failed = failed_items(*engines) - failed_before
    if failed:
        log.warning(
            "%s: %d remote requests failed for good; their cases are invalid (n_invalid), the rest kept",
            benchmark.name,
            failed,
        )
    return write_summary(output, benchmark, ids=[c.id for c in cases], extra={"remote_failed": failed})


def prompt_cuts(roles: Roles) -> dict[str, int]:
    """How many prompts each role's engine has cut to fit its context so far (engines that count)."""
    out: dict[str, int] = {}
    for role in ("policy", "simulator", "judge"):
        engine = getattr(roles, role)
        if engine is not None and isinstance(getattr(engine, "prompt_cuts", None), int):
            out[role] = engine.prompt_cuts
    return out


def _run_one_batch(
    benchmark: Benchmark,
    batch: Sequence[Case],
    roles: Roles,
    settings: EvalSettings,
    writer: ResultWriter,
    bar: progress.Task | None = None,
) -> None:
    waiting = {c.id for c in batch}
    repeats = {c.id: c.meta for c in batch if c.meta.get("repeat", 0)}

    def emit(record: Record) -> None:
        if record.get("id") not in waiting:
            raise RuntimeError(
                f"{benchmark.name}: emitted a record for {record.get('id')!r}, which is not pending"
            )
        waiting.discard(record["id"])
        meta = repeats.get(record["id"])
        if meta is not None:
            record = {**record, "case": meta["case"], "repeat": meta["repeat"]}
        writer.append(record)
        if bar is not None:
            bar.update(1)

    benchmark.run_batch(batch, roles, settings, emit)
    if waiting:
        raise RuntimeError(f"{benchmark.name}: batch ended without results for {sorted(waiting)}")


def compute_summary(
    output: str | Path,
    benchmark: Benchmark | None = None,
    *,
    expected: int | None = None,
    ids: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The summary of an output folder, computed from its ``results.jsonl`` (benchmark from ``config.json``
    when not given): of the cases ``ids`` when given (the cases a run asked for, e.g. with ``--limit``),
    else of every record."""
    output = Path(output)
    config: dict[str, Any] = {}
    if (output / CONFIG_FILE).exists():
        try:
            config = json.loads((output / CONFIG_FILE).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{output / CONFIG_FILE}: not valid JSON ({exc})") from exc
    if benchmark is None:
        if "benchmark" not in config:
            raise DataError(
                f"{output}: no {CONFIG_FILE} naming the benchmark; is this an eval output folder?"
            )
        benchmark = get_benchmark(config["benchmark"])
    records = read_records(output / RESULTS_FILE)
    if ids is not None:
        wanted = set(ids)
        records = [r for r in records if r["id"] in wanted]
        expected = len(wanted)
    n_valid = sum(bool(r.get("valid")) for r in records)
    repeats = by_repeat(records)
    path = output / RESULTS_FILE
    metrics = mean_metrics([_summarize(benchmark, rs, path) for rs in repeats.values()]) if records else {}
    figures = run_figures(records, figures_of(benchmark, records))
    metrics.update({k: f["mean"] for k, f in figures.items() if k.startswith("judge/")})
    summary = {
        "benchmark": benchmark.name,
        "models": config.get("models", {}),
        "data": config.get("data"),
        "n_cases": len(records),
        "n_valid": n_valid,
        "n_invalid": len(records) - n_valid,
        "n_expected": expected,
        "complete": expected is None or len(records) >= expected,
        "repeats": len(repeats),
        "metrics": metrics,
        "headline": [list(h) for h in benchmark.headline],
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if figures:
        summary.update({"figures": figures, "figures_method": METHOD})
    if config:
        summary["card"] = read_card(output, config)
    return summary


def _summarize(benchmark: Benchmark, records: list[dict[str, Any]], path: Path) -> dict[str, Any]:
    """``benchmark.summarize``; a record it cannot read (edited by hand, or from another version) is a
    :class:`DataError` naming the record, found by summarising each record alone."""
    if not records:
        return {}
    try:
        return benchmark.summarize(records)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as exc:
        for r in records:
            try:
                benchmark.summarize([r])
            except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as one:
                raise DataError(
                    f"{path}: the record of case {r['id']!r} has a malformed field ({type(one).__name__}: "
                    f"{one}); delete its line and run the eval again to recompute that case"
                ) from None
        raise DataError(f"{path}: cannot summarise the results ({type(exc).__name__}: {exc})") from None


def write_summary(
    output: str | Path,
    benchmark: Benchmark,
    *,
    expected: int | None = None,
    ids: Sequence[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Summarise ``output/results.jsonl`` into ``output/summary.json`` (with ``extra`` keys, figures of this
    run that the records do not hold) and return it."""
    summary = {**compute_summary(output, benchmark, expected=expected, ids=ids), **(extra or {})}
    write_json_atomic(Path(output) / SUMMARY_FILE, summary)
    return summary
