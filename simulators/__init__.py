"""The simulated users training talks to (shipped as ``rapo_echo.simulators``; docs/simulators.md).

* **Single reply -> reaction** (RAPO): :class:`.base.UserSimulator`; built in, :mod:`.reaction` (the LLM
  reaction simulator, "echo") and :mod:`.hidden_preference` (a deterministic user with a hidden rule).
* **Whole dialogue -> emotion** (RLVER and the SAGE benchmark): :class:`.sage.SageSimulator` plays a
  persona through a whole dialogue; the final emotion is the dialogue's reward.

Plugins and how a config names them: :mod:`.base`. :mod:`.replies` cleans a role-played reply (shared
with the benchmarks' role players, which live with their benchmark in ``rapo_echo.benchmarks``).
"""
