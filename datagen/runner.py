"""Run a data pipeline over contexts into an output folder: batched, resumable, with progress shown (bars
on a terminal, a line every half minute in a log: :mod:`rapo_echo.progress`), stopped cleanly by a signal.

The folder's files and their rules are the benchmarks' (:mod:`rapo_echo.benchmarks.runner` and
:mod:`rapo_echo.benchmarks.results`, reused as they are): ``config.json`` records the command, the model of
each role, the data and every setting, and a resume with any of them changed is refused
(:func:`~rapo_echo.benchmarks.runner.claim_output`); one process holds the folder at a time;
``results.jsonl`` gets one fsynced line per finished context, so a killed command, started again with the
same arguments, skips the contexts already there. Each record also holds its context's
:func:`~rapo_echo.datagen.contexts.context_key`: a context whose content changed under the
same id is refused, never mixed in. ``summary.json`` and the dataset the next command reads are recomputed
from every record of the asked contexts, in their input order, each time the command ends.

Contexts are taken in chunks of ``batch_size``; the pipeline runs each stage of a chunk as one batched
engine call. A remote failure (an :class:`~rapo_echo.errors.EngineError` other than a missing capability)
costs only the contexts it hits: the chunk is split in halves and run again until the failing contexts
are alone; those are left out of ``results.jsonl`` (the next run tries them again) and counted. Two
breakers end a run early, with its outputs written and ``summary.json``'s ``stopped`` saying why (the same
command resumes): :data:`FAILED_CHUNKS_TO_STOP` chunks in a row that lost every context (an endpoint that
refuses everything, e.g. a ``Retry-After`` of a day), and ``timeout_s`` (``--timeout-minutes``) reached
before the next chunk.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from rapo_echo import progress as show_progress
from rapo_echo.atomic import write_text_atomic
from rapo_echo.benchmarks import results  # the folder's files and their rules are the benchmarks'
from rapo_echo.benchmarks.runner import claim_output
from rapo_echo.datagen.contexts import context_key
from rapo_echo.errors import CapabilityError, ConfigError, EngineError
from rapo_echo.stopping import SignalStop, Stopped, stop_on_signals
from rapo_echo.types import Scenario

log = logging.getLogger(__name__)
Record = dict[str, Any]
FAILED_CHUNKS_TO_STOP = 2  # chunks in a row that lost every context: the endpoint is refusing; stop
WHAT = "data command"  # what check_resume calls the folder's content in its messages


class Pipeline(Protocol):
    """One data command: its name, the dataset file it writes, and how it turns contexts into records."""

    name: str
    dataset_file: str

    def run_chunk(self, contexts: Sequence[Scenario]) -> list[Record]:
        """One record per context, in order (each stage one batched engine call over the chunk)."""
        ...

    def export(self, items: Sequence[tuple[Scenario, Record]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The dataset's rows and the summary's figures, from each asked context with its record."""
        ...


def data_config(
    command: str,
    models: dict[str, str],
    data: str | None,
    fmt: str,
    settings: dict[str, Any],
    protocol: dict[str, Any],
) -> dict[str, Any]:
    """What ``config.json`` records (and a resume must match): command, model per role, data file and
    format, settings, and the prompts' fingerprint (``protocol``); as JSON reads it back (a tuple setting
    is a list), so that a resume compares like with like."""
    from rapo_echo.config import redacted

    config = {
        "command": command,
        "models": models,
        "data": data,
        "format": fmt,
        "settings": settings,
        "protocol": protocol,
    }
    return json.loads(json.dumps(redacted(config)))


def run_pipeline(
    pipeline: Pipeline,
    contexts: Sequence[Scenario],
    output: str | Path,
    config: dict[str, Any],
    *,
    batch_size: int,
    progress: bool = True,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Run ``pipeline`` on every context not yet in ``output/results.jsonl``; write the dataset and
    ``summary.json``, and return the summary. The run stops early (module doc) after
    :data:`FAILED_CHUNKS_TO_STOP` chunks in a row lost every context, or once ``timeout_s`` seconds
    passed."""
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {batch_size}")
    output = Path(output)
    with claim_output(output, {output: config}, what=WHAT):
        results.write_json_atomic(output / results.CONFIG_FILE, config)
        done = _finished(output / results.RESULTS_FILE, contexts)
        pending = [sc for sc in contexts if sc.id not in done]
        n, todo = len(contexts), len(pending)
        log.info("%s: %d contexts, %d already done, %d to run", pipeline.name, n, n - todo, todo)
        failed: dict[str, str] = {}
        stopped: str | None = None
        lost_chunks = 0
        t0 = time.monotonic()
        if progress:
            show_progress.enable()
        bar = show_progress.start(pipeline.name, len(contexts), "context", len(contexts) - len(pending))
        try:
            with stop_on_signals(), results.ResultWriter(output / results.RESULTS_FILE) as writer:
                for start in range(0, len(pending), batch_size):
                    if timeout_s is not None and time.monotonic() - t0 >= timeout_s:
                        stopped = f"timeout: {timeout_s / 60:g} minutes passed (--timeout-minutes)"
                        break
                    chunk = pending[start : start + batch_size]
                    records, lost = _run_isolated(pipeline, chunk)
                    for record in records:
                        writer.append(record)
                    failed.update(lost)
                    lost_chunks = lost_chunks + 1 if not records else 0
                    bar.update(len(chunk))
                    log.info(
                        "%s: %d/%d contexts done%s",
                        pipeline.name,
                        len(contexts) - len(pending) + start + len(chunk) - len(failed),
                        len(contexts),
                        f" ({len(failed)} failed)" if failed else "",
                    )
                    if lost_chunks >= FAILED_CHUNKS_TO_STOP:
                        last = next(iter(lost.values()))
                        stopped = f"{lost_chunks} chunks in a row lost every context (last: {last})"
                        break
        except SignalStop as stop:  # what is in results.jsonl stays; the chunk in flight is run again
            summary = _write_outputs(pipeline, output, contexts, failed, f"stopped by {stop.name}")
            raise Stopped(
                f"{pipeline.name}: stopped by {stop.name}: {summary['n_done']} of {len(contexts)} contexts "
                f"are saved in {output / results.RESULTS_FILE} (the chunk in flight is not), counted in "
                f"{output / results.SUMMARY_FILE}; run the same command again to resume",
                stop.name,
            ) from None
        finally:
            bar.close()
        if stopped:
            log.warning("%s: stopped early, %s; run the same command again to resume", pipeline.name, stopped)
        return _write_outputs(pipeline, output, contexts, failed, stopped)


def empty_note(pipeline: Pipeline, summary: dict[str, Any]) -> str | None:
    """For a run that wrote no rows: what its figures say and the switches that would give rows (the
    pipeline's ``when_empty(figures)`` where it has one), said last, so the next stage's "the file is
    empty" is no surprise; None when rows were written."""
    if summary["dataset"]["rows"] or not summary["n_done"]:
        return None
    figures = summary.get("figures") or {}
    counts = ", ".join(f"{k} {v}" for k, v in (figures.get("status") or {}).items())
    hint = pipeline.when_empty(figures) if hasattr(pipeline, "when_empty") else ""
    return (
        f"{pipeline.name}: 0 rows written to {summary['dataset']['file']} from {summary['n_done']} contexts"
        + (f" ({counts})" if counts else "")
        + (f"; {hint}" if hint else "")
    )


def _finished(path: Path, contexts: Sequence[Scenario]) -> dict[str, Record]:
    """The records already written for these contexts; a record whose context changed is refused."""
    by_id = {sc.id: sc for sc in contexts}
    done: dict[str, Record] = {}
    for record in results.read_records(path):
        sc = by_id.get(record["id"])
        if sc is None:
            continue
        if record.get("key") != context_key(sc):
            raise ConfigError(
                f"{path}: context {sc.id!r} was processed from different content (its dialogue, profile, "
                "reference or meta changed since); resume with the same data or choose another --output"
            )
        done[sc.id] = record
    return done


def _run_isolated(pipeline: Pipeline, chunk: Sequence[Scenario]) -> tuple[list[Record], dict[str, str]]:
    """The chunk's records; on a remote failure, its halves are run again until the failing contexts
    are alone, and those are returned as (id -> error) instead."""
    try:
        records = pipeline.run_chunk(chunk)
    except CapabilityError:
        raise  # not a passing failure: every context would hit it
    except EngineError as exc:
        if len(chunk) == 1:
            log.warning(
                "%s: context %s failed and is left for the next run: %s", pipeline.name, chunk[0].id, exc
            )
            return [], {chunk[0].id: str(exc)}
        log.warning(
            "%s: a remote failure in a chunk of %d contexts (%s); running its halves again",
            pipeline.name,
            len(chunk),
            exc,
        )
        half = len(chunk) // 2
        first, lost_a = _run_isolated(pipeline, chunk[:half])
        second, lost_b = _run_isolated(pipeline, chunk[half:])
        return first + second, {**lost_a, **lost_b}
    if len(records) != len(chunk):
        raise RuntimeError(f"{pipeline.name}: {len(records)} records for {len(chunk)} contexts")
    return [{"id": sc.id, "key": context_key(sc), **r} for sc, r in zip(chunk, records)], {}


def _write_outputs(
    pipeline: Pipeline,
    output: Path,
    contexts: Sequence[Scenario],
    failed: dict[str, str],
    stopped: str | None,
) -> dict[str, Any]:
    by_id = {r["id"]: r for r in results.read_records(output / results.RESULTS_FILE)}
    items = [(sc, by_id[sc.id]) for sc in contexts if sc.id in by_id]
    rows, figures = pipeline.export(items)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    write_text_atomic(output / pipeline.dataset_file, text)
    summary = {
        "command": pipeline.name,
        "n_contexts": len(contexts),
        "n_done": len(items),
        "n_failed": len(failed),
        "failed": failed,
        "complete": len(items) == len(contexts),
        "stopped": stopped,
        "dataset": {"file": pipeline.dataset_file, "rows": len(rows)},
        "figures": figures,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    results.write_json_atomic(output / results.SUMMARY_FILE, summary)
    return summary
