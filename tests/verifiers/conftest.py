"""The verifiers tier (``make test-verifiers``): rapo-echo's SAGE-style user and emotion reward as a
verifiers environment, run by the real verifiers (the version PyPI had when the tier was written, 0.4.0)
in its own venv (``.venv-verifiers``); verifiers is never rapo-echo's dependency. Without verifiers the
tests skip with the reason, and fail under CI (``CI=true``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

VERIFIERS_VERSION = "0.4.0"


def need_verifiers() -> Any:
    """``verifiers.v1``, imported; skip (locally) or fail (CI) where it is missing."""
    try:
        import verifiers.v1 as vf
    except ImportError:
        why = (
            f"verifiers is not installed in {sys.prefix} (make test-verifiers builds .venv-verifiers with "
            f"verifiers=={VERIFIERS_VERSION})"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"the verifiers tier must run in CI: {why}")
        pytest.skip(why)
    return vf


@pytest.fixture(scope="session")
def served() -> Iterator[Any]:
    """``served(engine, name) -> URL``: an engine behind rapo-echo's server in this process."""
    from tests.helpers.served_engine import serving

    with serving() as serve:
        yield serve


@pytest.fixture(autouse=True)
def _venv_tools_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """verifiers' local runtime runs its chat program with ``uv`` found on PATH (else it installs one into
    ~/.local): the venv's own ``uv`` comes first."""
    monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
