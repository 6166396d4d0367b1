"""Every generative judge lives here (docs/architecture.md, "The three roles").

* :mod:`.base` -- what every judge shares: label-token probabilities when the engine exposes
  log-probs, parsed text otherwise, retries; an unparseable reply is invalid, never 0.
* :mod:`.fencing` -- untrusted text (dialogue, replies, reactions, references, profiles) goes into
  prompts only inside fenced blocks with a per-call marker.
* :mod:`.labels` -- label verdicts for the benchmarks' critics and evaluators.
* :mod:`.group` -- RAPO's group judge: ranks a group of replies from the person's reactions and
  critiques them.
* :mod:`.epm` -- the EPM benchmark's rater: the IEDR form (initial deficit) and the per-turn MDEP form.

Modules are imported by name (nothing is re-exported here) so that loading one judge stays light.
"""
