"""SAGE benchmark: the policy supports a SAGE-style simulated user whose final emotion is the score.

* :mod:`.run` -- the benchmark (:class:`.run.Sage`) and the scoring of released transcripts. The
  simulated user itself is the one training talks to, :mod:`rapo_echo.simulators.sage`.
"""
