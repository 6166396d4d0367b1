"""Exceptions with messages meant for the user: each names the file, line, field or endpoint."""

from __future__ import annotations

from collections.abc import Iterable


class RapoEchoError(Exception):
    """Base class of every error rapo-echo raises on purpose."""


class ConfigError(RapoEchoError):
    """A config file, override or flag is invalid. The CLI exits with code 2."""

    @classmethod
    def invalid(cls, problems: Iterable[str]) -> ConfigError:
        """The error listing ``problems``, one line each (``file:line: key: got ...; what to do``)."""
        return cls("invalid config:\n  " + "\n  ".join(problems))


class DataError(RapoEchoError):
    """A data file is malformed; the message names the file and line."""


class ModelResolutionError(RapoEchoError):
    """A model spec could not be resolved or a needed package is missing."""


class EngineError(RapoEchoError):
    """A chat engine failed (remote endpoint down, bad response, ...)."""


class CapabilityError(EngineError):
    """The engine cannot do what was asked (e.g. log-probs from a server that gives none)."""
