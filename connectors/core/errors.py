"""The package's exception hierarchy: one root, every name ends in ``Error``."""

from __future__ import annotations


class EosError(Exception):
    """Root of every error this package raises on purpose."""


class ConfigError(EosError, ValueError):
    """An option is missing, unknown or malformed; the message names the option."""


class StackError(EosError):
    """The local service stack could not be installed, started, reached or stopped."""


class ServiceUnavailableError(EosError):
    """A Kafka, PostgreSQL or Redis server did not answer within the allowed time."""


class DataLossError(EosError):
    """Records the query needs are gone from the source (for example deleted by retention)."""
