"""SOTOPIA benchmark: two agents role-play a social scenario and an evaluator scores them.

* :mod:`.profiles` -- scenarios and agent profiles (``sotopia_en.json`` beside it is the default).
* :mod:`.agent` -- the agents' prompts and action parsing (the benchmark's role players).
* :mod:`.evaluator` -- SOTOPIA-Eval's seven dimensions: the evaluator prompt and its parsing.
* :mod:`.run` -- the episode loop (:class:`.run.Sotopia`).
"""
