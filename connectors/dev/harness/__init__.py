"""The exactly-once harness: pipelines run as their own processes, crashed and checked."""

import importlib


def load(reference: str) -> object:
    """``module:attribute``, imported (a custom sink's DataSource class or reader)."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)
