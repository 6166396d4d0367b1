"""The TRL tier (``make test-trl``): rapo-echo's rewards and SAGE-style user inside the real TRL's
``GRPOTrainer``, in TRL's own venv (``.venv-trl``: trl 1.16.0, the version of the peer bench); TRL is never
rapo-echo's dependency. Without TRL the tests skip with the reason, and fail under CI (``CI=true``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

TRL_VERSION = "1.16.0"


def need_trl() -> Any:
    """TRL, imported; skip (locally) or fail (CI) where it is missing."""
    try:
        import trl
    except ImportError:
        why = f"TRL is not installed in {sys.prefix} (make test-trl builds .venv-trl with trl=={TRL_VERSION})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"the TRL tier must run in CI: {why}")
        pytest.skip(why)
    return trl


def grpo_args(out: str, **overrides: Any) -> Any:
    """A ``GRPOConfig`` for a tiny CPU run: fp32, no gradient checkpointing, no reference model, no
    logging to any service, every step logged (TRL's GPU-minded defaults turned off, as the peer bench
    does)."""
    from trl import GRPOConfig

    settings = {
        "output_dir": out,
        "per_device_train_batch_size": 2,  # one prompt x num_generations 2 a step
        "num_generations": 2,
        "max_steps": 2,
        "learning_rate": 1e-5,
        "beta": 0.0,
        "bf16": False,
        "use_cpu": True,
        "gradient_checkpointing": False,
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "seed": 0,
        **overrides,
    }
    return GRPOConfig(**settings)


@pytest.fixture(scope="session")
def served() -> Iterator[Any]:
    """``served(engine, name) -> URL``: an engine behind rapo-echo's server in this process."""
    from tests.helpers.served_engine import serving

    with serving() as serve:
        yield serve
