"""Benchmarks: ESConv interactive (PPDPP) and reference-based, SOTOPIA; the runner, the ``eval`` / ``report``
CLI and the HTML report. See README.md in this folder."""
