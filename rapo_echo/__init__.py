"""rapo-echo: reinforcement learning of empathetic, emotionally supportive dialogue models.

The core every algorithm shares lives here (types, engines, policy, rewards, trainer, config, data,
CLI); the algorithms, simulated users and benchmarks ship as ``rapo_echo.algorithms``,
``rapo_echo.simulators`` and ``rapo_echo.benchmarks``.
"""

__version__ = "0.1.0"
