"""The LLM plumbing that judges, simulators and rewards share, below all three.

* :mod:`.addressing` -- the one detector of text that addresses the judge (answer syntax, words to
  the judge, fence and chat-template markers); :mod:`.judge_screen` -- what a judge does with it.
* :mod:`.fencing` -- untrusted text (dialogue, replies, reactions, references, profiles) goes into
  prompts only inside fenced blocks with a per-call marker.
* :mod:`.answers` -- answer lines parsed from a model's text, generation with retries (an unparseable
  reply is invalid, never 0), the log-prob mode switch.
* :mod:`.labels` -- a choice among labels read from label-token probabilities, else parsed from text.
* :mod:`.dialogue` -- the one ``render_dialogue``: a dialogue as ``Name: text`` lines.
* :mod:`.reaction` -- the :class:`~.reaction.Reaction` type and ``render_profile``.
* :mod:`.ranks` -- ``average_ranks`` (judges rank groups with it; RAPO's rank rewards read the ranks).

Modules are imported by name (nothing is re-exported here).
"""
