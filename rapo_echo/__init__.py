"""rapo-echo: reinforcement learning of empathetic, emotionally supportive dialogue models.

This package is the core every algorithm shares; the layers above it ship beside it as
``rapo_echo.algorithms``, ``.training``, ``.simulators``, ``.benchmarks``, ``.datagen``, ``.integrations``
and ``.perf`` (docs/architecture.md). The Python API (docs/python-api.md) is imported on first use, so
``import rapo_echo`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> the module that defines it, imported on first access (an upward import string, declared as
# such in tests/unit/architecture/test_import_layers.py).
LAZY_EXPORTS = {
    "train": "rapo_echo.training.api",
    "evaluate": "rapo_echo.training.api",
    "TrainResult": "rapo_echo.training.api",
    "load_config": "rapo_echo.training.run_config",
    "RunConfig": "rapo_echo.algorithms.run_sections",
}

__all__ = ["__version__", *LAZY_EXPORTS]


def __getattr__(name: str) -> Any:
    module = LAZY_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rapo_echo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *LAZY_EXPORTS})
