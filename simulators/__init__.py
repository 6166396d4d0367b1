"""The simulated users training talks to (shipped as ``rapo_echo.simulators``).

Two protocols, one per kind of algorithm:

* **Single reply -> reaction** (RAPO, ``--algo rapo``): :class:`.base.UserSimulator` gets a batch of
  ``(scenario, candidate reply)`` pairs and returns, per pair, a :class:`.base.Reaction` -- the person's
  next message, the change of their emotion in ``[-scale, +scale]`` and optionally an inner thought --
  or ``None`` when it could not react (the sample is then masked out and counted, never scored 0).
  Built in: :mod:`.reaction` (the LLM reaction simulator, "echo") and :mod:`.hidden_preference` (a
  deterministic user reacting by a hidden rule: RAPO with a known ground truth).
* **Whole dialogue -> emotion** (RLVER, ``--algo rlver``, and the SAGE benchmark): :mod:`.sage`'s
  :class:`.sage.SageSimulator` plays a persona with a goal and a hidden intention through a whole
  multi-turn dialogue; ``start`` opens a batch of dialogues and ``step`` takes the supporter's replies,
  updates each user's emotion (0-100) and answers, until goodbye, the turn limit or an emotion bound.
  The final emotion is the dialogue's reward.

A simulator plugin (single-reply protocol) is a class that subclasses :class:`.base.UserSimulator` or
sets ``rapo_echo_simulator = True``; a config names it in ``rapo.simulator.name`` as a built-in
(:data:`.base.BUILTINS`), an entry point of the ``rapo_echo.simulators`` group (in the plugin's own
``pyproject.toml``: ``[project.entry-points."rapo_echo.simulators"] my_user = "my_pkg.users:MyUser"``)
or a ``module:Class`` path; ``rapo.simulator.args`` go to its constructor (see :mod:`.base`).

:mod:`.replies` cleans a role-played reply (shared with the benchmarks' role players). The benchmarks'
own role players (ESConv seeker, SOTOPIA agents, EPM person and director) live with their benchmark in
``rapo_echo.benchmarks``.
"""
