"""Every generative judge lives here (docs/architecture.md, "The three roles").

What every judge shares (fencing, answer parsing and retries, label probabilities, dialogue rendering)
is in :mod:`rapo_echo.llm`, below the judges, the simulators and the rewards.

* :mod:`.verdict` -- the Echo-N1 judges' answer format (``Reasoning:`` then ``Verdict: LABEL``).
* :mod:`.humanlike`, :mod:`.empathy` -- Echo-N1's two generative reward models.
* :mod:`.reactions` -- ranks a group of replies from the person's emotion changes.
* :mod:`.group` -- RAPO's group judge: ranks a group of replies from the person's reactions and
  critiques them.
* :mod:`.training_data` / :mod:`.training` -- fine-tuning a judge on labelled verdict examples
  (the ``train-judge`` command). The EPM benchmark's rater lives with its benchmark
  (:mod:`rapo_echo.benchmarks.epm.judge`).

Modules are imported by name (nothing is re-exported here) so that loading one judge stays light.
"""
