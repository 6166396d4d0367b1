"""Human-fidelity benchmark: agreement of simulated users, rewards and judges with real help-seekers'
own in-dialogue ratings (ESConv feedback). See ``docs/fidelity.md``."""

from rapo_echo.benchmarks.fidelity.bench import Fidelity

__all__ = ["Fidelity"]
