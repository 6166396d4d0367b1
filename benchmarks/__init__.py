"""Benchmarks, one package each: :mod:`.esconv` (interactive PPDPP and reference-based), :mod:`.sotopia`,
:mod:`.sage`, :mod:`.epm`; shared here: the runner, the ``eval`` / ``report`` CLI, results, the HTML report
and its plots; :mod:`.perf` holds the performance benchmarks. See README.md in this folder."""
