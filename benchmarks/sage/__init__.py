"""SAGE benchmark: the policy supports a SAGE-style simulated user whose final emotion is the score.

* :mod:`.run` -- the benchmark (:class:`.run.Sage`). The simulated user itself is the one training talks
  to, :mod:`rapo_echo.simulators.sage`; ``--profiles hard`` plays our hard-to-help seekers.
* :mod:`.tracking` -- the state probe: does the policy perceive the user's hidden emotion?
* :mod:`.transcripts` -- the scoring of SAGE's released result files (``--transcripts``).
"""
