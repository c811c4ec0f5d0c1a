"""Shared core of eos-connectors: errors, options, the service stack and the CLI.

Public names: ``register`` (add the package's data sources to a SparkSession),
``Endpoints`` and the exception hierarchy rooted at ``EosError``.
"""

from connectors.endpoints import Endpoints
from connectors.errors import (
    ConfigError,
    DataLossError,
    EosError,
    ServiceUnavailableError,
    StackError,
)
from connectors.registry import register

__all__ = [
    "ConfigError",
    "DataLossError",
    "Endpoints",
    "EosError",
    "ServiceUnavailableError",
    "StackError",
    "register",
]
