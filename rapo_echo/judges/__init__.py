"""Every generative judge lives here (DESIGN.md, "The three roles").

* :mod:`.base` -- what every judge shares: label-token probabilities when the engine exposes
  log-probs, parsed text otherwise, retries; an unparseable reply is invalid, never 0.
* :mod:`.fencing` -- untrusted text (dialogue, replies, reactions, references, profiles) goes into
  prompts only inside fenced blocks with a per-call marker.
* :mod:`.labels` -- label verdicts for the benchmarks' critics and evaluators.
* :mod:`.group` -- RAPO's group judge: ranks a group of replies from the person's reactions and
  critiques them.
* :mod:`.training_data` / :mod:`.training` -- fine-tuning a judge on labelled verdict examples
  (the ``train-judge`` command). The EPM benchmark's rater lives with its benchmark
  (:mod:`rapo_echo.benchmarks.epm.judge`).

Modules are imported by name (nothing is re-exported here) so that loading one judge stays light.
"""
